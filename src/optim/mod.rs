//! Optimizers whose state lives on the device and is updated inside the step graph. Values that
//! change every step (learning rate, step count) are device scalars, never graph constants, so a
//! whole training run uses one step graph.
//!
//! ```no_run
//! use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
//! use neuron_pc::nn::Module;
//! use neuron_pc::optim::{clip_grad_norm, AdamW, WarmupCosine};
//! use neuron_pc::{grad, DType, LazyDevice, Tensor};
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! let config = TextEncoderConfig::default();
//! let model = TextEncoder::new(&device, config.clone(), 0)?;
//! let task = SyntheticTask::new(config, 0);
//! let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
//! let mut opt = AdamW::new(&device, &params, 0.01)?; // weight decay 0.01
//! let schedule = WarmupCosine {
//!     base_lr: 1e-3,
//!     min_lr: 1e-5,
//!     warmup_steps: 100,
//!     total_steps: 1000,
//! };
//! for step in 0..1000 {
//!     let batch = task.batch(0, step, 32);
//!     let [ids, mask, labels] = [&batch[0], &batch[1], &batch[2]].map(|t| device.tensor(t));
//!     let loss = model.loss(&ids?, &mask?, &labels?)?;
//!     let mut grads = grad(&loss, &params.iter().collect::<Vec<_>>())?;
//!     clip_grad_norm(&mut grads, 1.0)?;
//!     // a new rate every step, as data: the same graph
//!     let lr = device.scalar(schedule.lr(step), DType::F32)?;
//!     opt.step(&params, &grads, &lr)?;
//!     device.mark_step()?;
//! }
//! # Ok(()) }
//! ```
//!
//! On a data-parallel device, average the gradients over the replicas first
//! ([`average_gradients`]), or let ZeRO-1 ([`AdamW::zero1`]) reduce them inside its step.

use std::panic::Location;

use neuron_pc_compiler::DType;

use crate::device::{LazyDevice, Tracked};
use crate::error::Result;
use crate::tensor::Tensor;

mod accumulate;
mod traced;
mod zero1;

pub use accumulate::GradAccumulator;
use traced::Updates;
use zero1::Zero1;

/// Learning rate with linear warm-up then cosine decay to `min_lr` at `total_steps`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WarmupCosine {
    /// The peak rate, reached at the end of the warm-up.
    pub base_lr: f64,
    /// The rate at `total_steps` and after.
    pub min_lr: f64,
    /// Steps of linear warm-up: step `i < warmup_steps` gets `base_lr * (i + 1) / warmup_steps`.
    pub warmup_steps: u64,
    /// The step the cosine reaches `min_lr`, counted from 0 (warm-up included).
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
    let device = first.device()?;
    if device.global_replicas() == 1 {
        return Ok(out);
    }
    if device.mesh().is_some() {
        // the processes of a run with a mesh in each: each gradient's mean over them, on each
        // device's block of it (`grad` kept the parameter's layout)
        for (o, g) in out.iter_mut().zip(grads) {
            *o = g.all_reduce_at_mean(location)?;
        }
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

/// The global L2 norm of `grads` (in-graph, an f32 scalar): what [`clip_grad_norm`] clips to and
/// what training logs report as the gradient norm. On a data-parallel device, take it of the
/// averaged gradients, as [`clip_grad_norm`] says.
#[track_caller]
pub fn grad_norm(grads: &[Tensor]) -> Result<Tensor> {
    let mut total: Option<Tensor> = None;
    for g in grads {
        let s = g.mul(g)?.sum_all()?;
        total = Some(match total {
            Some(t) => t.add(&s)?,
            None => s,
        });
    }
    let Some(total) = total else {
        return Err(crate::Error::Config("grad_norm: no gradients".into()));
    };
    total.sqrt()
}

/// Scales `grads` so their global L2 norm is at most `max_norm` (in-graph); returns the norm
/// before clipping. On a data-parallel device, clip after [`average_gradients`]: the averaged
/// gradients are the global gradient, so the norm is the global norm on every replica (clipping
/// per-replica gradients would scale each replica by its own norm).
#[track_caller]
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f64) -> Result<Tensor> {
    let norm = grad_norm(grads)?;
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
    /// The whole state under PyTorch-like names (`<param name>.<slot>`, each shaped like its
    /// parameter), for parameters named `param_names` in the order the optimizer was made for.
    /// With ZeRO-1 the blocks are gathered (on the device, in the next step graph).
    fn named_state(&self, param_names: &[String]) -> Result<Vec<(String, Tensor)>>;

    /// Sets the state from `values`, named and shaped as [`OptimizerState::named_state`]
    /// gives them (each replica keeps its block with ZeRO-1). The default assigns by name to
    /// the tensors `named_state` returns, which is right whenever it shares them with the
    /// optimizer (as every optimizer's did before ZeRO-1), so existing implementations need
    /// no change.
    fn restore_state(&self, param_names: &[String], values: Vec<(String, Tensor)>) -> Result<()> {
        assign_by_name(self, param_names, values)
    }

    /// The state as the optimizer holds it, under [`OptimizerState::named_state`]'s names: what
    /// a checkpoint saves without gathering anything on the device
    /// ([`crate::state::Checkpoints`]). The default is `named_state`'s tensors, whole; a
    /// ZeRO-1 optimizer gives each replica's block ([`HeldState::Blocks`]).
    fn held_state(&self, param_names: &[String]) -> Result<Vec<(String, HeldState)>> {
        Ok(self
            .named_state(param_names)?
            .into_iter()
            .map(|(n, t)| (n, HeldState::Whole(t)))
            .collect())
    }
}

