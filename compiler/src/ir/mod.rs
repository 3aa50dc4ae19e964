//! The graph IR: what one traced step becomes before it is lowered to StableHLO.
//!
//! - [`TensorType`]: a dtype and static dims; [`Literal`]: constant values kept as raw bytes so
//!   that ops can derive `Eq` and `Hash` exactly.
//! - [`Op`]: one enum of primitives, grouped like `Unary(UnaryOp)`, `Binary(BinaryOp)`,
//!   `Reduce(ReduceOp, dims)`. A unary op is one row of the table in `families.rs` (name,
//!   StableHLO spelling, dtypes, reference value, ...). What the passes, the device and autodiff
//!   ask of every op (foldable? how do replicas see it? cheap to recompute? castable to bf16?)
//!   is answered in `facts.rs`. The `match`es that define an op (shape inference, lowering,
//!   the reference evaluator, the facts, autodiff in the root crate) list every variant with no
//!   wildcard, so adding a primitive is one variant plus one arm in each, and the compiler
//!   lists each place. `clippy::wildcard_enum_match_arm` holds this crate (and the root
//!   crate's `device` and `autodiff`) to it; the few wildcards left (a rule set such as
//!   simplification, a shortcut such as the tracer's small keys) are allowed one by one, with
//!   the reason.
//! - [`infer`]: shape and dtype inference, callable on its own (the lazy device calls it for
//!   every traced op); errors name the op, the operand types and what was expected.
//! - [`CallBody`]: a computation recorded once and applied by [`Op::Call`] (one node per
//!   result); graphs are compiled with calls written out ([`expand_calls`]).
//! - [`Graph`]: an append-only arena of [`Node`]s, parameters numbered in creation order, an
//!   ordered output list. A graph's identity for caching is the key of its lowered program
//!   (see [`crate::key`]), not anything computed here.

mod call;
mod facts;
mod families;
mod graph;
mod infer;
mod op;
mod types;

pub use call::{expand_calls, CallExpander};
pub use facts::ReplicaRule;
pub use families::{BinaryOp, CompareOp, DTypeClass, ReduceOp, UnaryOp};
pub use infer::{infer, shape_error};
pub use op::{CallBody, Op, ProcessCollective, Saved, ScanBody, ScanOutput};
pub use op::{Graph, Node, NodeId};
pub use types::{Literal, TensorType};
