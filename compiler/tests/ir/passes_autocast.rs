//! Auto-cast: which ops move to bf16/f16, which stay float32, outputs keep their types, and
//! results stay within the reduced type's error.
//!
//! Tolerances (relative, `|a - b| <= tol * (1 + |a|)`, inputs in [-1, 1), contraction length
//! 16): bf16 0.05 and f16 0.01. Rounding each input to bf16 (8 significant bits) perturbs each
//! product by at most 2^-8 of its size, so a 16-term dot of unit inputs moves by at most
//! 16 * 2^-8 = 0.0625 in the worst case and ~0.02 typically; f16 has 3 more bits.

use crate::passes_util;

use neuron_pc_compiler::flags::{AutoCast, AutoCastType, CompilerFlags};
use neuron_pc_compiler::ir::{BinaryOp, Graph, NodeId, Op, ReduceOp, TensorType, UnaryOp};
use neuron_pc_compiler::passes::{auto_cast, dce, run_pipeline, simplify};
use neuron_pc_compiler::DType;
use passes_util::{assert_close, count, eval, random_inputs};

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims.to_vec())
}
fn dot(g: &mut Graph, x: NodeId, y: NodeId) -> NodeId {
    let op = Op::DotGeneral {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contract: vec![1],
        rhs_contract: vec![0],
    };
    g.push(op, &[x, y]).unwrap()
}
fn bin(g: &mut Graph, b: BinaryOp, x: NodeId, y: NodeId) -> NodeId {
    g.push(Op::Binary(b), &[x, y]).unwrap()
}
fn un(g: &mut Graph, u: UnaryOp, x: NodeId) -> NodeId {
    g.push(Op::Unary(u), &[x]).unwrap()
}
/// Dtype of the nodes whose op matches `f`, in order.
fn dtypes_of(g: &Graph, f: impl Fn(&Op) -> bool) -> Vec<DType> {
    g.nodes()
        .iter()
        .filter(|n| f(&n.op))
        .map(|n| n.ty.dtype)
        .collect()
}

/// `x [8,16] @ w [16,4]`, then `h*h + h`, `exp`, a row sum, `tanh`; outputs the tanh and `w - x0`
/// style update reading a parameter.
fn graph() -> Graph {
    let mut g = Graph::new();
    let x = g.parameter(f32t(&[8, 16]));
    let w = g.parameter(f32t(&[16, 4]));
    let h = dot(&mut g, x, w);
    let hh = bin(&mut g, BinaryOp::Mul, h, h);
    let z = bin(&mut g, BinaryOp::Add, hh, h);
    let e = un(&mut g, UnaryOp::Exp, z);
    let r = g.push(Op::Reduce(ReduceOp::Sum, vec![1]), &[e]).unwrap();
    let t = un(&mut g, UnaryOp::Tanh, r);
    let n = un(&mut g, UnaryOp::Neg, t); // an output
    let upd = bin(&mut g, BinaryOp::Mul, w, w); // reads a parameter
    g.set_outputs(&[n, upd, h]).unwrap();
    g
}

/// [`graph`] with the chain feeding a second matmul, as the forward pass of a deeper model does:
/// `tanh(sum(exp(h*h + h)))` reshaped to `[8,1]` and multiplied by `u [1,4]`; the output `neg`
/// reads that product.
fn graph_feeding_matmul() -> Graph {
    let mut g = Graph::new();
    let x = g.parameter(f32t(&[8, 16]));
    let w = g.parameter(f32t(&[16, 4]));
    let u = g.parameter(f32t(&[1, 4]));
    let h = dot(&mut g, x, w);
    let hh = bin(&mut g, BinaryOp::Mul, h, h);
    let z = bin(&mut g, BinaryOp::Add, hh, h);
    let e = un(&mut g, UnaryOp::Exp, z);
    let r = g.push(Op::Reduce(ReduceOp::Sum, vec![1]), &[e]).unwrap();
    let t = un(&mut g, UnaryOp::Tanh, r);
    let t2 = g.push(Op::Reshape { dims: vec![8, 1] }, &[t]).unwrap();
    let d2 = dot(&mut g, t2, u);
    let n = un(&mut g, UnaryOp::Neg, d2); // an output
    let upd = bin(&mut g, BinaryOp::Mul, w, w); // reads a parameter
    g.set_outputs(&[n, upd, h]).unwrap();
    g
}

