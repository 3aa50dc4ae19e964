//! The finite-difference gradient check shared by `grad_ops.rs` and `grad_composites.rs`.
//!
//! One line per op, in the spirit of tinygrad's `helper_test_op`: for inputs `x` and an op
//! `f`, the scalar `L = sum(f(x) * W)` with a fixed random `W` (so every entry of the Jacobian
//! counts, not just its column sums) is differentiated by `neuron_pc::grad`, and each gradient
//! entry is compared with `(L(x + h e) - L(x - h e)) / 2h` evaluated on the device in f64.
//!
//! Tolerance: `|analytic - numeric| <= 1e-6 * (1 + |numeric|)` with `h = 1e-6`. In f64 the
//! truncation error is O(h^2) ~ 1e-12 and the rounding error ~ 1e-16 * |L| / h ~ 1e-9, so a
//! wrong rule (off by a factor, a sign, a transpose) is far outside it.
#![allow(dead_code)] // each test binary uses a different part

use std::cell::RefCell;

use neuron_pc::nn::HostRng;
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Result, Tensor};

const H: f64 = 1e-6;
const TOL: f64 = 1e-6;

/// Host values of one differentiable input.
#[derive(Clone, Debug)]
pub struct In {
    pub v: Vec<f64>,
    pub dims: Vec<usize>,
}

pub fn vals(v: &[f64], dims: &[usize]) -> In {
    assert_eq!(v.len(), dims.iter().product::<usize>());
    In {
        v: v.to_vec(),
        dims: dims.to_vec(),
    }
}

/// Every check is a new graph by design: no warm-up, so no recompile warnings.
pub fn device() -> LazyDevice {
    let config = DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        warmup_steps: u64::MAX,
        ..DeviceConfig::default()
    };
    LazyDevice::new(config).expect("cpu device: run scripts/setup")
}

pub struct Check {
    dev: LazyDevice,
    rng: RefCell<HostRng>,
    failures: RefCell<Vec<String>>,
}

impl Check {
    pub fn new(seed: u64) -> Check {
        Check {
            dev: device(),
            rng: RefCell::new(HostRng::new(seed)),
            failures: RefCell::new(Vec::new()),
        }
    }

    /// Uniform in [lo, hi).
    pub fn rand(&self, dims: &[usize], lo: f64, hi: f64) -> In {
        let n = dims.iter().product();
        let mut rng = self.rng.borrow_mut();
        In {
            v: (0..n).map(|_| lo + (hi - lo) * rng.uniform()).collect(),
            dims: dims.to_vec(),
        }
    }

    /// Magnitude uniform in [lo, hi) with a random sign (away from a kink at 0).
    pub fn away(&self, dims: &[usize], lo: f64, hi: f64) -> In {
        let mut x = self.rand(dims, lo, hi);
        let mut rng = self.rng.borrow_mut();
        for v in x.v.iter_mut() {
            if rng.uniform() < 0.5 {
                *v = -*v;
            }
        }
        x
    }

    pub fn f64s(&self, v: &[f64], dims: &[usize]) -> Tensor {
        self.dev.from_slice(v, dims).unwrap()
    }

    pub fn i32s(&self, v: &[i32], dims: &[usize]) -> Tensor {
        self.dev.from_slice(v, dims).unwrap()
    }

    /// Checks `f`'s gradients at `inputs`; failures are collected and reported by `finish`.
    pub fn op(&self, name: &str, inputs: &[In], f: impl Fn(&[Tensor]) -> Result<Tensor>) {
        if let Err(e) = self.run(name, inputs, &f) {
            self.failures.borrow_mut().push(format!("{name}: {e}"));
        }
    }

    fn upload(&self, inputs: &[In]) -> Result<Vec<Tensor>> {
        inputs
            .iter()
            .map(|i| self.dev.from_slice(&i.v, &i.dims))
            .collect()
    }

    fn run(
        &self,
        name: &str,
        inputs: &[In],
        f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
    ) -> anyhow::Result<()> {
        let xs = self.upload(inputs)?;
        let y = f(&xs)?;
        let w_vals = self.rand(y.dims(), -1.0, 1.0);
        let w = self.f64s(&w_vals.v, y.dims());
        let weighted =
            |y: &Tensor| -> Result<Tensor> { y.to_dtype(DType::F64)?.mul(&w)?.sum_all() };
        let loss = weighted(&y)?;
        let refs: Vec<&Tensor> = xs.iter().collect();
        let grads = grad(&loss, &refs)?;
        for (i, (g, x)) in grads.iter().zip(&xs).enumerate() {
            anyhow::ensure!(
                g.ty() == x.ty(),
                "gradient {i} has type {} for an input of {}",
                g.ty(),
                x.ty()
            );
        }
        self.dev.mark_step()?;
        let analytic: Vec<Vec<f64>> = grads
            .iter()
            .map(|g| g.to_vec::<f64>())
            .collect::<Result<_>>()?;

        // Every perturbed evaluation records the same graph: one compile for all of them.
        let compiles = self.dev.metrics().compiles;
        let eval = |vals: &[In]| -> anyhow::Result<f64> {
            Ok(weighted(&f(&self.upload(vals)?)?)?.item()?)
        };
        let mut bad = Vec::new();
        let mut perturbed = inputs.to_vec();
        for (i, input) in inputs.iter().enumerate() {
            for (j, (&x, &a)) in input.v.iter().zip(&analytic[i]).enumerate() {
                perturbed[i].v[j] = x + H;
                let plus = eval(&perturbed)?;
                perturbed[i].v[j] = x - H;
                let minus = eval(&perturbed)?;
                perturbed[i].v[j] = x;
                let numeric = (plus - minus) / (2.0 * H);
                // written so that NaN fails
                let close = (a - numeric).abs() <= TOL * (1.0 + numeric.abs());
                if !close {
                    bad.push(format!(
                        "input {i} element {j}: grad {a:.9} vs finite difference {numeric:.9}"
                    ));
                }
            }
        }
        let fd_compiles = self.dev.metrics().compiles - compiles;
        anyhow::ensure!(
            fd_compiles <= 1,
            "{fd_compiles} compiles for the finite differences of {name}"
        );
        anyhow::ensure!(
            bad.is_empty(),
            "{} of the gradient entries are off:\n    {}",
            bad.len(),
            bad.join("\n    ")
        );
        Ok(())
    }

    pub fn finish(self) {
        let f = self.failures.into_inner();
        assert!(
            f.is_empty(),
            "{} op(s) failed the gradient check:\n{}",
            f.len(),
            f.join("\n")
        );
    }
}
