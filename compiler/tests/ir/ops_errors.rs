//! Bad input gives typed errors naming the op and the shapes, never a panic: wrong shapes and
//! dtypes at construction, invalid raw graphs, unsupported dtypes, programs the plugin rejects,
//! and bad arguments to the reference evaluator.

use crate::ops_common;

use neuron_pc_compiler::ir::{
    infer, BinaryOp, CompareOp, Graph, Literal, Node, NodeId, Op, ReduceOp, TensorType, UnaryOp,
};
use neuron_pc_compiler::pjrt::CompileOptions;
use neuron_pc_compiler::{lower, reference, DType, Error, HostTensor};
use ops_common::ty;

fn f32s(dims: &[usize]) -> TensorType {
    ty(DType::F32, dims)
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
fn shape_errors_name_the_op_the_operands_and_the_expectation() {
    let groups = vec![vec![0, 1], vec![2]];
    let cases: Vec<(Op, Vec<TensorType>, &str, &str, &str)> = vec![
        (
            Op::Binary(BinaryOp::Add),
            vec![f32s(&[2, 3]), f32s(&[4, 3])],
            "add",
            "f32[2,3], f32[4,3]",
            "same shape",
        ),
        (
            Op::Binary(BinaryOp::Mul),
            vec![f32s(&[2]), ty(DType::I32, &[2])],
            "mul",
            "f32[2], i32[2]",
            "same shape and dtype",
        ),
        (
            Op::Compare(CompareOp::Lt),
            vec![f32s(&[2])],
            "lt",
            "f32[2]",
            "expected 2 operands",
        ),
        (
            dot(&[], &[], &[1], &[0]),
            vec![f32s(&[2, 3]), f32s(&[4, 5])],
            "dot_general",
            "f32[2,3], f32[4,5]",
            "must equal rhs dimension 0",
        ),
        (
            dot(&[0], &[], &[1], &[0]),
            vec![f32s(&[2, 3]), f32s(&[3, 5])],
            "dot_general",
            "f32[2,3], f32[3,5]",
            "as many batch",
        ),
        (
            Op::Reshape { dims: vec![5] },
            vec![f32s(&[2, 3])],
            "reshape",
            "f32[2,3]",
            "cannot reshape 6 elements",
        ),
        (
            Op::Transpose { perm: vec![0, 0] },
            vec![f32s(&[2, 3])],
            "transpose",
            "f32[2,3]",
            "not a permutation",
        ),
        (
            Op::Slice {
                start: vec![0],
                limit: vec![9],
                stride: vec![1],
            },
            vec![f32s(&[4])],
            "slice",
            "f32[4]",
            "start <= limit <= 4",
        ),
        (
            Op::BroadcastInDim {
                dims: vec![2, 4],
                broadcast_dimensions: vec![1],
            },
            vec![f32s(&[3])],
            "broadcast_in_dim",
            "f32[3]",
            "cannot broadcast",
        ),
        (
            Op::Concatenate { dim: 0 },
            vec![f32s(&[2, 3]), f32s(&[2, 4])],
            "concatenate",
            "f32[2,3], f32[2,4]",
            "every dimension but 0",
        ),
        (
            Op::Select,
            vec![f32s(&[2]), f32s(&[2]), f32s(&[2])],
            "select",
            "f32[2], f32[2], f32[2]",
            "must be pred",
        ),
        (
            Op::Gather,
            vec![f32s(&[5, 2]), f32s(&[3])],
            "gather",
            "f32[5,2], f32[3]",
            "indices must be integers",
        ),
        (
            Op::ScatterAdd,
            vec![f32s(&[5, 2]), ty(DType::I32, &[3]), f32s(&[3, 3])],
            "scatter_add",
            "f32[5,2], i32[3], f32[3,3]",
            "updates must be f32[3,2]",
        ),
        (
            Op::RandomBits { dims: vec![4] },
            vec![ty(DType::U32, &[3])],
            "random_bits",
            "u32[3]",
            "key must be u32[2]",
        ),
        (
            Op::AllGather {
                dim: 0,
                replica_groups: groups,
            },
            vec![f32s(&[2])],
            "all_gather",
            "f32[2]",
            "groups of one size",
        ),
        (
            Op::Reduce(ReduceOp::Sum, vec![2]),
            vec![f32s(&[2, 3])],
            "reduce_sum",
            "f32[2,3]",
            "below rank 2",
        ),
        (
            Op::Pad {
                low: vec![-3],
                high: vec![0],
                interior: vec![0],
            },
            vec![f32s(&[2]), f32s(&[])],
            "pad",
            "f32[2], f32[]",
            "negative size",
        ),
        (
            Op::DynamicSlice { sizes: vec![1, 1] },
            vec![f32s(&[2, 2]), ty(DType::I32, &[])],
            "dynamic_slice",
            "f32[2,2], i32[]",
            "2 scalar integer start indices",
        ),
        (
            Op::ArgMax {
                dim: 0,
                index_dtype: DType::F32,
            },
            vec![f32s(&[3])],
            "argmax",
            "f32[3]",
            "index dtype must be an integer",
        ),
        (
            Op::Iota {
                dims: vec![2],
                dim: 1,
                dtype: DType::I32,
            },
            vec![],
            "iota",
            "",
            "out of range",
        ),
        (
            Op::ArgMin {
                dim: 0,
                index_dtype: DType::U8,
            },
            vec![f32s(&[300])],
            "argmin",
            "f32[300]",
            "u8 cannot index 300",
        ),
    ];
    for (op, operands, name, shapes, expected) in cases {
        let refs: Vec<&TensorType> = operands.iter().collect();
        match infer(&op, &refs) {
            Err(Error::Shape {
                op: o,
                operands: s,
                message,
            }) => {
                assert_eq!(o, name);
                assert_eq!(s, shapes, "{name}");
                assert!(
                    message.contains(expected),
                    "{name}: {message:?} should mention {expected:?}"
                );
            }
            other => panic!("{name}: expected a shape error, got {other:?}"),
        }
        // The same through the graph builder, with the whole message in Display.
        let mut g = Graph::new();
        let ids: Vec<NodeId> = operands.iter().map(|t| g.parameter(t.clone())).collect();
        let err = g.push(op, &ids).unwrap_err().to_string();
        assert!(
            err.starts_with(name) && err.contains(shapes) && err.contains(expected),
            "{err}"
        );
    }
}

#[test]
fn unsupported_dtypes_are_typed_errors() {
    let cases = [
        (
            Op::Unary(UnaryOp::Exp),
            vec![ty(DType::I32, &[2])],
            "exp",
            DType::I32,
        ),
        (Op::Unary(UnaryOp::Not), vec![f32s(&[2])], "not", DType::F32),
        (
            Op::Unary(UnaryOp::Abs),
            vec![ty(DType::U8, &[2])],
            "abs",
            DType::U8,
        ),
        (
            Op::Binary(BinaryOp::And),
            vec![f32s(&[2]), f32s(&[2])],
            "and",
            DType::F32,
        ),
        (
            Op::Binary(BinaryOp::Add),
            vec![ty(DType::Pred, &[2]), ty(DType::Pred, &[2])],
            "add",
            DType::Pred,
        ),
        (
            Op::Reduce(ReduceOp::Sum, vec![0]),
            vec![ty(DType::Pred, &[2])],
            "reduce_sum",
            DType::Pred,
        ),
        (
            Op::Iota {
                dims: vec![3],
                dim: 0,
                dtype: DType::Pred,
            },
            vec![],
            "iota",
            DType::Pred,
        ),
        (
            dot(&[], &[], &[0], &[0]),
            vec![ty(DType::Pred, &[2]); 2],
            "dot_general",
            DType::Pred,
        ),
    ];
    for (op, operands, name, dtype) in cases {
        let refs: Vec<&TensorType> = operands.iter().collect();
        match infer(&op, &refs) {
            Err(Error::UnsupportedDType { op, dtype: d }) => assert_eq!((op, d), (name, dtype)),
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// Graphs assembled from raw nodes (as from a file) are validated before lowering.
#[test]
fn invalid_raw_graphs_are_refused() {
    let p = |index, t: TensorType| Node {
        op: Op::Parameter { index },
        operands: vec![],
        ty: t,
    };
    let exp_i32 = Node {
        op: Op::Unary(UnaryOp::Exp),
        operands: vec![NodeId(0)],
        ty: ty(DType::I32, &[2]),
    };
    let r = Graph::from_nodes(vec![p(0, ty(DType::I32, &[2])), exp_i32], vec![NodeId(1)]);
    assert!(
        matches!(
            r,
            Err(Error::UnsupportedDType {
                op: "exp",
                dtype: DType::I32
            })
        ),
        "{r:?}"
    );

    let wrong_type = Node {
        op: Op::Unary(UnaryOp::Exp),
        operands: vec![NodeId(0)],
        ty: f32s(&[3]),
    };
    let r = Graph::from_nodes(vec![p(0, f32s(&[2])), wrong_type], vec![NodeId(1)]);
    assert!(
        matches!(&r, Err(Error::InvalidGraph { message }) if message.contains("f32[3]")),
        "{r:?}"
    );

    let self_ref = Node {
        op: Op::Unary(UnaryOp::Exp),
        operands: vec![NodeId(0)],
        ty: f32s(&[2]),
    };
    assert!(matches!(
        Graph::from_nodes(vec![self_ref], vec![]),
        Err(Error::InvalidGraph { .. })
    ));

    let bad_output = Graph::from_nodes(vec![p(0, f32s(&[2]))], vec![NodeId(4)]);
    assert!(matches!(bad_output, Err(Error::InvalidGraph { .. })));

    let dup = Graph::from_nodes(vec![p(0, f32s(&[2])), p(0, f32s(&[2]))], vec![]);
    assert!(matches!(dup, Err(Error::InvalidGraph { .. })));

    let short_constant = Literal::splat_bytes(DType::F32, &[0, 0, 0], &[]);
    assert!(short_constant.is_err());
}

#[test]
fn a_program_the_plugin_rejects_is_a_pjrt_error() {
    let mut g = Graph::new();
    let x = g.parameter(f32s(&[2, 2]));
    let y = g.push(Op::Unary(UnaryOp::Tanh), &[x]).unwrap();
    g.set_outputs(&[y]).unwrap();
    let text = lower::to_stablehlo(&g)
        .unwrap()
        .replace("stablehlo.tanh", "stablehlo.no_such_op");
    match ops_common::client().compile(&text, &CompileOptions::default()) {
        Err(Error::Pjrt {
            api_fn, message, ..
        }) => {
            assert_eq!(api_fn, "PJRT_Client_Compile");
            assert!(message.contains("no_such_op"), "{message}");
        }
        Err(other) => panic!("expected a PJRT error, got {other}"),
        Ok(_) => panic!("the plugin accepted an unknown op"),
    }
    // A program cut inside a string literal (the op's name): the parser's complaint comes back
    // as a typed error at the end of the text. The parser reads the byte after the text to find
    // its end, so it must be a NUL: here the text is a slice whose next byte is the rest of the
    // name, which a plugin given no NUL reads on into (lammps-jax-pjrt-cpu crashed; the others
    // reported an error further on).
    let text = lower::to_stablehlo(&g).unwrap();
    let at = text
        .find("\"stablehlo.tanh\"")
        .expect("the op in generic form")
        + "\"s".len();
    let cut = &text[..at];
    let line = cut.lines().count();
    let column = cut.lines().last().map_or(0, str::len) + 1;
    match ops_common::client().compile(cut, &CompileOptions::default()) {
        Err(Error::Pjrt {
            api_fn, message, ..
        }) => {
            assert_eq!(api_fn, "PJRT_Client_Compile");
            let at_end = format!(":{line}:{column}: error: expected '\"' in string literal");
            assert!(message.contains(&at_end), "want {at_end:?} in {message}");
        }
        Err(other) => panic!("expected a PJRT error, got {other}"),
        Ok(_) => panic!("the plugin accepted half a program"),
    }
}

#[test]
fn reference_evaluator_checks_its_inputs() {
    let mut g = Graph::new();
    let x = g.parameter(f32s(&[2]));
    let y = g.push(Op::Unary(UnaryOp::Neg), &[x]).unwrap();
    g.set_outputs(&[y]).unwrap();
    assert!(matches!(
        reference::evaluate(&g, &[]),
        Err(Error::Argument { .. })
    ));
    let wrong = HostTensor::from_slice(&[1i32, 2], &[2]).unwrap();
    let err = reference::evaluate(&g, &[wrong]).unwrap_err().to_string();
    assert!(err.contains("f32[2]"), "{err}");

    let mut g = Graph::new();
    let x = g.parameter(f32s(&[2]));
    let s = g
        .push(
            Op::AllReduce {
                op: ReduceOp::Sum,
                replica_groups: vec![vec![0, 1]],
            },
            &[x],
        )
        .unwrap();
    g.set_outputs(&[s]).unwrap();
    let input = HostTensor::from_slice(&[1f32, 2.0], &[2]).unwrap();
    assert!(matches!(
        reference::evaluate(&g, &[input]),
        Err(Error::Evaluate {
            op: "all_reduce",
            ..
        })
    ));
}

/// Attributes from untrusted graphs can be absurd; they give errors, not overflow panics.
#[test]
fn absurd_sizes_are_errors_not_panics() {
    let big = usize::MAX;
    let cases: Vec<(Op, Vec<TensorType>)> = vec![
        (Op::Reshape { dims: vec![big, 2] }, vec![f32s(&[4])]),
        (
            Op::Iota {
                dims: vec![big, big],
                dim: 0,
                dtype: DType::I32,
            },
            vec![],
        ),
        (
            Op::Iota {
                dims: vec![big / 2],
                dim: 0,
                dtype: DType::I64,
            },
            vec![],
        ),
        (
            Op::BroadcastInDim {
                dims: vec![big, 3],
                broadcast_dimensions: vec![],
            },
            vec![f32s(&[])],
        ),
        (
            Op::Constant(Literal::splat(DType::F32, 1.0, &[big, big])),
            vec![],
        ),
        (
            Op::Pad {
                low: vec![i64::MAX],
                high: vec![i64::MAX],
                interior: vec![big],
            },
            vec![f32s(&[3]), f32s(&[])],
        ),
        (
            Op::Concatenate { dim: 0 },
            vec![f32s(&[big / 2 + 1]), f32s(&[big / 2 + 1])],
        ),
        (
            Op::AllGather {
                dim: 0,
                replica_groups: vec![vec![0, 1, 2]],
            },
            vec![f32s(&[big / 2])],
        ),
        (
            Op::RandomBits {
                dims: vec![big, big],
            },
            vec![ty(DType::U32, &[2])],
        ),
        (Op::Gather, vec![f32s(&[0, 4]), ty(DType::I32, &[3])]),
    ];
    for (op, operands) in cases {
        let refs: Vec<&TensorType> = operands.iter().collect();
        assert!(
            infer(&op, &refs).is_err(),
            "{op} on {operands:?} should be refused"
        );
    }
    let p = Node {
        op: Op::Parameter { index: 0 },
        operands: vec![],
        ty: f32s(&[big, 4]),
    };
    let r = Graph::from_nodes(vec![p], vec![NodeId(0)]);
    assert!(matches!(r, Err(Error::InvalidGraph { .. })), "{r:?}");
    let mut g = Graph::new();
    let x = g.parameter(f32s(&[big, 4]));
    g.set_outputs(&[x]).unwrap();
    assert!(lower::to_stablehlo(&g).is_err());
    assert!(reference::evaluate(&g, &[HostTensor::zeros(DType::F32, &[1])]).is_err());
}
