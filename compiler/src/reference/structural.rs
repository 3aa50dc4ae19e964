//! Ops that move elements: each computes, for every output element, where it comes from.

use crate::ir::TensorType;

use super::data::{for_each_index, strides, Data, Value};

fn gather_by(out: &TensorType, data: &Data, f: impl Fn(&[usize]) -> usize) -> Data {
    let mut idx = Vec::with_capacity(out.element_count());
    for_each_index(&out.dims, |_, o| idx.push(f(o)));
    data.take(&idx)
}

pub(crate) fn broadcast_in_dim(x: &Value, out: &TensorType, bdims: &[usize]) -> Data {
    let s = strides(&x.ty.dims);
    gather_by(out, &x.data, |o| {
        bdims
            .iter()
            .enumerate()
            .map(|(i, &r)| if x.ty.dims[i] == 1 { 0 } else { o[r] * s[i] })
            .sum()
    })
}

pub(crate) fn transpose(x: &Value, out: &TensorType, perm: &[usize]) -> Data {
    let s = strides(&x.ty.dims);
    gather_by(out, &x.data, |o| {
        perm.iter().enumerate().map(|(i, &p)| o[i] * s[p]).sum()
    })
}

pub(crate) fn slice(x: &Value, out: &TensorType, start: &[usize], stride: &[usize]) -> Data {
    let s = strides(&x.ty.dims);
    gather_by(out, &x.data, |o| {
        (0..o.len())
            .map(|i| (start[i] + o[i] * stride[i]) * s[i])
            .sum()
    })
}

/// Start indices clamped so a window of `sizes` fits in `dims`.
pub(crate) fn clamp_starts(starts: &[i64], dims: &[usize], sizes: &[usize]) -> Vec<usize> {
    starts
        .iter()
        .zip(dims.iter().zip(sizes))
        .map(|(&s, (&d, &z))| s.clamp(0, (d - z) as i64) as usize)
        .collect()
}

pub(crate) fn dynamic_slice(x: &Value, out: &TensorType, starts: &[i64]) -> Data {
    let st = clamp_starts(starts, &x.ty.dims, &out.dims);
    let s = strides(&x.ty.dims);
    gather_by(out, &x.data, |o| {
        (0..o.len()).map(|i| (st[i] + o[i]) * s[i]).sum()
    })
}

pub(crate) fn dynamic_update_slice(x: &Value, u: &Value, starts: &[i64]) -> Data {
    let st = clamp_starts(starts, &x.ty.dims, &u.ty.dims);
    let us = strides(&u.ty.dims);
    let n = x.data.len();
    let all = Data::concat(&[&x.data, &u.data]);
    gather_by(&x.ty, &all, |o| {
        let inside = (0..o.len()).all(|i| o[i] >= st[i] && o[i] < st[i] + u.ty.dims[i]);
        if inside {
            n + (0..o.len()).map(|i| (o[i] - st[i]) * us[i]).sum::<usize>()
        } else {
            (0..o.len()).map(|i| o[i] * strides(&x.ty.dims)[i]).sum()
        }
    })
}

pub(crate) fn concatenate(xs: &[&Value], out: &TensorType, dim: usize) -> Data {
    let parts: Vec<&Data> = xs.iter().map(|x| &x.data).collect();
    let all = Data::concat(&parts);
    let mut offsets = Vec::with_capacity(xs.len());
    let (mut base, mut along) = (0, 0);
    for x in xs {
        offsets.push((base, along, strides(&x.ty.dims), x.ty.dims[dim]));
        base += x.data.len();
        along += x.ty.dims[dim];
    }
    gather_by(out, &all, |o| {
        let k = offsets
            .iter()
            .rposition(|&(_, a, _, _)| a <= o[dim])
            .unwrap_or(0);
        let (b, a, s, _) = &offsets[k];
        b + (0..o.len())
            .map(|i| {
                if i == dim {
                    (o[i] - a) * s[i]
                } else {
                    o[i] * s[i]
                }
            })
            .sum::<usize>()
    })
}

pub(crate) fn pad(x: &Value, v: &Value, out: &TensorType, low: &[i64], interior: &[usize]) -> Data {
    let s = strides(&x.ty.dims);
    let n = x.data.len();
    let all = Data::concat(&[&x.data, &v.data]);
    gather_by(out, &all, |o| {
        let mut src = 0;
        for i in 0..o.len() {
            // Position relative to the first operand element, in steps of (interior + 1).
            let p = o[i] as i64 - low[i];
            let step = interior[i] as i64 + 1;
            if p < 0 || p % step != 0 || p / step >= x.ty.dims[i] as i64 {
                return n;
            }
            src += (p / step) as usize * s[i];
        }
        src
    })
}

pub(crate) fn iota(out: &TensorType, dim: usize) -> Data {
    let mut v = Vec::with_capacity(out.element_count());
    for_each_index(&out.dims, |_, o| v.push(o[dim] as u64));
    Data::from_scalars(out.dtype, v.into_iter().map(super::data::Scalar::U))
}

/// Row of `table` for each index (clamped into range, as StableHLO gather does).
pub(crate) fn gather(table: &Value, idx: &Value, out: &TensorType) -> Data {
    let rows = table.ty.dims[0];
    let row_len: usize = table.ty.dims[1..].iter().product();
    let mut src = Vec::with_capacity(out.element_count());
    for k in 0..idx.data.len() {
        let r = idx.data.get(k).as_i64().clamp(0, rows as i64 - 1) as usize;
        src.extend((0..row_len).map(|j| r * row_len + j));
    }
    table.data.take(&src)
}

/// Adds update rows into the table rows named by the indices (out-of-range rows are skipped).
/// Sums are accumulated in f64 and rounded once.
pub(crate) fn scatter_add(table: &Value, idx: &Value, upd: &Value) -> Data {
    let rows = table.ty.dims[0] as i64;
    let row_len: usize = table.ty.dims[1..].iter().product();
    let mut acc: Vec<f64> = (0..table.data.len())
        .map(|i| table.data.get(i).as_f64())
        .collect();
    let mut acc_i: Vec<i64> = (0..table.data.len())
        .map(|i| table.data.get(i).as_i64())
        .collect();
    for k in 0..idx.data.len() {
        let r = idx.data.get(k).as_i64();
        if r < 0 || r >= rows {
            continue;
        }
        for j in 0..row_len {
            let u = upd.data.get(k * row_len + j);
            acc[r as usize * row_len + j] += u.as_f64();
            acc_i[r as usize * row_len + j] =
                acc_i[r as usize * row_len + j].wrapping_add(u.as_i64());
        }
    }
    let d = table.ty.dtype;
    if d.is_float() {
        Data::from_scalars(d, acc.into_iter().map(super::data::Scalar::F))
    } else {
        Data::from_scalars(d, acc_i.into_iter().map(super::data::Scalar::I))
    }
}
