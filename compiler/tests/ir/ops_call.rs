//! `Op::Call`: shape inference and its errors, the reference evaluator against the arithmetic
//! by hand, the expansion (each application's ops once, however many results are read) and
//! the program run on the cpu plugin against the reference.

use crate::ops_common;

use std::sync::Arc;

use neuron_pc_compiler::ir::{expand_calls, BinaryOp, CallBody, Graph, Op, UnaryOp};
use neuron_pc_compiler::{lower, reference, DType, HostTensor};
use ops_common::{check_graph, ty};

/// `(x, s) -> (x * s + x, exp(x))` over `x: f32[3]`, `s: f32[3]`.
fn body() -> Arc<CallBody> {
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::F32, &[3]));
    let s = g.parameter(ty(DType::F32, &[3]));
    let xs = g.push(Op::Binary(BinaryOp::Mul), &[x, s]).unwrap();
    let sum = g.push(Op::Binary(BinaryOp::Add), &[xs, x]).unwrap();
    let e = g.push(Op::Unary(UnaryOp::Exp), &[x]).unwrap();
    g.set_outputs(&[sum, e]).unwrap();
    Arc::new(CallBody::new(g).unwrap())
}

fn call(body: &Arc<CallBody>, output: usize) -> Op {
    Op::Call {
        body: body.clone(),
        output,
    }
}

/// Both results of one application over `(a, b)`, one result of a second over `(b, a)`.
fn program(body: &Arc<CallBody>) -> Graph {
    let mut g = Graph::new();
    let a = g.parameter(ty(DType::F32, &[3]));
    let b = g.parameter(ty(DType::F32, &[3]));
    let r0 = g.push(call(body, 0), &[a, b]).unwrap();
    let r1 = g.push(call(body, 1), &[a, b]).unwrap();
    let q0 = g.push(call(body, 0), &[b, a]).unwrap();
    g.set_outputs(&[r0, r1, q0]).unwrap();
    g
}

fn host(v: &[f32]) -> HostTensor {
    HostTensor::from_slice(v, &[v.len()]).unwrap()
}

#[test]
fn a_calls_results_are_its_bodys_outputs_over_the_operands() {
    let g = program(&body());
    let (a, b) = ([0.5f32, -1.0, 2.0], [3.0f32, 0.25, -0.5]);
    let out = reference::evaluate(&g, &[host(&a), host(&b)]).unwrap();
    let got: Vec<Vec<f32>> = out.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
    let by_hand = |x: &[f32; 3], s: &[f32; 3]| -> Vec<f32> {
        x.iter().zip(s).map(|(x, s)| x * s + x).collect()
    };
    assert_eq!(got[0], by_hand(&a, &b));
    assert_eq!(got[1], a.iter().map(|x| x.exp()).collect::<Vec<_>>());
    assert_eq!(got[2], by_hand(&b, &a));
}

#[test]
fn expanding_writes_each_application_out_once() {
    let g = program(&body());
    let x = expand_calls(&g).unwrap();
    assert!(x.nodes().iter().all(|n| !matches!(n.op, Op::Call { .. })));
    // two applications: (mul, add, exp) for (a, b), read twice, and (mul, add, exp) for (b, a)
    assert_eq!(x.op_count(), 6, "{:?}", x.op_descriptions());
    assert_eq!(x.output_types(), g.output_types());
    let inputs = [host(&[1.5, -2.0, 0.0]), host(&[-0.5, 4.0, 1.0])];
    assert_eq!(
        reference::evaluate(&x, &inputs).unwrap(),
        reference::evaluate(&g, &inputs).unwrap()
    );
    // the lowering writes calls out itself: the same program as the expanded graph's
    assert_eq!(
        lower::to_stablehlo(&g).unwrap(),
        lower::to_stablehlo(&x).unwrap()
    );
}

#[test]
fn a_program_with_calls_runs_on_the_plugin_as_the_reference_says() {
    let g = program(&body());
    let inputs = [host(&[0.1, -0.7, 1.3]), host(&[2.0, 0.5, -1.5])];
    check_graph("calls", &g, &inputs, 1.0);
}

#[test]
fn a_call_checks_its_operands_against_the_bodys_parameters() {
    let body = body();
    let mut g = Graph::new();
    let a = g.parameter(ty(DType::F32, &[3]));
    let wrong = g.parameter(ty(DType::F32, &[4]));
    let e = g.push(call(&body, 0), &[a, wrong]).unwrap_err().to_string();
    assert!(
        e.contains("operand 1 is not the body's parameter type f32[3]"),
        "{e}"
    );
    let e = g.push(call(&body, 0), &[a]).unwrap_err().to_string();
    assert!(
        e.contains("the body takes 2 operands, the call has 1"),
        "{e}"
    );
    let e = g.push(call(&body, 2), &[a, a]).unwrap_err().to_string();
    assert!(e.contains("the body has 2 outputs, no output 2"), "{e}");
}

#[test]
fn a_body_holds_no_op_whose_value_depends_on_the_replica() {
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::F32, &[3]));
    let op = Op::AllReduce {
        op: neuron_pc_compiler::ir::ReduceOp::Sum,
        replica_groups: vec![vec![0, 1]],
    };
    let r = g.push(op, &[x]).unwrap();
    g.set_outputs(&[r]).unwrap();
    let e = CallBody::new(g).unwrap_err().to_string();
    assert!(e.contains("may not hold all_reduce"), "{e}");
    let e = CallBody::new(Graph::new()).unwrap_err().to_string();
    assert!(e.contains("no outputs"), "{e}");
}

#[test]
fn bodies_are_equal_by_content_and_calls_of_equal_bodies_are_one_op() {
    use std::hash::{BuildHasher, RandomState};
    let (b1, b2) = (body(), body());
    assert!(!Arc::ptr_eq(&b1, &b2));
    assert_eq!(call(&b1, 0), call(&b2, 0));
    assert_ne!(call(&b1, 0), call(&b1, 1));
    let hasher = RandomState::new();
    assert_eq!(hasher.hash_one(call(&b1, 0)), hasher.hash_one(call(&b2, 0)));
    // another body of the same shape: a different op
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::F32, &[3]));
    let s = g.parameter(ty(DType::F32, &[3]));
    let d = g.push(Op::Binary(BinaryOp::Sub), &[x, s]).unwrap();
    g.set_outputs(&[d, d]).unwrap();
    assert_ne!(call(&b1, 0), call(&Arc::new(CallBody::new(g).unwrap()), 0));
}
