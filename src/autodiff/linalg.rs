//! The gradient rule of `dot_general` (matmul, batched matmul, any contraction).

use std::panic::Location;

use neuron_pc_compiler::ir::Op;

use crate::error::Result;
use crate::tensor::Tensor;

/// Gradients of `dot_general`: contract the output gradient with the other operand over that
/// operand's free dimensions, then put the result's dimensions back in operand order.
#[allow(clippy::too_many_arguments)]
pub(super) fn dot_general(
    lhs: &Tensor,
    rhs: &Tensor,
    g: &Tensor,
    lhs_batch: &[usize],
    rhs_batch: &[usize],
    lhs_contract: &[usize],
    rhs_contract: &[usize],
    location: &'static Location<'static>,
) -> Result<Vec<Option<Tensor>>> {
    let nb = lhs_batch.len();
    let free = |rank: usize, batch: &[usize], contract: &[usize]| -> Vec<usize> {
        (0..rank)
            .filter(|d| !batch.contains(d) && !contract.contains(d))
            .collect()
    };
    let lhs_free = free(lhs.rank(), lhs_batch, lhs_contract);
    let rhs_free = free(rhs.rank(), rhs_batch, rhs_contract);
    let g_batch: Vec<usize> = (0..nb).collect();
    let g_lhs_free: Vec<usize> = (nb..nb + lhs_free.len()).collect();
    let g_rhs_free: Vec<usize> =
        (nb + lhs_free.len()..nb + lhs_free.len() + rhs_free.len()).collect();

    // dlhs = g . rhs over rhs's free dims → [batch, lhs_free, rhs's remaining (= its contract
    // dims, in rhs order)].
    let dl = Tensor::apply_at(
        Op::DotGeneral {
            lhs_batch: g_batch.clone(),
            rhs_batch: rhs_batch.to_vec(),
            lhs_contract: g_rhs_free.clone(),
            rhs_contract: rhs_free.clone(),
        },
        &[g, rhs],
        location,
    )?;
    // Where each lhs dimension sits in `dl`.
    let mut rhs_remaining: Vec<usize> = rhs_contract.to_vec();
    rhs_remaining.sort_unstable();
    let mut pos_l = vec![0usize; lhs.rank()];
    for (i, &d) in lhs_batch.iter().enumerate() {
        pos_l[d] = i;
    }
    for (i, &d) in lhs_free.iter().enumerate() {
        pos_l[d] = nb + i;
    }
    for (k, &d) in lhs_contract.iter().enumerate() {
        let r = rhs_contract[k];
        pos_l[d] = nb
            + lhs_free.len()
            + rhs_remaining
                .iter()
                .position(|&x| x == r)
                .expect("contract dim");
    }
    let dl = dl.permute_dims(&pos_l)?;

    // drhs = lhs . g over lhs's free dims → [batch, lhs's remaining (its contract dims, in lhs
    // order), rhs_free].
    let dr = Tensor::apply_at(
        Op::DotGeneral {
            lhs_batch: lhs_batch.to_vec(),
            rhs_batch: g_batch,
            lhs_contract: lhs_free.clone(),
            rhs_contract: g_lhs_free,
        },
        &[lhs, g],
        location,
    )?;
    let mut lhs_remaining: Vec<usize> = lhs_contract.to_vec();
    lhs_remaining.sort_unstable();
    let mut pos_r = vec![0usize; rhs.rank()];
    for (i, &d) in rhs_batch.iter().enumerate() {
        pos_r[d] = i;
    }
    for (k, &d) in rhs_contract.iter().enumerate() {
        let l = lhs_contract[k];
        pos_r[d] = nb
            + lhs_remaining
                .iter()
                .position(|&x| x == l)
                .expect("contract dim");
    }
    for (i, &d) in rhs_free.iter().enumerate() {
        pos_r[d] = nb + lhs_remaining.len() + i;
    }
    let dr = dr.permute_dims(&pos_r)?;
    Ok(vec![Some(dl), Some(dr)])
}