/// One tensor of optimizer state as the optimizer holds it (see
/// [`OptimizerState::held_state`]).
#[derive(Clone, Debug)]
pub enum HeldState {
    /// The whole tensor, the same on every replica.
    Whole(Tensor),
    /// ZeRO-1: each replica's block of the tensor flattened and padded with zeros to a
    /// multiple of the run's replicas; global replica `g` holds elements `g * block ..` of it,
    /// where `block` is the blocks' length.
    Blocks {
        /// The per-replica blocks, one-dimensional.
        blocks: Tensor,
        /// The whole tensor's shape.
        dims: Vec<usize>,
    },
}

/// One value that exists once every gradient of `grads` does (the first gradient, ordered
/// after the rest): what [`read_for_update`] waits for. One node for the step, so each
/// parameter's read has two operands, not one per gradient.
#[track_caller]
fn gradients_done(grads: &[Tensor]) -> Result<Vec<Tensor>> {
    match grads.split_first() {
        Some((first, rest)) => Ok(vec![first.after(rest)?]),
        None => Ok(Vec::new()),
    }
}

/// `p` as an update reads it: once every gradient is computed (`done`, from
/// [`gradients_done`]; see [`Tensor::after`]). The product that carries a gradient back
/// through a weight (`dx = dy . w`) reads the weight but is no ancestor of the weight's
/// update, so without this nothing orders the two, and XLA copies every donated parameter
/// before the step to update it in place: on the small Llama of `examples/bench_llama.rs`,
/// 4.2M floats copied per step (0.5 ms of 47, about 1%).
#[track_caller]
fn read_for_update(p: &Tensor, done: &[Tensor]) -> Result<Tensor> {
    p.after(done)
}

/// Counts `tensors` as optimizer state in the device's metrics (`optimizer_state_bytes`).
fn register_state<'a>(device: &LazyDevice, tensors: impl IntoIterator<Item = &'a Tensor>) {
    let cells = tensors.into_iter().map(|t| &t.cell);
    device.inner.track(Tracked::OptimizerState, cells);
}

/// Counts gradients kept on the device between steps (accumulated sums) in the device's
/// metrics (`gradient_bytes`).
pub(crate) fn register_gradients(device: &LazyDevice, grads: &[Tensor]) {
    device
        .inner
        .track(Tracked::Gradients, grads.iter().map(|t| &t.cell));
}

