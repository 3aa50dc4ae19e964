//! Every differentiable primitive of the IR: its gradient rule against central finite
//! differences in f64 on the cpu plugin (the check and its tolerance: `grad_check/mod.rs`).

use crate::grad_check;

use grad_check::{device, vals, Check};
use neuron_pc::{grad, DType, Tensor};
use neuron_pc_compiler::sharding::{Mesh, PartitionSpec, Sharding};

#[test]
fn unary_ops() {
    let c = Check::new(1);
    let s = [2, 3];
    c.op("neg", &[c.rand(&s, -1.0, 1.0)], |x| x[0].neg());
    c.op("abs", &[c.away(&s, 0.1, 1.0)], |x| x[0].abs());
    c.op("sign", &[c.away(&s, 0.1, 1.0)], |x| x[0].sign()?.mul(&x[0]));
    c.op("exp", &[c.rand(&s, -1.0, 1.0)], |x| x[0].exp());
    c.op("log", &[c.rand(&s, 0.5, 2.0)], |x| x[0].log());
    c.op("log1p", &[c.rand(&s, -0.5, 1.0)], |x| x[0].log1p());
    c.op("tanh", &[c.rand(&s, -2.0, 2.0)], |x| x[0].tanh());
    c.op("logistic", &[c.rand(&s, -3.0, 3.0)], |x| x[0].sigmoid());
    c.op("sqrt", &[c.rand(&s, 0.5, 2.0)], |x| x[0].sqrt());
    c.op("rsqrt", &[c.rand(&s, 0.5, 2.0)], |x| x[0].rsqrt());
    c.op("sin", &[c.rand(&s, -3.0, 3.0)], |x| x[0].sin());
    c.op("cos", &[c.rand(&s, -3.0, 3.0)], |x| x[0].cos());
    c.op("erf", &[c.rand(&s, -1.5, 1.5)], |x| x[0].erf());
    c.op("erfc", &[c.rand(&s, -1.5, 1.5)], |x| x[0].erfc());
    let off_integers = || vals(&[-2.3, -0.6, 0.4, 1.7, 2.5, 3.2], &s);
    c.op("floor", &[off_integers()], |x| {
        x[0].floor()?.add(&x[0].mul(&x[0])?)
    });
    c.op("ceil", &[off_integers()], |x| x[0].ceil()?.mul(&x[0]));
    // only the first operand gets a gradient: the second reaches the loss through the product
    c.op(
        "after",
        &[c.rand(&s, -1.0, 1.0), c.rand(&s, -1.0, 1.0)],
        |x| x[0].after(&x[1..])?.mul(&x[1]),
    );
    c.op("relu", &[c.away(&s, 0.1, 1.0)], |x| x[0].relu());
    let mesh = Mesh::new(&[("model", 1)], &[0]).unwrap();
    let split = Sharding::new(&mesh, &PartitionSpec::new(&[&[], &["model"]]), &s).unwrap();
    c.op("sharding_constraint", &[c.rand(&s, -1.0, 1.0)], |x| {
        x[0].with_sharding_constraint(&split)?.tanh()
    });
    c.finish();
}

#[test]
fn binary_ops() {
    let c = Check::new(2);
    let s = [2, 3];
    let two = || [c.rand(&s, -1.0, 1.0), c.rand(&s, -1.0, 1.0)];
    c.op("add", &two(), |x| x[0].add(&x[1]));
    c.op("sub", &two(), |x| x[0].sub(&x[1]));
    c.op("mul", &two(), |x| x[0].mul(&x[1]));
    c.op("div", &[c.rand(&s, -1.0, 1.0), c.away(&s, 0.5, 2.0)], |x| {
        x[0].div(&x[1])
    });
    // quotients a/c away from integers, dividends of both signs
    let divisor = c.away(&s, 0.5, 2.0);
    let q = [-1.7, -0.4, 0.3, 1.6, 2.5, -2.8];
    let dividend = vals(
        &divisor
            .v
            .iter()
            .zip(q)
            .map(|(c, q)| c * q)
            .collect::<Vec<_>>(),
        &s,
    );
    c.op("rem", &[dividend, divisor], |x| x[0].rem(&x[1]));
    c.op("pow", &[c.rand(&s, 0.5, 2.0), c.rand(&s, -1.5, 2.5)], |x| {
        x[0].pow(&x[1])
    });
    // a constant exponent may meet a negative base: its (unused) log must not leak NaN
    c.op("powf", &[c.rand(&s, -1.0, 1.0)], |x| x[0].powf(3.0));
    c.op("max", &two(), |x| x[0].maximum(&x[1]));
    c.op("min", &two(), |x| x[0].minimum(&x[1]));
    c.op(
        "mul broadcast [2,3]x[3]",
        &[c.rand(&s, -1.0, 1.0), c.rand(&[3], -1.0, 1.0)],
        |x| x[0].mul(&x[1]),
    );
    c.op(
        "sub broadcast [2,1]x[1,3]",
        &[c.rand(&[2, 1], -1.0, 1.0), c.rand(&[1, 3], -1.0, 1.0)],
        |x| x[0].sub(&x[1]),
    );
    c.op("shared operand x*x+x", &[c.rand(&s, -1.0, 1.0)], |x| {
        x[0].mul(&x[0])?.add(&x[0])
    });
    c.finish();
}

