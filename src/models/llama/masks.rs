//! The additive attention masks of the decoder: padding, packed documents, sliding windows,
//! each the lowest finite value where a key is masked (as transformers builds them).

use neuron_pc_compiler::DType;

use crate::device::LazyDevice;
use crate::error::Result;
use crate::tensor::Tensor;

/// The additive mask `[b or 1, 1, s, s]` that keeps each query inside its document, the
/// documents of a row being the runs of `position_ids` (`[s]` or `[b, s]`) that step by 1
/// (transformers' `find_packed_sequence_indices`). One run per row adds nothing.
pub(super) fn document_mask(position_ids: &Tensor, dtype: DType) -> Result<Tensor> {
    let dev = position_ids.device()?;
    let s = *position_ids.dims().last().unwrap_or(&0);
    if s < 2 {
        return dev.zeros(&[1, 1, s, s], dtype);
    }
    let p = position_ids.reshape(&[
        position_ids.dims()[..position_ids.rank() - 1]
            .iter()
            .product(),
        s,
    ])?;
    // a document starts where the id is not the previous one + 1 (the first always does)
    let previous = Tensor::cat(
        &[
            &p.narrow(1, 0, 1)?.add_scalar(-1.0)?,
            &p.narrow(1, 0, s - 1)?,
        ],
        1,
    )?;
    let starts = p
        .sub(&previous)?
        .ne(&p.constant_like(1.0)?)?
        .to_dtype(DType::F32)?;
    // its running count, the document index: starts times the upper triangle of ones
    let idx = dev.arange(s, DType::I32)?;
    let upper = idx.unsqueeze(1)?.le(&idx)?.to_dtype(DType::F32)?;
    // exact in float32 (counts up to 2^24); autocast would round them in bfloat16
    let document = dev.autocast(None, || starts.matmul(&upper))?; // [b, s]
    let same = document.unsqueeze(2)?.eq(&document.unsqueeze(1)?)?; // [b, s, s]
    let open = dev.zeros(&[s, s], dtype)?;
    let shut = open.constant_like(-lowest(dtype))?;
    Tensor::where_cond(&same, &open, &shut)?.unsqueeze(1)
}

/// The magnitude of `dtype`'s lowest finite value: what an additive mask adds where a key is
/// masked, as transformers builds its masks (a row with every key masked stays finite).
pub(super) fn lowest(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 3.389_531_389_251_535_5e38,
        DType::F16 => 65_504.0,
        DType::F64 => f64::MAX,
        _ => f64::from(f32::MAX),
    }
}

/// The additive band `[1, 1, s, s]` of a sliding window: query `i` keeps keys `j > i - w`
/// (the causal mask does the rest), the others get the lowest value.
pub(super) fn band(dev: &LazyDevice, s: usize, w: usize, dtype: DType) -> Result<Tensor> {
    let rows = dev.arange(s, DType::I32)?.unsqueeze(1)?; // [s, 1]
    let keep = dev.arange(s, DType::I32)?.add_scalar(w as f64)?.gt(&rows)?;
    let open = dev.full(0.0, &[s, s], dtype)?;
    Tensor::where_cond(&keep, &open, &open.constant_like(-lowest(dtype))?)?.reshape(&[1, 1, s, s])
}