/// Counts the tensors an optimizer updates as parameters in the device's metrics
/// (`parameter_bytes`).
fn register_parameters(device: &LazyDevice, params: &[Tensor]) {
    device
        .inner
        .track(Tracked::Parameters, params.iter().map(|t| &t.cell));
}

/// State values to restore, by name.
struct Values(std::collections::HashMap<String, Tensor>);

impl Values {
    fn new(values: Vec<(String, Tensor)>) -> Values {
        Values(values.into_iter().collect())
    }

    fn take(&mut self, name: String) -> Result<Tensor> {
        self.0.remove(&name).ok_or_else(|| {
            crate::Error::Config(format!(
                "optimizer state {name} is missing from the values to restore"
            ))
        })
    }
}

/// The default [`OptimizerState::restore_state`], for overrides that fall back to it.
fn assign_by_name<O: OptimizerState + ?Sized>(
    opt: &O,
    param_names: &[String],
    values: Vec<(String, Tensor)>,
) -> Result<()> {
    let mut values = Values::new(values);
    for (name, t) in opt.named_state(param_names)? {
        t.assign(&values.take(name)?)?;
    }
    Ok(())
}

/// [`AdamW::with_config`]'s settings, named as `torch.optim.AdamW`'s keyword arguments, with
/// its defaults (the learning rate is given to each [`AdamW::step`]):
///
/// ```no_run
/// # use neuron_pc::optim::{AdamW, AdamWConfig};
/// # fn f(device: &neuron_pc::LazyDevice, params: &[neuron_pc::Tensor]) -> neuron_pc::Result<()> {
/// // torch.optim.AdamW(params, betas=(0.9, 0.95), weight_decay=0.1)
/// let config = AdamWConfig { betas: (0.9, 0.95), weight_decay: 0.1, ..Default::default() };
/// let opt = AdamW::with_config(device, params, config)?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct AdamWConfig {
    /// Decays of the first and second moments (default 0.9, 0.999).
    pub betas: (f64, f64),
    /// Added to the denominator (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay (default 0.01).
    pub weight_decay: f64,
    /// Shard the moments over the data-parallel replicas (ZeRO-1, [`AdamW::zero1`]).
    pub zero1: bool,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig {
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay: 0.01,
            zero1: false,
        }
    }
}

/// [`Sgd::with_config`]'s settings, named as `torch.optim.SGD`'s keyword arguments (no
/// dampening, no Nesterov).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SgdConfig {
    /// The momentum factor (default 0: plain SGD).
    pub momentum: f64,
    /// L2 penalty added to the gradient (default 0).
    pub weight_decay: f64,
    /// Shard the momentum buffers over the data-parallel replicas (ZeRO-1, [`Sgd::zero1`]).
    pub zero1: bool,
}

/// AdamW as in `torch.optim.AdamW` (decoupled weight decay, bias-corrected moments).
pub struct AdamW {
    /// Decay of the first moment (`betas[0]`, default 0.9).
    pub beta1: f64,
    /// Decay of the second moment (`betas[1]`, default 0.999).
    pub beta2: f64,
    /// Added to the denominator, the root of the bias-corrected second moment (default 1e-8).
    pub eps: f64,
    /// Decoupled weight decay: each step multiplies the parameters by `1 - lr * weight_decay`.
    pub weight_decay: f64,
    /// `exp_avg` per parameter (the first moment), on the device.
    pub exp_avg: Vec<Tensor>,
    /// `exp_avg_sq` per parameter (the second moment), on the device.
    pub exp_avg_sq: Vec<Tensor>,
    /// Steps taken so far (a device scalar, f32).
    pub step: Tensor,
    /// With ZeRO-1 ([`AdamW::zero1`]) the moments are each replica's block of them.
    zero1: Option<Zero1>,
    /// The update of one parameter and its moments, traced once per argument types.
    updates: Updates,
    /// The step count's increment and the bias corrections, traced once.
    corrections: Updates,
}