#[test]
fn select_convert_and_broadcast() {
    let c = Check::new(3);
    let s = [2, 3];
    let m = c.f64s(&[1.0, -1.0, -1.0, 1.0, 1.0, -1.0], &s);
    c.op(
        "select",
        &[c.rand(&s, -1.0, 1.0), c.rand(&s, -1.0, 1.0)],
        |x| Tensor::where_cond(&m.gt(&m.constant_like(0.0)?)?, &x[0], &x[1]),
    );
    c.op(
        "select by a compare of the input",
        &[c.away(&s, 0.1, 1.0)],
        |x| {
            Tensor::where_cond(
                &x[0].gt(&x[0].constant_like(0.0)?)?,
                &x[0].exp()?,
                &x[0].sin()?,
            )
        },
    );
    // f64 -> f64 through f64 (a no-op) and f64 -> f32 -> f64: the finite differences are f64,
    // so the f32 leg is checked exactly below instead
    c.op("convert f64 pred path", &[c.rand(&s, -1.0, 1.0)], |x| {
        x[0].mul(&x[0].gt(&x[0].constant_like(0.0)?)?.to_dtype(DType::F64)?)
    });
    c.op(
        "broadcast_in_dim stretch [2,1,3]->[2,4,3]",
        &[c.rand(&[2, 1, 3], -1.0, 1.0)],
        |x| x[0].broadcast_in_dim(&[2, 4, 3], &[0, 1, 2]),
    );
    c.op(
        "broadcast_in_dim new dim [3]->[2,3]",
        &[c.rand(&[3], -1.0, 1.0)],
        |x| x[0].broadcast_in_dim(&[2, 3], &[1]),
    );
    c.op("broadcast_in_dim scalar", &[c.rand(&[], -1.0, 1.0)], |x| {
        x[0].broadcast_in_dim(&[2, 3], &[])
    });
    c.op(
        "broadcast_in_dim unsorted [3,1]->[2,4,3]",
        &[c.rand(&[3, 1], -1.0, 1.0)],
        |x| x[0].broadcast_in_dim(&[2, 4, 3], &[2, 0]),
    );
    c.op(
        "broadcast_in_dim transposing [3,2]->[2,4,3]",
        &[c.rand(&[3, 2], -1.0, 1.0)],
        |x| x[0].broadcast_in_dim(&[2, 4, 3], &[2, 0]),
    );
    c.op(
        "broadcast_to [2,1]->[3,2,4]",
        &[c.rand(&[2, 1], -1.0, 1.0)],
        |x| x[0].broadcast_to(&[3, 2, 4]),
    );
    c.finish();

    // Convert between f32 and f64: gradients flow back in the input's dtype. Checked against
    // the exact derivative, since finite differences through f32 are too coarse.
    let dev = device();
    let xv = [0.5f64, -1.25, 2.0];
    let x = dev.from_slice(&xv, &[3]).unwrap();
    let y = x
        .to_dtype(DType::F32)
        .unwrap()
        .mul_scalar(3.0)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap();
    let wv = [0.3f64, -0.7, 1.1];
    let w = dev.from_slice(&wv, &[3]).unwrap();
    let g = &grad(&y.mul(&w).unwrap().sum_all().unwrap(), &[&x]).unwrap()[0];
    assert_eq!(g.dtype(), DType::F64);
    let got = g.to_vec::<f64>().unwrap();
    for (a, w) in got.iter().zip(wv) {
        assert!((a - 3.0 * w).abs() < 1e-6, "{got:?}");
    }
    let x32 = dev.from_slice(&[0.5f32, -1.25, 2.0], &[3]).unwrap();
    let y = x32.to_dtype(DType::F64).unwrap().exp().unwrap();
    let g = &grad(&y.mul(&w).unwrap().sum_all().unwrap(), &[&x32]).unwrap()[0];
    assert_eq!(g.dtype(), DType::F32);
    let got = g.to_vec::<f32>().unwrap();
    for ((a, x), w) in got.iter().zip(xv).zip(wv) {
        let want = (x.exp() * w) as f32;
        assert!((a - want).abs() <= 1e-6 * want.abs().max(1.0), "{got:?}");
    }
}

