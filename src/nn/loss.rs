//! `cross_entropy` with PyTorch's defaults (`ignore_index` -100) and `label_smoothing`.

use neuron_pc_compiler::ir::Op;

use crate::error::Result;
use crate::nn::log_softmax;
use crate::tensor::{shape_error, Tensor};

/// The label PyTorch's `cross_entropy` ignores by default (`ignore_index=-100`): padding
/// positions of a batch carry it, and the mean runs over the other rows.
pub const IGNORE_INDEX: i64 = -100;

/// Options of [`cross_entropy_with`]. The default is PyTorch's: labels equal to
/// [`IGNORE_INDEX`] (-100) are ignored, no label smoothing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyOptions {
    /// Rows whose label equals this contribute nothing, and the mean runs over the others
    /// (`None`: every label counts).
    pub ignore_index: Option<i64>,
    /// `ε` in `[0, 1]`: the target is `(1 - ε)` on the label plus `ε / classes` everywhere.
    pub label_smoothing: f64,
}

impl Default for CrossEntropyOptions {
    fn default() -> Self {
        CrossEntropyOptions {
            ignore_index: Some(IGNORE_INDEX),
            label_smoothing: 0.0,
        }
    }
}

/// Mean cross-entropy of `logits [.., classes]` against integer `labels [..]` (the logits'
/// leading dimensions), as `torch.nn.functional.cross_entropy(logits.view(-1, classes),
/// labels.view(-1), ignore_index=.., label_smoothing=..)`: per position
/// `(1 - ε) (-log p[label]) + ε mean_c(-log p[c])`, averaged over the positions that are not
/// ignored (NaN when every position is ignored, as in PyTorch). Classes are the last dimension,
/// as a language model's `[batch, seq, vocab]` logits have them (PyTorch's own layout for
/// rank 3 and more is `[n, classes, d..]`; flatten as above to move between the two).
///
/// A label outside `[0, classes)` (and not ignored) is an error in PyTorch; here it selects no
/// class, so its row's loss is the smoothing term alone. With index checks on
/// ([`crate::DeviceConfig::check_indices`], `NEURON_PC_CHECK_INDICES=1`) such a label is
/// reported as an error naming this call.
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
    if logits.rank() == 0 {
        return Err(err(
            "logits must have a class dimension ([.., classes])".into()
        ));
    }
    let lead = &logits.dims()[..logits.rank() - 1];
    if labels.dims() != lead {
        return Err(err(format!(
            "labels must have the logits' leading dimensions {lead:?} (logits [.., classes], \
             labels [..])"
        )));
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
    let classes = logits.dims()[logits.rank() - 1];
    let n: usize = lead.iter().product();
    let (logits, labels) = if logits.rank() == 2 {
        (logits.clone(), labels.clone())
    } else {
        (logits.reshape(&[n, classes])?, labels.reshape(&[n])?)
    };
    labels.check_index_range(
        "cross_entropy",
        "labels",
        classes,
        options.ignore_index,
        location,
    )?;
    let logp = log_softmax(&logits, -1)?;
    let valid = match options.ignore_index {
        Some(i) => labels.ne(&labels.constant_like(i as f64)?)?,
        None => labels.eq(&labels)?,
    };
    // ignored rows pick class 0, then are masked out
    let safe = Tensor::where_cond(&valid, &labels, &labels.zeros_like()?)?;
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