impl AdamW {
    /// ZeRO-1 AdamW: each data-parallel replica keeps only its 1/N block of the moments (see
    /// `optim/zero1.rs`). Pass each replica's own gradients to [`AdamW::step`] (no
    /// [`average_gradients`] first: the step reduce-scatters them); the parameters come out
    /// the same on every replica, as plain data-parallel AdamW makes them.
    pub fn zero1(device: &LazyDevice, params: &[Tensor], weight_decay: f64) -> Result<AdamW> {
        let z = Zero1::new(device, params);
        let mut opt = AdamW::new_with(device, params, weight_decay, Some(&z))?;
        opt.zero1 = Some(z);
        Ok(opt)
    }

    /// Whether the state is sharded over the replicas (ZeRO-1).
    pub fn is_zero1(&self) -> bool {
        self.zero1.is_some()
    }

    /// Zero moments for `params`, with `config`'s betas, eps and weight decay, sharded over
    /// the replicas when it says `zero1`.
    pub fn with_config(
        device: &LazyDevice,
        params: &[Tensor],
        config: AdamWConfig,
    ) -> Result<AdamW> {
        let mut opt = match config.zero1 {
            true => AdamW::zero1(device, params, config.weight_decay)?,
            false => AdamW::new(device, params, config.weight_decay)?,
        };
        (opt.beta1, opt.beta2) = config.betas;
        opt.eps = config.eps;
        Ok(opt)
    }

    /// Zero moments for `params` (PyTorch defaults: betas 0.9/0.999, eps 1e-8); the number is
    /// the weight decay. [`AdamW::with_config`] names every setting.
    pub fn new(device: &LazyDevice, params: &[Tensor], weight_decay: f64) -> Result<AdamW> {
        AdamW::new_with(device, params, weight_decay, None)
    }

