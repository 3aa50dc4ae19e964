//! Auto-cast (`--auto-cast matmult|all`, `--auto-cast-type bf16|fp16`): chosen float32 ops run
//! in the reduced precision, with float32 values on both sides, so every other op and every
//! output keeps its type.
//!
//! - `matmult`: each float32 `dot_general` becomes `convert(dot(convert(a), convert(b)))`: inputs
//!   rounded to bf16/f16, result handed on as float32, as Neuron users expect. The IR's
//!   `dot_general` has no separate result type, so the product is rounded to the reduced type
//!   before widening (XLA's CPU backend accumulates bf16 dots in float32 internally; the final
//!   rounding adds at most half an ulp of the reduced type).
//! - `all`: matmuls as above, plus the elementwise float32 ops that are safe in 8 (bf16) or 11
//!   (f16) significant bits: neg, abs, sign, floor, ceil, tanh, logistic, sin, cos, erf, add,
//!   sub, mul, div, max, min. Kept in float32, by choice:
//!   - reductions (a sum of thousands of terms in bf16 loses most of its digits), softmax's
//!     exp, log and log1p (exp overflows f16 above 11.1; log of small probabilities), pow,
//!     sqrt, rsqrt (layer-norm variances), rem, comparisons (rounding flips near-ties), select,
//!     and data movement (no arithmetic to speed up);
//!   - any elementwise op that reads a graph parameter or produces a graph output: in a
//!     training step these are the weight and optimizer-state updates, where `w - lr * g` in
//!     bf16 would round small updates away entirely.
//!
//! Chains of reduced-precision ops first get `convert` pairs between them
//! (`bf16 → f32 → bf16`); the pipeline's simplify pass removes those (an exact round trip), so
//! the chain stays in the reduced type.

use crate::dtype::DType;
use crate::error::Result;
use crate::flags::{AutoCast, AutoCastType};
use crate::ir::{BinaryOp, Graph, Node, NodeId, Op, UnaryOp};

use super::rewrite::{rebuild, Builder, NodeRewrite};

/// The reduced dtype of an auto-cast type.
pub fn cast_dtype(t: AutoCastType) -> DType {
    match t {
        AutoCastType::Bf16 => DType::BF16,
        AutoCastType::Fp16 => DType::F16,
    }
}

/// `graph` with the ops chosen by `mode` computed in `to`. `AutoCast::None` returns a copy.
pub fn auto_cast(graph: &Graph, mode: AutoCast, to: AutoCastType) -> Result<Graph> {
    let mut boundary = vec![false; graph.len()];
    for &o in graph.outputs() {
        boundary[o.index()] = true;
    }
    let params: Vec<bool> = graph
        .nodes()
        .iter()
        .map(|n| matches!(n.op, Op::Parameter { .. }))
        .collect();
    let mut rw = Cast {
        mode,
        to: cast_dtype(to),
        is_output: boundary,
        is_param: params,
    };
    rebuild(graph, None, false, &mut rw)
}

struct Cast {
    mode: AutoCast,
    to: DType,
    /// Indexed by old node id.
    is_output: Vec<bool>,
    is_param: Vec<bool>,
}

impl Cast {
    fn selected(&self, old: NodeId, node: &Node) -> bool {
        // Every op considered here has its operands' dtype as its result dtype.
        if node.ty.dtype != DType::F32 {
            return false;
        }
        match (&node.op, self.mode) {
            (_, AutoCast::None) => false,
            (Op::DotGeneral { .. }, _) => true,
            (op, AutoCast::All) if elementwise_castable(op) => {
                !self.is_output[old.index()]
                    && !node.operands.iter().any(|o| self.is_param[o.index()])
            }
            (_, AutoCast::Matmult | AutoCast::All) => false,
        }
    }
}

/// Elementwise float ops that `--auto-cast all` runs in the reduced type (see the module doc
/// for what stays float32 and why).
fn elementwise_castable(op: &Op) -> bool {
    match op {
        Op::Unary(u) => match u {
            UnaryOp::Neg
            | UnaryOp::Abs
            | UnaryOp::Sign
            | UnaryOp::Floor
            | UnaryOp::Ceil
            | UnaryOp::Tanh
            | UnaryOp::Logistic
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Erf => true,
            UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Log1p
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Not => false,
        },
        Op::Binary(b) => match b {
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Max
            | BinaryOp::Min => true,
            BinaryOp::Rem | BinaryOp::Pow | BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => false,
        },
        _ => false,
    }
}

impl NodeRewrite for Cast {
    fn rewrite(
        &mut self,
        b: &mut Builder,
        old: NodeId,
        node: &Node,
        operands: &[NodeId],
    ) -> Result<NodeId> {
        if !self.selected(old, node) {
            return b.push(node.op.clone(), operands);
        }
        let mut low = Vec::with_capacity(operands.len());
        for &o in operands {
            low.push(b.push(Op::Convert(self.to), &[o])?);
        }
        let r = b.push(node.op.clone(), &low)?;
        b.push(Op::Convert(DType::F32), &[r])
    }
}
