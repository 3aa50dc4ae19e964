//! Algebraic simplification: identities that make a node equal to one of its operands, or to
//! a cheaper op. Every rule gives bit-identical results with one documented exception: `x + 0`
//! becomes `x`, so an input of `-0.0` stays `-0.0` where IEEE addition would give `+0.0`
//! (XLA's own simplifier does the same; the two compare equal).
//!
//! Rules (operand constants may be splats or dense literals whose elements are all equal):
//! - `x * 1`, `1 * x`, `x + 0`, `0 + x`, `x - 0`, `x / 1` → `x`
//! - `neg(neg(x))` → `x`
//! - `convert` to the operand's own dtype → `x`; `convert(convert(x))` back to `x`'s dtype
//!   through an exact widening (bf16→f32→bf16, i32→i64→i32, ...) → `x` (these chains are
//!   what auto-cast leaves between two reduced-precision ops)
//! - `transpose(transpose(x))` → one transpose, or `x` when the permutations cancel; identity
//!   transpose → `x`
//! - `reshape(reshape(x))` → one reshape; reshape to the operand's own shape → `x`
//! - `broadcast_in_dim`, `reshape` or `transpose` of a splat constant → a splat constant of the
//!   result shape; an identity `broadcast_in_dim` → `x`
//! - `select` on a constant condition → the chosen branch
//! - full-range unit-stride `slice`, all-zero `pad`, one-operand `concatenate`, reduction over
//!   no dimensions → `x`
//!
//! Deliberately absent: `x * 0 → 0` and `x - x → 0` (wrong for NaN and infinities).

use crate::dtype::DType;
use crate::error::Result;
use crate::ir::{BinaryOp, Graph, Literal, Node, NodeId, Op, UnaryOp};

use super::rewrite::{rebuild, Builder, NodeRewrite};

/// `graph` with the identities above applied.
pub fn simplify(graph: &Graph) -> Result<Graph> {
    rebuild(graph, None, false, &mut Simplify)
}

pub(crate) struct Simplify;

impl NodeRewrite for Simplify {
    fn rewrite(
        &mut self,
        b: &mut Builder,
        _: NodeId,
        node: &Node,
        operands: &[NodeId],
    ) -> Result<NodeId> {
        emit(b, node.op.clone(), operands.to_vec())
    }
}

/// The outcome of one rule.
enum Simplified {
    /// The node equals this existing node.
    Node(NodeId),
    /// The node equals this (simpler) op, which may simplify further.
    Op(Op, Vec<NodeId>),
}

/// Emits `op(operands)` after applying rules until none fits. Each step either returns an
/// existing node or strictly shortens a chain, so the loop ends; the bound is a safety net.
pub(crate) fn emit(b: &mut Builder, mut op: Op, mut operands: Vec<NodeId>) -> Result<NodeId> {
    for _ in 0..16 {
        match rule(b, &op, &operands)? {
            Some(Simplified::Node(id)) => return Ok(id),
            Some(Simplified::Op(o, args)) => {
                op = o;
                operands = args;
            }
            None => break,
        }
    }
    b.push(op, &operands)
}

/// True when `lit` holds `value` in every element.
fn all_equal_to(lit: &Literal, value: f64) -> bool {
    let stored = if lit.is_splat() {
        1
    } else {
        lit.element_count()
    };
    stored > 0 && (0..stored).all(|i| lit.get_f64(i) == Some(value))
}

/// A splat constant of `lit`'s dtype and first element, over `dims`.
fn splat_like(lit: &Literal, dims: &[usize]) -> Option<Op> {
    if !lit.is_splat() {
        return None;
    }
    let bytes = lit.element_bytes(0)?;
    Literal::splat_bytes(lit.dtype(), bytes, dims)
        .ok()
        .map(Op::Constant)
}

/// Converting `from` to `to` and back gives the original value for every input.
fn exact_widening(from: DType, to: DType) -> bool {
    use DType::*;
    matches!(
        (from, to),
        (BF16 | F16, F32 | F64)
            | (F32, F64)
            | (I32, I64)
            | (U8, I32 | I64 | U32)
            | (U32, I64)
            | (Pred, _)
    ) && from != to
}

