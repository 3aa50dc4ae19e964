//! Gradients of the layers added for PyTorch users (BatchNorm, GroupNorm, RMSNorm, causal
//! attention, cross-entropy with ignore_index and label smoothing) against central finite
//! differences in f64 (the check: `grad_check/mod.rs`).

use crate::grad_check;

use grad_check::Check;
use neuron_pc::nn::{
    cross_entropy_with, BatchNorm, CrossEntropyOptions, GroupNorm, Linear, MultiHeadAttention,
    RMSNorm,
};

#[test]
fn layer_gradients() {
    let c = Check::new(41);
    let ch = 3;
    let stats = (
        c.f64s(&[0.1, -0.2, 0.3], &[ch]),
        c.f64s(&[1.0, 1.5, 0.5], &[ch]),
        c.i32s(&[0], &[]),
    );
    for training in [true, false] {
        c.op(
            &format!("batch norm, training {training}"),
            &[
                c.rand(&[4, ch, 2], -1.0, 1.0),
                c.rand(&[ch], 0.5, 1.5),
                c.rand(&[ch], -0.5, 0.5),
            ],
            |x| {
                BatchNorm {
                    weight: x[1].clone(),
                    bias: x[2].clone(),
                    running_mean: stats.0.clone(),
                    running_var: stats.1.clone(),
                    num_batches_tracked: stats.2.clone(),
                    eps: 1e-5,
                    momentum: 0.1,
                    training,
                }
                .forward(&x[0])
            },
        );
    }
    c.op(
        "group norm",
        &[
            c.rand(&[2, 4, 3], -1.0, 1.0),
            c.rand(&[4], 0.5, 1.5),
            c.rand(&[4], -0.5, 0.5),
        ],
        |x| {
            GroupNorm {
                groups: 2,
                weight: x[1].clone(),
                bias: x[2].clone(),
                eps: 1e-5,
            }
            .forward(&x[0])
        },
    );
    c.op(
        "rms norm",
        &[c.rand(&[2, 5], -1.0, 1.0), c.rand(&[5], 0.5, 1.5)],
        |x| {
            RMSNorm {
                weight: x[1].clone(),
                eps: Some(1e-6),
            }
            .forward(&x[0])
        },
    );
    let (e, s) = (4, 3);
    c.op(
        "causal multi-head attention",
        &[
            c.rand(&[1, s, e], -1.0, 1.0),
            c.rand(&[3 * e, e], -0.7, 0.7),
            c.rand(&[3 * e], -0.2, 0.2),
            c.rand(&[e, e], -0.7, 0.7),
            c.rand(&[e], -0.2, 0.2),
        ],
        |x| {
            MultiHeadAttention {
                in_proj_weight: x[1].clone(),
                in_proj_bias: x[2].clone(),
                out_proj: Linear {
                    weight: x[3].clone(),
                    bias: Some(x[4].clone()),
                },
                heads: 2,
            }
            .forward_with(&x[0], None, true)
        },
    );
    let labels = c.i32s(&[2, -1, 0, 3], &[4]);
    let options = CrossEntropyOptions {
        ignore_index: Some(-1),
        label_smoothing: 0.2,
    };
    c.op(
        "cross entropy, ignore_index + smoothing",
        &[c.rand(&[4, 5], -2.0, 2.0)],
        |x| cross_entropy_with(&x[0], &labels, options),
    );
    c.finish();
}

#[test]
fn conv_layer_shapes_and_init() {
    use neuron_pc::nn::{Conv2d, ConvConfig, HostRng, Module};
    let dev = grad_check::device();
    let mut rng = HostRng::new(3);
    let mut config = ConvConfig::new(4, 6, [3, 3]);
    config.groups = 2;
    config.padding = [1, 1];
    let conv = Conv2d::new(&dev, &mut rng, config).unwrap();
    assert_eq!(conv.weight.dims(), &[6, 2, 3, 3]);
    let names: Vec<String> = conv.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, vec!["weight", "bias"]);
    // uniform in ±1/sqrt(fan_in), fan_in = 2 * 9
    let bound = 1.0 / 18f64.sqrt();
    let w = conv.weight.to_host().unwrap().to_f64_vec();
    assert!(w.iter().all(|v| v.abs() <= bound));
    assert!(w.iter().any(|v| v.abs() > bound * 0.8));
    let x = dev.zeros(&[2, 4, 5, 5], neuron_pc::DType::F32).unwrap();
    let y = conv.forward(&x).unwrap();
    assert_eq!(y.dims(), &[2, 6, 5, 5]);
    // zero input: every output is the bias of its channel
    let b = conv.bias.as_ref().unwrap().to_vec::<f32>().unwrap();
    let got = y.to_vec::<f32>().unwrap();
    for (i, v) in got.iter().enumerate() {
        assert_eq!(*v, b[(i / 25) % 6]);
    }
    let mut bad = ConvConfig::new(4, 6, [3, 3]);
    bad.groups = 4;
    assert!(Conv2d::new(&dev, &mut rng, bad).is_err());
}
