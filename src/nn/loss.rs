//! `cross_entropy` with PyTorch's defaults (`ignore_index` -100) and `label_smoothing`.

use neuron_pc_compiler::ir::Op;

use neuron_pc_compiler::DType;

use crate::autodiff::{scan, Remat, ScanOptions};
use crate::error::Result;
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
    let valid = valid_rows(&labels, options)?;
    let (sum, count) = summed_rows(&logits, &labels, &valid, options)?;
    sum.div(&count)
}

/// The rows' losses summed over the `valid` rows (`[n]`, boolean), and how many those are
/// (float scalars of the logits' dtype): `logits [n, classes]`, `labels [n]`, checked by the
/// caller.
///
/// Written as `logsumexp(row) - (1 - ε) row[label] - ε mean(row)`, the log-probabilities never
/// formed: the label's logit is picked by a select the gradient passes through elementwise, so
/// neither pass holds more `[n, classes]` temporaries than the exponentials its sum needs
/// (a one-hot product and `log_softmax`'s gradient each add one, and a reduction over classes
/// of a cotangent another).
fn summed_rows(
    logits: &Tensor,
    labels: &Tensor,
    valid: &Tensor,
    options: CrossEntropyOptions,
) -> Result<(Tensor, Tensor)> {
    let (n, classes) = (logits.dims()[0], logits.dims()[1]);
    let max = logits.max(&[1], true)?.detach()?;
    let lse = logits
        .sub(&max)?
        .exp()?
        .sum(&[1], false)?
        .log()?
        .add(&max.reshape(&[n])?)?;
    // ignored rows pick class 0, then are masked out
    let safe = Tensor::where_cond(valid, labels, &labels.zeros_like()?)?;
    let dev = logits.device_inner()?;
    let iota = Tensor::apply_nullary(
        &dev,
        Op::Iota {
            dims: vec![n, classes],
            dim: 1,
            dtype: labels.dtype(),
        },
    )?;
    let hit = safe.unsqueeze(1)?.eq(&iota)?;
    let picked = Tensor::where_cond(&hit, logits, &logits.zeros_like()?)?.sum(&[1], false)?;
    // a label outside [0, classes) selects no class: its row's loss is the smoothing term alone
    let in_range = safe
        .ge(&safe.zeros_like()?)?
        .logical_and(&safe.lt(&safe.constant_like(classes as f64)?)?)?;
    let nll = lse.sub(&picked)?;
    let nll = Tensor::where_cond(&in_range, &nll, &nll.zeros_like()?)?;
    let eps = options.label_smoothing;
    let per_row = if eps > 0.0 {
        let smooth = lse.sub(&logits.mean(&[1], false)?)?;
        nll.mul_scalar(1.0 - eps)?.add(&smooth.mul_scalar(eps)?)?
    } else {
        nll
    };
    let w = valid.to_dtype(logits.dtype())?;
    Ok((per_row.mul(&w)?.sum_all()?, w.sum_all()?))
}

fn valid_rows(labels: &Tensor, options: CrossEntropyOptions) -> Result<Tensor> {
    match options.ignore_index {
        Some(i) => labels.ne(&labels.constant_like(i as f64)?),
        None => labels.eq(labels),
    }
}

/// [`cross_entropy_with`] of the logits `hidden . weight^T` (a language model's head: `hidden
/// [.., h]`, `weight [classes, h]`, `labels [..]`), computed `chunk` rows at a time so that at
/// most one chunk's logits exist at once, in the forward pass and in the backward pass: one
/// loop over the chunks ([`crate::nn::scan`]) reduces each chunk's logits (in float32) to a sum
/// as soon as they are computed, and its backward loop computes them again, chunk by chunk.
/// The value and the gradients (for `hidden` and `weight`) are those of the whole; the cost is
/// the head's product computed twice. The last chunk is filled up with rows that count for
/// nothing. For a vocabulary of 128k and 8k tokens, the whole logits are 4 GiB of float32;
/// chunks of 1024 rows, 512 MiB.
#[track_caller]
pub fn chunked_cross_entropy(
    hidden: &Tensor,
    weight: &Tensor,
    labels: &Tensor,
    chunk: usize,
    options: CrossEntropyOptions,
) -> Result<Tensor> {
    let location = std::panic::Location::caller();
    let err = |message: String| {
        shape_error(
            "chunked_cross_entropy",
            format!("{}, {}, {}", hidden.ty(), weight.ty(), labels.ty()),
            message,
            location,
        )
    };
    if hidden.rank() == 0
        || weight.rank() != 2
        || weight.dims()[1] != hidden.dims()[hidden.rank() - 1]
    {
        return Err(err(
            "expected hidden [.., h] and weight [classes, h] (a head's weight, as nn::Linear \
             holds it)"
                .into(),
        ));
    }
    let lead = &hidden.dims()[..hidden.rank() - 1];
    if labels.dims() != lead {
        return Err(err(format!(
            "labels must have the hidden states' leading dimensions {lead:?}"
        )));
    }
    if !labels.dtype().is_int() {
        return Err(err(format!(
            "labels must have an integer dtype, got {}",
            labels.dtype()
        )));
    }
    if chunk == 0 {
        return Err(err("the chunk must hold at least one row".into()));
    }
    if !(0.0..=1.0).contains(&options.label_smoothing) {
        return Err(err(format!(
            "label_smoothing must be in [0, 1], got {}",
            options.label_smoothing
        )));
    }
    let (classes, h) = (weight.dims()[0], weight.dims()[1]);
    let n: usize = lead.iter().product();
    let hidden = hidden.reshape(&[n, h])?;
    let labels = labels.reshape(&[n])?;
    labels.check_index_range(
        "chunked_cross_entropy",
        "labels",
        classes,
        options.ignore_index,
        location,
    )?;
    // the rows that count: not ignored, and not the rows that fill the last chunk
    let valid = valid_rows(&labels, options)?;
    let count = valid.to_dtype(DType::F32)?.sum_all()?;
    let chunks = n.div_ceil(chunk);
    let fill = (chunks * chunk - n) as i64;
    let filled = |t: &Tensor, rank: usize| -> Result<Tensor> {
        if fill == 0 {
            return Ok(t.clone());
        }
        let mut high = vec![0; rank];
        high[0] = fill;
        t.pad(
            &vec![0; rank],
            &high,
            &vec![0; rank],
            &t.constant_like(0.0)?,
        )
    };
    let rows = filled(&hidden, 2)?.reshape(&[chunks, chunk, h])?;
    let targets = filled(&labels, 1)?.reshape(&[chunks, chunk])?;
    let valid = filled(&valid, 1)?.reshape(&[chunks, chunk])?;
    // A loop, not a block per chunk: XLA orders its iterations and cannot merge the backward
    // loop's logits into the forward's. Newer XLA cpu pipelines expand optimization barriers
    // before their last CSE, which undid both for checkpointed blocks (every chunk's logits
    // were alive at once).
    let options_loop = ScanOptions {
        remat: Remat::Full,
        ..ScanOptions::default()
    };
    let (total, _) = scan(
        &[&count.zeros_like()?],
        &[&rows, &targets, &valid],
        options_loop,
        |sum, x| {
            let logits = x[0].linear(weight, None)?.to_dtype(DType::F32)?;
            let (chunk_sum, _) = summed_rows(&logits, &x[1], &x[2], options)?;
            Ok((vec![sum[0].add(&chunk_sum)?], vec![]))
        },
    )?;
    total[0].div(&count)
}
