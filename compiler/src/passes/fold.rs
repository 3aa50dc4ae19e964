//! Constant folding: an op whose operands are all constants becomes a constant, computed by the
//! crate's reference evaluator (one definition of every op's semantics, so folding covers every
//! op without a second implementation to keep in step).
//!
//! Size rules, so that folding never bloats the program or spends long evaluating:
//! - elementwise ops (unary, binary, compare, select, convert) on splat operands are evaluated
//!   on one element and give a splat, whatever the shape;
//! - anything else is evaluated only when its result has at most `limit` elements and the
//!   evaluation costs at most 16 element operations per element of `limit` (a constant matmul
//!   with a small result can still be billions of multiply-adds), and is kept
//!   only as a splat (when all elements are equal) or when the dense result holds no more
//!   elements than its operands together (a `broadcast_in_dim` or `pad` of a dense constant
//!   would multiply the constant data in the program text, so it stays an op);
//! - ops without operands (`iota`) are generators, cheaper to compute than to ship: not folded;
//!   collectives depend on other replicas: never folded.
//!
//! A fold the evaluator cannot do is skipped, not an error: the op is still correct unfolded.

use crate::error::Result;
use crate::host::HostTensor;
use crate::ir::{Graph, Literal, Node, NodeId, Op};

use super::rewrite::{rebuild, Builder, NodeRewrite};

/// `graph` with constant subexpressions folded, creating no constant larger than `limit`
/// elements (splats excepted, they are one element).
pub fn constant_fold(graph: &Graph, limit: usize) -> Result<Graph> {
    rebuild(graph, None, false, &mut Fold { limit })
}

pub(crate) struct Fold {
    pub(crate) limit: usize,
}

impl NodeRewrite for Fold {
    fn rewrite(
        &mut self,
        b: &mut Builder,
        _: NodeId,
        node: &Node,
        operands: &[NodeId],
    ) -> Result<NodeId> {
        if let Some(lit) = self.try_fold(b, node, operands) {
            return b.push(Op::Constant(lit), &[]);
        }
        b.push(node.op.clone(), operands)
    }
}

impl Fold {
    fn try_fold(&self, b: &Builder, node: &Node, operands: &[NodeId]) -> Option<Literal> {
        if operands.is_empty() || !node.op.is_foldable() {
            return None;
        }
        let lits: Vec<&Literal> = operands
            .iter()
            .map(|&o| b.constant(o))
            .collect::<Option<_>>()?;
        let dims = &node.ty.dims;
        if elementwise(&node.op) && lits.iter().all(|l| l.is_splat()) {
            // Same op on scalars; the result is that scalar over the node's shape.
            let scalars: Vec<Literal> = lits
                .iter()
                .map(|l| Literal::splat_bytes(l.dtype(), l.element_bytes(0)?, &[]).ok())
                .collect::<Option<_>>()?;
            let out = evaluate_one(&node.op, &scalars)?;
            return Literal::splat_bytes(out.dtype(), out.bytes(), dims).ok();
        }
        if node.ty.element_count() > self.limit
            || work(&node.op, &lits, node) > WORK_FACTOR * self.limit
        {
            return None;
        }
        let owned: Vec<Literal> = lits.iter().map(|&l| l.clone()).collect();
        let out = evaluate_one(&node.op, &owned)?;
        let w = out.dtype().size_in_bytes();
        let bytes = out.bytes();
        if bytes.len() >= w && bytes.chunks_exact(w).all(|c| c == &bytes[..w]) {
            return Literal::splat_bytes(out.dtype(), &bytes[..w], dims).ok();
        }
        let operand_elements: usize = lits.iter().map(|l| l.element_count()).sum();
        (out.element_count() <= operand_elements).then(|| Literal::dense(&out))
    }
}

/// Folding may spend this many element operations per element of the size limit; beyond it
/// (a large constant matmul with a small result, say) the op is left for the device.
const WORK_FACTOR: usize = 16;

/// Element operations the reference evaluator spends on `node`, roughly.
fn work(op: &Op, operands: &[&Literal], node: &Node) -> usize {
    let inputs: usize = operands.iter().map(|l| l.element_count()).sum();
    match op.contracted_dims() {
        Some(dims) => {
            let contracted: usize = operands.first().map_or(1, |l| {
                dims.iter()
                    .map(|&d| l.dims().get(d).copied().unwrap_or(1))
                    .product()
            });
            node.ty.element_count().saturating_mul(contracted)
        }
        None => inputs.saturating_add(node.ty.element_count()),
    }
}

fn elementwise(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_) | Op::Binary(_) | Op::Compare(_) | Op::Select | Op::Convert(_)
    )
}

/// Evaluates `op` on constant operands with the reference evaluator.
fn evaluate_one(op: &Op, operands: &[Literal]) -> Option<HostTensor> {
    let mut g = Graph::with_capacity(operands.len() + 1);
    let ids: Vec<NodeId> = operands
        .iter()
        .map(|l| g.push(Op::Constant(l.clone()), &[]))
        .collect::<Result<_>>()
        .ok()?;
    let out = g.push(op.clone(), &ids).ok()?;
    g.set_outputs(&[out]).ok()?;
    match crate::reference::evaluate(&g, &[]) {
        Ok(mut v) if v.len() == 1 => v.pop(),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!("constant folding skipped {}: {e}", op.name());
            None
        }
    }
}