fn cast(g: &Graph, mode: AutoCast, to: AutoCastType) -> Graph {
    dce(&simplify(&auto_cast(g, mode, to).unwrap()).unwrap()).unwrap()
}

#[test]
fn matmult_casts_only_the_dot() {
    let g = graph();
    for (to, dt, tol) in [
        (AutoCastType::Bf16, DType::BF16, 0.05),
        (AutoCastType::Fp16, DType::F16, 0.01),
    ] {
        let c = cast(&g, AutoCast::Matmult, to);
        let dots: Vec<&neuron_pc_compiler::ir::Node> = c
            .nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::DotGeneral { .. }))
            .collect();
        assert_eq!(dots.len(), 1);
        assert_eq!(dots[0].ty.dtype, dt);
        for &o in &dots[0].operands {
            assert_eq!(c.node_type(o).dtype, dt, "dot inputs are {dt}");
        }
        assert_eq!(
            count(&c, |o| matches!(o, Op::Convert(_))),
            3,
            "two down, one up\n{c}"
        );
        assert_eq!(
            dtypes_of(&c, |o| matches!(
                o,
                Op::Binary(_) | Op::Unary(_) | Op::Reduce(..)
            )),
            vec![DType::F32; 7],
            "everything else stays f32"
        );
        assert_eq!(c.output_types(), g.output_types());
        let mut differs = false;
        for seed in 0..3 {
            let inputs = random_inputs(&g, seed);
            let (a, b) = (eval(&g, &inputs), eval(&c, &inputs));
            assert_close(&a, &b, tol, "matmult");
            differs |= a[2] != b[2];
        }
        assert!(
            differs,
            "{dt}: rounding must be visible in the dot's result"
        );
    }
}

#[test]
fn all_casts_safe_elementwise_ops_but_not_reductions_exp_inputs_or_outputs() {
    let g = graph_feeding_matmul();
    let c = cast(&g, AutoCast::All, AutoCastType::Bf16);
    // h*h and +h run in bf16, reading the dot's bf16 result directly (the convert pair in
    // between is gone); exp, the sum, tanh and the output's neg stay f32; w*w reads a parameter.
    let muls = dtypes_of(&c, |o| matches!(o, Op::Binary(BinaryOp::Mul)));
    assert_eq!(
        muls,
        vec![DType::BF16, DType::F32],
        "h*h in bf16, w*w (parameter) in f32\n{c}"
    );
    assert_eq!(
        dtypes_of(&c, |o| matches!(o, Op::Binary(BinaryOp::Add))),
        vec![DType::BF16]
    );
    assert_eq!(
        dtypes_of(&c, |o| matches!(o, Op::Unary(UnaryOp::Exp))),
        vec![DType::F32]
    );
    assert_eq!(
        dtypes_of(&c, |o| matches!(o, Op::Reduce(..))),
        vec![DType::F32]
    );
    assert_eq!(
        dtypes_of(&c, |o| matches!(o, Op::Unary(UnaryOp::Tanh))),
        vec![DType::BF16]
    );
    assert_eq!(
        dtypes_of(&c, |o| matches!(o, Op::Unary(UnaryOp::Neg))),
        vec![DType::F32],
        "an output"
    );
    // x and w down; the dot's result up (an output); add's result up for exp; the sum down
    // for tanh and tanh's result up, then down again after the reshape for the second dot
    // (the pair is not adjacent, so simplify keeps it); u down; the second dot's result up
    // for the output's neg. The mul's widened copy was dead.
    assert_eq!(count(&c, |o| matches!(o, Op::Convert(_))), 9, "{c}");
    assert_eq!(c.output_types(), g.output_types());
    for seed in 0..3 {
        let inputs = random_inputs(&g, seed);
        assert_close(&eval(&g, &inputs), &eval(&c, &inputs), 0.05, "all bf16");
    }
}

