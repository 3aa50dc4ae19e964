//! Algebraic simplification, one table row per rule: the op count after simplify + DCE, and
//! identical results before and after on seeded random inputs (reference evaluator).

use crate::passes_util;

use neuron_pc_compiler::ir::{
    BinaryOp, CompareOp, Graph, Literal, NodeId, Op, TensorType, UnaryOp,
};
use neuron_pc_compiler::passes::{dce, simplify};
use neuron_pc_compiler::{DType, HostTensor};
use passes_util::{assert_same, count, eval, random_inputs};

type Build = fn(&mut Graph, NodeId) -> NodeId;

fn c(g: &mut Graph, v: f64, dims: &[usize]) -> NodeId {
    g.push(Op::Constant(Literal::splat(DType::F32, v, dims)), &[])
        .unwrap()
}
fn bin(g: &mut Graph, b: BinaryOp, x: NodeId, y: NodeId) -> NodeId {
    g.push(Op::Binary(b), &[x, y]).unwrap()
}
fn op(g: &mut Graph, o: Op, args: &[NodeId]) -> NodeId {
    g.push(o, args).unwrap()
}
fn tr(g: &mut Graph, x: NodeId, perm: &[usize]) -> NodeId {
    op(
        g,
        Op::Transpose {
            perm: perm.to_vec(),
        },
        &[x],
    )
}
fn rs(g: &mut Graph, x: NodeId, dims: &[usize]) -> NodeId {
    op(
        g,
        Op::Reshape {
            dims: dims.to_vec(),
        },
        &[x],
    )
}

