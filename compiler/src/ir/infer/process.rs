//! The types of the ops [`crate::passes::cross_process`] makes: collectives between
//! processes, alone or in buckets.

use crate::error::Result;

use super::{dtype_in, shape_error, unary};
use crate::ir::{Op, ProcessCollective, ReduceOp, TensorType};

/// A [`Op::ProcessCollective`] of one operand (and perhaps an ordering edge, which does not
/// count).
pub(super) fn infer_process_collective(
    op: &Op,
    operands: &[&TensorType],
    collective: ProcessCollective,
    processes: usize,
) -> Result<TensorType> {
    let e = |m: String| shape_error(op, operands, m);
    let x = match operands {
        [x] | [x, _] => *x,
        _ => unary(op, operands)?,
    };
    if processes == 0 {
        return Err(e("no processes".to_string()));
    }
    let mut dims = x.dims.clone();
    match collective {
        ProcessCollective::AllReduce(r) => dtype_in(op, x.dtype, r.dtypes())?,
        ProcessCollective::AllGather { dim } => {
            if dim >= x.rank() {
                return Err(e(format!(
                    "dim {dim} is out of range for rank {}",
                    x.rank()
                )));
            }
            dims[dim] = dims[dim]
                .checked_mul(processes)
                .ok_or_else(|| e("the result is too large".to_string()))?;
        }
        ProcessCollective::ReduceScatter { op: r, dim } => {
            dtype_in(op, x.dtype, r.dtypes())?;
            if dim >= x.rank() || x.dims[dim] % processes != 0 {
                return Err(e(format!(
                    "dimension {dim} must exist and divide by the process count {processes}"
                )));
            }
            dims[dim] /= processes;
        }
        ProcessCollective::Ordered => {}
    }
    Ok(TensorType::new(x.dtype, dims))
}

/// Result `output` of an [`Op::ProcessBucket`] of `layouts` layouts combining with `r`: that
/// operand's type; one layout per operand, all of one dtype.
pub(super) fn infer_process_bucket(
    op: &Op,
    operands: &[&TensorType],
    r: ReduceOp,
    layouts: usize,
    output: usize,
) -> Result<TensorType> {
    let e = |m: String| shape_error(op, operands, m);
    let Some(x) = operands.get(output) else {
        return Err(e(format!("output {output} of {} operands", operands.len())));
    };
    if layouts != operands.len() || operands.iter().any(|o| o.dtype != x.dtype) {
        return Err(e("one layout per operand, all of one dtype".to_string()));
    }
    dtype_in(op, x.dtype, r.dtypes())?;
    Ok((*x).clone())
}
