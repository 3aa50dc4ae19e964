//! Picking each generated token: on the device, inside the step that computes the logits, so
//! only the `[b]` token ids come back to the host (not `[b, vocab]` logits, and no host sort
//! of the vocabulary per token); and the host version it is checked against.

use neuron_pc_compiler::DType;

use super::generate::Sampling;
use crate::error::{Error, Result};
use crate::nn::HostRng;
use crate::tensor::Tensor;

impl Sampling {
    /// The next token of every row of `logits [b, vocab]` (float32), recorded on the device:
    /// `argmax` when greedy; otherwise the draw of [`Sampling::pick_on_host`] with `u [b]`,
    /// each row's uniform number in `[0, 1)`: the candidates sorted (all, or the `top_k`
    /// largest), weighted by `exp((l - l_max) / temperature)`, cut at `top_p` of the total,
    /// and the first whose running sum passes `u` times the kept total. The same draws as the
    /// host's up to float32 rounding (the host sums in float64). Returns `[b]` i32 ids.
    pub(super) fn pick_on_device(&self, logits: &Tensor, u: Option<&Tensor>) -> Result<Tensor> {
        let Sampling::Sample {
            temperature,
            top_k,
            top_p,
            ..
        } = self
        else {
            return logits.argmax(1);
        };
        let u = u.ok_or_else(|| Error::Config("sampling needs a uniform number per row".into()))?;
        let (b, vocab) = (logits.dims()[0], logits.dims()[1]);
        let (vals, idx) = match top_k {
            Some(k) => logits.topk((*k).clamp(1, vocab), 1, true)?,
            None => logits.sort(1, true)?,
        };
        let n = vals.dims()[1];
        let scaled = vals.mul_scalar(1.0 / temperature)?;
        let weights = scaled.sub(&scaled.narrow(1, 0, 1)?)?.exp()?;
        // how many candidates stay: the fewest whose share reaches top_p (those with less
        // than top_p before them)
        let (kept, kept_last) = match top_p {
            Some(p) => {
                let total = weights.sum(&[1], true)?;
                let before = weights.cumsum(1)?.sub(&weights)?;
                let keep = before.lt(&total.mul_scalar(*p)?)?;
                let kept = Tensor::where_cond(&keep, &weights, &weights.zeros_like()?)?;
                let count = keep.to_dtype(DType::I32)?.sum(&[1], false)?;
                (kept, Some(count.add_scalar(-1.0)?))
            }
            None => (weights, None),
        };
        let target = u.reshape(&[b, 1])?.mul(&kept.sum(&[1], true)?)?;
        // the first candidate whose running sum passes the target (the last kept one when
        // rounding leaves the target past them all)
        let passed = kept
            .cumsum(1)?
            .le(&target)?
            .to_dtype(DType::I32)?
            .sum(&[1], false)?;
        let at = match kept_last {
            Some(last) => passed.minimum(&last)?,
            None => passed.clamp(None, Some((n - 1) as f64))?,
        };
        idx.take_along_dim(&at.reshape(&[b, 1])?, 1)?
            .reshape(&[b])?
            .to_dtype(DType::I32)
    }

    /// The next token from one row of logits on the host, drawing one number from `rng` when
    /// sampling: the reference the device's pick (what `generate` does) is checked against.
    pub fn pick_on_host(&self, logits: &[f64], rng: Option<&mut HostRng>) -> i32 {
        let argmax = || {
            let mut best = 0;
            for (i, v) in logits.iter().enumerate() {
                if *v > logits[best] {
                    best = i;
                }
            }
            best as i32
        };
        let (
            Sampling::Sample {
                temperature,
                top_k,
                top_p,
                ..
            },
            Some(rng),
        ) = (self, rng)
        else {
            return argmax();
        };
        // most likely first (a stable sort: equals in index order)
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|a, b| logits[*b].total_cmp(&logits[*a]));
        if let Some(k) = top_k {
            order.truncate((*k).max(1));
        }
        let top = logits[order[0]] / temperature;
        let weights: Vec<f64> = order
            .iter()
            .map(|i| (logits[*i] / temperature - top).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut keep = weights.len();
        if let Some(p) = top_p {
            let mut sum = 0.0;
            for (n, w) in weights.iter().enumerate() {
                sum += w / total;
                if sum >= *p {
                    keep = n + 1;
                    break;
                }
            }
        }
        let total: f64 = weights[..keep].iter().sum();
        let mut u = rng.uniform() * total;
        for (n, w) in weights[..keep].iter().enumerate() {
            if u < *w {
                return order[n] as i32;
            }
            u -= w;
        }
        order[keep - 1] as i32
    }
}