#[test]
fn shape_ops() {
    let c = Check::new(4);
    c.op("reshape", &[c.rand(&[2, 3], -1.0, 1.0)], |x| {
        x[0].reshape(&[3, 2])?.exp()
    });
    c.op("transpose", &[c.rand(&[2, 3, 4], -1.0, 1.0)], |x| {
        x[0].permute(&[2, 0, 1])
    });
    c.op("slice strided", &[c.rand(&[4, 5], -1.0, 1.0)], |x| {
        x[0].slice_strided(&[1, 0], &[4, 5], &[2, 2])
    });
    c.op(
        "slice stride 3 short end",
        &[c.rand(&[7], -1.0, 1.0)],
        |x| x[0].slice_strided(&[1], &[6], &[3]),
    );
    c.op("narrow", &[c.rand(&[2, 5], -1.0, 1.0)], |x| {
        x[0].narrow(1, 1, 3)
    });
    let (i1, i2) = (c.i32s(&[1], &[]), c.i32s(&[2], &[]));
    c.op("dynamic_slice", &[c.rand(&[4, 5], -1.0, 1.0)], |x| {
        x[0].dynamic_slice(&[&i1, &i2], &[2, 3])
    });
    let (i3, i4) = (c.i32s(&[3], &[]), c.i32s(&[4], &[]));
    c.op(
        "dynamic_slice clamped",
        &[c.rand(&[4, 5], -1.0, 1.0)],
        |x| x[0].dynamic_slice(&[&i3, &i4], &[2, 3]),
    );
    c.op(
        "dynamic_update_slice",
        &[c.rand(&[4, 5], -1.0, 1.0), c.rand(&[2, 3], -1.0, 1.0)],
        |x| x[0].dynamic_update_slice(&x[1], &[&i1, &i2]),
    );
    c.op(
        "dynamic_update_slice clamped",
        &[c.rand(&[4, 5], -1.0, 1.0), c.rand(&[2, 3], -1.0, 1.0)],
        |x| x[0].dynamic_update_slice(&x[1], &[&i3, &i4]),
    );
    c.op(
        "concatenate",
        &[c.rand(&[2, 3], -1.0, 1.0), c.rand(&[2, 2], -1.0, 1.0)],
        |x| Tensor::cat(&[&x[0], &x[1]], 1),
    );
    c.op(
        "concatenate three, dim 0",
        &[
            c.rand(&[1, 2], -1.0, 1.0),
            c.rand(&[2, 2], -1.0, 1.0),
            c.rand(&[1, 2], -1.0, 1.0),
        ],
        |x| Tensor::cat(&[&x[0], &x[1], &x[2]], 0),
    );
    c.op(
        "pad interior + value",
        &[c.rand(&[2, 3], -1.0, 1.0), c.rand(&[], -1.0, 1.0)],
        |x| x[0].pad(&[1, 0], &[0, 2], &[1, 2], &x[1]),
    );
    c.op(
        "pad negative low/high",
        &[c.rand(&[3, 3], -1.0, 1.0), c.rand(&[], -1.0, 1.0)],
        |x| x[0].pad(&[-1, 1], &[1, -2], &[1, 0], &x[1]),
    );
    c.finish();
}

#[test]
fn reductions() {
    let c = Check::new(5);
    let s = [2, 3];
    c.op("sum dim 1", &[c.rand(&s, -1.0, 1.0)], |x| {
        x[0].sum(&[1], false)
    });
    c.op("sum all", &[c.rand(&s, -1.0, 1.0)], |x| x[0].sum_all());
    c.op(
        "sum dims 0,2 keepdim",
        &[c.rand(&[2, 3, 2], -1.0, 1.0)],
        |x| x[0].sum(&[0, 2], true),
    );
    c.op("mean", &[c.rand(&s, -1.0, 1.0)], |x| x[0].mean(&[0], false));
    // distinct values, so each maximum is unique and differentiable
    let distinct = || vals(&[0.3, -0.8, 0.9, 0.1, 0.7, -0.2], &s);
    c.op("max dim 1", &[distinct()], |x| x[0].max(&[1], false));
    c.op("max all", &[distinct()], |x| x[0].max(&[0, 1], false));
    c.op("min dim 0 keepdim", &[distinct()], |x| x[0].min(&[0], true));
    c.op("prod dim 1", &[c.away(&s, 0.5, 1.5)], |x| {
        x[0].prod(&[1], false)
    });
    c.op(
        "prod with one zero",
        &[vals(&[0.0, -0.8, 0.9, 0.5, 1.2, -0.7], &s)],
        |x| x[0].prod(&[1], false),
    );
    c.op(
        "prod with two zeros",
        &[vals(&[0.0, 0.0, 0.9, 0.5, 0.0, -0.7], &s)],
        |x| x[0].prod(&[1], false),
    );
    c.finish();
}

