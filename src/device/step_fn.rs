//! Step functions: a training step traced on its first calls and replayed without tracing
//! after (see [`StepFn`]; the machinery is the device's, `src/device/replay.rs`).

use std::panic::Location;
use std::sync::Arc;

use super::replay::Replayer;
use super::LazyDevice;
use super::Tensor;
use crate::error::Result;

/// A training step (a closure over the model and optimizer, taking the batch's tensors and
/// returning, say, the loss) that runs without tracing once its graph is known.
///
/// The first two calls trace it (run the closure and cut the graph as [`LazyDevice::mark_step`]
/// does); when both cut the same graph and every input of it is an argument, a value the step
/// updates, or the same value both times, later calls launch the executable directly: no
/// closure, no recording, no step cut. The closure must not call `mark_step` itself.
///
/// As with `jax.jit`, what the closure does on the host is done when it traces only: a host
/// number baked into the graph stays as traced. A value made on the device inside the closure
/// on every call (a learning rate from `LazyDevice::scalar` in the closure) is caught: the step
/// then traces on every call and says why once. Pass such values as arguments. A write to a
/// tensor that the step did not make ([`Tensor::assign`], a checkpoint load) makes the next
/// two calls trace again.
///
/// ```no_run
/// # use neuron_pc::{grad, DType, LazyDevice, Tensor, optim::AdamW};
/// # fn f(device: &LazyDevice, w: Tensor, batches: Vec<[Tensor; 2]>) -> neuron_pc::Result<()> {
/// let mut opt = AdamW::new(device, &[w.clone()], 0.0)?;
/// let lr = device.scalar(1e-3, DType::F32)?;
/// let mut step = device.step_fn(|args: &[Tensor]| {
///     let d = args[0].matmul(&w)?.sub(&args[1])?;
///     let loss = d.mul(&d)?.mean_all()?;
///     let g = grad(&loss, &[&w])?;
///     opt.step(&[w.clone()], &g, &args[2])?;
///     Ok(vec![loss])
/// });
/// for [x, y] in batches {
///     let loss = step.call(&[x, y, lr.clone()])?.remove(0);
/// }
/// # Ok(()) }
/// ```
pub struct StepFn<F> {
    device: LazyDevice,
    f: F,
    replayer: Replayer,
}

impl LazyDevice {
    /// A step function over `f` (see [`StepFn`]).
    pub fn step_fn<F>(&self, f: F) -> StepFn<F>
    where
        F: FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
    {
        StepFn {
            device: self.clone(),
            f,
            replayer: Replayer::default(),
        }
    }
}

impl<F> StepFn<F>
where
    F: FnMut(&[Tensor]) -> Result<Vec<Tensor>>,
{
    /// Runs one step over `args`, replayed when the plan allows (see [`StepFn`]), else traced;
    /// returns the closure's results. Like `mark_step`, it returns once the step is launched.
    #[track_caller]
    pub fn call(&mut self, args: &[Tensor]) -> Result<Vec<Tensor>> {
        let site = Location::caller();
        let dev = &self.device.inner;
        let cells: Vec<_> = args.iter().map(|a| a.cell.clone()).collect();
        if let Some(results) = self.replayer.replay(dev, &cells, site)? {
            return Ok(wrap(results));
        }
        let f = &mut self.f;
        let results = self.replayer.trace(dev, &cells, site, || {
            Ok(f(args)?.into_iter().map(|t| t.cell).collect())
        })?;
        Ok(wrap(results))
    }

    /// True when the next call with arguments like the last ones will be replayed.
    pub fn is_replaying(&self) -> bool {
        self.replayer.is_replaying(&self.device.inner)
    }

    /// Why the step traces on every call, when two traced calls could not make a plan.
    pub fn why_traced(&self) -> Option<&str> {
        self.replayer.why_traced()
    }
}

fn wrap(cells: Vec<Arc<crate::device::trace::Cell>>) -> Vec<Tensor> {
    cells.into_iter().map(|cell| Tensor { cell }).collect()
}
