//! Reductions, argmax/argmin and dot_general: explicit loops over output elements.

use crate::dtype::DType;
use crate::ir::{ReduceOp, TensorType};

use super::data::{for_each_index, strides, Data, Scalar, Value};

/// Linear source positions of every element reduced into each output element: outer list in
/// output order, inner list in row-major order of the reduced dimensions.
fn groups(x: &TensorType, reduced: &[usize]) -> Vec<Vec<usize>> {
    let s = strides(&x.dims);
    let kept: Vec<usize> = (0..x.rank()).filter(|i| !reduced.contains(i)).collect();
    let kept_dims: Vec<usize> = kept.iter().map(|&i| x.dims[i]).collect();
    let red_dims: Vec<usize> = reduced.iter().map(|&i| x.dims[i]).collect();
    let mut out = Vec::new();
    for_each_index(&kept_dims, |_, o| {
        let base: usize = kept.iter().zip(o).map(|(&k, &v)| v * s[k]).sum();
        let mut g = Vec::new();
        for_each_index(&red_dims, |_, r| {
            g.push(
                base + reduced
                    .iter()
                    .zip(r)
                    .map(|(&k, &v)| v * s[k])
                    .sum::<usize>(),
            )
        });
        out.push(g);
    });
    out
}

/// Floats are accumulated in f64 and rounded once; max/min propagate NaN.
pub(crate) fn reduce(op: ReduceOp, x: &Value, dims: &[usize]) -> Data {
    let d = x.ty.dtype;
    let gs = groups(&x.ty, dims);
    match &x.data {
        Data::F(v) => Data::from_scalars(
            d,
            gs.iter().map(|g| {
                let it = g.iter().map(|&i| v[i]);
                Scalar::F(match op {
                    ReduceOp::Sum => it.sum(),
                    ReduceOp::Prod => it.product(),
                    ReduceOp::Max => it.fold(f64::NEG_INFINITY, |a, b| {
                        if a.is_nan() || b.is_nan() {
                            f64::NAN
                        } else {
                            a.max(b)
                        }
                    }),
                    ReduceOp::Min => it.fold(f64::INFINITY, |a, b| {
                        if a.is_nan() || b.is_nan() {
                            f64::NAN
                        } else {
                            a.min(b)
                        }
                    }),
                })
            }),
        ),
        Data::I(v) => Data::from_scalars(
            d,
            gs.iter().map(|g| {
                let it = g.iter().map(|&i| v[i]);
                Scalar::I(match op {
                    ReduceOp::Sum => it.fold(0i64, |a, b| a.wrapping_add(b)),
                    ReduceOp::Prod => it.fold(1i64, |a, b| a.wrapping_mul(b)),
                    ReduceOp::Max => it.fold(
                        if d == DType::I32 {
                            i32::MIN as i64
                        } else {
                            i64::MIN
                        },
                        i64::max,
                    ),
                    ReduceOp::Min => it.fold(
                        if d == DType::I32 {
                            i32::MAX as i64
                        } else {
                            i64::MAX
                        },
                        i64::min,
                    ),
                })
            }),
        ),
        Data::U(v) => Data::from_scalars(
            d,
            gs.iter().map(|g| {
                let it = g.iter().map(|&i| v[i]);
                Scalar::U(match op {
                    ReduceOp::Sum => it.fold(0u64, |a, b| a.wrapping_add(b)),
                    ReduceOp::Prod => it.fold(1u64, |a, b| a.wrapping_mul(b)),
                    ReduceOp::Max => it.fold(0, u64::max),
                    ReduceOp::Min => it.fold(u64::MAX >> (64 - 8 * d.size_in_bytes()), u64::min),
                })
            }),
        ),
        Data::P(_) => x.data.clone(),
    }
}

/// First index of the largest (`max`) or smallest element along `dim`; NaN beats any number.
pub(crate) fn arg_reduce(x: &Value, dim: usize, index_dtype: DType, max: bool) -> Data {
    let gs = groups(&x.ty, &[dim]);
    let better = |a: Scalar, b: Scalar| -> bool {
        let (a, b) = (a.as_f64_exact(), b.as_f64_exact());
        match (a, b) {
            (Ok(a), Ok(b)) => {
                if a.is_nan() || b.is_nan() {
                    a.is_nan() && !b.is_nan()
                } else if max {
                    a > b
                } else {
                    a < b
                }
            }
            (Err(a), Err(b)) => {
                if max {
                    a > b
                } else {
                    a < b
                }
            }
            _ => false,
        }
    };
    let idx = gs.iter().map(|g| {
        let mut best = 0;
        for (k, &i) in g.iter().enumerate().skip(1) {
            if better(x.data.get(i), x.data.get(g[best])) {
                best = k;
            }
        }
        Scalar::U(best as u64)
    });
    Data::from_scalars(index_dtype, idx)
}

impl Scalar {
    /// Floats as `Ok(f64)`; integers as `Err(i128)` so that every i64/u64 compares exactly.
    fn as_f64_exact(self) -> Result<f64, i128> {
        match self {
            Scalar::F(v) => Ok(v),
            Scalar::I(v) => Err(v as i128),
            Scalar::U(v) => Err(v as i128),
            Scalar::P(v) => Err(v as i128),
        }
    }
}

pub(crate) fn dot_general(
    l: &Value,
    r: &Value,
    out: &TensorType,
    (lb, rb, lc, rc): (&[usize], &[usize], &[usize], &[usize]),
) -> Data {
    let (ls, rs) = (strides(&l.ty.dims), strides(&r.ty.dims));
    let lfree: Vec<usize> = (0..l.ty.rank())
        .filter(|i| !lb.contains(i) && !lc.contains(i))
        .collect();
    let rfree: Vec<usize> = (0..r.ty.rank())
        .filter(|i| !rb.contains(i) && !rc.contains(i))
        .collect();
    let cdims: Vec<usize> = lc.iter().map(|&i| l.ty.dims[i]).collect();
    // The (lhs, rhs) offsets of every contraction position, the same for each output element.
    let mut offsets = Vec::new();
    for_each_index(&cdims, |_, c| {
        let lo: usize = c.iter().zip(lc).map(|(&v, &d)| v * ls[d]).sum();
        let ro: usize = c.iter().zip(rc).map(|(&v, &d)| v * rs[d]).sum();
        offsets.push((lo, ro));
    });
    let float = l.ty.dtype.is_float();
    let mut vals = Vec::with_capacity(out.element_count());
    for_each_index(&out.dims, |_, o| {
        let (bo, rest) = o.split_at(lb.len());
        let (lo, ro) = rest.split_at(lfree.len());
        let mut lbase = 0;
        let mut rbase = 0;
        for (k, &v) in bo.iter().enumerate() {
            lbase += v * ls[lb[k]];
            rbase += v * rs[rb[k]];
        }
        for (k, &v) in lo.iter().enumerate() {
            lbase += v * ls[lfree[k]];
        }
        for (k, &v) in ro.iter().enumerate() {
            rbase += v * rs[rfree[k]];
        }
        let (mut fsum, mut isum) = (0.0f64, 0i64);
        for &(lo, ro) in &offsets {
            let (a, b) = (l.data.get(lbase + lo), r.data.get(rbase + ro));
            if float {
                fsum += a.as_f64() * b.as_f64();
            } else {
                isum = isum.wrapping_add(a.as_i64().wrapping_mul(b.as_i64()));
            }
        }
        vals.push(if float {
            Scalar::F(fsum)
        } else {
            Scalar::I(isum)
        });
    });
    Data::from_scalars(out.dtype, vals.into_iter())
}
