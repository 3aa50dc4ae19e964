//! Normalisation layers beyond `LayerNorm`: `BatchNorm` (train/eval, running statistics),
//! `GroupNorm` and `RMSNorm`, with PyTorch's parameter names, defaults and formulas.

use neuron_pc_compiler::{DType, HostTensor};

use crate::device::LazyDevice;
use crate::error::Result;
use crate::nn::Module;
use crate::tensor::{shape_error, Tensor};

fn filled(device: &LazyDevice, value: f32, n: usize) -> Result<Tensor> {
    device.tensor(&HostTensor::from_slice(&vec![value; n], &[n])?)
}

/// `[c]` → `[c, 1, ..]` so it broadcasts over a `[n, c, spatial..]` input.
fn per_channel(t: &Tensor, rank: usize) -> Result<Tensor> {
    let mut dims = vec![t.dims()[0]];
    dims.extend(std::iter::repeat_n(1, rank.saturating_sub(2)));
    t.reshape(&dims)
}

/// Batch normalisation over dimension 1 of `[n, c]`, `[n, c, l]` or `[n, c, h, w]`, as
/// `torch.nn.BatchNorm1d/2d`: in training it normalises with the batch's mean and biased
/// variance and moves the running statistics by `momentum` (the running variance takes the
/// unbiased batch variance); in evaluation it uses the running statistics.
///
/// The running statistics are buffers, not parameters: [`Module::named_params`] lists only
/// `weight` and `bias` (so optimisers never update the statistics), and
/// [`Module::named_buffers`] the statistics, which `state::module_state` and
/// `state::load_module` save and load with the parameters, as PyTorch's `state_dict()` does.
#[derive(Module)]
pub struct BatchNorm {
    /// `[c]`, the per-channel scale.
    pub weight: Tensor,
    /// `[c]`, the per-channel shift.
    pub bias: Tensor,
    /// The running mean `[c]` (initially 0). `running_mean`, `running_var`,
    /// `num_batches_tracked`: buffers, as PyTorch names them.
    #[module(buffer)]
    pub running_mean: Tensor,
    /// The running (unbiased) variance `[c]` (initially 1).
    #[module(buffer)]
    pub running_var: Tensor,
    /// Training steps taken (i64 scalar, PyTorch's `num_batches_tracked`).
    #[module(buffer)]
    pub num_batches_tracked: Tensor,
    /// Added to the variance before the square root (default 1e-5).
    #[module(skip)]
    pub eps: f64,
    /// Weight of the batch's statistics in each running-statistics update (default 0.1).
    #[module(skip)]
    pub momentum: f64,
    /// `model.train()` / `model.eval()`.
    #[module(skip)]
    pub training: bool,
}

impl BatchNorm {
    /// Weight 1, bias 0, running mean 0 and variance 1, `eps = 1e-5`, `momentum = 0.1`, training.
    pub fn new(device: &LazyDevice, channels: usize) -> Result<BatchNorm> {
        Ok(BatchNorm {
            weight: filled(device, 1.0, channels)?,
            bias: filled(device, 0.0, channels)?,
            running_mean: filled(device, 0.0, channels)?,
            running_var: filled(device, 1.0, channels)?,
            num_batches_tracked: device.tensor(&HostTensor::zeros(DType::I64, &[]))?,
            eps: 1e-5,
            momentum: 0.1,
            training: true,
        })
    }

    /// Normalises `x`; in training this also records the running-statistics update (it lands
    /// in the same step graph).
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let location = std::panic::Location::caller();
        let c = self.weight.dims()[0];
        if x.rank() < 2 || x.dims()[1] != c {
            return Err(shape_error(
                "batch_norm",
                x.ty().to_string(),
                format!("expected [n, {c}, ..] (channels in dimension 1)"),
                location,
            ));
        }
        let rank = x.rank();
        let (mean, var) = if self.training {
            let dims: Vec<isize> = (0..rank as isize).filter(|&d| d != 1).collect();
            let count: usize = x.elem_count() / c;
            if count < 2 {
                return Err(shape_error(
                    "batch_norm",
                    x.ty().to_string(),
                    "training needs more than one value per channel".into(),
                    location,
                ));
            }
            let mean = x.mean(&dims, false)?;
            let var = x.var(&dims, 0, false)?;
            let m = self.momentum;
            let unbiased = var.mul_scalar(count as f64 / (count - 1) as f64)?;
            let dt = self.running_mean.dtype();
            let new_mean = self
                .running_mean
                .mul_scalar(1.0 - m)?
                .add(&mean.detach()?.to_dtype(dt)?.mul_scalar(m)?)?;
            let new_var = self
                .running_var
                .mul_scalar(1.0 - m)?
                .add(&unbiased.detach()?.to_dtype(dt)?.mul_scalar(m)?)?;
            self.running_mean.assign(&new_mean)?;
            self.running_var.assign(&new_var)?;
            let tracked = &self.num_batches_tracked;
            tracked.assign(&tracked.add(&tracked.constant_like(1.0)?)?)?;
            (mean, var)
        } else {
            (self.running_mean.clone(), self.running_var.clone())
        };
        let scale = var.add_scalar(self.eps)?.rsqrt()?;
        let normed = x
            .sub(&per_channel(&mean, rank)?)?
            .mul(&per_channel(&scale, rank)?)?;
        normed
            .mul(&per_channel(&self.weight, rank)?)?
            .add(&per_channel(&self.bias, rank)?)
    }
}

