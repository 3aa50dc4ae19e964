//! Gradient rules of the reductions over dimensions of one tensor.

use neuron_pc_compiler::ir::ReduceOp;

use crate::error::Result;
use crate::tensor::Tensor;

/// The cotangent of `reduce(r, dims)(x) = y` for the output cotangent `g`.
pub(super) fn reduce(
    r: &ReduceOp,
    dims: &[usize],
    x: &[Tensor],
    y: &Tensor,
    g: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    let a = &x[0];
    let kept: Vec<usize> = (0..a.rank())
        .map(|i| if dims.contains(&i) { 1 } else { a.dims()[i] })
        .collect();
    let sdims: Vec<isize> = dims.iter().map(|&d| d as isize).collect();
    let spread = |t: &Tensor| -> Result<Tensor> { t.reshape(&kept)?.broadcast_to(a.dims()) };
    let gk = spread(g)?;
    let d = match r {
        // d/dx_i sum(x) = 1
        ReduceOp::Sum => gk,
        // d/dx_i max(x) = 1 at the maximum; tied extremes share the gradient equally
        ReduceOp::Max | ReduceOp::Min => {
            let hit = a.eq(&spread(y)?)?.to_dtype(a.dtype())?;
            let count = hit.sum(&sdims, true)?.broadcast_to(a.dims())?;
            gk.mul(&hit)?.div(&count)?
        }
        // d/dx_i prod(x) = prod_{j != i} x_j: prod/x_i without zeros; with one zero only
        // that element gets the product of the others; with two or more, all get 0
        ReduceOp::Prod => {
            let zero = a.constant_like(0.0)?;
            let is_zero = a.eq(&zero)?;
            let safe = Tensor::where_cond(&is_zero, &a.constant_like(1.0)?, a)?;
            let others = spread(&safe.prod(&sdims, false)?)?;
            let zeros = spread(&is_zero.to_dtype(a.dtype())?.sum(&sdims, false)?)?;
            let at_zero = Tensor::where_cond(&zeros.eq(&a.constant_like(1.0)?)?, &others, &zero)?;
            let elsewhere = Tensor::where_cond(&zeros.eq(&zero)?, &others.div(&safe)?, &zero)?;
            gk.mul(&Tensor::where_cond(&is_zero, &at_zero, &elsewhere)?)?
        }
    };
    Ok(vec![Some(d)])
}
