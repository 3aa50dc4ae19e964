//! `cross_entropy` with PyTorch's `ignore_index` and `label_smoothing`.

use neuron_pc_compiler::ir::Op;

use crate::error::Result;
use crate::nn::log_softmax;
use crate::tensor::{shape_error, Tensor};

/// Options of [`cross_entropy_with`] (PyTorch's defaults: nothing ignored, no smoothing).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CrossEntropyOptions {
    /// Rows whose label equals this contribute nothing, and the mean runs over the others.
    pub ignore_index: Option<i64>,
    /// `ε` in `[0, 1]`: the target is `(1 - ε)` on the label plus `ε / classes` everywhere.
    pub label_smoothing: f64,
}

/// Mean cross-entropy of `logits [n, classes]` against integer `labels [n]`, as
/// `torch.nn.functional.cross_entropy(logits, labels, ignore_index=.., label_smoothing=..)`:
/// per row `(1 - ε) (-log p[label]) + ε mean_c(-log p[c])`, averaged over the rows that are not
/// ignored (NaN when every row is ignored, as in PyTorch).
#[track_caller]
pub fn cross_entropy_with(
    logits: &Tensor,
    labels: &Tensor,
    options: CrossEntropyOptions,
) -> Result<Tensor> {
    let location = std::panic::Location::caller();
    let err = |message: String| {
        shape_error(
            "cross_entropy",
            format!("{}, {}", logits.ty(), labels.ty()),
            message,
            location,
        )
    };
    if logits.rank() != 2 || labels.rank() != 1 || labels.dims()[0] != logits.dims()[0] {
        return Err(err("expected logits [n, classes] and labels [n]".into()));
    }
    if !labels.dtype().is_int() {
        return Err(err(format!(
            "labels must have an integer dtype, got {}",
            labels.dtype()
        )));
    }
    let eps = options.label_smoothing;
    if !(0.0..=1.0).contains(&eps) {
        return Err(err(format!("label_smoothing must be in [0, 1], got {eps}")));
    }
    let (n, classes) = (logits.dims()[0], logits.dims()[1]);
    let logp = log_softmax(logits, -1)?;
    let valid = match options.ignore_index {
        Some(i) => labels.ne(&labels.constant_like(i as f64)?)?,
        None => labels.eq(labels)?,
    };
    // ignored rows pick class 0, then are masked out
    let safe = Tensor::where_cond(&valid, labels, &labels.zeros_like()?)?;
    let dev = logits.device_inner()?;
    let iota = Tensor::apply_nullary(
        &dev,
        Op::Iota {
            dims: vec![n, classes],
            dim: 1,
            dtype: labels.dtype(),
        },
    )?;
    let onehot = safe.unsqueeze(1)?.eq(&iota)?.to_dtype(logits.dtype())?;
    let nll = logp.mul(&onehot)?.sum(&[1], false)?.neg()?;
    let per_row = if eps > 0.0 {
        let smooth = logp.mean(&[1], false)?.neg()?;
        nll.mul_scalar(1.0 - eps)?.add(&smooth.mul_scalar(eps)?)?
    } else {
        nll
    };
    let w = valid.to_dtype(logits.dtype())?;
    per_row.mul(&w)?.sum_all()?.div(&w.sum_all()?)
}