/// (name, input dtype, pattern builder on an input of dims [2,3,4], op count expected after
/// simplify + DCE, the pattern's own count included; every graph ends in one `tanh` or
/// `convert` so at least that op remains).
const CASES: &[(&str, DType, Build, usize)] = &[
    (
        "x*1",
        DType::F32,
        |g, x| {
            let k = c(g, 1.0, &[2, 3, 4]);
            bin(g, BinaryOp::Mul, x, k)
        },
        1,
    ),
    (
        "1*x",
        DType::F32,
        |g, x| {
            let k = c(g, 1.0, &[2, 3, 4]);
            bin(g, BinaryOp::Mul, k, x)
        },
        1,
    ),
    (
        "x+0",
        DType::F32,
        |g, x| {
            let k = c(g, 0.0, &[2, 3, 4]);
            bin(g, BinaryOp::Add, x, k)
        },
        1,
    ),
    (
        "0+x",
        DType::F32,
        |g, x| {
            let k = c(g, 0.0, &[2, 3, 4]);
            bin(g, BinaryOp::Add, k, x)
        },
        1,
    ),
    (
        "x-0",
        DType::F32,
        |g, x| {
            let k = c(g, 0.0, &[2, 3, 4]);
            bin(g, BinaryOp::Sub, x, k)
        },
        1,
    ),
    (
        "x/1",
        DType::F32,
        |g, x| {
            let k = c(g, 1.0, &[2, 3, 4]);
            bin(g, BinaryOp::Div, x, k)
        },
        1,
    ),
    (
        "x*dense ones",
        DType::F32,
        |g, x| {
            let ones = HostTensor::from_f64s(DType::F32, &[1.0; 24], &[2, 3, 4]).unwrap();
            let k = op(g, Op::Constant(Literal::dense(&ones)), &[]);
            bin(g, BinaryOp::Mul, x, k)
        },
        1,
    ),
    (
        "x*broadcast(1)",
        DType::F32,
        |g, x| {
            let one = c(g, 1.0, &[]);
            let k = op(
                g,
                Op::BroadcastInDim {
                    dims: vec![2, 3, 4],
                    broadcast_dimensions: vec![],
                },
                &[one],
            );
            bin(g, BinaryOp::Mul, x, k)
        },
        1,
    ),
    (
        "neg(neg x)",
        DType::F32,
        |g, x| {
            let n = op(g, Op::Unary(UnaryOp::Neg), &[x]);
            op(g, Op::Unary(UnaryOp::Neg), &[n])
        },
        1,
    ),
    (
        "neg(neg(neg x))",
        DType::F32,
        |g, x| {
            let n = op(g, Op::Unary(UnaryOp::Neg), &[x]);
            let n = op(g, Op::Unary(UnaryOp::Neg), &[n]);
            op(g, Op::Unary(UnaryOp::Neg), &[n])
        },
        2,
    ),
    (
        "transpose twice = identity",
        DType::F32,
        |g, x| {
            let t = tr(g, x, &[2, 0, 1]);
            tr(g, t, &[1, 2, 0])
        },
        1,
    ),
    (
        "transpose twice = one",
        DType::F32,
        |g, x| {
            let t = tr(g, x, &[1, 2, 0]);
            tr(g, t, &[1, 2, 0])
        },
        2,
    ),
    (
        "transpose twice, non-commuting",
        DType::F32,
        |g, x| {
            let t = tr(g, x, &[1, 0, 2]);
            tr(g, t, &[0, 2, 1])
        },
        2,
    ),
    (
        "transpose thrice = identity",
        DType::F32,
        |g, x| {
            let t = tr(g, x, &[1, 2, 0]);
            let t = tr(g, t, &[1, 2, 0]);
            tr(g, t, &[1, 2, 0])
        },
        1,
    ),
    (
        "identity transpose",
        DType::F32,
        |g, x| tr(g, x, &[0, 1, 2]),
        1,
    ),
    (
        "reshape chain",
        DType::F32,
        |g, x| {
            let a = rs(g, x, &[6, 4]);
            let b = rs(g, a, &[24]);
            rs(g, b, &[4, 6])
        },
        2,
    ),
    (
        "reshape round trip",
        DType::F32,
        |g, x| {
            let a = rs(g, x, &[6, 4]);
            rs(g, a, &[2, 3, 4])
        },
        1,
    ),
    (
        "reshape to same",
        DType::F32,
        |g, x| rs(g, x, &[2, 3, 4]),
        1,
    ),
    (
        "broadcast of scalar const",
        DType::F32,
        |g, x| {
            let two = c(g, 2.0, &[]);
            let k = op(
                g,
                Op::BroadcastInDim {
                    dims: vec![2, 3, 4],
                    broadcast_dimensions: vec![],
                },
                &[two],
            );
            bin(g, BinaryOp::Mul, x, k)
        },
        3,
    ), // constant (now a splat of the full shape), mul, tanh
    (
        "identity broadcast",
        DType::F32,
        |g, x| {
            op(
                g,
                Op::BroadcastInDim {
                    dims: vec![2, 3, 4],
                    broadcast_dimensions: vec![0, 1, 2],
                },
                &[x],
            )
        },
        1,
    ),
    (
        "convert to same dtype",
        DType::F32,
        |g, x| op(g, Op::Convert(DType::F32), &[x]),
        1,
    ),
    (
        "bf16 -> f32 -> bf16",
        DType::BF16,
        |g, x| {
            let w = op(g, Op::Convert(DType::F32), &[x]);
            let n = op(g, Op::Convert(DType::BF16), &[w]);
            op(g, Op::Convert(DType::F32), &[n])
        },
        1,
    ), // only the last widening convert remains, then tanh on f32: see `finish`
    (
        "select on constant true",
        DType::F32,
        |g, x| {
            let t = op(g, Op::Constant(Literal::splat(DType::Pred, 1.0, &[])), &[]);
            let n = op(g, Op::Unary(UnaryOp::Neg), &[x]);
            op(g, Op::Select, &[t, x, n])
        },
        1,
    ),
    (
        "full slice",
        DType::F32,
        |g, x| {
            op(
                g,
                Op::Slice {
                    start: vec![0, 0, 0],
                    limit: vec![2, 3, 4],
                    stride: vec![1, 1, 1],
                },
                &[x],
            )
        },
        1,
    ),
    // Not identities: must stay.
    (
        "x*0 stays (NaN, inf)",
        DType::F32,
        |g, x| {
            let k = c(g, 0.0, &[2, 3, 4]);
            bin(g, BinaryOp::Mul, x, k)
        },
        3,
    ),
    (
        "x-x stays",
        DType::F32,
        |g, x| bin(g, BinaryOp::Sub, x, x),
        2,
    ),
    (
        "0-x stays",
        DType::F32,
        |g, x| {
            let k = c(g, 0.0, &[2, 3, 4]);
            bin(g, BinaryOp::Sub, k, x)
        },
        3,
    ),
    (
        "1/x stays",
        DType::F32,
        |g, x| {
            let k = c(g, 1.0, &[2, 3, 4]);
            bin(g, BinaryOp::Div, k, x)
        },
        3,
    ),
    (
        "f32 -> bf16 -> f32 stays (lossy)",
        DType::F32,
        |g, x| {
            let n = op(g, Op::Convert(DType::BF16), &[x]);
            op(g, Op::Convert(DType::F32), &[n])
        },
        3,
    ),
    (
        "x+1 stays",
        DType::F32,
        |g, x| {
            let k = c(g, 1.0, &[2, 3, 4]);
            bin(g, BinaryOp::Add, x, k)
        },
        3,
    ),
];