#[test]
fn dot_general() {
    let c = Check::new(6);
    c.op(
        "matmul",
        &[c.rand(&[2, 3], -1.0, 1.0), c.rand(&[3, 4], -1.0, 1.0)],
        |x| x[0].matmul(&x[1]),
    );
    c.op(
        "batched matmul",
        &[c.rand(&[2, 2, 3], -1.0, 1.0), c.rand(&[2, 3, 2], -1.0, 1.0)],
        |x| x[0].matmul(&x[1]),
    );
    c.op(
        "rank-3 x matrix",
        &[c.rand(&[2, 2, 3], -1.0, 1.0), c.rand(&[3, 2], -1.0, 1.0)],
        |x| x[0].matmul(&x[1]),
    );
    c.op(
        "linear (weight dim 1 contracted)",
        &[
            c.rand(&[2, 3], -1.0, 1.0),
            c.rand(&[4, 3], -1.0, 1.0),
            c.rand(&[4], -1.0, 1.0),
        ],
        |x| x[0].linear(&x[1], Some(&x[2])),
    );
    c.op(
        "contracting dim first (x^T y)",
        &[c.rand(&[3, 2], -1.0, 1.0), c.rand(&[3, 4], -1.0, 1.0)],
        |x| x[0].dot_general(&x[1], &[], &[], &[0], &[0]),
    );
    c.op(
        "batch dim in the middle",
        &[c.rand(&[3, 2, 2], -1.0, 1.0), c.rand(&[2, 2, 3], -1.0, 1.0)],
        |x| x[0].dot_general(&x[1], &[1], &[1], &[0], &[2]),
    );
    // contracting pairs listed out of the operands' dimension order
    c.op(
        "two contracting dims, crossed",
        &[c.rand(&[2, 3, 2], -1.0, 1.0), c.rand(&[2, 2, 3], -1.0, 1.0)],
        |x| x[0].dot_general(&x[1], &[], &[], &[0, 2], &[1, 0]),
    );
    c.op(
        "two contracting dims, crossed sizes",
        &[c.rand(&[2, 3, 4], -1.0, 1.0), c.rand(&[4, 2, 3], -1.0, 1.0)],
        |x| x[0].dot_general(&x[1], &[], &[], &[0, 2], &[1, 0]),
    );
    c.op(
        "two batch dims swapped",
        &[c.rand(&[2, 3, 2], -1.0, 1.0), c.rand(&[3, 2, 2], -1.0, 1.0)],
        |x| x[0].dot_general(&x[1], &[0, 1], &[1, 0], &[2], &[2]),
    );
    c.finish();
}

#[test]
fn gather_and_scatter_add() {
    let c = Check::new(7);
    let idx = c.i32s(&[1, 3, 1, 0, 1], &[5]);
    c.op("gather repeated rows", &[c.rand(&[4, 3], -1.0, 1.0)], |x| {
        x[0].index_select_rows(&idx)
    });
    let idx2 = c.i32s(&[2, 2, 0, 3], &[2, 2]);
    c.op("gather 2-d indices", &[c.rand(&[4, 3], -1.0, 1.0)], |x| {
        x[0].index_select_rows(&idx2)
    });
    // out-of-range indices read the clamped row, so that row gets the gradient
    let clamped = c.i32s(&[5, -1, 2], &[3]);
    c.op(
        "gather clamped indices",
        &[c.rand(&[4, 3], -1.0, 1.0)],
        |x| x[0].index_select_rows(&clamped),
    );
    let sidx = c.i32s(&[2, 0, 2], &[3]);
    c.op(
        "scatter_add",
        &[c.rand(&[4, 3], -1.0, 1.0), c.rand(&[3, 3], -1.0, 1.0)],
        |x| x[0].scatter_add_rows(&sidx, &x[1])?.tanh(),
    );
    // out-of-range rows are skipped, so their updates get no gradient
    let skipped = c.i32s(&[4, -1, 1], &[3]);
    c.op(
        "scatter_add out of range",
        &[c.rand(&[4, 3], -1.0, 1.0), c.rand(&[3, 3], -1.0, 1.0)],
        |x| x[0].scatter_add_rows(&skipped, &x[1])?.sin(),
    );
    c.finish();
}
