//! Gradient accumulation over micro-batches.

use crate::device::LazyDevice;
use crate::error::Result;
use crate::tensor::Tensor;

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
/// same number of examples (`tests/training/grad_accumulation.rs` checks AdamW's trajectory). For
/// token losses whose micro-batches hold different numbers of real tokens, sum the token losses
/// and divide by the large batch's token count instead. On several replicas the sums are each
/// replica's own; average the returned gradients
/// ([`average_gradients`](super::average_gradients)) once per update, not once per micro-batch.
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
            .map(|p| device.zeros_like_data(p, true))
            .collect::<Result<Vec<_>>>()?;
        super::register_gradients(device, &sums);
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
