//! Constant folding: constant subexpressions become constants with the same values, and the
//! size rules keep large or expanding constants out of the program.

use crate::passes_util;

use neuron_pc_compiler::ir::{BinaryOp, Graph, Literal, NodeId, Op, ReduceOp, TensorType, UnaryOp};
use neuron_pc_compiler::passes::{constant_fold, dce};
use neuron_pc_compiler::{DType, HostTensor};
use passes_util::{assert_same, count, eval, random_inputs};

fn splat(g: &mut Graph, v: f64, dims: &[usize]) -> NodeId {
    g.push(Op::Constant(Literal::splat(DType::F32, v, dims)), &[])
        .unwrap()
}
fn dense(g: &mut Graph, v: &[f32], dims: &[usize]) -> NodeId {
    let t = HostTensor::from_slice(v, dims).unwrap();
    g.push(Op::Constant(Literal::dense(&t)), &[]).unwrap()
}
fn constants(g: &Graph) -> Vec<Literal> {
    g.nodes()
        .iter()
        .filter_map(|n| match &n.op {
            Op::Constant(l) => Some(l.clone()),
            _ => None,
        })
        .collect()
}
fn is_const(o: &Op) -> bool {
    matches!(o, Op::Constant(_))
}

#[test]
fn splat_arithmetic_folds_to_one_splat() {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![4, 3]));
    let a = splat(&mut g, 2.0, &[4, 3]);
    let b = splat(&mut g, 3.0, &[4, 3]);
    let s = g.push(Op::Binary(BinaryOp::Add), &[a, b]).unwrap();
    let e = g.push(Op::Unary(UnaryOp::Sqrt), &[s]).unwrap();
    let m = g.push(Op::Binary(BinaryOp::Mul), &[x, e]).unwrap();
    g.set_outputs(&[m, e]).unwrap();
    let f = dce(&constant_fold(&g, 0).unwrap()).unwrap();
    assert_eq!(f.op_count(), 2, "one constant and the multiply\n{f}");
    assert_eq!(
        constants(&f),
        vec![Literal::splat(DType::F32, (5.0f32).sqrt() as f64, &[4, 3])]
    );
    for seed in 0..3 {
        let inputs = random_inputs(&g, seed);
        assert_same(&eval(&g, &inputs), &eval(&f, &inputs), "splat fold");
    }
}

#[test]
fn huge_splats_fold_without_materializing() {
    // 2^28 elements: materializing this would need a gigabyte; folding works on one element.
    let dims = [1 << 14, 1 << 14];
    let mut g = Graph::new();
    let a = splat(&mut g, 1.5, &dims);
    let b = splat(&mut g, 2.5, &dims);
    let s = g.push(Op::Binary(BinaryOp::Mul), &[a, b]).unwrap();
    let c = g.push(Op::Convert(DType::BF16), &[s]).unwrap();
    g.set_outputs(&[c]).unwrap();
    let f = dce(&constant_fold(&g, 16).unwrap()).unwrap();
    assert_eq!(
        constants(&f),
        vec![Literal::splat(DType::BF16, 3.75, &dims)]
    );
    assert_eq!(f.op_count(), 1);
}