/// Elementwise arithmetic whose value reaches only graph outputs (an optimizer update, a
/// loss epilogue) stays float32 under `all`: in [`graph`] nothing but the dot is cast.
#[test]
fn all_keeps_arithmetic_that_feeds_no_matmul_in_f32() {
    let g = graph();
    for to in [AutoCastType::Bf16, AutoCastType::Fp16] {
        let c = cast(&g, AutoCast::All, to);
        let low: Vec<String> = c
            .nodes()
            .iter()
            .filter(|n| {
                matches!(n.ty.dtype, DType::BF16 | DType::F16)
                    && !matches!(n.op, Op::DotGeneral { .. } | Op::Convert(_))
            })
            .map(|n| n.op.to_string())
            .collect();
        assert!(low.is_empty(), "{to}: {low:?} cast\n{c}");
        assert_eq!(c, cast(&g, AutoCast::Matmult, to), "{to}");
    }
}

/// AdamW's `eps` (1e-8) is zero in f16 and 1e5 is infinite there: an op reading such a
/// constant (even broadcast) stays float32 under fp16, and is cast under bf16, which holds both.
#[test]
fn all_keeps_ops_reading_constants_the_cast_type_cannot_hold_in_f32() {
    use neuron_pc_compiler::ir::Literal;
    for value in [1e-8, 1e5, -1e-8] {
        let mut g = Graph::new();
        let x = g.parameter(f32t(&[4, 4]));
        let w = g.parameter(f32t(&[4, 4]));
        let t = un(&mut g, UnaryOp::Tanh, x);
        let k = g
            .push(Op::Constant(Literal::splat(DType::F32, value, &[])), &[])
            .unwrap();
        let kb = g
            .push(
                Op::BroadcastInDim {
                    dims: vec![4, 4],
                    broadcast_dimensions: vec![],
                },
                &[k],
            )
            .unwrap();
        let s = bin(&mut g, BinaryOp::Add, t, kb);
        let d = dot(&mut g, s, w);
        g.set_outputs(&[d]).unwrap();
        let adds = |to| {
            dtypes_of(&cast(&g, AutoCast::All, to), |o| {
                matches!(o, Op::Binary(BinaryOp::Add))
            })
        };
        assert_eq!(adds(AutoCastType::Fp16), vec![DType::F32], "{value} in f16");
        assert_eq!(
            adds(AutoCastType::Bf16),
            vec![DType::BF16],
            "{value} in bf16"
        );
        if value.abs() > 1.0 {
            continue; // the dot's own f16 inputs overflow, as Neuron's matmult cast would
        }
        // tanh reads a parameter, so only the add could have moved
        let inputs = random_inputs(&g, 0);
        let want = eval(&g, &inputs);
        let got = eval(&cast(&g, AutoCast::All, AutoCastType::Fp16), &inputs);
        assert_close(&want, &got, 0.01, "fp16 with a tiny or huge constant");
    }
}

/// A matmul with a constant operand f16 cannot hold stays f32 under fp16 (both modes); bf16,
/// with float32's exponent range, casts it.
#[test]
fn a_matmul_reading_an_unrepresentable_constant_stays_f32() {
    use neuron_pc_compiler::ir::Literal;
    let mut g = Graph::new();
    let x = g.parameter(f32t(&[4, 4]));
    let k = g
        .push(Op::Constant(Literal::splat(DType::F32, 1e-8, &[4, 4])), &[])
        .unwrap();
    let d = dot(&mut g, x, k);
    g.set_outputs(&[d]).unwrap();
    let dots = |mode, to| dtypes_of(&cast(&g, mode, to), |o| matches!(o, Op::DotGeneral { .. }));
    for mode in [AutoCast::Matmult, AutoCast::All] {
        assert_eq!(dots(mode, AutoCastType::Fp16), vec![DType::F32], "{mode}");
        assert_eq!(dots(mode, AutoCastType::Bf16), vec![DType::BF16], "{mode}");
    }
    let inputs = random_inputs(&g, 1);
    let want = eval(&g, &inputs);
    let got = eval(&cast(&g, AutoCast::Matmult, AutoCastType::Fp16), &inputs);
    assert_eq!(want, got, "left exactly as it was");
}

