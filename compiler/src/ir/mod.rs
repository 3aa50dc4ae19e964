//! The graph IR: what one traced step becomes before it is lowered to StableHLO.
//!
//! - [`TensorType`]: a dtype and static dims; [`Literal`]: constant values kept as raw bytes so
//!   that ops can derive `Eq` and `Hash` exactly.
//! - [`Op`]: one enum of primitives, grouped like `Unary(UnaryOp)`, `Binary(BinaryOp)`,
//!   `Reduce(ReduceOp, dims)`. Facts about an op (its name, StableHLO spelling, dtypes it
//!   takes) live on the enums. Every `match` over ops in this crate is exhaustive, so adding a
//!   primitive is one variant plus one arm in [`infer`], the lowering, the reference evaluator
//!   and the canonical encoding; the compiler lists each place.
//! - [`infer`]: shape and dtype inference, callable on its own (the lazy device calls it for
//!   every traced op); errors name the op, the operand types and what was expected.
//! - [`Graph`]: an append-only arena of [`Node`]s, parameters numbered in creation order, an
//!   ordered output list; [`Graph::canonical_bytes`] and [`Graph::fingerprint`] give a stable,
//!   versioned identity that never includes parameter values.

mod canon;
mod graph;
mod infer;
mod op;
mod types;

pub use canon::CANONICAL_VERSION;
pub use graph::{Graph, Node, NodeId};
pub use infer::{infer, shape_error};
pub use op::{BinaryOp, CompareOp, DTypeClass, Op, ReduceOp, UnaryOp};
pub use types::{Literal, TensorType};
