//! The PyTorch fixture of `torch_llm_blocks.rs` (the pattern of `torch_layers.rs`): a safetensors
//! file written by a script under `scripts/fixtures/`, holding per case the inputs, PyTorch's
//! output `out`, a cotangent `cot` and PyTorch's gradients `grad.<input>` of `sum(out * cot)`.
//!
//! Tolerances (float32): outputs `1e-5 + 1e-4 |torch|`; gradients `1e-4 |torch|` plus `2e-5`
//! of the largest entry of that gradient (a small entry is a difference of larger terms and
//! carries their rounding).
#![allow(dead_code)] // each test binary uses a different part

use std::path::Path;

use neuron_pc::state_dict::StateDict;
use neuron_pc::{grad, DeviceConfig, LazyDevice, Result, Tensor};

pub struct Fixture {
    pub dev: LazyDevice,
    pub sd: StateDict,
}

impl Fixture {
    /// `tests/data/torch/<name>.safetensors`.
    pub fn load(name: &str) -> Fixture {
        let config = DeviceConfig {
            cache: neuron_pc::compile::CacheConfig::disabled(),
            // every case is a new graph by design
            warmup_steps: u64::MAX,
            ..DeviceConfig::default()
        };
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/data/torch/{name}.safetensors"));
        Fixture {
            dev: LazyDevice::new(config).expect("cpu device: run scripts/setup"),
            sd: StateDict::load(&path)
                .unwrap_or_else(|e| panic!("fixture {name}: run scripts/fixtures/{name}.py: {e}")),
        }
    }

    pub fn host(&self, name: &str) -> &neuron_pc::HostTensor {
        self.sd
            .tensors
            .get(name)
            .unwrap_or_else(|| panic!("fixture has no {name}"))
    }

    pub fn tensor(&self, name: &str) -> Tensor {
        self.dev.tensor(self.host(name)).unwrap()
    }

    /// Feeds `prefix.<input>` for each input to `f`, then checks `prefix.out` and
    /// `prefix.grad.<input>`.
    pub fn check(&self, prefix: &str, inputs: &[&str], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
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

    pub fn compare(&self, name: &str, got: &Tensor, atol: f64, of_largest: bool) {
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
