//! Shape and dtype inference on valid input: the result type of every op, table-driven.

use neuron_pc_compiler::ir::{
    infer, BinaryOp, CompareOp, Literal, Op, ReduceOp, TensorType, UnaryOp,
};
use neuron_pc_compiler::DType::{self, *};

fn t(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, dims.to_vec())
}

fn dot(lb: &[usize], rb: &[usize], lc: &[usize], rc: &[usize]) -> Op {
    Op::DotGeneral {
        lhs_batch: lb.to_vec(),
        rhs_batch: rb.to_vec(),
        lhs_contract: lc.to_vec(),
        rhs_contract: rc.to_vec(),
    }
}

#[test]
fn result_types() {
    let g = vec![vec![0, 1], vec![2, 3]];
    let cases: Vec<(Op, Vec<TensorType>, TensorType)> = vec![
        (
            Op::Constant(Literal::splat(BF16, 1.0, &[2, 3])),
            vec![],
            t(BF16, &[2, 3]),
        ),
        (Op::Unary(UnaryOp::Sign), vec![t(I64, &[4])], t(I64, &[4])),
        (Op::Unary(UnaryOp::Not), vec![t(Pred, &[4])], t(Pred, &[4])),
        (
            Op::Binary(BinaryOp::Pow),
            vec![t(F16, &[2]), t(F16, &[2])],
            t(F16, &[2]),
        ),
        (
            Op::Binary(BinaryOp::Xor),
            vec![t(U8, &[]), t(U8, &[])],
            t(U8, &[]),
        ),
        (
            Op::Compare(CompareOp::Ge),
            vec![t(U32, &[3, 1]), t(U32, &[3, 1])],
            t(Pred, &[3, 1]),
        ),
        (
            Op::Select,
            vec![t(Pred, &[]), t(F64, &[2]), t(F64, &[2])],
            t(F64, &[2]),
        ),
        (Op::Convert(BF16), vec![t(I32, &[2, 2])], t(BF16, &[2, 2])),
        (
            Op::Iota {
                dims: vec![3, 4],
                dim: 1,
                dtype: U32,
            },
            vec![],
            t(U32, &[3, 4]),
        ),
        (
            Op::BroadcastInDim {
                dims: vec![2, 3, 4],
                broadcast_dimensions: vec![2, 0],
            },
            vec![t(F32, &[1, 2])],
            t(F32, &[2, 3, 4]),
        ),
        (
            Op::Reshape { dims: vec![] },
            vec![t(F32, &[1, 1, 1])],
            t(F32, &[]),
        ),
        (
            Op::Transpose {
                perm: vec![2, 0, 1],
            },
            vec![t(F32, &[2, 3, 4])],
            t(F32, &[4, 2, 3]),
        ),
        (
            Op::Slice {
                start: vec![1, 0],
                limit: vec![8, 3],
                stride: vec![3, 1],
            },
            vec![t(F32, &[9, 3])],
            t(F32, &[3, 3]),
        ),
        (
            Op::DynamicSlice { sizes: vec![1, 2] },
            vec![t(F32, &[3, 4]), t(I64, &[]), t(I64, &[])],
            t(F32, &[1, 2]),
        ),
        (
            Op::DynamicUpdateSlice,
            vec![t(F32, &[3, 4]), t(F32, &[1, 4]), t(U32, &[]), t(U32, &[])],
            t(F32, &[3, 4]),
        ),
        (
            Op::Concatenate { dim: 1 },
            vec![t(I32, &[2, 1]), t(I32, &[2, 5]), t(I32, &[2, 0])],
            t(I32, &[2, 6]),
        ),
        (
            Op::Pad {
                low: vec![1, -1],
                high: vec![0, 2],
                interior: vec![2, 0],
            },
            vec![t(F32, &[3, 4]), t(F32, &[])],
            t(F32, &[8, 5]),
        ),
        (
            Op::Reduce(ReduceOp::Prod, vec![0, 2]),
            vec![t(I32, &[2, 3, 4])],
            t(I32, &[3]),
        ),
        (
            Op::Reduce(ReduceOp::Sum, vec![]),
            vec![t(F32, &[2])],
            t(F32, &[2]),
        ),
        (
            Op::ArgMin {
                dim: 0,
                index_dtype: I64,
            },
            vec![t(F32, &[5, 6])],
            t(I64, &[6]),
        ),
        (
            dot(&[], &[], &[1], &[0]),
            vec![t(F32, &[2, 3]), t(F32, &[3, 4])],
            t(F32, &[2, 4]),
        ),
        (
            dot(&[], &[], &[2], &[1]),
            vec![t(F32, &[7, 2, 3]), t(F32, &[4, 3])],
            t(F32, &[7, 2, 4]),
        ),
        (
            dot(&[1], &[0], &[2], &[1]),
            vec![t(F32, &[2, 5, 3]), t(F32, &[5, 3, 4])],
            t(F32, &[5, 2, 4]),
        ),
        (
            dot(&[], &[], &[], &[]),
            vec![t(I32, &[2]), t(I32, &[3])],
            t(I32, &[2, 3]),
        ),
        (
            Op::Gather,
            vec![t(F32, &[100, 16]), t(I32, &[8, 32])],
            t(F32, &[8, 32, 16]),
        ),
        (Op::Gather, vec![t(F32, &[100]), t(U32, &[])], t(F32, &[])),
        (Op::StopGradient, vec![t(BF16, &[3, 2])], t(BF16, &[3, 2])),
        (Op::After, vec![t(BF16, &[3, 2])], t(BF16, &[3, 2])),
        (
            Op::After,
            vec![t(I32, &[4]), t(F32, &[3, 2]), t(Pred, &[])],
            t(I32, &[4]),
        ),
        (
            Op::ScatterAdd,
            vec![t(F32, &[100, 16]), t(I64, &[8]), t(F32, &[8, 16])],
            t(F32, &[100, 16]),
        ),
        (
            Op::RandomBits { dims: vec![3, 5] },
            vec![t(U32, &[2])],
            t(U32, &[3, 5]),
        ),
        (
            Op::AllReduce {
                op: ReduceOp::Max,
                replica_groups: g.clone(),
            },
            vec![t(F32, &[3])],
            t(F32, &[3]),
        ),
        (
            Op::AllGather {
                dim: 0,
                replica_groups: g.clone(),
            },
            vec![t(F32, &[3, 2])],
            t(F32, &[6, 2]),
        ),
        (
            Op::ReduceScatter {
                op: ReduceOp::Sum,
                dim: 1,
                replica_groups: g,
            },
            vec![t(F32, &[3, 4])],
            t(F32, &[3, 2]),
        ),
    ];
    for (op, operands, want) in cases {
        let refs: Vec<&TensorType> = operands.iter().collect();
        let got = infer(&op, &refs).unwrap_or_else(|e| panic!("{op}: {e}"));
        assert_eq!(got, want, "{op}");
    }
}

/// Op names used in messages are distinct, so an error always says which op failed.
#[test]
fn op_names_are_distinct() {
    let mut names: Vec<&str> = UnaryOp::ALL.iter().map(|u| u.name()).collect();
    names.extend(BinaryOp::ALL.iter().map(|b| b.name()));
    names.extend(CompareOp::ALL.iter().map(|c| c.name()));
    names.extend(ReduceOp::ALL.iter().map(|r| r.name()));
    let n = names.len();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), n);
}
