//! Gradient rules of the row-indexing ops: gather and scatter-add.

use crate::error::Result;
use crate::tensor::Tensor;

/// d/dtable gather(table, i) = g scattered (summed) into the rows that were read, which
/// are the clamped indices.
pub(super) fn gather(x: &[Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let idx = clamp_rows(&x[1], x[0].dims()[0])?;
    Ok(vec![
        Some(x[0].zeros_like()?.scatter_add_rows(&idx, g)?),
        None,
    ])
}

/// d/dtable scatter_add = g; d/dupdates = the rows of g they were added to (zero for
/// out-of-range rows, which scatter_add skips).
pub(super) fn scatter_add(x: &[Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let (table, idx) = (&x[0], &x[1]);
    let rows = table.dims()[0];
    let picked = g.index_select_rows(idx)?;
    let in_range = idx
        .ge(&idx.constant_like(0.0)?)?
        .logical_and(&idx.lt(&idx.constant_like(rows as f64)?)?)?;
    let mut mask_dims = idx.dims().to_vec();
    mask_dims.extend(std::iter::repeat_n(1, table.rank() - 1));
    let du = Tensor::where_cond(
        &in_range.reshape(&mask_dims)?,
        &picked,
        &picked.zeros_like()?,
    )?;
    Ok(vec![Some(g.clone()), None, Some(du)])
}

/// Integer `indices` clamped into `0..rows`, as gather reads them.
fn clamp_rows(indices: &Tensor, rows: usize) -> Result<Tensor> {
    let top = rows.saturating_sub(1) as f64;
    indices
        .maximum(&indices.constant_like(0.0)?)?
        .minimum(&indices.constant_like(top)?)
}
