//! DCE and CSE: results identical before and after (reference evaluator, seeded random
//! inputs), node counts drop by exactly what was dead or duplicated, the signature stays.

use crate::passes_util;

use neuron_pc_compiler::ir::{BinaryOp, Graph, Literal, NodeId, Op, ReduceOp, TensorType, UnaryOp};
use neuron_pc_compiler::passes::{cse, dce};
use neuron_pc_compiler::DType;
use passes_util::{assert_same, eval, random_inputs};

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims.to_vec())
}

fn bin(g: &mut Graph, b: BinaryOp, x: NodeId, y: NodeId) -> NodeId {
    g.push(Op::Binary(b), &[x, y]).unwrap()
}

fn un(g: &mut Graph, u: UnaryOp, x: NodeId) -> NodeId {
    g.push(Op::Unary(u), &[x]).unwrap()
}

#[test]
fn dce_removes_exactly_the_unreachable_nodes() {
    let mut g = Graph::new();
    let a = g.parameter(f32t(&[3, 4]));
    let unused = g.parameter(f32t(&[2])); // unused, but part of the signature
    let b = g.parameter(f32t(&[3, 4]));
    let s = bin(&mut g, BinaryOp::Add, a, b);
    // Dead: a chain hanging off a live node and a chain off the unused parameter.
    let d1 = un(&mut g, UnaryOp::Exp, s);
    let _d2 = bin(&mut g, BinaryOp::Mul, d1, a);
    let _d3 = un(&mut g, UnaryOp::Neg, unused);
    let t = un(&mut g, UnaryOp::Tanh, s);
    let r = g.push(Op::Reduce(ReduceOp::Sum, vec![1]), &[t]).unwrap();
    g.set_outputs(&[r, t, r, a]).unwrap();

    let out = dce(&g).unwrap();
    assert_eq!(g.op_count(), 6);
    assert_eq!(out.op_count(), 3, "add, tanh, reduce remain\n{out}");
    assert_eq!(out.parameter_types(), g.parameter_types());
    assert_eq!(out.output_types(), g.output_types());
    assert_eq!(out.outputs().len(), 4);
    assert_eq!(
        out.outputs()[0],
        out.outputs()[2],
        "a repeated output stays one node"
    );
    for seed in 0..3 {
        let inputs = random_inputs(&g, seed);
        assert_same(&eval(&g, &inputs), &eval(&out, &inputs), "dce");
    }
    // Idempotent: nothing left to remove.
    assert_eq!(dce(&out).unwrap(), out);
}

#[test]
fn cse_merges_duplicate_subtrees_and_constants() {
    let mut g = Graph::new();
    let x = g.parameter(f32t(&[4, 5]));
    let y = g.parameter(f32t(&[4, 5]));
    // The same subtree `tanh(x * y) + 2` built twice, each time with its own constant.
    let tree = |g: &mut Graph| {
        let m = bin(g, BinaryOp::Mul, x, y);
        let t = un(g, UnaryOp::Tanh, m);
        let c = g
            .push(Op::Constant(Literal::splat(DType::F32, 2.0, &[4, 5])), &[])
            .unwrap();
        bin(g, BinaryOp::Add, t, c)
    };
    let first = tree(&mut g);
    let second = tree(&mut g);
    // Same ops on swapped operands are different computations and must stay apart.
    let swapped = bin(&mut g, BinaryOp::Sub, y, x);
    let straight = bin(&mut g, BinaryOp::Sub, x, y);
    // A constant with the same value but another shape is not a duplicate either.
    let other = g
        .push(Op::Constant(Literal::splat(DType::F32, 2.0, &[5])), &[])
        .unwrap();
    let prod = bin(&mut g, BinaryOp::Mul, first, second);
    g.set_outputs(&[prod, first, second, swapped, straight, other])
        .unwrap();

    let out = cse(&g).unwrap();
    assert_eq!(g.op_count(), 12);
    assert_eq!(
        out.op_count(),
        8,
        "one copy of the 4-node subtree is gone\n{out}"
    );
    assert_eq!(
        out.outputs()[1],
        out.outputs()[2],
        "both trees are now one node"
    );
    assert_ne!(out.outputs()[3], out.outputs()[4]);
    for seed in 0..3 {
        let inputs = random_inputs(&g, seed);
        assert_same(&eval(&g, &inputs), &eval(&out, &inputs), "cse");
    }
    assert_eq!(cse(&out).unwrap(), out, "a second run finds nothing");
}

#[test]
fn cse_never_merges_parameters() {
    let mut g = Graph::new();
    let a = g.parameter(f32t(&[2]));
    let b = g.parameter(f32t(&[2]));
    let ea = un(&mut g, UnaryOp::Exp, a);
    let eb = un(&mut g, UnaryOp::Exp, b);
    g.set_outputs(&[ea, eb]).unwrap();
    let out = cse(&g).unwrap();
    assert_eq!(out.op_count(), 2);
    assert_eq!(out.parameters().len(), 2);
    let inputs = random_inputs(&g, 7);
    let r = eval(&out, &inputs);
    assert_ne!(r[0], r[1], "the two inputs differ, so must the outputs");
    assert_same(&eval(&g, &inputs), &r, "cse params");
}

#[test]
fn dce_and_cse_on_the_step_graph() {
    use passes_util::step::{build_step, StepConfig};
    let c = StepConfig::TINY;
    let g = build_step(c).unwrap();
    let inputs = passes_util::step_inputs(c, 11, &g);
    let want = eval(&g, &inputs);
    let after_dce = dce(&g).unwrap();
    assert_eq!(
        after_dce.op_count(),
        g.op_count() - 1,
        "the dropped abs(loss)"
    );
    let after_cse = cse(&after_dce).unwrap();
    assert!(
        after_cse.op_count() + 40 < after_dce.op_count(),
        "repeated constants and recomputed subexpressions merge: {} -> {}",
        after_dce.op_count(),
        after_cse.op_count()
    );
    assert_same(&want, &eval(&after_dce, &inputs), "step dce");
    assert_same(&want, &eval(&after_cse, &inputs), "step cse");
}
