//! Auto-cast (`--auto-cast matmult|all`, `--auto-cast-type bf16|fp16`): chosen float32 ops run
//! in the reduced precision, with float32 values on both sides, so every other op and every
//! output keeps its type. Ops are chosen by class, as Neuron's auto-cast documents it: matrix
//! multiplications first, then (`all`) the arithmetic around them, never the rest.
//!
//! - `matmult`: each float32 `dot_general` becomes `convert(dot(convert(a), convert(b)))`: inputs
//!   rounded to bf16/f16, result handed on as float32, as Neuron users expect. The IR's
//!   `dot_general` has no separate result type, so the product is rounded to the reduced type
//!   before widening (XLA's CPU backend accumulates bf16 dots in float32 internally; the final
//!   rounding adds at most half an ulp of the reduced type). A matmul reading a constant the
//!   reduced type cannot hold (below its smallest normal number or above its largest) stays
//!   float32. The IR has no convolution op; one would belong to this class.
//! - `all`: matmuls as above, plus the elementwise float32 ops that are safe in 8 (bf16) or 11
//!   (f16) significant bits (neg, abs, sign, floor, ceil, tanh, logistic, sin, cos, erf, add,
//!   sub, mul, div, max, min) when all of these hold:
//!   - the op's result flows into a matmul (it is part of the forward or backward computation
//!     that feeds one). Arithmetic that flows only into graph outputs is the optimizer's (bias
//!     corrections `1 - 0.999^t`, where 0.999 rounds to 1 in bf16; `g * g` of small gradients,
//!     which is zero in f16; `sqrt(v) + eps`) or the loss's epilogue, and stays float32;
//!   - it reads no graph parameter and produces no graph output: in a training step those are
//!     the weight and optimizer-state updates, where `w - lr * g` in bf16 would round small
//!     updates away entirely;
//!   - no operand is a constant that the reduced type cannot hold: a nonzero value below its
//!     smallest normal number (AdamW's `eps = 1e-8` is zero in f16) or above its largest.
//!
//!   Kept in float32 always: reductions (a sum of thousands of terms in bf16 loses most of its
//!   digits, and f16 overflows at 65504), softmax's exp, log and log1p (exp overflows f16 above
//!   11.1; log of small probabilities), pow, sqrt, rsqrt (layer-norm variances), rem,
//!   comparisons (rounding flips near-ties), select, and data movement (no arithmetic to speed
//!   up).
//!
//! Chains of reduced-precision ops first get `convert` pairs between them
//! (`bf16 → f32 → bf16`); the pipeline's simplify pass removes those (an exact round trip), so
//! the chain stays in the reduced type.

use crate::dtype::DType;
use crate::error::Result;
use crate::flags::{AutoCast, AutoCastType};
use crate::ir::{Graph, Node, NodeId, Op};

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
    let to = cast_dtype(to);
    let mut rw = Cast {
        mode,
        to,
        is_output: boundary,
        is_param: params,
        feeds_matmul: feeds_matmul(graph),
        unrepresentable: unrepresentable_constants(graph, to),
    };
    rebuild(graph, None, false, &mut rw)
}

struct Cast {
    mode: AutoCast,
    to: DType,
    /// Indexed by old node id.
    is_output: Vec<bool>,
    is_param: Vec<bool>,
    /// Whether some `dot_general` consumes the node's value, directly or through other ops.
    feeds_matmul: Vec<bool>,
    /// Constants (or broadcasts, reshapes and converts of one) with a value `to` cannot hold.
    unrepresentable: Vec<bool>,
}

impl Cast {
    fn selected(&self, old: NodeId, node: &Node) -> bool {
        // Every op considered here has its operands' dtype as its result dtype.
        if node.ty.dtype != DType::F32 {
            return false;
        }
        match (&node.op, self.mode) {
            (_, AutoCast::None) => false,
            // A constant operand the reduced type cannot hold would be flushed to zero or
            // infinity before the product: that matmul stays float32.
            (Op::DotGeneral { .. }, _) => !node
                .operands
                .iter()
                .any(|o| self.unrepresentable[o.index()]),
            (op, AutoCast::All) if elementwise_castable(op) => {
                self.feeds_matmul[old.index()]
                    && !self.is_output[old.index()]
                    && !node
                        .operands
                        .iter()
                        .any(|o| self.is_param[o.index()] || self.unrepresentable[o.index()])
            }
            (_, AutoCast::Matmult | AutoCast::All) => false,
        }
    }
}

/// For each node, whether a `dot_general` reads its value directly or through other nodes.
/// Nodes are in topological order, so one backward sweep sees every consumer before its operands.
fn feeds_matmul(graph: &Graph) -> Vec<bool> {
    let mut feeds = vec![false; graph.len()];
    for (i, node) in graph.nodes().iter().enumerate().rev() {
        if feeds[i] || matches!(node.op, Op::DotGeneral { .. }) {
            for o in &node.operands {
                feeds[o.index()] = true;
            }
        }
    }
    feeds
}

/// The smallest positive normal number and the largest finite number of a reduced float type.
fn normal_range(to: DType) -> (f64, f64) {
    match to {
        // bf16 has float32's exponent range
        DType::BF16 => (f32::MIN_POSITIVE as f64, 3.389_531_389_251_535e38),
        DType::F16 => (6.103_515_625e-5, 65504.0),
        // not a reduced type: nothing is out of its range
        DType::F32
        | DType::F64
        | DType::I32
        | DType::I64
        | DType::U32
        | DType::U8
        | DType::Pred => (0.0, f64::INFINITY),
    }
}

/// For each node, whether it is a constant (possibly broadcast, reshaped or converted) holding
/// a value that `to` would flush to zero or turn into infinity.
fn unrepresentable_constants(graph: &Graph, to: DType) -> Vec<bool> {
    let (tiny, huge) = normal_range(to);
    let mut out = vec![false; graph.len()];
    for (i, node) in graph.nodes().iter().enumerate() {
        out[i] = if let Op::Constant(lit) = &node.op {
            {
                let n = if lit.is_splat() {
                    1
                } else {
                    lit.element_count()
                };
                (0..n).any(|k| {
                    let v = lit.get_f64(k).unwrap_or(0.0).abs();
                    (v != 0.0 && v < tiny) || (v.is_finite() && v > huge)
                })
            }
        } else {
            // ops that carry a constant's values on unchanged (others: the constant is gone)
            let carries = matches!(
                node.op,
                Op::BroadcastInDim { .. } | Op::Reshape { .. } | Op::Convert(_)
            );
            carries && node.operands.first().is_some_and(|o| out[o.index()])
        };
    }
    out
}

/// Elementwise float ops that `--auto-cast all` runs in the reduced type (see the module doc
/// for what stays float32 and why); the per-op answer is a fact on the op enums.
fn elementwise_castable(op: &Op) -> bool {
    op.half_precision_safe()
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