#[test]
fn none_is_identity_and_other_dtypes_are_untouched() {
    let g = graph();
    assert_eq!(
        cast(&g, AutoCast::None, AutoCastType::Bf16),
        dce(&simplify(&g).unwrap()).unwrap()
    );
    let mut h = Graph::new();
    let a = h.parameter(TensorType::new(DType::F64, vec![2, 3]));
    let b = h.parameter(TensorType::new(DType::F64, vec![3, 2]));
    let d = dot(&mut h, a, b);
    let s = bin(&mut h, BinaryOp::Add, d, d);
    h.set_outputs(&[s]).unwrap();
    assert_eq!(
        cast(&h, AutoCast::All, AutoCastType::Bf16),
        h,
        "f64 is the user's explicit choice"
    );
}

#[test]
fn pipeline_casts_on_xla_targets_only() {
    use passes_util::step::{build_step, StepConfig};
    let c = StepConfig::TINY;
    let g = build_step(c).unwrap();
    let inputs = passes_util::step_inputs(c, 2, &g);
    let want = eval(&g, &inputs);
    let dots = |g: &Graph| dtypes_of(g, |o| matches!(o, Op::DotGeneral { .. }));

    let cuda = run_pipeline(
        &g,
        &CompilerFlags::parse("--target cuda --auto-cast matmult").unwrap(),
    )
    .unwrap();
    assert_eq!(
        dots(&cuda),
        vec![DType::BF16; 12],
        "4 forward, 8 backward matmuls"
    );
    assert_eq!(cuda.output_types(), g.output_types());
    // The loss (output 0) within bf16 error; the updated weights move by lr-sized steps, so
    // they agree far more closely.
    assert_close(
        &want[..1],
        &eval(&cuda, &inputs)[..1],
        0.05,
        "loss, matmult",
    );
    assert_close(
        &want[1..],
        &eval(&cuda, &inputs)[1..],
        2e-3,
        "updates, matmult",
    );

    // On cpu the same bf16 products run as f32 products of the bf16 operands, rounded once
    // (`half_products_in_f32`): the same values, up to the order of the sums.
    let cpu = run_pipeline(&g, &CompilerFlags::parse("--auto-cast matmult").unwrap()).unwrap();
    assert_eq!(dots(&cpu), vec![DType::F32; 12]);
    for n in cpu
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::DotGeneral { .. }))
    {
        for &o in &n.operands {
            let widened = cpu.node(o).unwrap();
            assert!(
                matches!(widened.op, Op::Convert(DType::F32)),
                "{:?}",
                widened.op
            );
            assert_eq!(cpu.node_type(widened.operands[0]).dtype, DType::BF16);
        }
    }
    let (on_cpu, on_cuda) = (eval(&cpu, &inputs), eval(&cuda, &inputs));
    assert_close(
        &on_cuda,
        &on_cpu,
        1e-2,
        "cpu's f32 products of bf16 values vs bf16 products",
    );

    let all = run_pipeline(
        &g,
        &CompilerFlags::parse("--target cuda --auto-cast all --auto-cast-type fp16").unwrap(),
    )
    .unwrap();
    assert_eq!(dots(&all), vec![DType::F16; 12]);
    assert!(dtypes_of(&all, |o| matches!(o, Op::Binary(_))).contains(&DType::F16));
    assert_close(
        &want[..1],
        &eval(&all, &inputs)[..1],
        0.05,
        "loss, all fp16",
    );

    let trn = run_pipeline(
        &g,
        &CompilerFlags::parse("--target trn1 --auto-cast all").unwrap(),
    )
    .unwrap();
    assert_eq!(
        dots(&trn),
        vec![DType::F32; 12],
        "Neuron's compiler casts on trn, not this pass"
    );
}
