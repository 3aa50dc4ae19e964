//! Convolution and pooling over 1 or 2 spatial dimensions (PyTorch's NCL / NCHW layouts).
//!
//! `conv1d`/`conv2d` record one [`Op::Convolution`] (StableHLO `convolution`, so the backend
//! compiler sees a real convolution). Its gradient is the vjp of the same convolution written as
//! an im2col composite: the input padded, one strided slice per kernel offset gathering the
//! patches, and one `dot_general` batched over the groups; the pad, slice and `dot_general`
//! rules differentiate that. Pooling records one [`Op::ReduceWindow`] (StableHLO
//! `reduce_window`); its gradient is likewise the vjp of the windows gathered by strided slices
//! and reduced. Both rules are in `autodiff/window.rs`, beside the other gradient rules.

use std::panic::Location;

use neuron_pc_compiler::ir::{Op, ReduceOp};

use super::shape::shape_error;
use super::Tensor;
use crate::error::Result;

/// Window geometry of a convolution or pooling over `k` spatial dimensions.
struct Window<'a> {
    kernel: &'a [usize],
    stride: &'a [usize],
    padding: &'a [usize],
    dilation: &'a [usize],
}

impl Tensor {
    /// `torch.nn.functional.conv1d`: input `[n, c_in, l]`, weight `[c_out, c_in / groups, k]`,
    /// optional bias `[c_out]` → `[n, c_out, l_out]`.
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn conv1d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: usize,
        padding: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<Tensor> {
        self.conv_at(
            "conv1d",
            weight,
            bias,
            (&[stride], &[padding], &[dilation]),
            groups,
            Location::caller(),
        )
    }

    /// `torch.nn.functional.conv2d`: input `[n, c_in, h, w]`, weight
    /// `[c_out, c_in / groups, kh, kw]`, optional bias `[c_out]` → `[n, c_out, h_out, w_out]`;
    /// `stride`, `padding` and `dilation` are per spatial dimension.
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn conv2d(
        &self,
        weight: &Tensor,
        bias: Option<&Tensor>,
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
        groups: usize,
    ) -> Result<Tensor> {
        self.conv_at(
            "conv2d",
            weight,
            bias,
            (&stride, &padding, &dilation),
            groups,
            Location::caller(),
        )
    }

    /// `torch.nn.functional.max_pool1d` over `[n, c, l]` (implicit padding is `-inf`).
    #[track_caller]
    pub fn max_pool1d(&self, kernel: usize, stride: usize, padding: usize) -> Result<Tensor> {
        self.pool_at(
            "max_pool1d",
            ReduceOp::Max,
            &[kernel],
            &[stride],
            &[padding],
            Location::caller(),
        )
    }

    /// `torch.nn.functional.max_pool2d` over `[n, c, h, w]` (implicit padding is `-inf`).
    #[track_caller]
    pub fn max_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Tensor> {
        self.pool_at(
            "max_pool2d",
            ReduceOp::Max,
            &kernel,
            &stride,
            &padding,
            Location::caller(),
        )
    }

    /// `torch.nn.functional.avg_pool1d` over `[n, c, l]` (zero padding counts in the mean,
    /// PyTorch's default `count_include_pad=True`).
    #[track_caller]
    pub fn avg_pool1d(&self, kernel: usize, stride: usize, padding: usize) -> Result<Tensor> {
        self.pool_at(
            "avg_pool1d",
            ReduceOp::Sum,
            &[kernel],
            &[stride],
            &[padding],
            Location::caller(),
        )
    }

    /// `torch.nn.functional.avg_pool2d` over `[n, c, h, w]` (zero padding counts in the mean).
    #[track_caller]
    pub fn avg_pool2d(
        &self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    ) -> Result<Tensor> {
        self.pool_at(
            "avg_pool2d",
            ReduceOp::Sum,
            &kernel,
            &stride,
            &padding,
            Location::caller(),
        )
    }