/// Ends the graph in `tanh`, converting to f32 first when the pattern left another dtype.
fn finish(g: &mut Graph, y: NodeId) -> NodeId {
    let y = if g.node_type(y).dtype != DType::F32 {
        op(g, Op::Convert(DType::F32), &[y])
    } else {
        y
    };
    op(g, Op::Unary(UnaryOp::Tanh), &[y])
}

#[test]
fn each_rule() {
    for &(name, dtype, build, want_ops) in CASES {
        let mut g = Graph::new();
        let x = g.parameter(TensorType::new(dtype, vec![2, 3, 4]));
        let y = build(&mut g, x);
        let out = finish(&mut g, y);
        g.set_outputs(&[out, y]).unwrap();
        let s = dce(&simplify(&g).unwrap()).unwrap();
        // The pattern's value is an output too, so the rewrite must keep it exact, not only
        // the tanh of it.
        let got_ops = s.op_count() - usize::from(dtype != DType::F32);
        assert_eq!(got_ops, want_ops, "{name}: before\n{g}\nafter\n{s}");
        assert_eq!(s.output_types(), g.output_types(), "{name}");
        for seed in 0..3 {
            let inputs = random_inputs(&g, seed);
            assert_same(&eval(&g, &inputs), &eval(&s, &inputs), name);
        }
    }
}

#[test]
fn broadcast_of_scalar_constant_becomes_a_splat() {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![3, 4]));
    let k = c(&mut g, 0.5, &[]);
    let b = op(
        &mut g,
        Op::BroadcastInDim {
            dims: vec![3, 4],
            broadcast_dimensions: vec![],
        },
        &[k],
    );
    let m = bin(&mut g, BinaryOp::Max, x, b);
    g.set_outputs(&[m]).unwrap();
    let s = dce(&simplify(&g).unwrap()).unwrap();
    assert_eq!(count(&s, |o| matches!(o, Op::BroadcastInDim { .. })), 0);
    let lit = s.nodes().iter().find_map(|n| match &n.op {
        Op::Constant(l) => Some(l.clone()),
        _ => None,
    });
    assert_eq!(lit, Some(Literal::splat(DType::F32, 0.5, &[3, 4])));
    let inputs = random_inputs(&g, 3);
    assert_same(&eval(&g, &inputs), &eval(&s, &inputs), "splat");
}

#[test]
fn integer_identities_and_compare_untouched() {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::I32, vec![5]));
    let one = op(
        &mut g,
        Op::Constant(Literal::splat(DType::I32, 1.0, &[5])),
        &[],
    );
    let zero = op(
        &mut g,
        Op::Constant(Literal::splat(DType::I32, 0.0, &[5])),
        &[],
    );
    let m = bin(&mut g, BinaryOp::Mul, x, one);
    let d = bin(&mut g, BinaryOp::Div, m, one);
    let a = bin(&mut g, BinaryOp::Add, zero, d);
    let e = op(&mut g, Op::Compare(CompareOp::Eq), &[a, zero]);
    g.set_outputs(&[a, e]).unwrap();
    let s = dce(&simplify(&g).unwrap()).unwrap();
    assert_eq!(s.op_count(), 2, "zero constant and the compare\n{s}");
    assert_eq!(s.outputs()[0], s.parameters()[0]);
    for seed in 0..3 {
        let inputs = random_inputs(&g, seed);
        assert_same(&eval(&g, &inputs), &eval(&s, &inputs), "ints");
    }
}
