//! The layers PyTorch users reach for (conv1d/conv2d with groups and dilation, pooling,
//! BatchNorm, GroupNorm, RMSNorm, causal multi-head attention, cross-entropy with ignore_index
//! and label smoothing) against values PyTorch computed: `tests/data/torch/layers.safetensors`,
//! written by `scripts/fixtures/layers.py`. Each case compares the output and the gradients of
//! `sum(out * cot)` for every input and parameter.
//!
//! Tolerances (float32): outputs `1e-5 + 1e-4 |torch|`; gradients `1e-4 |torch|` plus `2e-5`
//! of the largest entry of that gradient (a small entry is a difference of larger terms and
//! carries their rounding). XLA reorders sums, so a few ulps of difference are expected; a
//! wrong formula (biased vs unbiased variance, a missing mask, a transposed kernel) is off by
//! far more.

use std::path::Path;

use neuron_pc::nn::Module;
use neuron_pc::nn::{
    cross_entropy_with, BatchNorm, CrossEntropyOptions, GroupNorm, Linear, MultiHeadAttention,
    RMSNorm,
};
use neuron_pc::state_dict::StateDict;
use neuron_pc::{grad, state, DeviceConfig, LazyDevice, Result, Tensor};

struct Fixture {
    dev: LazyDevice,
    sd: StateDict,
}

impl Fixture {
    fn load() -> Fixture {
        let config = DeviceConfig {
            cache: neuron_pc::compile::CacheConfig::disabled(),
            // every case is a new graph by design
            warmup_steps: u64::MAX,
            ..DeviceConfig::default()
        };
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/torch/layers.safetensors");
        Fixture {
            dev: LazyDevice::new(config).expect("cpu device: run scripts/setup"),
            sd: StateDict::load(&path).expect("fixture: run scripts/fixtures/layers.py"),
        }
    }

    fn host(&self, name: &str) -> &neuron_pc::HostTensor {
        self.sd
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("fixture has no {name}"))
    }

    fn tensor(&self, name: &str) -> Tensor {
        self.dev.tensor(self.host(name)).unwrap()
    }

    /// Feeds `prefix.<input>` for each input to `f`, then checks `prefix.out` and
    /// `prefix.grad.<input>`.
    fn check(&self, prefix: &str, inputs: &[&str], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
        let xs: Vec<Tensor> = inputs
            .iter()
            .map(|i| self.tensor(&format!("{prefix}.{i}")))
            .collect();
        let out = f(&xs).unwrap();
        let cot = self.tensor(&format!("{prefix}.cot"));
        let loss = out.mul(&cot).unwrap().sum_all().unwrap();
        let refs: Vec<&Tensor> = xs.iter().collect();
        let grads = grad(&loss, &refs).unwrap();
        self.dev.mark_step().unwrap();
        self.compare(&format!("{prefix}.out"), &out, 1e-5, false);
        for (name, g) in inputs.iter().zip(&grads) {
            self.compare(&format!("{prefix}.grad.{name}"), g, 2e-5, true);
        }
    }

    fn compare(&self, name: &str, got: &Tensor, atol: f64, of_largest: bool) {
        let want = self.host(name);
        assert_eq!(got.dims(), want.dims(), "{name}: shape");
        let want = want.to_f64_vec();
        let got = got.to_host().unwrap().to_f64_vec();
        let largest = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let atol = if of_largest {
            atol * largest.max(1e-3)
        } else {
            atol
        };
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() - 1e-4 * w.abs())
            .fold(f64::NEG_INFINITY, f64::max);
        assert!(
            worst <= atol,
            "{name}: off by {worst:e} beyond the tolerance {atol:e}\n got {got:?}\nwant {want:?}"
        );
    }
}

#[test]
fn conv_and_pooling_match_pytorch() {
    let fx = Fixture::load();
    fx.check("conv1d", &["x", "weight", "bias"], |x| {
        x[0].conv1d(&x[1], Some(&x[2]), 2, 1, 2, 2)
    });
    fx.check("conv2d", &["x", "weight", "bias"], |x| {
        x[0].conv2d(&x[1], Some(&x[2]), [2, 1], [1, 2], [1, 2], 2)
    });
    fx.check("maxpool2d", &["x"], |x| {
        x[0].max_pool2d([3, 2], [2, 1], [1, 1])
    });
    fx.check("avgpool2d", &["x"], |x| {
        x[0].avg_pool2d([2, 3], [2, 2], [1, 1])
    });
}

