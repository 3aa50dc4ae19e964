//! Gradient rules of the windowed ops, convolution and pooling: each is the vjp of the same
//! computation written with primitives that have rules (pad, strided slices, `dot_general`,
//! reduce), taken by [`grad`] on stopped copies of the operands so that only the paths through
//! this op count.

use std::panic::Location;

use neuron_pc_compiler::ir::{Op, ReduceOp};

use super::grad;
use crate::error::Result;
use crate::tensor::Tensor;

/// Gradients of [`Op::Convolution`] with respect to its input and kernel for the output
/// gradient `g`: the vjp of `Tensor::conv_composite` on stopped copies of the operands, so
/// only the paths through this convolution count.
pub(super) fn convolution(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    geometry: (&[usize], &[usize], &[usize]),
    groups: usize,
    location: &'static Location<'static>,
) -> Result<(Tensor, Tensor)> {
    let (xd, wd, gd) = (x.detach()?, w.detach()?, g.detach()?);
    let y = xd.conv_composite(&wd, geometry, groups, location)?;
    let loss = y.mul(&gd)?.sum_all()?;
    let mut grads = grad(&loss, &[&xd, &wd])?.into_iter();
    match (grads.next(), grads.next()) {
        (Some(dx), Some(dw)) => Ok((dx, dw)),
        _ => unreachable!("grad returns one gradient per tensor asked for"),
    }
}

/// Gradient of [`Op::ReduceWindow`] for the output gradient `g`: the vjp of the same
/// reduction written as one strided slice of the padded input per window offset, stacked
/// and reduced with `reduce` (so a maximum's gradient goes to the window's maximum; tied
/// maxima share it).
pub(super) fn reduce_window(
    x: &Tensor,
    g: &Tensor,
    reduce: ReduceOp,
    (window, stride, padding): (&[usize], &[usize], &[usize]),
    location: &'static Location<'static>,
) -> Result<Tensor> {
    let (xd, gd) = (x.detach()?, g.detach()?);
    let fill = match reduce {
        ReduceOp::Sum => 0.0,
        ReduceOp::Prod => 1.0,
        ReduceOp::Max => f64::NEG_INFINITY,
        ReduceOp::Min => f64::INFINITY,
    };
    let padded = if padding.iter().all(|&p| p == 0) {
        xd.clone()
    } else {
        let edge: Vec<i64> = padding.iter().map(|&p| p as i64).collect();
        Tensor::apply_at(
            Op::Pad {
                low: edge.clone(),
                high: edge,
                interior: vec![0; padding.len()],
            },
            &[&xd, &xd.constant_like(fill)?],
            location,
        )?
    };
    let out = g.dims();
    let offsets: usize = window.iter().product();
    let mut with_axis = vec![1];
    with_axis.extend_from_slice(out);
    let mut slices = Vec::with_capacity(offsets);
    for flat in 0..offsets {
        // row-major window offset
        let mut rest = flat;
        let mut start = vec![0; window.len()];
        for i in (0..window.len()).rev() {
            start[i] = rest % window[i];
            rest /= window[i];
        }
        let limit: Vec<usize> = (0..window.len())
            .map(|i| start[i] + (out[i] - 1) * stride[i] + 1)
            .collect();
        let piece = Tensor::apply_at(
            Op::Slice {
                start,
                limit,
                stride: stride.to_vec(),
            },
            &[&padded],
            location,
        )?;
        slices.push(piece.reshape_at(&with_axis, location)?);
    }
    let refs: Vec<&Tensor> = slices.iter().collect();
    let stacked = Tensor::apply_at(Op::Concatenate { dim: 0 }, &refs, location)?;
    let y = Tensor::apply_at(Op::Reduce(reduce, vec![0]), &[&stacked], location)?;
    let loss = y.mul(&gd)?.sum_all()?;
    let mut grads = grad(&loss, &[&xd])?;
    Ok(grads.remove(0))
}
