//! Gradients of the composites of `neuron_pc::nn` against central finite differences in f64,
//! and the behaviour of `grad` around non-differentiable ops and bad losses.

use crate::grad_check;

use grad_check::{device, vals, Check};
use neuron_pc::nn::{self, LayerNorm, Linear, MultiHeadAttention};
use neuron_pc::{grad, DType, Result, Tensor};

#[test]
fn nn_composites() {
    let c = Check::new(8);
    let s = [2, 3];
    c.op("softmax", &[c.rand(&s, -2.0, 2.0)], |x| {
        nn::softmax(&x[0], -1)
    });
    c.op("softmax dim 0", &[c.rand(&s, -2.0, 2.0)], |x| {
        nn::softmax(&x[0], 0)
    });
    c.op("log_softmax", &[c.rand(&s, -2.0, 2.0)], |x| {
        nn::log_softmax(&x[0], -1)
    });
    let labels = c.i32s(&[2, 0, 3], &[3]);
    c.op("cross_entropy", &[c.rand(&[3, 4], -2.0, 2.0)], |x| {
        nn::cross_entropy(&x[0], &labels)
    });
    c.op("gelu", &[c.rand(&s, -3.0, 3.0)], |x| nn::gelu(&x[0]));
    c.op(
        "layer norm",
        &[
            c.rand(&s, -1.0, 1.0),
            c.rand(&[3], 0.5, 1.5),
            c.rand(&[3], -0.5, 0.5),
        ],
        |x| {
            LayerNorm {
                weight: x[1].clone(),
                bias: x[2].clone(),
                eps: 1e-5,
            }
            .forward(&x[0])
        },
    );
    let mask = c.f64s(&[1.0, 1.0, 0.0, 1.0, 0.0, 0.0], &[2, 3]);
    c.op("masked_mean", &[c.rand(&[2, 3, 2], -1.0, 1.0)], |x| {
        nn::masked_mean(&x[0], &mask)
    });
    let (e, sq) = (4, 3);
    let mha = |x: &[Tensor], mask: Option<&Tensor>| -> Result<Tensor> {
        let layer = MultiHeadAttention {
            in_proj_weight: x[1].clone(),
            in_proj_bias: x[2].clone(),
            out_proj: Linear {
                weight: x[3].clone(),
                bias: Some(x[4].clone()),
            },
            heads: 2,
        };
        layer.forward(&x[0], mask)
    };
    let params = || {
        vec![
            c.rand(&[1, sq, e], -1.0, 1.0),
            c.rand(&[3 * e, e], -0.7, 0.7),
            c.rand(&[3 * e], -0.2, 0.2),
            c.rand(&[e, e], -0.7, 0.7),
            c.rand(&[e], -0.2, 0.2),
        ]
    };
    c.op("multi-head attention", &params(), |x| mha(x, None));
    let key_mask = c.f64s(&[1.0, 1.0, 0.0], &[1, sq]);
    c.op("multi-head attention, padding mask", &params(), |x| {
        mha(x, Some(&key_mask))
    });
    c.finish();
}

#[test]
fn non_differentiable_paths() {
    let c = Check::new(9);
    let s = [2, 3];
    // Not, And and argmax feed only conditions and integer values: gradient flows around them
    c.op(
        "through a logical_not condition",
        &[c.away(&s, 0.1, 1.0)],
        |x| {
            let not_pos = x[0].gt(&x[0].constant_like(0.0)?)?.logical_not()?;
            Tensor::where_cond(&not_pos, &x[0].mul_scalar(2.0)?, &x[0].mul_scalar(3.0)?)
        },
    );
    c.op(
        "through a logical_and condition",
        &[vals(&[0.2, 0.7, -0.4, 0.3, 0.9, -0.1], &s)],
        |x| {
            let zero = x[0].constant_like(0.0)?;
            let half = x[0].constant_like(0.5)?;
            let both = x[0].gt(&zero)?.logical_and(&x[0].lt(&half)?)?;
            Tensor::where_cond(&both, &x[0].exp()?, &x[0].sin()?)
        },
    );
    c.op(
        "argmax as a factor",
        &[vals(&[0.3, -0.8, 0.9, 0.1, 0.7, -0.2], &s)],
        |x| x[0].mul(&x[0].argmax(1)?.to_dtype(DType::F64)?.unsqueeze(1)?),
    );
    c.op("an integer round trip", &[c.rand(&s, 0.1, 3.9)], |x| {
        x[0].to_dtype(DType::I32)?
            .to_dtype(DType::F64)?
            .add(&x[0].mul_scalar(0.5)?)
    });
    c.finish();

    let dev = &device();
    let x = dev.from_slice(&[0.3f64, -0.8, 0.9, 0.1], &[2, 2]).unwrap();
    let unused = dev.from_slice(&[1.0f64, 2.0, 3.0], &[3]).unwrap();
    // A loss made only of argmax has no gradient: zeros, not an error.
    let loss = x
        .argmax(1)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .sum_all()
        .unwrap();
    let g = grad(&loss, &[&x, &unused]).unwrap();
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![0.0; 4]);
    assert_eq!(g[1].to_vec::<f64>().unwrap(), vec![0.0; 3]);
    // A loss that does not read a tensor gives it zeros of its type; the others are right.
    let loss = x.mul(&x).unwrap().sum_all().unwrap();
    let g = grad(&loss, &[&unused, &x]).unwrap();
    assert_eq!(g[0].ty(), unused.ty());
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![0.0; 3]);
    assert_eq!(g[1].to_vec::<f64>().unwrap(), vec![0.6, -1.6, 1.8, 0.2]);
    // The gradient of the loss itself is 1; of an intermediate, its cotangent.
    let h = x.exp().unwrap();
    let loss = h.sum_all().unwrap().mul_scalar(2.0).unwrap();
    let g = grad(&loss, &[&loss, &h]).unwrap();
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![1.0]);
    assert_eq!(g[1].to_vec::<f64>().unwrap(), vec![2.0; 4]);
    // Bad losses are errors naming the problem, never panics.
    let e = grad(&x, &[&x]).unwrap_err().to_string();
    assert!(
        e.contains("one element") && e.contains("grad_composites.rs"),
        "{e}"
    );
    let ints = x.argmax(1).unwrap().sum_all().unwrap();
    let e = grad(&ints, &[&x]).unwrap_err().to_string();
    assert!(e.contains("float"), "{e}");
    let other = device();
    let foreign = other.from_slice(&[1.0f64], &[1]).unwrap();
    assert!(matches!(
        grad(&loss, &[&foreign]),
        Err(neuron_pc::Error::DeviceMismatch { .. })
    ));
}

#[test]
fn ties_follow_the_documented_convention() {
    let dev = device();
    let x = dev.from_slice(&[1.0f64, 3.0, 3.0, 2.0], &[4]).unwrap();
    let c = dev.from_slice(&[1.0f64, 0.0, 5.0, 2.0], &[4]).unwrap();
    // reduce max: tied maxima share the gradient equally
    let g = grad(&x.max(&[0], false).unwrap(), &[&x]).unwrap();
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![0.0, 0.5, 0.5, 0.0]);
    // elementwise max: a tie goes to the left operand
    let loss = x.maximum(&c).unwrap().sum_all().unwrap();
    let g = grad(&loss, &[&x, &c]).unwrap();
    assert_eq!(g[0].to_vec::<f64>().unwrap(), vec![1.0, 1.0, 0.0, 1.0]);
    assert_eq!(g[1].to_vec::<f64>().unwrap(), vec![0.0, 0.0, 1.0, 0.0]);
}