#[test]
fn dense_folds_within_the_limit_and_never_expand() {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![3, 3]));
    let m = dense(
        &mut g,
        &[1.0, -2.0, 0.5, 3.0, 0.0, 1.0, -1.0, 2.0, 4.0],
        &[3, 3],
    );
    let e = g.push(Op::Unary(UnaryOp::Exp), &[m]).unwrap(); // 9 elements
    let r = g.push(Op::Reduce(ReduceOp::Sum, vec![1]), &[e]).unwrap(); // 3 elements
    let d = g
        .push(
            Op::DotGeneral {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![1],
                rhs_contract: vec![0],
            },
            &[m, e],
        )
        .unwrap(); // 9 elements from 18 operand elements

    // A broadcast of a dense constant would multiply its data: stays an op at any limit.
    let big = g
        .push(
            Op::BroadcastInDim {
                dims: vec![50, 3],
                broadcast_dimensions: vec![1],
            },
            &[r],
        )
        .unwrap();
    let xd = g.push(Op::Binary(BinaryOp::Mul), &[x, d]).unwrap();
    g.set_outputs(&[xd, big, r]).unwrap();

    let small = dce(&constant_fold(&g, 4).unwrap()).unwrap();
    // Limit 4: exp (9 elements) is over it, and everything else depends on exp.
    assert_eq!(count(&small, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 1);
    assert_eq!(count(&small, |o| matches!(o, Op::DotGeneral { .. })), 1);

    let wide = dce(&constant_fold(&g, 1000).unwrap()).unwrap();
    assert_eq!(count(&wide, |o| matches!(o, Op::Unary(UnaryOp::Exp))), 0);
    assert_eq!(
        count(&wide, |o| matches!(
            o,
            Op::DotGeneral { .. } | Op::Reduce(..)
        )),
        0
    );
    assert_eq!(
        count(&wide, |o| matches!(o, Op::BroadcastInDim { .. })),
        1,
        "expanding broadcast kept"
    );
    assert_eq!(
        count(&wide, is_const),
        2,
        "dot result [3,3] and reduce result [3]\n{wide}"
    );
    for seed in 0..3 {
        let inputs = random_inputs(&g, seed);
        let want = eval(&g, &inputs);
        assert_same(&want, &eval(&small, &inputs), "limit 4");
        assert_same(&want, &eval(&wide, &inputs), "limit 1000");
    }
}

#[test]
fn generators_and_non_constant_operands_stay() {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![6]));
    let iota = g
        .push(
            Op::Iota {
                dims: vec![6],
                dim: 0,
                dtype: DType::F32,
            },
            &[],
        )
        .unwrap();
    let one = splat(&mut g, 1.0, &[6]);
    let s = g.push(Op::Binary(BinaryOp::Add), &[iota, one]).unwrap();
    let t = g.push(Op::Binary(BinaryOp::Add), &[x, one]).unwrap();
    g.set_outputs(&[s, t]).unwrap();
    let f = constant_fold(&g, 1 << 20).unwrap();
    assert_eq!(
        f.op_count(),
        g.op_count(),
        "iota is not a constant; x is an input\n{f}"
    );
    let inputs = random_inputs(&g, 1);
    assert_same(&eval(&g, &inputs), &eval(&f, &inputs), "generators");
}

#[test]
fn folding_on_the_step_graph_keeps_results() {
    use passes_util::step::{build_step, StepConfig};
    let c = StepConfig::TINY;
    let g = build_step(c).unwrap();
    let inputs = passes_util::step_inputs(c, 5, &g);
    let f = dce(&constant_fold(&g, 1 << 16).unwrap()).unwrap();
    assert!(
        f.op_count() < g.op_count(),
        "{} -> {}",
        g.op_count(),
        f.op_count()
    );
    assert_same(&eval(&g, &inputs), &eval(&f, &inputs), "step fold");
}

#[test]
fn expensive_folds_are_left_to_the_device() {
    // [32, 8192] x [8192, 32]: a 1024-element result, but 8M multiply-adds.
    let mut g = Graph::new();
    let a = splat_dense(&mut g, &[32, 8192]);
    let b = splat_dense(&mut g, &[8192, 32]);
    let d = g
        .push(
            Op::DotGeneral {
                lhs_batch: vec![],
                rhs_batch: vec![],
                lhs_contract: vec![1],
                rhs_contract: vec![0],
            },
            &[a, b],
        )
        .unwrap();
    g.set_outputs(&[d]).unwrap();
    let t = std::time::Instant::now();
    let f = constant_fold(&g, 1 << 16).unwrap();
    assert_eq!(count(&f, |o| matches!(o, Op::DotGeneral { .. })), 1);
    assert!(t.elapsed().as_secs_f64() < 1.0);
    // The same shapes with a generous limit do fold (and the values are right: 0.5 * 0.25 * 8192).
    let small = constant_fold(&g, 1 << 20).unwrap();
    assert_eq!(
        constants(&dce(&small).unwrap()),
        vec![Literal::splat(DType::F32, 1024.0, &[32, 32])]
    );
}

/// A dense (not splat) literal: 0.5 everywhere for the `[32, _]` operand, 0.25 for the other.
fn splat_dense(g: &mut Graph, dims: &[usize]) -> NodeId {
    let v = if dims[0] == 32 { 0.5 } else { 0.25 };
    let n: usize = dims.iter().product();
    dense(g, &vec![v; n], dims)
}
