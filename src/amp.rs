//! Loss scaling for float16 training, like `torch.amp.GradScaler`.
//!
//! Small gradients underflow in float16 (below 6e-8 they become 0). The scaler multiplies the
//! loss by a large factor before differentiation, divides the gradients by it afterwards, and
//! adapts the factor: on any inf/NaN gradient the step is skipped and the scale backs off; after
//! `growth_interval` clean steps it grows.
//!
//! ```no_run
//! # use neuron_pc::{amp::GradScaler, grad, LazyDevice, Tensor};
//! # fn step(device: &LazyDevice, loss: &Tensor, params: &[Tensor],
//! #         mut apply: impl FnMut(&[Tensor]) -> neuron_pc::Result<()>) -> neuron_pc::Result<()> {
//! let mut scaler = GradScaler::new(device);
//! let scaled = scaler.scale(loss)?;
//! let refs: Vec<&Tensor> = params.iter().collect();
//! let mut grads = grad(&scaled, &refs)?;
//! let found_inf = scaler.unscale(&mut grads)?;
//! if scaler.update(&found_inf)? {
//!     apply(&grads)?; // the optimizer step
//! }
//! device.mark_step()?;
//! # Ok(()) }
//! ```
//!
//! `update` reads one flag from the device (a sync, as `GradScaler.step` does in PyTorch): the
//! forward and backward pass run as one graph and the optimizer step as another.

use neuron_pc_compiler::DType;

use crate::device::LazyDevice;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// A dynamic loss scaler (PyTorch's defaults: scale 2^16, growth ×2 every 2000 clean steps,
/// backoff ×0.5).
pub struct GradScaler {
    device: LazyDevice,
    scale: f64,
    /// What the scale is multiplied by after `growth_interval` clean steps (default 2).
    pub growth_factor: f64,
    /// What the scale is multiplied by when a step's gradients overflow (default 0.5).
    pub backoff_factor: f64,
    /// Clean steps (no inf/NaN gradient) in a row before the scale grows (default 2000).
    pub growth_interval: u64,
    clean_steps: u64,
}

impl GradScaler {
    /// A scaler on `device` with PyTorch's initial scale, 2^16 (`init_scale=65536.0`).
    pub fn new(device: &LazyDevice) -> GradScaler {
        GradScaler::with_scale(device, 65536.0)
    }

    /// A scaler on `device` starting from `scale`, with the default growth and backoff.
    pub fn with_scale(device: &LazyDevice, scale: f64) -> GradScaler {
        GradScaler {
            device: device.clone(),
            scale,
            growth_factor: 2.0,
            backoff_factor: 0.5,
            growth_interval: 2000,
            clean_steps: 0,
        }
    }

    /// The current scale.
    pub fn scale_value(&self) -> f64 {
        self.scale
    }

    /// `loss × scale`, at least in float32 (as in PyTorch, where the float32 scale promotes a
    /// float16 loss: 2^16 itself does not fit float16). The scale enters as device data, so
    /// changing it keeps the graph.
    #[track_caller]
    pub fn scale(&self, loss: &Tensor) -> Result<Tensor> {
        let s = self.device.scalar(self.scale, DType::F32)?;
        loss.mul(&s)
    }

    /// Divides every gradient by the scale (in float32, then back to the gradient's dtype) and
    /// returns a pred scalar that is true when any gradient holds an inf or a NaN.
    #[track_caller]
    pub fn unscale(&self, grads: &mut [Tensor]) -> Result<Tensor> {
        let inv = self.device.scalar(1.0 / self.scale, DType::F32)?;
        let mut bad = self.device.scalar(0.0, DType::F32)?;
        for g in grads.iter_mut() {
            let dtype = g.dtype();
            let un = g.to_dtype(DType::F32)?.mul(&inv)?;
            // x - x is 0 for finite x and NaN for inf or NaN; NaN != NaN
            let diff = un.sub(&un)?;
            let nonfinite = diff.ne(&diff)?.to_dtype(DType::F32)?.sum_all()?;
            bad = bad.add(&nonfinite)?;
            *g = un.to_dtype(dtype)?;
        }
        bad.gt(&bad.zeros_like()?)
    }

    /// Reads `found_inf` and adapts the scale. Returns whether the optimizer step should run
    /// (false: the gradients overflowed, skip the step; the scale has backed off).
    #[track_caller]
    pub fn update(&mut self, found_inf: &Tensor) -> Result<bool> {
        if found_inf.item()? != 0.0 {
            self.scale *= self.backoff_factor;
            self.clean_steps = 0;
            return Ok(false);
        }
        self.clean_steps += 1;
        if self.clean_steps >= self.growth_interval {
            self.scale *= self.growth_factor;
            self.clean_steps = 0;
        }
        Ok(true)
    }
}

/// What a training step computes its matrix products in: float32, or bf16 over float32 master
/// weights (`LazyDevice::autocast`; NxD's "standard mixed precision"). Parses from `f32` /
/// `float32` and `bf16` / `bfloat16`, as a `--precision` flag takes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Float32 throughout (the default).
    #[default]
    F32,
    /// Matrix products autocast to bfloat16, the parameters kept in float32.
    Bf16,
}

impl Precision {
    /// The dtype to autocast the products to (`None`: float32 throughout).
    pub fn autocast(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::Bf16 => Some(DType::BF16),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        })
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Precision> {
        match s {
            "f32" | "float32" => Ok(Precision::F32),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            other => Err(Error::Config(format!(
                "precision {other:?}: use f32 or bf16"
            ))),
        }
    }
}