// A rule set: an op no rule names (a new one included) is left as it is, which is right for
// every op, so the wildcards here decide nothing per op.
#[allow(clippy::wildcard_enum_match_arm)]
fn rule(b: &Builder, op: &Op, args: &[NodeId]) -> Result<Option<Simplified>> {
    use Simplified::{Node as Same, Op as Becomes};
    let is = |id: NodeId, v: f64| b.constant(id).is_some_and(|l| all_equal_to(l, v));
    Ok(match op {
        Op::Binary(bop) if args.len() == 2 => {
            let (x, y) = (args[0], args[1]);
            match bop {
                BinaryOp::Add if is(y, 0.0) => Some(Same(x)),
                BinaryOp::Add if is(x, 0.0) => Some(Same(y)),
                BinaryOp::Sub if is(y, 0.0) => Some(Same(x)),
                BinaryOp::Mul if is(y, 1.0) => Some(Same(x)),
                BinaryOp::Mul if is(x, 1.0) => Some(Same(y)),
                BinaryOp::Div if is(y, 1.0) => Some(Same(x)),
                _ => None,
            }
        }
        Op::Unary(UnaryOp::Neg) if args.len() == 1 => match &b.node(args[0])?.op {
            Op::Unary(UnaryOp::Neg) => Some(Same(b.node(args[0])?.operands[0])),
            _ => None,
        },
        Op::Convert(to) if args.len() == 1 => {
            let x = b.node(args[0])?;
            if x.ty.dtype == *to {
                Some(Same(args[0]))
            } else if let Op::Convert(mid) = x.op {
                let inner = x.operands[0];
                let from = b.ty(inner)?.dtype;
                (from == *to && exact_widening(from, mid)).then_some(Same(inner))
            } else {
                None
            }
        }
        Op::Transpose { perm } if args.len() == 1 => {
            let x = b.node(args[0])?;
            if perm.iter().enumerate().all(|(i, &p)| i == p) {
                Some(Same(args[0]))
            } else if let Op::Transpose { perm: inner } = &x.op {
                let composed: Vec<usize> = perm.iter().map(|&p| inner[p]).collect();
                Some(Becomes(
                    Op::Transpose { perm: composed },
                    vec![x.operands[0]],
                ))
            } else if let Op::Constant(lit) = &x.op {
                let dims: Vec<usize> = perm.iter().map(|&p| x.ty.dims[p]).collect();
                splat_like(lit, &dims).map(|c| Becomes(c, vec![]))
            } else {
                None
            }
        }
        Op::Reshape { dims } if args.len() == 1 => {
            let x = b.node(args[0])?;
            if &x.ty.dims == dims {
                Some(Same(args[0]))
            } else if let Op::Reshape { .. } = x.op {
                Some(Becomes(
                    Op::Reshape { dims: dims.clone() },
                    vec![x.operands[0]],
                ))
            } else if let Op::Constant(lit) = &x.op {
                splat_like(lit, dims).map(|c| Becomes(c, vec![]))
            } else {
                None
            }
        }
        Op::BroadcastInDim {
            dims,
            broadcast_dimensions,
        } if args.len() == 1 => {
            let x = b.node(args[0])?;
            let identity = broadcast_dimensions
                .iter()
                .enumerate()
                .all(|(i, &d)| i == d);
            if &x.ty.dims == dims && identity {
                Some(Same(args[0]))
            } else if let Op::Constant(lit) = &x.op {
                splat_like(lit, dims).map(|c| Becomes(c, vec![]))
            } else {
                None
            }
        }
        Op::Select if args.len() == 3 => match b.constant(args[0]) {
            Some(l) if all_equal_to(l, 1.0) => Some(Same(args[1])),
            Some(l) if all_equal_to(l, 0.0) => Some(Same(args[2])),
            _ => None,
        },
        Op::Slice {
            start,
            limit,
            stride,
        } if args.len() == 1 => {
            let dims = &b.ty(args[0])?.dims;
            let full =
                start.iter().all(|&s| s == 0) && limit == dims && stride.iter().all(|&s| s == 1);
            full.then_some(Same(args[0]))
        }
        Op::Pad {
            low,
            high,
            interior,
        } if args.len() == 2 => {
            let zero = low.iter().chain(high).all(|&p| p == 0) && interior.iter().all(|&p| p == 0);
            zero.then_some(Same(args[0]))
        }
        Op::Concatenate { .. } if args.len() == 1 => Some(Same(args[0])),
        Op::Reduce(_, dims) if dims.is_empty() && args.len() == 1 => Some(Same(args[0])),
        _ => None,
    })
}
