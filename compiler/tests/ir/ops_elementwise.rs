//! Elementwise ops on the cpu plugin against the reference evaluator, for every dtype each op
//! supports (tolerances per dtype in `ops_common::tolerance`).

use crate::ops_common;

use neuron_pc_compiler::ir::{BinaryOp, CompareOp, Op, UnaryOp};
use neuron_pc_compiler::DType;
use ops_common::{check_op, ty, Domain};

fn unary_domain(u: UnaryOp) -> Domain {
    match u {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Rsqrt => Domain::Range(0.05, 4.0),
        UnaryOp::Log1p => Domain::Range(-0.9, 3.0),
        UnaryOp::Exp => Domain::Range(-4.0, 4.0),
        UnaryOp::Not => Domain::Range(-50.0, 250.0),
        UnaryOp::Erfc => Domain::Range(-3.0, 4.5),
        UnaryOp::Neg
        | UnaryOp::Abs
        | UnaryOp::Sign
        | UnaryOp::Tanh
        | UnaryOp::Logistic
        | UnaryOp::Sin
        | UnaryOp::Cos
        | UnaryOp::Erf
        | UnaryOp::Floor
        | UnaryOp::Ceil => Domain::Range(-3.0, 3.0),
    }
}

#[test]
fn unary_ops_every_dtype() {
    let mut checked = 0;
    for (k, u) in UnaryOp::ALL.into_iter().enumerate() {
        for d in u.dtypes().dtypes() {
            check_op(
                Op::Unary(u),
                &[ty(d, &[3, 5])],
                &[unary_domain(u)],
                100 + k as u64,
            );
            checked += 1;
        }
    }
    assert!(checked >= 50, "{checked}");
}

fn binary_domains(b: BinaryOp, d: DType) -> [Domain; 2] {
    match b {
        BinaryOp::Div | BinaryOp::Rem => [Domain::Range(-20.0, 20.0), Domain::NonZero(-6.0, 6.0)],
        BinaryOp::Pow if d.is_float() => [Domain::Range(0.1, 3.0), Domain::Range(-2.0, 2.0)],
        BinaryOp::Pow => [Domain::Range(-4.0, 4.0), Domain::Range(0.0, 5.0)],
        BinaryOp::Mul if d == DType::U8 => [Domain::Range(0.0, 250.0), Domain::Range(0.0, 250.0)],
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Max | BinaryOp::Min => {
            [Domain::Range(-5.0, 5.0), Domain::Range(-5.0, 5.0)]
        }
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => {
            [Domain::Range(-100.0, 250.0), Domain::Range(-100.0, 250.0)]
        }
    }
}

#[test]
fn binary_ops_every_dtype() {
    let mut checked = 0;
    for (k, b) in BinaryOp::ALL.into_iter().enumerate() {
        for d in b.dtypes().dtypes() {
            let t = ty(d, &[4, 6]);
            check_op(
                Op::Binary(b),
                &[t.clone(), t],
                &binary_domains(b, d),
                200 + k as u64,
            );
            checked += 1;
        }
    }
    assert!(checked >= 79, "{checked}");
}

#[test]
fn integer_overflow_wraps() {
    // u8 products and i32 sums that overflow must wrap like the reference says.
    check_op(
        Op::Binary(BinaryOp::Mul),
        &[ty(DType::U8, &[16]), ty(DType::U8, &[16])],
        &[Domain::Range(100.0, 255.0)],
        1,
    );
    check_op(
        Op::Binary(BinaryOp::Add),
        &[ty(DType::I32, &[16]), ty(DType::I32, &[16])],
        &[Domain::Range(2.0e9, 2.1e9)],
        2,
    );
}

#[test]
fn compare_ops_every_dtype() {
    for (k, c) in CompareOp::ALL.into_iter().enumerate() {
        for d in DType::ALL {
            let t = ty(d, &[5, 4]);
            // A narrow range makes equal pairs common.
            check_op(
                Op::Compare(c),
                &[t.clone(), t],
                &[Domain::Range(-2.0, 2.0)],
                300 + k as u64,
            );
        }
    }
}

#[test]
fn select_with_full_and_scalar_conditions() {
    for d in DType::ALL {
        let t = ty(d, &[3, 4]);
        check_op(
            Op::Select,
            &[ty(DType::Pred, &[3, 4]), t.clone(), t.clone()],
            &[Domain::Range(-3.0, 3.0)],
            400,
        );
        check_op(
            Op::Select,
            &[ty(DType::Pred, &[]), t.clone(), t],
            &[Domain::Range(-3.0, 3.0)],
            401,
        );
    }
}

#[test]
fn convert_between_every_pair_of_dtypes() {
    for from in DType::ALL {
        for to in DType::ALL {
            // Floats converted to unsigned integers stay non-negative (negative values are
            // implementation-defined in StableHLO); everything stays inside u8's range.
            let domain = if from.is_float() && to.is_unsigned_int() {
                Domain::Range(0.0, 200.0)
            } else {
                Domain::Range(-100.0, 200.0)
            };
            check_op(Op::Convert(to), &[ty(from, &[2, 8])], &[domain], 500);
        }
    }
}

/// StableHLO's maximum/minimum propagate NaN; the lowering must keep that on every backend.
#[test]
fn max_min_propagate_nan() {
    use neuron_pc_compiler::ir::Graph;
    use neuron_pc_compiler::HostTensor;
    for b in [BinaryOp::Max, BinaryOp::Min] {
        let mut g = Graph::new();
        let x = g.parameter(ty(DType::F32, &[4]));
        let y = g.parameter(ty(DType::F32, &[4]));
        let m = g.push(Op::Binary(b), &[x, y]).unwrap();
        g.set_outputs(&[m]).unwrap();
        let nan = f32::NAN;
        let inputs = [
            HostTensor::from_slice(&[nan, 1.0, nan, 2.0], &[4]).unwrap(),
            HostTensor::from_slice(&[1.0, nan, nan, -2.0], &[4]).unwrap(),
        ];
        let got = ops_common::run_device(&g, &inputs)[0]
            .to_vec::<f32>()
            .unwrap();
        assert!(got[..3].iter().all(|v| v.is_nan()), "{b:?}: {got:?}");
        ops_common::check_graph("max/min with NaN", &g, &inputs, 1.0);
    }
}