    fn new_with(
        device: &LazyDevice,
        params: &[Tensor],
        weight_decay: f64,
        zero1: Option<&Zero1>,
    ) -> Result<AdamW> {
        let named = |i: usize, p: &Tensor, what: &str| -> Result<Tensor> {
            let t = match zero1 {
                Some(z) => z.zeros(i, p.dtype())?,
                None => device.zeros_like_data(p, false)?,
            };
            if let Some(n) = p.name() {
                t.set_name(&format!("optimizer.{n}.{what}"));
            }
            Ok(t)
        };
        let exp_avg: Vec<Tensor> = (params.iter().enumerate())
            .map(|(i, p)| named(i, p, "exp_avg"))
            .collect::<Result<_>>()?;
        let exp_avg_sq: Vec<Tensor> = (params.iter().enumerate())
            .map(|(i, p)| named(i, p, "exp_avg_sq"))
            .collect::<Result<_>>()?;
        register_state(device, exp_avg.iter().chain(&exp_avg_sq));
        register_parameters(device, params);
        // its state-dict key: a graph's record names the input, where two scalars (this and
        // the learning rate) would otherwise be told apart by position only
        let step = device.scalar(0.0, DType::F32)?;
        step.set_name("optimizer.step");
        Ok(AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            exp_avg,
            exp_avg_sq,
            step,
            zero1: None,
            updates: Updates::default(),
            corrections: Updates::default(),
        })
    }

    /// Records one update of `params` with `grads` at learning rate `lr` (a device scalar).
    #[track_caller]
    pub fn step(&mut self, params: &[Tensor], grads: &[Tensor], lr: &Tensor) -> Result<()> {
        let (b1, b2, wd) = (self.beta1, self.beta2, self.weight_decay);
        let args = [&self.step, lr];
        let scalars = self.corrections.call(0, &[b1, b2, wd], &args, |a| {
            let [step, lr] = a else {
                unreachable!("traced over two arguments")
            };
            let t = step.add_scalar(1.0)?;
            // bias corrections 1 - beta^t, computed on the device from the step count
            let bc1 = t.constant_like(b1)?.pow(&t)?.neg()?.add_scalar(1.0)?;
            let bc2 = t.constant_like(b2)?.pow(&t)?.neg()?.add_scalar(1.0)?;
            let step_size = lr.div(&bc1)?;
            // sqrt(v) / sqrt(bc2) as PyTorch writes it, computed as sqrt(v) * rsqrt(bc2): one
            // divide per element fewer (XLA makes the same rewrite of JAX's AdamW, not of a
            // sqrt that several parameters share); the two differ by at most an ulp.
            let bc2_rsqrt = bc2.rsqrt()?;
            let decay = lr.mul_scalar(-wd)?.add_scalar(1.0)?;
            Ok(vec![t, step_size, bc2_rsqrt, decay])
        })?;
        let [t, step_size, bc2_rsqrt, decay] = &scalars[..] else {
            unreachable!("the corrections' four results")
        };
        let done = gradients_done(grads)?;
        // with ZeRO-1, this replica's block of each averaged gradient (one exchange a bucket)
        let blocks = match &self.zero1 {
            Some(z) => Some(z.grad_blocks(grads)?),
            None => None,
        };
        let mut updates = Vec::new();
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let w = read_for_update(p, &done)?;
            // with ZeRO-1, this replica's block of the averaged gradient and of the parameter
            let (g, w) = match (&self.zero1, &blocks) {
                (Some(z), Some(b)) => (b[i].clone(), z.local_block(i, &w)?),
                _ => (g.clone(), w),
            };
            // one call of the update traced once: three nodes, not one per op
            let eps = self.eps;
            let args = [
                &w,
                &g,
                &self.exp_avg[i],
                &self.exp_avg_sq[i],
                step_size,
                bc2_rsqrt,
                decay,
            ];
            let mut out = self.updates.call(i, &[b1, b2, eps], &args, |a| {
                let [w, g, m, v, step_size, bc2_rsqrt, decay] = a else {
                    unreachable!("traced over seven arguments")
                };
                let m = m.mul_scalar(b1)?.add(&g.mul_scalar(1.0 - b1)?)?;
                let v = v.mul_scalar(b2)?.add(&g.mul(g)?.mul_scalar(1.0 - b2)?)?;
                let denom = v.sqrt()?.mul(bc2_rsqrt)?.add_scalar(eps)?;
                let updated = w.mul(decay)?.sub(&m.div(&denom)?.mul(step_size)?)?;
                Ok(vec![updated, m, v])
            })?;
            let (v, m, updated) = (out.remove(2), out.remove(1), out.remove(0));
            match &self.zero1 {
                Some(_) => updates.push(updated),
                None => p.assign(&updated)?,
            }
            self.exp_avg[i].assign(&m)?;
            self.exp_avg_sq[i].assign(&v)?;
        }
        if let Some(z) = &self.zero1 {
            for (p, whole) in params.iter().zip(z.gather_all(&updates)?) {
                p.assign(&whole)?;
            }
        }
        self.step.assign(t)
    }

    /// State tensors under PyTorch-like names (`<param>.exp_avg`, `<param>.exp_avg_sq`, each
    /// shaped like its parameter; gathered from the replicas' blocks with ZeRO-1).
    pub fn named_state(&self, param_names: &[String]) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for (i, name) in param_names.iter().enumerate() {
            for (slot, t) in [
                ("exp_avg", &self.exp_avg[i]),
                ("exp_avg_sq", &self.exp_avg_sq[i]),
            ] {
                let whole = match &self.zero1 {
                    Some(z) => z.gather(i, t)?,
                    None => t.clone(),
                };
                out.push((format!("{name}.{slot}"), whole));
            }
        }
        out.push(("step".to_string(), self.step.clone()));
        Ok(out)
    }
}

impl OptimizerState for AdamW {
    fn named_state(&self, param_names: &[String]) -> Result<Vec<(String, Tensor)>> {
        AdamW::named_state(self, param_names)
    }

