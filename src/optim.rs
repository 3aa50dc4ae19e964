//! Optimizers whose state lives on the device and is updated inside the step graph. Values that
//! change every step (learning rate, step count) are device scalars, never graph constants, so a
//! whole training run uses one step graph.

use std::panic::Location;

use neuron_pc_compiler::{DType, HostTensor};

use crate::device::LazyDevice;
use crate::error::Result;
use crate::tensor::Tensor;

/// Learning rate with linear warm-up then cosine decay to `min_lr` at `total_steps`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupCosine {
    pub base_lr: f64,
    pub min_lr: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
}

impl WarmupCosine {
    /// The rate for (0-based) `step`.
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.base_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
        self.min_lr
            + 0.5 * (self.base_lr - self.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// Gradients combined in one all-reduce at most (PyTorch DDP's default bucket size).
pub const BUCKET_BYTES: usize = 25 << 20;

/// Averages each replica's gradients over every replica, inside the step graph: what PyTorch's
/// `DistributedDataParallel` does during backward. Call it between `grad` and the optimizer.
/// With per-replica losses (each replica's mean over its shard of the batch), the result is the
/// gradient of the mean loss over the global batch, the same on every replica.
///
/// Gradients of one dtype are flattened into buckets of at most [`BUCKET_BYTES`] and each
/// bucket is all-reduced once. Replicated gradients pass through; on one device nothing is
/// recorded.
#[track_caller]
pub fn average_gradients(grads: &[Tensor]) -> Result<Vec<Tensor>> {
    let location = Location::caller();
    let mut out: Vec<Tensor> = grads.to_vec();
    let Some(first) = grads.first() else {
        return Ok(out);
    };
    if first.device()?.replicas() == 1 {
        return Ok(out);
    }
    // Buckets of gradient indices, by dtype, in order.
    let mut buckets: Vec<(DType, usize, Vec<usize>)> = Vec::new();
    for (i, g) in grads.iter().enumerate() {
        if !g.is_per_replica() {
            continue;
        }
        let bytes = g.elem_count() * g.dtype().size_in_bytes();
        match buckets
            .iter_mut()
            .rev()
            .find(|(d, used, _)| *d == g.dtype() && used + bytes <= BUCKET_BYTES)
        {
            Some((_, used, members)) => {
                *used += bytes;
                members.push(i);
            }
            None => buckets.push((g.dtype(), bytes, vec![i])),
        }
    }
    for (_, _, members) in buckets {
        if let [i] = members[..] {
            out[i] = grads[i].all_reduce_at_mean(location)?;
            continue;
        }
        let flat: Vec<Tensor> = members
            .iter()
            .map(|&i| grads[i].reshape(&[grads[i].elem_count()]))
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = flat.iter().collect();
        let averaged = Tensor::cat(&refs, 0)?.all_reduce_at_mean(location)?;
        let sizes: Vec<usize> = flat.iter().map(Tensor::elem_count).collect();
        for (&i, part) in members.iter().zip(averaged.split_sizes(&sizes, 0)?) {
            out[i] = part.reshape(grads[i].dims())?;
        }
    }
    Ok(out)
}

/// Scales `grads` so their global L2 norm is at most `max_norm` (in-graph); returns the norm
/// before clipping. On a data-parallel device, clip after [`average_gradients`]: the averaged
/// gradients are the global gradient, so the norm is the global norm on every replica (clipping
/// per-replica gradients would scale each replica by its own norm).
#[track_caller]
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f64) -> Result<Tensor> {
    let mut total: Option<Tensor> = None;
    for g in grads.iter() {
        let s = g.mul(g)?.sum_all()?;
        total = Some(match total {
            Some(t) => t.add(&s)?,
            None => s,
        });
    }
    let Some(total) = total else {
        return Err(crate::Error::Config("clip_grad_norm: no gradients".into()));
    };
    let norm = total.sqrt()?;
    // scale = min(1, max_norm / (norm + 1e-6)), as torch.nn.utils.clip_grad_norm_
    let scale = norm
        .add_scalar(1e-6)?
        .powf(-1.0)?
        .mul_scalar(max_norm)?
        .minimum(&norm.constant_like(1.0)?)?;
    for g in grads.iter_mut() {
        *g = g.mul(&scale)?;
    }
    Ok(norm)
}

/// An optimizer whose state can be saved and restored (see [`crate::state`]).
pub trait OptimizerState {
    /// The state tensors under PyTorch-like names (`<param name>.<slot>`), for parameters named
    /// `param_names` in the order the optimizer was made for; shared with the optimizer, so
    /// assigning to them restores its state.
    fn named_state(&self, param_names: &[String]) -> Vec<(String, Tensor)>;
}

/// AdamW as in `torch.optim.AdamW` (decoupled weight decay, bias-corrected moments).
pub struct AdamW {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// `exp_avg` and `exp_avg_sq` per parameter, on the device.
    pub exp_avg: Vec<Tensor>,
    pub exp_avg_sq: Vec<Tensor>,
    /// Steps taken so far (a device scalar, f32).
    pub step: Tensor,
}

impl AdamW {
    /// Zero moments for `params` (PyTorch defaults: betas 0.9/0.999, eps 1e-8).
    pub fn new(device: &LazyDevice, params: &[Tensor], weight_decay: f64) -> Result<AdamW> {
        let zeros = |p: &Tensor| device.tensor(&HostTensor::zeros(p.dtype(), p.dims()));
        let named = |p: &Tensor, what: &str| -> Result<Tensor> {
            let t = zeros(p)?;
            if let Some(n) = p.name() {
                t.set_name(&format!("optimizer.{n}.{what}"));
            }
            Ok(t)
        };
        Ok(AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            exp_avg: params
                .iter()
                .map(|p| named(p, "exp_avg"))
                .collect::<Result<_>>()?,
            exp_avg_sq: params
                .iter()
                .map(|p| named(p, "exp_avg_sq"))
                .collect::<Result<_>>()?,
            step: device.scalar(0.0, DType::F32)?,
        })
    }