    fn conv_at(
        &self,
        op: &'static str,
        weight: &Tensor,
        bias: Option<&Tensor>,
        (stride, padding, dilation): (&[usize], &[usize], &[usize]),
        groups: usize,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let k = stride.len();
        let err = |message: String| {
            shape_error(
                op,
                format!("{}, {}", self.ty(), weight.ty()),
                message,
                location,
            )
        };
        if self.rank() != k + 2 || weight.rank() != k + 2 {
            return Err(err(format!(
                "input and weight must have rank {} (batch, channels, {k} spatial)",
                k + 2
            )));
        }
        let (c_in, c_out) = (self.dims()[1], weight.dims()[0]);
        if groups == 0 || !c_in.is_multiple_of(groups) || !c_out.is_multiple_of(groups) {
            return Err(err(format!(
                "groups ({groups}) must divide the input channels ({c_in}) and the output \
                 channels ({c_out})"
            )));
        }
        if weight.dims()[1] * groups != c_in {
            return Err(err(format!(
                "weight dimension 1 is {} but input channels / groups is {}",
                weight.dims()[1],
                c_in / groups
            )));
        }
        if let Some(b) = bias {
            if b.dims() != [c_out] {
                return Err(err(format!("the bias must be [{c_out}], got {}", b.ty())));
            }
        }
        let (x, w) = Tensor::promoted(self, weight, location)?;
        let window = Window {
            kernel: &weight.dims()[2..],
            stride,
            padding,
            dilation,
        };
        // the shape errors name the user's op, not the primitive
        x.window_out(op, &window, location)?;
        let y = Tensor::apply_at(
            Op::Convolution {
                stride: stride.to_vec(),
                padding: padding.to_vec(),
                dilation: dilation.to_vec(),
                groups,
            },
            &[&x, &w],
            location,
        )?;
        match bias {
            Some(b) => {
                let mut bd = vec![c_out];
                bd.extend(std::iter::repeat_n(1, k));
                y.add(&b.reshape_at(&bd, location)?)
            }
            None => Ok(y),
        }
    }

    /// The convolution as an im2col composite (pad, one strided slice per kernel offset, one
    /// `dot_general` batched over the groups): the same values as [`Op::Convolution`], built
    /// from primitives that have gradient rules.
    pub(crate) fn conv_composite(
        &self,
        w: &Tensor,
        (stride, padding, dilation): (&[usize], &[usize], &[usize]),
        groups: usize,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let x = self;
        let k = stride.len();
        let (c_in, c_out) = (x.dims()[1], w.dims()[0]);
        let window = Window {
            kernel: &w.dims()[2..],
            stride,
            padding,
            dilation,
        };
        let zero = x.constant_like(0.0)?;
        // patches: [n, c, kk, out..]
        let (patches, out) = x.patches("convolution", &window, &zero, location)?;
        let n = x.dims()[0];
        let kk: usize = window.kernel.iter().product();
        let cg = c_in / groups;
        let mut grouped = vec![n, groups, cg * kk];
        grouped.extend_from_slice(&out);
        let patches = patches.reshape_at(&grouped, location)?;
        let w = w.reshape_at(&[groups, c_out / groups, cg * kk], location)?;
        // [groups, n, out.., c_out / groups]
        let y = Tensor::apply_at(
            Op::DotGeneral {
                lhs_batch: vec![1],
                rhs_batch: vec![0],
                lhs_contract: vec![2],
                rhs_contract: vec![2],
            },
            &[&patches, &w],
            location,
        )?;
        let mut perm = vec![1, 0, 2 + k];
        perm.extend(2..2 + k);
        let y = Tensor::apply_at(Op::Transpose { perm }, &[&y], location)?;
        let mut dims = vec![n, c_out];
        dims.extend_from_slice(&out);
        let y = y.reshape_at(&dims, location)?;
        Ok(y)
    }

