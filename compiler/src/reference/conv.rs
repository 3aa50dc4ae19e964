//! `convolution` and `reduce_window` by their definitions: every convolution output sums input
//! times kernel over the channels of its group and the kernel window, with zeros outside the
//! input; every window reduction combines the positions inside the input.

use crate::ir::{ReduceOp, TensorType};

use super::data::{for_each_index, strides, Data, Scalar, Value};

pub(crate) fn convolution(
    x: &Value,
    w: &Value,
    out: &TensorType,
    (stride, padding, dilation): (&[usize], &[usize], &[usize]),
    groups: usize,
) -> Data {
    let (xs, ws) = (strides(&x.ty.dims), strides(&w.ty.dims));
    let spatial = &x.ty.dims[2..];
    let kernel = &w.ty.dims[2..];
    let cg = w.ty.dims[1];
    let og = out.dims[1] / groups;
    let float = x.ty.dtype.is_float();
    let mut vals = Vec::with_capacity(out.element_count());
    for_each_index(&out.dims, |_, o| {
        let (b, oc, pos) = (o[0], o[1], &o[2..]);
        let group = oc / og;
        let (mut fsum, mut isum) = (0.0f64, 0i64);
        for ci in 0..cg {
            let xc = b * xs[0] + (group * cg + ci) * xs[1];
            let wc = oc * ws[0] + ci * ws[1];
            for_each_index(kernel, |_, k| {
                let mut xo = xc;
                for (i, &ki) in k.iter().enumerate() {
                    let p = (pos[i] * stride[i] + ki * dilation[i]) as i64 - padding[i] as i64;
                    if p < 0 || p as usize >= spatial[i] {
                        return;
                    }
                    xo += p as usize * xs[2 + i];
                }
                let wo = wc
                    + k.iter()
                        .enumerate()
                        .map(|(i, &ki)| ki * ws[2 + i])
                        .sum::<usize>();
                let (a, c) = (x.data.get(xo), w.data.get(wo));
                if float {
                    fsum += a.as_f64() * c.as_f64();
                } else {
                    isum = isum.wrapping_add(a.as_i64().wrapping_mul(c.as_i64()));
                }
            });
        }
        vals.push(if float {
            Scalar::F(fsum)
        } else {
            Scalar::I(isum)
        });
    });
    Data::from_scalars(out.dtype, vals.into_iter())
}

/// `reduce_window` by definition: positions in the padding hold the reduction's identity, so
/// they are skipped; max/min propagate NaN, as `reduce` does.
pub(crate) fn reduce_window(
    op: ReduceOp,
    x: &Value,
    out: &TensorType,
    (window, stride, padding): (&[usize], &[usize], &[usize]),
) -> Data {
    let xs = strides(&x.ty.dims);
    let mut vals = Vec::with_capacity(out.element_count());
    for_each_index(&out.dims, |_, o| {
        let mut acc = match op {
            ReduceOp::Sum => 0.0,
            ReduceOp::Prod => 1.0,
            ReduceOp::Max => f64::NEG_INFINITY,
            ReduceOp::Min => f64::INFINITY,
        };
        for_each_index(window, |_, k| {
            let mut at = 0;
            for (i, &ki) in k.iter().enumerate() {
                let p = (o[i] * stride[i] + ki) as i64 - padding[i] as i64;
                if p < 0 || p as usize >= x.ty.dims[i] {
                    return;
                }
                at += p as usize * xs[i];
            }
            let v = x.data.get(at).as_f64();
            acc = match op {
                ReduceOp::Sum => acc + v,
                ReduceOp::Prod => acc * v,
                ReduceOp::Max | ReduceOp::Min if acc.is_nan() || v.is_nan() => f64::NAN,
                ReduceOp::Max => acc.max(v),
                ReduceOp::Min => acc.min(v),
            };
        });
        vals.push(Scalar::F(acc));
    });
    Data::from_scalars(out.dtype, vals.into_iter())
}
