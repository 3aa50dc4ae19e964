//! Ordering along a dimension: `argsort` (the [`Op::ArgSort`] primitive), and the composites
//! built on it and on row lookups: `sort`, `topk`, `take_along_dim`, and `cumsum`, PyTorch's
//! names and semantics. Checked against the reference evaluator, plain Rust and finite
//! differences in `tests/ops/sort.rs`.

use std::panic::Location;

use neuron_pc_compiler::ir::Op;
use neuron_pc_compiler::DType;

use super::shape::{dim_index, shape_error};
use super::Tensor;
use crate::error::Result;

impl Tensor {
    /// The positions that sort this tensor along `dim` (i64 indices, as `torch.argsort(x, dim,
    /// descending, stable=True)`): equal elements keep their order. Floats are ordered
    /// totally, `-NaN < -inf < ... < -0 < +0 < ... < inf < NaN` (`f64::total_cmp`); PyTorch
    /// also puts NaN last (first when descending) but treats `-0` and `+0` as equal.
    /// No gradient flows through the indices.
    #[track_caller]
    pub fn argsort(&self, dim: isize, descending: bool) -> Result<Tensor> {
        let location = Location::caller();
        let d = dim_index("argsort", dim, self.dims(), location)?;
        Tensor::apply_at(
            Op::ArgSort {
                dim: d,
                descending,
                index_dtype: DType::I64,
            },
            &[self],
            location,
        )
    }

    /// The sorted values along `dim` and the positions they came from, as `torch.sort(x, dim,
    /// descending, stable=True)`. Gradients flow to the values' original positions.
    #[track_caller]
    pub fn sort(&self, dim: isize, descending: bool) -> Result<(Tensor, Tensor)> {
        let indices = self.argsort(dim, descending)?;
        Ok((self.take_along_dim(&indices, dim)?, indices))
    }

    /// The `k` largest (or, without `largest`, smallest) elements along `dim`, in order, and
    /// their positions, as `torch.topk(x, k, dim, largest, sorted=True)`; among equal elements
    /// the first position comes first. Gradients flow to the chosen elements.
    #[track_caller]
    pub fn topk(&self, k: usize, dim: isize, largest: bool) -> Result<(Tensor, Tensor)> {
        let location = Location::caller();
        let d = dim_index("topk", dim, self.dims(), location)?;
        if k == 0 || k > self.dims()[d] {
            return Err(shape_error(
                "topk",
                self.ty().to_string(),
                format!("k {k} must be in 1..={} (dim {d}'s size)", self.dims()[d]),
                location,
            ));
        }
        let indices = if largest && d + 1 == self.rank() && self.dtype() != DType::Pred {
            // the partial sort of `Op::TopK` (same order, far cheaper than a whole sort)
            Tensor::apply_at(Op::TopK { k }, &[self], location)?.to_dtype(DType::I64)?
        } else {
            self.argsort(dim, largest)?.narrow(dim, 0, k)?
        };
        Ok((self.take_along_dim(&indices, dim)?, indices))
    }

    /// `torch.take_along_dim(x, indices, dim)`: `out[.., j, ..] = x[.., indices[.., j, ..], ..]`,
    /// `indices` an integer tensor of this rank and of these dimensions except along `dim`
    /// (not broadcast). An index outside `0..dims[dim]` is clamped into it where PyTorch
    /// raises; index checks ([`crate::DeviceConfig::check_indices`]) report it as an error
    /// naming this call. A row lookup, so it costs the result's size, unlike
    /// [`Tensor::gather`]'s one-hot (which suits small dimensions).
    #[track_caller]
    pub fn take_along_dim(&self, indices: &Tensor, dim: isize) -> Result<Tensor> {
        let location = Location::caller();
        let d = dim_index("take_along_dim", dim, self.dims(), location)?;
        let err = |message: String| {
            shape_error(
                "take_along_dim",
                format!("{}, {}", self.ty(), indices.ty()),
                message,
                location,
            )
        };
        if !indices.dtype().is_int() {
            return Err(err(format!(
                "the indices must have an integer dtype, got {}",
                indices.dtype()
            )));
        }
        let same_elsewhere = indices.rank() == self.rank()
            && (0..self.rank()).all(|i| i == d || indices.dims()[i] == self.dims()[i]);
        if !same_elsewhere {
            return Err(err(format!(
                "the indices must have the input's rank and dimensions except along dim {d}"
            )));
        }
        let n = self.dims()[d];
        indices.check_index_range("take_along_dim", "indices", n, None, location)?;
        // `dim` moved last; rows numbered, so row r's position p is flat element r * n + p
        let rank = self.rank() as isize;
        let last: Vec<isize> = (0..rank)
            .filter(|&i| i != d as isize)
            .chain([d as isize])
            .collect();
        let mut back = vec![0isize; last.len()];
        for (to, &from) in last.iter().enumerate() {
            back[from as usize] = to as isize;
        }
        let x = self.permute(&last)?;
        let idx = indices.permute(&last)?;
        let (m, moved) = (idx.dims()[idx.rank() - 1], idx.dims().to_vec());
        let rows = x.elem_count() / n.max(1);
        let wide = rows.saturating_mul(n) > i32::MAX as usize;
        let flat_dtype = if wide { DType::I64 } else { DType::I32 };
        let dev = self.device()?;
        let starts = dev
            .arange(rows, flat_dtype)?
            .mul_scalar(n as f64)?
            .reshape(&[rows, 1])?
            .broadcast_to(&[rows, m])?;
        let flat = idx
            .to_dtype(flat_dtype)?
            .clamp(Some(0.0), Some(n.saturating_sub(1) as f64))?
            .reshape(&[rows, m])?
            .add(&starts)?;
        x.reshape(&[rows * n, 1])?
            .index_select_rows(&flat)?
            .reshape(&moved)?
            .permute(&back)
    }

    /// Running sums along `dim` (`torch.cumsum(x, dim)`): element `j` is the sum of elements
    /// `0..=j`. Computed in `log2(n)` rounds of shifted adds (a Hillis-Steele scan, as JAX's
    /// `cumsum` is on cpu and GPU), so the float sums are ordered differently from a loop's.
    #[track_caller]
    pub fn cumsum(&self, dim: isize) -> Result<Tensor> {
        let location = Location::caller();
        let d = dim_index("cumsum", dim, self.dims(), location)?;
        let n = self.dims()[d];
        let zero = self.device()?.zeros(&[], self.dtype())?;
        let (mut low, mut high) = (vec![0i64; self.rank()], vec![0i64; self.rank()]);
        let interior = vec![0usize; self.rank()];
        let mut x = self.clone();
        let mut shift = 1;
        while shift < n {
            // x shifted `shift` along `dim`: zeros in front, its last `shift` cropped
            (low[d], high[d]) = (shift as i64, -(shift as i64));
            x = x.add(&x.pad(&low, &high, &interior, &zero)?)?;
            shift *= 2;
        }
        Ok(x)
    }
}
