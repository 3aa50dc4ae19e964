//! Shape ops in PyTorch's naming: `unsqueeze`, `squeeze`, `flatten`, `cat`, `stack`, `split`,
//! `chunk`. All of them are reshapes, slices and concatenations of the IR; dimension arguments
//! are `isize` and count from the end when negative, as in PyTorch.

use std::panic::Location;

use neuron_pc_compiler::ir::Op;

use super::shape::{dim_index, shape_error};
use super::Tensor;
use crate::error::Result;

impl Tensor {
    /// Inserts a dimension of size 1 at `dim` (`-1` appends one, as in PyTorch: a negative
    /// `dim` counts from `rank + 1`).
    #[track_caller]
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        self.unsqueeze_at("unsqueeze", dim, Location::caller())
    }

    /// Removes every dimension of size 1.
    #[track_caller]
    pub fn squeeze(&self) -> Result<Tensor> {
        let dims: Vec<usize> = self.dims().iter().copied().filter(|&d| d != 1).collect();
        self.reshape_at(&dims, Location::caller())
    }

    /// Removes dimension `dim` if it has size 1 (otherwise returns the tensor unchanged, as
    /// PyTorch does).
    #[track_caller]
    pub fn squeeze_dim(&self, dim: isize) -> Result<Tensor> {
        let location = Location::caller();
        let d = dim_index("squeeze", dim, self.dims(), location)?;
        if self.dims()[d] != 1 {
            return Ok(self.clone());
        }
        let mut dims = self.dims().to_vec();
        dims.remove(d);
        self.reshape_at(&dims, location)
    }

    /// Merges dimensions `start..=end` into one (`flatten(0, -1)` gives a vector; a scalar
    /// becomes a one-element vector).
    #[track_caller]
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        let location = Location::caller();
        if self.rank() == 0 {
            return self.reshape_at(&[1], location);
        }
        let s = dim_index("flatten", start, self.dims(), location)?;
        let e = dim_index("flatten", end, self.dims(), location)?;
        if s > e {
            return Err(shape_error(
                "flatten",
                format!("{:?}", self.dims()),
                format!("start dimension {start} comes after end dimension {end}"),
                location,
            ));
        }
        let mut dims = self.dims()[..s].to_vec();
        dims.push(self.dims()[s..=e].iter().product());
        dims.extend_from_slice(&self.dims()[e + 1..]);
        self.reshape_at(&dims, location)
    }

    /// Concatenates along `dim`; the tensors must agree on every other dimension and share a
    /// device (dtypes are promoted to a common one).
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let location = Location::caller();
        let Some(first) = tensors.first() else {
            return Err(shape_error(
                "cat",
                String::new(),
                "expected at least one tensor".into(),
                location,
            ));
        };
        let d = dim_index("cat", dim, first.dims(), location)?;
        let fits = |t: &&Tensor| {
            t.rank() == first.rank()
                && (0..t.rank()).all(|i| i == d || t.dims()[i] == first.dims()[i])
        };
        if let Some(other) = tensors.iter().find(|t| !fits(t)) {
            return Err(shape_error(
                "cat",
                format!("{}, {}", first.ty(), other.ty()),
                format!("every tensor must match the first except in dimension {dim}"),
                location,
            ));
        }
        let common = tensors.iter().fold(first.dtype(), |acc, t| {
            super::shape::promote(acc, t.dtype())
        });
        let converted: Vec<Tensor> = tensors
            .iter()
            .map(|t| {
                if t.dtype() == common {
                    Ok((*t).clone())
                } else {
                    Tensor::apply_at(Op::Convert(common), &[t], location)
                }
            })
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = converted.iter().collect();
        Tensor::apply_at(Op::Concatenate { dim: d }, &refs, location)
    }

    /// Joins equally shaped tensors along a new dimension `dim` (negative counts from
    /// `rank + 1`, as in `unsqueeze`).
    #[track_caller]
    pub fn stack(tensors: &[&Tensor], dim: isize) -> Result<Tensor> {
        let location = Location::caller();
        let Some(first) = tensors.first() else {
            return Err(shape_error(
                "stack",
                String::new(),
                "expected at least one tensor".into(),
                location,
            ));
        };
        if let Some(other) = tensors.iter().find(|t| t.dims() != first.dims()) {
            return Err(shape_error(
                "stack",
                format!("{:?}, {:?}", first.dims(), other.dims()),
                "every tensor must have the same shape".into(),
                location,
            ));
        }
        let expanded: Vec<Tensor> = tensors
            .iter()
            .map(|t| t.unsqueeze_at("stack", dim, location))
            .collect::<Result<_>>()?;
        let refs: Vec<&Tensor> = expanded.iter().collect();
        let d = if dim < 0 {
            dim + first.rank() as isize + 1
        } else {
            dim
        };
        Tensor::cat_at(&refs, d, location)
    }

    /// Pieces of `size` entries along `dim` (the last one shorter if `size` does not divide
    /// the dimension), like `torch.split(x, size, dim)`.
    #[track_caller]
    pub fn split(&self, size: usize, dim: isize) -> Result<Vec<Tensor>> {
        let location = Location::caller();
        let d = dim_index("split", dim, self.dims(), location)?;
        if size == 0 {
            return Err(shape_error(
                "split",
                format!("{:?}", self.dims()),
                "the piece size must be at least 1".into(),
                location,
            ));
        }
        let n = self.dims()[d];
        let sizes: Vec<usize> = (0..n)
            .step_by(size)
            .map(|start| size.min(n - start))
            .collect();
        self.split_sizes_at(&sizes, d, location)
    }

    /// Pieces with the given sizes along `dim` (they must add up to the dimension), like
    /// `torch.split(x, [a, b, ...], dim)`.
    #[track_caller]
    pub fn split_sizes(&self, sizes: &[usize], dim: isize) -> Result<Vec<Tensor>> {
        let location = Location::caller();
        let d = dim_index("split", dim, self.dims(), location)?;
        if sizes.iter().sum::<usize>() != self.dims()[d] {
            return Err(shape_error(
                "split",
                format!("{:?}", self.dims()),
                format!(
                    "sizes {sizes:?} add up to {}, not dimension {dim}'s {}",
                    sizes.iter().sum::<usize>(),
                    self.dims()[d]
                ),
                location,
            ));
        }
        self.split_sizes_at(sizes, d, location)
    }

    /// At most `chunks` pieces of equal size along `dim` (the last may be smaller), like
    /// `torch.chunk`.
    #[track_caller]
    pub fn chunk(&self, chunks: usize, dim: isize) -> Result<Vec<Tensor>> {
        let location = Location::caller();
        let d = dim_index("chunk", dim, self.dims(), location)?;
        if chunks == 0 {
            return Err(shape_error(
                "chunk",
                format!("{:?}", self.dims()),
                "the number of chunks must be at least 1".into(),
                location,
            ));
        }
        let n = self.dims()[d];
        let size = n.div_ceil(chunks).max(1);
        let sizes: Vec<usize> = (0..n)
            .step_by(size)
            .map(|start| size.min(n - start))
            .collect();
        self.split_sizes_at(&sizes, d, location)
    }

    fn split_sizes_at(
        &self,
        sizes: &[usize],
        d: usize,
        location: &'static Location<'static>,
    ) -> Result<Vec<Tensor>> {
        let mut start = 0;
        let mut out = Vec::with_capacity(sizes.len());
        for &len in sizes {
            let mut lo = vec![0; self.rank()];
            let mut hi = self.dims().to_vec();
            lo[d] = start;
            hi[d] = start + len;
            out.push(Tensor::apply_at(
                Op::Slice {
                    start: lo,
                    limit: hi,
                    stride: vec![1; self.rank()],
                },
                &[self],
                location,
            )?);
            start += len;
        }
        Ok(out)
    }

    pub(crate) fn reshape_at(
        &self,
        dims: &[usize],
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        if dims == self.dims() {
            return Ok(self.clone());
        }
        Tensor::apply_at(
            Op::Reshape {
                dims: dims.to_vec(),
            },
            &[self],
            location,
        )
    }

    fn unsqueeze_at(
        &self,
        op: &'static str,
        dim: isize,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let slots = self.rank() as isize + 1;
        let at = if dim < 0 { dim + slots } else { dim };
        if !(0..slots).contains(&at) {
            return Err(shape_error(
                op,
                format!("{:?}", self.dims()),
                format!(
                    "dimension {dim} is out of range for inserting into rank {}",
                    self.rank()
                ),
                location,
            ));
        }
        let mut dims = self.dims().to_vec();
        dims.insert(at as usize, 1);
        self.reshape_at(&dims, location)
    }

    fn cat_at(
        tensors: &[&Tensor],
        dim: isize,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let d = dim_index("cat", dim, tensors[0].dims(), location)?;
        Tensor::apply_at(Op::Concatenate { dim: d }, tensors, location)
    }
}