/// Group normalisation of `[n, c, ..]` as `torch.nn.GroupNorm`: the channels split into
/// `groups` groups, each normalised over its channels and spatial positions (biased variance),
/// then a per-channel affine transform (weight 1, bias 0).
#[derive(Module)]
pub struct GroupNorm {
    /// Number of groups the channels are split into.
    #[module(skip)]
    pub groups: usize,
    /// `[c]`, the per-channel scale.
    pub weight: Tensor,
    /// `[c]`, the per-channel shift.
    pub bias: Tensor,
    /// Added to the variance before the square root (default 1e-5).
    #[module(skip)]
    pub eps: f64,
}

impl GroupNorm {
    /// `torch.nn.GroupNorm(groups, channels)`: weight 1, bias 0, `eps = 1e-5`; `groups` must
    /// divide `channels`.
    pub fn new(device: &LazyDevice, groups: usize, channels: usize) -> Result<GroupNorm> {
        if groups == 0 || !channels.is_multiple_of(groups) {
            return Err(crate::Error::Config(format!(
                "GroupNorm: {groups} groups must divide {channels} channels"
            )));
        }
        Ok(GroupNorm {
            groups,
            weight: filled(device, 1.0, channels)?,
            bias: filled(device, 0.0, channels)?,
            eps: 1e-5,
        })
    }

    /// Normalises `x [n, c, ..]` group by group; the same shape.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let location = std::panic::Location::caller();
        let c = self.weight.dims()[0];
        if x.rank() < 2 || x.dims()[1] != c {
            return Err(shape_error(
                "group_norm",
                x.ty().to_string(),
                format!("expected [n, {c}, ..] (channels in dimension 1)"),
                location,
            ));
        }
        let n = x.dims()[0];
        let grouped = x.reshape(&[n, self.groups, x.elem_count() / (n * self.groups)])?;
        let mean = grouped.mean(&[-1], true)?;
        let var = grouped.var(&[-1], 0, true)?;
        let normed = grouped
            .sub(&mean)?
            .mul(&var.add_scalar(self.eps)?.rsqrt()?)?
            .reshape(x.dims())?;
        normed
            .mul(&per_channel(&self.weight, x.rank())?)?
            .add(&per_channel(&self.bias, x.rank())?)
    }
}

/// Root-mean-square normalisation over the last dimension, as `torch.nn.RMSNorm`:
/// `x / sqrt(mean(x^2) + eps) * weight` (weight 1). PyTorch's default `eps` is the machine
/// epsilon of the input's dtype; `eps: None` does the same.
#[derive(Module)]
pub struct RMSNorm {
    /// `[dim]`, the per-feature scale.
    pub weight: Tensor,
    /// Added to the mean square; `None` takes the machine epsilon of the input's dtype.
    #[module(skip)]
    pub eps: Option<f64>,
}

impl RMSNorm {
    /// PyTorch's default: `eps` is the machine epsilon of the input's dtype.
    pub fn new(device: &LazyDevice, dim: usize) -> Result<RMSNorm> {
        Ok(RMSNorm {
            weight: filled(device, 1.0, dim)?,
            eps: None,
        })
    }

    /// `torch.nn.RMSNorm(dim, eps=eps)`; Llama configs give `rms_norm_eps` (1e-5 or 1e-6).
    pub fn with_eps(device: &LazyDevice, dim: usize, eps: f64) -> Result<RMSNorm> {
        Ok(RMSNorm {
            weight: filled(device, 1.0, dim)?,
            eps: Some(eps),
        })
    }

    /// `weight [dim]` under `vb`'s prefix (1 with no checkpoint); `eps` as the field.
    pub fn from_vb(vb: &super::VarBuilder, dim: usize, eps: Option<f64>) -> Result<RMSNorm> {
        Ok(RMSNorm {
            weight: vb.get(&[dim], "weight", super::Init::Const(1.0))?,
            eps,
        })
    }

    /// `x [.., dim]` normalised over its last dimension and scaled by `weight`; the same
    /// shape.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        super::check_last_dim("rms_norm", x, &self.weight)?;
        let eps = self.eps.unwrap_or(match x.dtype() {
            DType::F64 => f64::EPSILON,
            DType::F16 => 0.000_976_562_5,
            DType::BF16 => 0.007_812_5,
            _ => f32::EPSILON as f64,
        });
        let ms = x.mul(x)?.mean(&[-1], true)?;
        x.mul(&ms.add_scalar(eps)?.rsqrt()?)?.mul(&self.weight)
    }
}
