//! The graph IR: what one traced step becomes before it is lowered to StableHLO.
//!
//! - [`TensorType`]: a dtype and static dims; [`Literal`]: constant values kept as raw bytes so
//!   that ops can derive `Eq` and `Hash` exactly.
//! - [`Op`]: one enum of primitives, grouped like `Unary(UnaryOp)`, `Binary(BinaryOp)`,
//!   `Reduce(ReduceOp, dims)`. Facts about an op (its name, StableHLO spelling, dtypes it
//!   takes) live on the enums. The `match`es that define an op (shape inference, lowering, the
//!   reference evaluator, autodiff in the root crate) list every variant with no wildcard, so
//!   adding a primitive is one variant plus one arm in each, and the compiler lists each place.
//!   Passes that only look for particular ops (folding, simplification) use wildcards on purpose.
//! - [`infer`]: shape and dtype inference, callable on its own (the lazy device calls it for
//!   every traced op); errors name the op, the operand types and what was expected.
//! - [`Graph`]: an append-only arena of [`Node`]s, parameters numbered in creation order, an
//!   ordered output list. A graph's identity for caching is the key of its lowered program
//!   (see [`crate::key`]), not anything computed here.

mod families;
mod graph;
mod infer;
mod op;
mod types;

pub use families::{BinaryOp, CompareOp, DTypeClass, ReduceOp, UnaryOp};
pub use infer::{infer, shape_error};
pub use op::{Graph, Node, NodeId};
pub use op::{Op, ProcessCollective, Saved, ScanBody, ScanOutput};
pub use types::{Literal, TensorType};
