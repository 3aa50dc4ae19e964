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

    // dlhs contracts g with rhs over rhs's free dims (g . rhs unless only rhs . g needs no
    // transpose): as g . rhs it comes out
    // [batch, lhs_free, rhs's remaining dims (its contract dims, in rhs order)], as rhs . g
    // [batch, rhs's remaining, lhs_free]; each lhs contract dim sits where its rhs partner does.
    let dl = contract_back(
        (g, &g_batch, &g_rhs_free, lhs_free.len()),
        (rhs, rhs_batch, &rhs_free, rhs_contract),
        lhs.rank(),
        (lhs_batch, &lhs_free, lhs_contract),
        true,
        location,
    )?;
    // drhs contracts lhs with g over lhs's free dims, as lhs . g unless g . lhs needs no
    // transpose and lhs . g does.
    let dr = contract_back(
        (g, &g_batch, &g_lhs_free, rhs_free.len()),
        (lhs, lhs_batch, &lhs_free, lhs_contract),
        rhs.rank(),
        (rhs_batch, &rhs_free, rhs_contract),
        false,
        location,
    )?;
    Ok(vec![Some(dl), Some(dr)])
}

/// The gradient of one operand of a dot (`want`, of rank `rank`, with its batch, free and
/// contract dims) from the output gradient `g` (its batch dims, the dims it shares with the
/// other operand, and how many it shares with `want`) and the other operand (its batch, free
/// and contract dims, the contract dims paired in order with `want`'s).
///
/// The dot is written with `g` first or with the other operand first (`g_first` unless only
/// the other order gives the operand's own dimension order), so that no transpose follows it:
/// a weight gradient of `x . w^T` (`w` stored `[out, in]` as PyTorch does) is `g^T . x`, not
/// `(x^T . g)^T`. XLA's
/// CPU backend turns a dot whose result is transposed into one that contracts its first
/// operand's leading dims, which its YNNPACK fusions do not take, so such dots ran as plain
/// (Eigen) dots: 29 of the small Llama step's 111, none now. The step time did not move on
/// the 2-core machine (Eigen's kernels are as fast at these sizes); the program is smaller.
/// The 8 left are attention's key and value gradients, whose operands both contract a middle
/// dim (XLA folds a transpose put before them back into the dot).
#[allow(clippy::type_complexity)]
fn contract_back(
    (g, g_batch, g_other, shared): (&Tensor, &[usize], &[usize], usize),
    (other, other_batch, other_free, other_contract): (&Tensor, &[usize], &[usize], &[usize]),
    rank: usize,
    (want_batch, want_free, want_contract): (&[usize], &[usize], &[usize]),
    g_first: bool,
    location: &'static Location<'static>,
) -> Result<Tensor> {
    let nb = want_batch.len();
    // the other operand's dims left after the dot: its contract dims, in its order
    let mut remaining: Vec<usize> = other_contract.to_vec();
    remaining.sort_unstable();
    // where each of `want`'s dims sits in the dot's result, g first or the other first
    let place = |g_first: bool| -> Vec<usize> {
        let (free_at, rem_at) = if g_first {
            (nb, nb + shared)
        } else {
            (nb + remaining.len(), nb)
        };
        let mut pos = vec![0usize; rank];
        for (i, &d) in want_batch.iter().enumerate() {
            pos[d] = i;
        }
        for (i, &d) in want_free.iter().enumerate() {
            pos[d] = free_at + i;
        }
        for (k, &d) in want_contract.iter().enumerate() {
            let partner = other_contract[k];
            pos[d] = rem_at
                + remaining
                    .iter()
                    .position(|&x| x == partner)
                    .expect("contract dim");
        }
        pos
    };
    let identity = |p: &[usize]| p.iter().enumerate().all(|(i, &d)| i == d);
    let g_first = if identity(&place(g_first)) || !identity(&place(!g_first)) {
        g_first
    } else {
        !g_first
    };
    let op = if g_first {
        Op::DotGeneral {
            lhs_batch: g_batch.to_vec(),
            rhs_batch: other_batch.to_vec(),
            lhs_contract: g_other.to_vec(),
            rhs_contract: other_free.to_vec(),
        }
    } else {
        Op::DotGeneral {
            lhs_batch: other_batch.to_vec(),
            rhs_batch: g_batch.to_vec(),
            lhs_contract: other_free.to_vec(),
            rhs_contract: g_other.to_vec(),
        }
    };
    let operands = if g_first { [g, other] } else { [other, g] };
    let d = Tensor::apply_at(op, &operands, location)?;
    d.permute_dims(&place(g_first))
}