#[test]
fn norms_match_pytorch() {
    let fx = Fixture::load();
    let dev = &fx.dev;
    let bn = BatchNorm::new(dev, 3).unwrap();
    fx.check("batchnorm", &["x", "weight", "bias"], |x| {
        BatchNorm {
            weight: x[1].clone(),
            bias: x[2].clone(),
            running_mean: bn.running_mean.clone(),
            running_var: bn.running_var.clone(),
            num_batches_tracked: bn.num_batches_tracked.clone(),
            eps: 1e-5,
            momentum: 0.1,
            training: true,
        }
        .forward(&x[0])
    });
    // the training step moved the running statistics as PyTorch's did
    fx.compare("batchnorm.running_mean", &bn.running_mean, 1e-6, false);
    fx.compare("batchnorm.running_var", &bn.running_var, 1e-6, false);
    let eval = BatchNorm {
        weight: fx.tensor("batchnorm.weight"),
        bias: fx.tensor("batchnorm.bias"),
        running_mean: bn.running_mean.clone(),
        running_var: bn.running_var.clone(),
        num_batches_tracked: bn.num_batches_tracked.clone(),
        eps: 1e-5,
        momentum: 0.1,
        training: false,
    };
    let y = eval.forward(&fx.tensor("batchnorm.eval.x")).unwrap();
    fx.compare("batchnorm.eval.out", &y, 1e-5, false);
    // evaluation leaves the running statistics alone
    fx.compare("batchnorm.running_mean", &eval.running_mean, 1e-6, false);

    // the statistics are buffers: saved and loaded with PyTorch's state_dict() names, never
    // handed to an optimiser
    let names = |v: Vec<(String, Tensor)>| v.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(names(bn.parameters()), ["weight", "bias"]);
    let sd = state::module_state(&bn).unwrap();
    assert_eq!(
        sd.tensors.keys().collect::<Vec<_>>(),
        [
            "bias",
            "num_batches_tracked",
            "running_mean",
            "running_var",
            "weight"
        ]
    );
    assert_eq!(
        sd.tensors["num_batches_tracked"].to_vec::<i64>().unwrap(),
        [1]
    );
    let fresh = BatchNorm::new(dev, 3).unwrap();
    state::load_module(&fresh, &sd, Path::new("bn.safetensors")).unwrap();
    fx.compare("batchnorm.running_var", &fresh.running_var, 1e-6, false);
    assert_eq!(fresh.num_batches_tracked.to_vec::<i64>().unwrap(), [1]);

    fx.check("groupnorm", &["x", "weight", "bias"], |x| {
        GroupNorm {
            groups: 3,
            weight: x[1].clone(),
            bias: x[2].clone(),
            eps: 1e-5,
        }
        .forward(&x[0])
    });
    fx.check("rmsnorm", &["x", "weight"], |x| {
        RMSNorm {
            weight: x[1].clone(),
            eps: None,
        }
        .forward(&x[0])
    });
    assert!(BatchNorm::new(dev, 4)
        .unwrap()
        .forward(&fx.tensor("batchnorm.x"))
        .unwrap_err()
        .to_string()
        .contains("[n, 4, ..]"));
    assert!(GroupNorm::new(dev, 4, 6).is_err());
}

#[test]
fn causal_attention_matches_pytorch() {
    let fx = Fixture::load();
    let names = [
        "x",
        "in_proj_weight",
        "in_proj_bias",
        "out_proj.weight",
        "out_proj.bias",
    ];
    fx.check("mha", &names, |x| {
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
    });
}

#[test]
fn cross_entropy_options_match_pytorch() {
    let fx = Fixture::load();
    let labels = fx.tensor("xent.labels");
    let options = CrossEntropyOptions {
        ignore_index: Some(-100),
        label_smoothing: 0.1,
    };
    fx.check("xent", &["logits"], |x| {
        cross_entropy_with(&x[0], &labels, options)
    });
    // bad options and labels are errors, not panics
    let logits = fx.tensor("xent.logits");
    let smoothing = CrossEntropyOptions {
        label_smoothing: 1.5,
        ..options
    };
    assert!(cross_entropy_with(&logits, &labels, smoothing).is_err());
    let float_labels = labels.to_dtype(neuron_pc::DType::F32).unwrap();
    let e = cross_entropy_with(&logits, &float_labels, options)
        .unwrap_err()
        .to_string();
    assert!(e.contains("integer dtype, got f32"), "{e}");
    assert!(cross_entropy_with(&labels, &labels, options).is_err());
}