    /// Records one update of `params` with `grads` at learning rate `lr` (a device scalar).
    #[track_caller]
    pub fn step(&mut self, params: &[Tensor], grads: &[Tensor], lr: &Tensor) -> Result<()> {
        let t = self.step.add_scalar(1.0)?;
        // bias corrections 1 - beta^t, computed on the device from the step count
        let bc1 = t
            .constant_like(self.beta1)?
            .pow(&t)?
            .neg()?
            .add_scalar(1.0)?;
        let bc2 = t
            .constant_like(self.beta2)?
            .pow(&t)?
            .neg()?
            .add_scalar(1.0)?;
        let step_size = lr.div(&bc1)?;
        let bc2_sqrt = bc2.sqrt()?;
        let decay = lr.mul_scalar(-self.weight_decay)?.add_scalar(1.0)?;
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let m = self.exp_avg[i]
                .mul_scalar(self.beta1)?
                .add(&g.mul_scalar(1.0 - self.beta1)?)?;
            let v = self.exp_avg_sq[i]
                .mul_scalar(self.beta2)?
                .add(&g.mul(g)?.mul_scalar(1.0 - self.beta2)?)?;
            let denom = v.sqrt()?.div(&bc2_sqrt)?.add_scalar(self.eps)?;
            let updated = p.mul(&decay)?.sub(&m.div(&denom)?.mul(&step_size)?)?;
            p.assign(&updated)?;
            self.exp_avg[i].assign(&m)?;
            self.exp_avg_sq[i].assign(&v)?;
        }
        self.step.assign(&t)
    }

    /// State tensors under PyTorch-like names (`<param>.exp_avg`, `<param>.exp_avg_sq`).
    pub fn named_state(&self, param_names: &[String]) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, name) in param_names.iter().enumerate() {
            out.push((format!("{name}.exp_avg"), self.exp_avg[i].clone()));
            out.push((format!("{name}.exp_avg_sq"), self.exp_avg_sq[i].clone()));
        }
        out.push(("step".to_string(), self.step.clone()));
        out
    }
}

impl OptimizerState for AdamW {
    fn named_state(&self, param_names: &[String]) -> Vec<(String, Tensor)> {
        AdamW::named_state(self, param_names)
    }
}

/// SGD with momentum and (coupled) weight decay, as `torch.optim.SGD` with dampening 0.
pub struct Sgd {
    pub momentum: f64,
    pub weight_decay: f64,
    pub momentum_buffer: Vec<Tensor>,
}

impl Sgd {
    pub fn new(
        device: &LazyDevice,
        params: &[Tensor],
        momentum: f64,
        weight_decay: f64,
    ) -> Result<Sgd> {
        let momentum_buffer = params
            .iter()
            .map(|p| device.tensor(&HostTensor::zeros(p.dtype(), p.dims())))
            .collect::<Result<_>>()?;
        Ok(Sgd {
            momentum,
            weight_decay,
            momentum_buffer,
        })
    }

    /// Records one update with learning rate `lr` (a device scalar).
    #[track_caller]
    pub fn step(&mut self, params: &[Tensor], grads: &[Tensor], lr: &Tensor) -> Result<()> {
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let g = if self.weight_decay != 0.0 {
                g.add(&p.mul_scalar(self.weight_decay)?)?
            } else {
                g.clone()
            };
            let d = if self.momentum != 0.0 {
                let b = self.momentum_buffer[i].mul_scalar(self.momentum)?.add(&g)?;
                self.momentum_buffer[i].assign(&b)?;
                b
            } else {
                g
            };
            p.assign(&p.sub(&d.mul(lr)?)?)?;
        }
        Ok(())
    }
}