    fn held_state(&self, param_names: &[String]) -> Result<Vec<(String, HeldState)>> {
        let mut out = Vec::new();
        for (i, name) in param_names.iter().enumerate() {
            for (slot, t) in [
                ("exp_avg", &self.exp_avg[i]),
                ("exp_avg_sq", &self.exp_avg_sq[i]),
            ] {
                out.push((format!("{name}.{slot}"), held(self.zero1.as_ref(), i, t)));
            }
        }
        out.push(("step".to_string(), HeldState::Whole(self.step.clone())));
        Ok(out)
    }

    fn restore_state(&self, param_names: &[String], values: Vec<(String, Tensor)>) -> Result<()> {
        let Some(z) = &self.zero1 else {
            return assign_by_name(self, param_names, values);
        };
        let mut values = Values::new(values);
        for (i, name) in param_names.iter().enumerate() {
            let m = values.take(format!("{name}.exp_avg"))?;
            self.exp_avg[i].assign(&z.local_block(i, &m)?)?;
            let v = values.take(format!("{name}.exp_avg_sq"))?;
            self.exp_avg_sq[i].assign(&z.local_block(i, &v)?)?;
        }
        self.step.assign(&values.take("step".to_string())?)
    }
}

/// Parameter `i`'s state tensor `t` as held: its blocks under ZeRO-1, else whole.
fn held(zero1: Option<&Zero1>, i: usize, t: &Tensor) -> HeldState {
    match zero1 {
        Some(z) => HeldState::Blocks {
            blocks: t.clone(),
            dims: z.dims(i).to_vec(),
        },
        None => HeldState::Whole(t.clone()),
    }
}

/// SGD with momentum and (coupled) weight decay, as `torch.optim.SGD` with dampening 0.
pub struct Sgd {
    /// The momentum factor (0: plain SGD, no buffer updated).
    pub momentum: f64,
    /// L2 penalty added to the gradient (`g + weight_decay * p`), before the momentum.
    pub weight_decay: f64,
    /// Per parameter; with ZeRO-1 ([`Sgd::zero1`]) each replica's block of it.
    pub momentum_buffer: Vec<Tensor>,
    zero1: Option<Zero1>,
    /// The update of one parameter (and its buffer), traced once per argument types.
    updates: Updates,
}

impl Sgd {
    /// Zero momentum buffers for `params` with `config`'s momentum and weight decay, sharded
    /// over the replicas when it says `zero1`.
    pub fn with_config(device: &LazyDevice, params: &[Tensor], config: SgdConfig) -> Result<Sgd> {
        match config.zero1 {
            true => Sgd::zero1(device, params, config.momentum, config.weight_decay),
            false => Sgd::new(device, params, config.momentum, config.weight_decay),
        }
    }

    /// Zero momentum buffers for `params` (`torch.optim.SGD(params, momentum=..,
    /// weight_decay=..)`, no dampening, no Nesterov). [`Sgd::with_config`] names the numbers.
    pub fn new(
        device: &LazyDevice,
        params: &[Tensor],
        momentum: f64,
        weight_decay: f64,
    ) -> Result<Sgd> {
        Sgd::new_with(device, params, momentum, weight_decay, None)
    }

    /// ZeRO-1 SGD: each replica keeps its 1/N block of the momentum buffers; pass each
    /// replica's own gradients to [`Sgd::step`] (see [`AdamW::zero1`]).
    pub fn zero1(
        device: &LazyDevice,
        params: &[Tensor],
        momentum: f64,
        weight_decay: f64,
    ) -> Result<Sgd> {
        let z = Zero1::new(device, params);
        Sgd::new_with(device, params, momentum, weight_decay, Some(z))
    }