    fn pool_at(
        &self,
        op: &'static str,
        reduce: ReduceOp,
        kernel: &[usize],
        stride: &[usize],
        padding: &[usize],
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let k = kernel.len();
        if self.rank() != k + 2 {
            return Err(shape_error(
                op,
                self.ty().to_string(),
                format!(
                    "the input must have rank {} (batch, channels, {k} spatial)",
                    k + 2
                ),
                location,
            ));
        }
        if let Some(i) = (0..k).find(|&i| 2 * padding[i] > kernel[i]) {
            return Err(shape_error(
                op,
                self.ty().to_string(),
                format!(
                    "padding {} must be at most half the kernel size {} (as in PyTorch)",
                    padding[i], kernel[i]
                ),
                location,
            ));
        }
        let geometry = Window {
            kernel,
            stride,
            padding,
            dilation: &vec![1; k],
        };
        self.window_out(op, &geometry, location)?;
        let mut window = vec![1, 1];
        window.extend_from_slice(kernel);
        let mut strides = vec![1, 1];
        strides.extend_from_slice(stride);
        let mut pads = vec![0, 0];
        pads.extend_from_slice(padding);
        let pooled = Tensor::apply_at(
            Op::ReduceWindow {
                op: reduce,
                window,
                stride: strides,
                padding: pads,
            },
            &[self],
            location,
        )?;
        match reduce {
            ReduceOp::Sum => pooled.mul_scalar(1.0 / kernel.iter().product::<usize>() as f64),
            ReduceOp::Max | ReduceOp::Min | ReduceOp::Prod => Ok(pooled),
        }
    }

    /// The output's spatial sizes, or an error naming `op` when the window does not fit.
    fn window_out(
        &self,
        op: &'static str,
        window: &Window<'_>,
        location: &'static Location<'static>,
    ) -> Result<Vec<usize>> {
        let spatial = &self.dims()[2..];
        let err = |message: String| shape_error(op, self.ty().to_string(), message, location);
        if [window.stride, window.dilation]
            .iter()
            .any(|v| v.contains(&0))
        {
            return Err(err("stride and dilation must be at least 1".into()));
        }
        let mut out = Vec::with_capacity(spatial.len());
        for (i, &size) in spatial.iter().enumerate() {
            let reach = window.dilation[i] * (window.kernel[i].max(1) - 1) + 1;
            let padded = size + 2 * window.padding[i];
            if window.kernel[i] == 0 || padded < reach {
                return Err(err(format!(
                    "spatial dimension {i}: a kernel of {} (dilation {}) does not fit {} \
                     padded entries",
                    window.kernel[i], window.dilation[i], padded
                )));
            }
            out.push((padded - reach) / window.stride[i] + 1);
        }
        Ok(out)
    }

    /// `[n, c, spatial..]` → (`[n, c, kernel offsets, out..]`, out): one strided slice of the
    /// padded input per kernel offset (row-major over the kernel).
    fn patches(
        &self,
        op: &'static str,
        window: &Window<'_>,
        pad_value: &Tensor,
        location: &'static Location<'static>,
    ) -> Result<(Tensor, Vec<usize>)> {
        let k = window.kernel.len();
        let out = self.window_out(op, window, location)?;
        let x = if window.padding.iter().all(|&p| p == 0) {
            self.clone()
        } else {
            let mut edge = vec![0i64, 0];
            edge.extend(window.padding.iter().map(|&p| p as i64));
            Tensor::apply_at(
                Op::Pad {
                    low: edge.clone(),
                    high: edge,
                    interior: vec![0; k + 2],
                },
                &[self, pad_value],
                location,
            )?
        };
        let (n, c) = (self.dims()[0], self.dims()[1]);
        let offsets: usize = window.kernel.iter().product();
        let mut slices = Vec::with_capacity(offsets);
        for flat in 0..offsets {
            // row-major kernel offset
            let mut rest = flat;
            let mut offset = vec![0; k];
            for i in (0..k).rev() {
                offset[i] = rest % window.kernel[i];
                rest /= window.kernel[i];
            }
            let mut start = vec![0, 0];
            let mut limit = vec![n, c];
            let mut stride = vec![1, 1];
            for i in 0..k {
                let s = offset[i] * window.dilation[i];
                start.push(s);
                limit.push(s + (out[i] - 1) * window.stride[i] + 1);
                stride.push(window.stride[i]);
            }
            let piece = Tensor::apply_at(
                Op::Slice {
                    start,
                    limit,
                    stride,
                },
                &[&x],
                location,
            )?;
            let mut with_axis = vec![n, c, 1];
            with_axis.extend_from_slice(&out);
            slices.push(piece.reshape_at(&with_axis, location)?);
        }
        let refs: Vec<&Tensor> = slices.iter().collect();
        let patches = if refs.len() == 1 {
            slices[0].clone()
        } else {
            Tensor::apply_at(Op::Concatenate { dim: 2 }, &refs, location)?
        };
        Ok((patches, out))
    }
}
