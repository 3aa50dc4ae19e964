//! Gradient rules of the shape ops: broadcast, transpose, slices, concatenation and padding
//! (reshape's is one line, in the dispatcher).

use crate::error::Result;
use crate::tensor::Tensor;

/// d/dx broadcast(x): the gradient summed over the new and the stretched dimensions.
pub(super) fn broadcast_in_dim(
    x: &[Tensor],
    g: &Tensor,
    dims: &[usize],
    broadcast_dimensions: &[usize],
) -> Result<Vec<Option<Tensor>>> {
    // d/dx broadcast(x) sums the gradient over the new dimensions and over those
    // stretched from size 1; the remaining ones map back in operand order.
    let src = x[0].dims();
    let mut summed: Vec<isize> = (0..dims.len())
        .filter(|d| !broadcast_dimensions.contains(d))
        .map(|d| d as isize)
        .collect();
    // (result dimension, operand dimension) of the dimensions that survive the sum
    let mut kept: Vec<(usize, usize)> = Vec::new();
    for (i, &d) in broadcast_dimensions.iter().enumerate() {
        if src[i] == 1 && dims[d] != 1 {
            summed.push(d as isize);
        } else {
            kept.push((d, i));
        }
    }
    let s = if summed.is_empty() {
        g.clone()
    } else {
        g.sum(&summed, false)?
    };
    // After the sum they sit in result order; broadcast_dimensions need not be sorted.
    kept.sort_unstable();
    let mut perm: Vec<usize> = (0..kept.len()).collect();
    perm.sort_by_key(|&j| kept[j].1);
    let s = if perm.iter().enumerate().all(|(i, &p)| i == p) {
        s
    } else {
        s.permute_dims(&perm)?
    };
    Ok(vec![Some(s.reshape(src)?)])
}

/// d/dx transpose(x, perm) = transpose(g, perm^-1).
pub(super) fn transpose(g: &Tensor, perm: &[usize]) -> Result<Vec<Option<Tensor>>> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    Ok(vec![Some(g.permute_dims(&inv)?)])
}

/// d/dx slice(x) = g placed back at start + i * stride, zeros elsewhere.
pub(super) fn slice(
    x: &[Tensor],
    g: &Tensor,
    start: &[usize],
    stride: &[usize],
) -> Result<Vec<Option<Tensor>>> {
    let src = x[0].dims();
    let low: Vec<i64> = start.iter().map(|&s| s as i64).collect();
    let high: Vec<i64> = (0..src.len())
        .map(|i| {
            let n = g.dims()[i];
            let end = if n == 0 {
                start[i]
            } else {
                start[i] + (n - 1) * stride[i] + 1
            };
            src[i] as i64 - end as i64
        })
        .collect();
    let interior: Vec<usize> = stride.iter().map(|&s| s - 1).collect();
    let zero = g.constant_like(0.0)?;
    Ok(vec![Some(g.pad(&low, &high, &interior, &zero)?)])
}

/// d/dx dynamic_slice(x, s) = g written into zeros at the same (clamped) offsets.
pub(super) fn dynamic_slice(x: &[Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let starts: Vec<&Tensor> = x[1..].iter().collect();
    let dx = x[0].zeros_like()?.dynamic_update_slice(g, &starts)?;
    let mut grads = vec![Some(dx)];
    grads.extend(x[1..].iter().map(|_| None));
    Ok(grads)
}

/// d/dx update(x, u, s) = g with the window cleared; d/du = the window of g.
pub(super) fn dynamic_update_slice(x: &[Tensor], g: &Tensor) -> Result<Vec<Option<Tensor>>> {
    let update = &x[1];
    let starts: Vec<&Tensor> = x[2..].iter().collect();
    let cleared = g.dynamic_update_slice(&update.zeros_like()?, &starts)?;
    let du = g.dynamic_slice(&starts, update.dims())?;
    let mut grads = vec![Some(cleared), Some(du)];
    grads.extend(x[2..].iter().map(|_| None));
    Ok(grads)
}

/// d/dx_k concat(x) = the k-th block of g.
pub(super) fn concatenate(x: &[Tensor], g: &Tensor, dim: &usize) -> Result<Vec<Option<Tensor>>> {
    let mut at = 0;
    let mut grads = Vec::new();
    for t in x {
        let n = t.dims()[*dim];
        grads.push(Some(g.narrow(*dim as isize, at, n)?));
        at += n;
    }
    Ok(grads)
}

/// d/dx pad(x, v) = g at low + i * (interior + 1) (zero where negative low/high cropped
/// x); d/dv = the sum of g over the padding positions.
pub(super) fn pad(
    x: &[Tensor],
    g: &Tensor,
    low: &[i64],
    high: &[i64],
    interior: &[usize],
) -> Result<Vec<Option<Tensor>>> {
    let src = x[0].dims();
    // Pad g first by what was cropped, so every operand element has a position.
    let pre: Vec<i64> = low.iter().map(|&l| (-l).max(0)).collect();
    let post: Vec<i64> = high.iter().map(|&h| (-h).max(0)).collect();
    let gp = if pre.iter().chain(&post).all(|&p| p == 0) {
        g.clone()
    } else {
        g.pad(&pre, &post, &vec![0; src.len()], &g.constant_like(0.0)?)?
    };
    let start: Vec<usize> = low.iter().map(|&l| l.max(0) as usize).collect();
    let stride: Vec<usize> = interior.iter().map(|&i| i + 1).collect();
    let limit: Vec<usize> = (0..src.len())
        .map(|i| {
            if src[i] == 0 {
                start[i]
            } else {
                start[i] + (src[i] - 1) * stride[i] + 1
            }
        })
        .collect();
    let dx = gp.slice_strided(&start, &limit, &stride)?;
    // 1 where the output holds the pad value (exact, unlike sum(g) - sum(dx))
    let is_pad = x[0]
        .zeros_like()?
        .pad(low, high, interior, &g.constant_like(1.0)?)?;
    let dv = g.mul(&is_pad)?.sum_all()?;
    Ok(vec![Some(dx), Some(dv)])
}
