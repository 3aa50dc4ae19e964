//! On the cpu target, a `dot_general` or convolution of bf16 (or f16) operands computed as a
//! float32 one of the same values, rounded once to the operands' type.
//!
//! XLA's cpu backend has no half-precision kernels for a product whose operands are not plain
//! matrices (a projection of `[batch, seq, hidden]` activations): it emits a generic loop nest,
//! which made a bf16 Llama step about 17x slower than the float32 one on this machine. The
//! product of two bf16 (or f16) values is exact in float32, the sums are float32 (what a
//! half-precision kernel that accumulates in float32 does: PyTorch's, a GPU's tensor cores),
//! and the result is rounded once: the numbers of such a kernel, up to the order of the sums.
//! For that rounding to stay, the cpu target compiles with `xla_allow_excess_precision` off
//! ([`crate::optlevel::backend_options`]): with it on, XLA drops a bf16 round trip between two
//! float32 ops, and the products' results were not rounded at all. Accelerators keep their
//! half-precision products; this pass runs for `cpu` alone.

use crate::dtype::DType;
use crate::error::Result;
use crate::ir::{Graph, Node, NodeId, Op};

use super::rewrite::{rebuild, Builder, NodeRewrite};

/// `graph` with each half-precision product computed in float32 and rounded once.
pub fn half_products_in_f32(graph: &Graph) -> Result<Graph> {
    let any = graph.nodes().iter().any(|n| {
        is_product(&n.op)
            && n.operands
                .first()
                .is_some_and(|o| is_half(graph.node_type(*o).dtype))
    });
    if !any {
        return Ok(graph.clone());
    }
    rebuild(graph, None, false, &mut Widen)
}

fn is_product(op: &Op) -> bool {
    matches!(op, Op::DotGeneral { .. } | Op::Convolution { .. })
}

fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
}

struct Widen;

impl NodeRewrite for Widen {
    fn rewrite(
        &mut self,
        b: &mut Builder,
        _old: NodeId,
        node: &Node,
        operands: &[NodeId],
    ) -> Result<NodeId> {
        let dtype = match operands.first() {
            Some(&o) if is_product(&node.op) => b.ty(o)?.dtype,
            _ => return b.push(node.op.clone(), operands),
        };
        let mut same = true;
        for &o in operands {
            same &= b.ty(o)?.dtype == dtype;
        }
        if !is_half(dtype) || !same {
            return b.push(node.op.clone(), operands);
        }
        let mut wide = Vec::with_capacity(operands.len());
        for &o in operands {
            wide.push(b.push(Op::Convert(DType::F32), &[o])?);
        }
        let r = b.push(node.op.clone(), &wide)?;
        b.push(Op::Convert(dtype), &[r])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{TensorType, UnaryOp};

    fn matmul(dtype: DType) -> Graph {
        let mut g = Graph::new();
        let a = g.parameter(TensorType::new(dtype, vec![2, 3]));
        let w = g.parameter(TensorType::new(dtype, vec![3, 4]));
        let dot = Op::DotGeneral {
            lhs_batch: vec![],
            rhs_batch: vec![],
            lhs_contract: vec![1],
            rhs_contract: vec![0],
        };
        let d = g.push(dot, &[a, w]).unwrap();
        let t = g.push(Op::Unary(UnaryOp::Tanh), &[d]).unwrap();
        g.set_outputs(&[t]).unwrap();
        g
    }

    #[test]
    fn a_bf16_product_is_widened_and_rounded_once_and_f32_is_left_alone() {
        let g = half_products_in_f32(&matmul(DType::BF16)).unwrap();
        let ops: Vec<(&str, DType)> = g
            .nodes()
            .iter()
            .enumerate()
            .filter(|(_, n)| !matches!(n.op, Op::Parameter { .. }))
            .map(|(i, n)| (n.op.name(), g.node_type(NodeId(i)).dtype))
            .collect();
        // two converts up, the product in f32, one convert down, the tanh in bf16
        assert_eq!(
            ops,
            [
                ("convert", DType::F32),
                ("convert", DType::F32),
                ("dot_general", DType::F32),
                ("convert", DType::BF16),
                ("tanh", DType::BF16)
            ]
        );
        let f32 = matmul(DType::F32);
        assert_eq!(half_products_in_f32(&f32).unwrap(), f32);
    }
}
