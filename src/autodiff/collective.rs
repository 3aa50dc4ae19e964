//! Gradient rules of the collectives. The loss of an SPMD program is the sum of the replicas'
//! losses, so the cotangent of an operand on replica k sums what every replica's result
//! received from it.

use std::panic::Location;

use neuron_pc_compiler::ir::{Op, ReduceOp};

use super::non_diff;
use crate::error::Result;
use crate::tensor::Tensor;

/// The cotangent of `all_reduce(r)(x) = y` on every replica of `groups`.
pub(super) fn all_reduce(
    op: &Op,
    r: &ReduceOp,
    groups: &[Vec<usize>],
    x: &[Tensor],
    y: &Tensor,
    g: &Tensor,
    location: &'static Location<'static>,
) -> Result<Vec<Option<Tensor>>> {
    Ok(match r {
        // sum: every replica's result holds x_k, so x̄_k = sum over the group of ȳ
        ReduceOp::Sum => vec![Some(group_sum(g, groups, location)?)],
        // max/min: x_k reached the result where it equals it (ties share)
        ReduceOp::Max | ReduceOp::Min => {
            let hit = x[0].eq(y)?.to_dtype(g.dtype())?;
            let count = group_sum(&hit, groups, location)?;
            let total = group_sum(g, groups, location)?;
            vec![Some(total.mul(&hit)?.div(&count)?)]
        }
        ReduceOp::Prod => return Err(non_diff(op, location)),
    })
}

/// Concatenation: x_k is block k of every replica's result, so x̄_k is block k of the group's
/// sum of ȳ (a reduce-scatter).
pub(super) fn all_gather(
    dim: usize,
    groups: &[Vec<usize>],
    g: &Tensor,
    location: &'static Location<'static>,
) -> Result<Vec<Option<Tensor>>> {
    let op = Op::ReduceScatter {
        op: ReduceOp::Sum,
        dim,
        replica_groups: groups.to_vec(),
    };
    Ok(vec![Some(Tensor::apply_at(op, &[g], location)?)])
}

/// The cotangent of `reduce_scatter(r, dim)(x) = y` on every replica of `groups`.
#[allow(clippy::too_many_arguments)]
pub(super) fn reduce_scatter(
    op: &Op,
    r: &ReduceOp,
    dim: usize,
    groups: &[Vec<usize>],
    x: &[Tensor],
    y: &Tensor,
    g: &Tensor,
    location: &'static Location<'static>,
) -> Result<Vec<Option<Tensor>>> {
    Ok(match r {
        // block j of the group's sum went to replica j: x̄_k gathers every ȳ_j
        ReduceOp::Sum => vec![Some(gather(g, dim, groups, location)?)],
        ReduceOp::Max | ReduceOp::Min => {
            let whole = gather(y, dim, groups, location)?;
            let hit = x[0].eq(&whole)?.to_dtype(g.dtype())?;
            let count = group_sum(&hit, groups, location)?;
            let total = gather(g, dim, groups, location)?;
            vec![Some(total.mul(&hit)?.div(&count)?)]
        }
        ReduceOp::Prod => return Err(non_diff(op, location)),
    })
}

/// The sum of `t` over each replica group (an all-reduce).
fn group_sum(
    t: &Tensor,
    groups: &[Vec<usize>],
    location: &'static Location<'static>,
) -> Result<Tensor> {
    let op = Op::AllReduce {
        op: ReduceOp::Sum,
        replica_groups: groups.to_vec(),
    };
    Tensor::apply_at(op, &[t], location)
}

/// The group's `t` concatenated along `dim` (an all-gather).
fn gather(
    t: &Tensor,
    dim: usize,
    groups: &[Vec<usize>],
    location: &'static Location<'static>,
) -> Result<Tensor> {
    let op = Op::AllGather {
        dim,
        replica_groups: groups.to_vec(),
    };
    Tensor::apply_at(op, &[t], location)
}