impl OptimizerState for Sgd {
    /// `<param name>.momentum_buffer` per parameter, as in `torch.optim.SGD`'s state.
    fn named_state(&self, param_names: &[String]) -> Vec<(String, Tensor)> {
        param_names
            .iter()
            .zip(&self.momentum_buffer)
            .map(|(name, b)| (format!("{name}.momentum_buffer"), b.clone()))
            .collect()
    }
}

/// Gradient accumulation: the gradients of `micro_batches` micro-batches summed on the device,
/// so a batch too large for memory trains as k smaller ones with the large batch's update.
///
/// Two step graphs, compiled once each: a micro-batch's forward, backward and accumulation
/// (`accumulate` returns `None`; call `mark_step`), and on every k-th micro-batch the same plus
/// the mean of the k gradients, which goes to the optimizer, and the sums' reset (`accumulate`
/// returns the mean). The alternative, tracing all k forward and backward passes before one
/// `mark_step`, makes one graph k times larger and keeps every micro-batch's activations alive
/// at once; this keeps one micro-batch's.
///
/// The mean equals the large batch's gradient when each micro-batch's loss is a mean over the
/// same number of examples (`tests/grad_accumulation.rs` checks AdamW's trajectory). For
/// token losses whose micro-batches hold different numbers of real tokens, sum the token losses
/// and divide by the large batch's token count instead. On several replicas the sums are each
/// replica's own; average the returned gradients ([`average_gradients`]) once per update, not
/// once per micro-batch.
pub struct GradAccumulator {
    sums: Vec<Tensor>,
    micro_batches: usize,
    seen: usize,
}

impl GradAccumulator {
    /// Zero sums shaped like `params`, for updates every `micro_batches` micro-batches.
    pub fn new(device: &LazyDevice, params: &[Tensor], micro_batches: usize) -> Result<Self> {
        if micro_batches == 0 {
            return Err(crate::Error::Config(
                "gradient accumulation needs at least 1 micro-batch per update".into(),
            ));
        }
        let sums = params
            .iter()
            .map(|p| {
                let zeros = HostTensor::zeros(p.dtype(), p.dims());
                device.from_replicas(&vec![zeros; device.replicas()])
            })
            .collect::<Result<_>>()?;
        Ok(GradAccumulator {
            sums,
            micro_batches,
            seen: 0,
        })
    }

    /// Micro-batches per update.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// Adds one micro-batch's gradients (in the order of the parameters). On the last
    /// micro-batch of an update, returns the mean over the k micro-batches and resets the sums;
    /// before it, `None`.
    #[track_caller]
    pub fn accumulate(&mut self, grads: &[Tensor]) -> Result<Option<Vec<Tensor>>> {
        if grads.len() != self.sums.len() {
            return Err(crate::Error::Config(format!(
                "gradient accumulation: {} gradients for {} parameters",
                grads.len(),
                self.sums.len()
            )));
        }
        self.seen += 1;
        if self.seen < self.micro_batches {
            for (sum, g) in self.sums.iter().zip(grads) {
                sum.assign(&sum.add(g)?)?;
            }
            return Ok(None);
        }
        self.seen = 0;
        let scale = 1.0 / self.micro_batches as f64;
        let mut mean = Vec::with_capacity(grads.len());
        for (sum, g) in self.sums.iter().zip(grads) {
            mean.push(sum.add(g)?.mul_scalar(scale)?);
            // zeros that stay each replica's own (a plain constant would be replicated, and the
            // next micro-batch's per-replica sum could not be assigned to it); NaN-safe
            let zero = sum.zeros_like()?;
            let never = zero.ne(&zero)?;
            sum.assign(&Tensor::where_cond(&never, sum, &zero)?)?;
        }
        Ok(Some(mean))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine() {
        let s = WarmupCosine {
            base_lr: 1e-3,
            min_lr: 1e-5,
            warmup_steps: 10,
            total_steps: 110,
        };
        assert!((s.lr(0) - 1e-4).abs() < 1e-12);
        assert!((s.lr(9) - 1e-3).abs() < 1e-12);
        assert!((s.lr(10) - 1e-3).abs() < 1e-12);
        assert!((s.lr(60) - (1e-5 + 0.5 * (1e-3 - 1e-5))).abs() < 1e-12);
        assert!((s.lr(110) - 1e-5).abs() < 1e-12);
        assert!((s.lr(500) - 1e-5).abs() < 1e-12);
    }
}