    fn new_with(
        device: &LazyDevice,
        params: &[Tensor],
        momentum: f64,
        weight_decay: f64,
        zero1: Option<Zero1>,
    ) -> Result<Sgd> {
        let momentum_buffer: Vec<Tensor> = (params.iter().enumerate())
            .map(|(i, p)| match &zero1 {
                Some(z) => z.zeros(i, p.dtype()),
                None => device.zeros_like_data(p, false),
            })
            .collect::<Result<_>>()?;
        register_state(device, &momentum_buffer);
        register_parameters(device, params);
        Ok(Sgd {
            momentum,
            weight_decay,
            momentum_buffer,
            zero1,
            updates: Updates::default(),
        })
    }

    /// Records one update with learning rate `lr` (a device scalar).
    #[track_caller]
    pub fn step(&mut self, params: &[Tensor], grads: &[Tensor], lr: &Tensor) -> Result<()> {
        let done = gradients_done(grads)?;
        let blocks = match &self.zero1 {
            Some(z) => Some(z.grad_blocks(grads)?),
            None => None,
        };
        let mut updates = Vec::new();
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let w = read_for_update(p, &done)?;
            let (g, w) = match (&self.zero1, &blocks) {
                (Some(z), Some(b)) => (b[i].clone(), z.local_block(i, &w)?),
                _ => (g.clone(), w),
            };
            // one call of the update traced once: one node per updated tensor
            let (momentum, decay) = (self.momentum, self.weight_decay);
            let mut args = vec![&w, &g, lr];
            if momentum != 0.0 {
                args.push(&self.momentum_buffer[i]);
            }
            let mut out = self.updates.call(i, &[momentum, decay], &args, |a| {
                let (w, g, lr) = (&a[0], &a[1], &a[2]);
                let g = match decay != 0.0 {
                    true => g.add(&w.mul_scalar(decay)?)?,
                    false => g.clone(),
                };
                let mut out = Vec::new();
                let d = match a.get(3) {
                    Some(buffer) => {
                        let b = buffer.mul_scalar(momentum)?.add(&g)?;
                        out.push(b.clone());
                        b
                    }
                    None => g,
                };
                out.insert(0, w.sub(&d.mul(lr)?)?);
                Ok(out)
            })?;
            if momentum != 0.0 {
                self.momentum_buffer[i].assign(&out.remove(1))?;
            }
            let updated = out.remove(0);
            match &self.zero1 {
                Some(_) => updates.push(updated),
                None => p.assign(&updated)?,
            }
        }
        if let Some(z) = &self.zero1 {
            for (p, whole) in params.iter().zip(z.gather_all(&updates)?) {
                p.assign(&whole)?;
            }
        }
        Ok(())
    }
}

impl OptimizerState for Sgd {
    /// `<param name>.momentum_buffer` per parameter, as in `torch.optim.SGD`'s state.
    fn named_state(&self, param_names: &[String]) -> Result<Vec<(String, Tensor)>> {
        let mut out = Vec::new();
        for (i, (name, b)) in param_names.iter().zip(&self.momentum_buffer).enumerate() {
            let whole = match &self.zero1 {
                Some(z) => z.gather(i, b)?,
                None => b.clone(),
            };
            out.push((format!("{name}.momentum_buffer"), whole));
        }
        Ok(out)
    }

    fn held_state(&self, param_names: &[String]) -> Result<Vec<(String, HeldState)>> {
        let zero1 = self.zero1.as_ref();
        Ok((param_names.iter().zip(&self.momentum_buffer).enumerate())
            .map(|(i, (name, b))| (format!("{name}.momentum_buffer"), held(zero1, i, b)))
            .collect())
    }

    fn restore_state(&self, param_names: &[String], values: Vec<(String, Tensor)>) -> Result<()> {
        let Some(z) = &self.zero1 else {
            return assign_by_name(self, param_names, values);
        };
        let mut values = Values::new(values);
        for (i, name) in param_names.iter().enumerate() {
            let v = values.take(format!("{name}.momentum_buffer"))?;
            self.momentum_buffer[i].assign(&z.local_block(i, &v)?)?;
        }
        Ok(())
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
