//! Composites PyTorch users reach for: `clamp`, `silu`, `var`/`std`, `logsumexp`, `detach`,
//! and `gather` along a dimension. Built from IR primitives; each is checked against a plain Rust
//! reference and finite differences in `tests/ops/tensor_ops.rs`.

use std::panic::Location;

use neuron_pc_compiler::ir::{Op, ReduceOp};
use neuron_pc_compiler::DType;

use super::shape::{dim_index, shape_error};
use super::Tensor;
use crate::error::{Error, Result};

impl Tensor {
    /// Limits every element to `[min, max]` (either bound may be absent), like `torch.clamp`.
    /// The gradient passes where the input is inside the bounds, bounds included.
    #[track_caller]
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Result<Tensor> {
        let location = Location::caller();
        if let (Some(lo), Some(hi)) = (min, max) {
            if lo > hi {
                return Err(shape_error(
                    "clamp",
                    self.ty().to_string(),
                    format!("min {lo} is larger than max {hi}"),
                    location,
                ));
            }
        }
        let mut y = self.clone();
        if let Some(lo) = min {
            y = y.maximum(&y.constant_like(lo)?)?;
        }
        if let Some(hi) = max {
            y = y.minimum(&y.constant_like(hi)?)?;
        }
        Ok(y)
    }

    /// SiLU (swish), `x * sigmoid(x)`, like `torch.nn.functional.silu` (Llama's MLP gate). A
    /// bf16 or f16 input is computed in float32 and rounded once, as PyTorch's kernels do:
    /// rounding the sigmoid first moves a bf16 Llama's logits by 7e-4 on average.
    #[track_caller]
    pub fn silu(&self) -> Result<Tensor> {
        match self.dtype() {
            DType::BF16 | DType::F16 => {
                let x = self.to_dtype(DType::F32)?;
                x.mul(&x.sigmoid()?)?.to_dtype(self.dtype())
            }
            _ => self.mul(&self.sigmoid()?),
        }
    }

    /// Variance over `dims` with Bessel's `correction` (1 gives the unbiased estimate, PyTorch's
    /// default; 0 the population variance): `sum((x - mean)^2) / (n - correction)`.
    #[track_caller]
    pub fn var(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        let location = Location::caller();
        let n: usize = dims
            .iter()
            .map(|&d| dim_index("var", d, self.dims(), location).map(|i| self.dims()[i]))
            .collect::<Result<Vec<_>>>()?
            .iter()
            .product();
        let mean = self.mean(dims, true)?;
        let centered = self.sub(&mean)?;
        let squares = centered.mul(&centered)?;
        let total = squares.reduce(ReduceOp::Sum, dims, keepdim, location)?;
        // n <= correction divides by zero or a negative count; PyTorch returns inf/NaN there too
        total.mul_scalar(1.0 / (n as f64 - correction as f64))
    }

    /// Standard deviation over `dims`: the square root of [`Tensor::var`].
    #[track_caller]
    pub fn std(&self, dims: &[isize], correction: usize, keepdim: bool) -> Result<Tensor> {
        self.var(dims, correction, keepdim)?.sqrt()
    }

    /// `log(sum(exp(x)))` over `dims`, computed stably: the maximum is subtracted first (and
    /// treated as a constant, so the gradient is exactly the softmax). Rows that are all `-inf`
    /// give `-inf`, not NaN.
    #[track_caller]
    pub fn logsumexp(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        let location = Location::caller();
        let m = self.reduce(ReduceOp::Max, dims, true, location)?.detach()?;
        // an infinite maximum (all -inf, or +inf present) would give inf - inf = NaN: shift by 0
        let finite = m.abs()?.lt(&m.constant_like(f64::INFINITY)?)?;
        let shift = Tensor::where_cond(&finite, &m, &m.zeros_like()?)?;
        let s = self
            .sub(&shift)?
            .exp()?
            .reduce(ReduceOp::Sum, dims, true, location)?
            .log()?
            .add(&shift)?;
        if keepdim {
            return Ok(s);
        }
        let mut ds: Vec<usize> = dims
            .iter()
            .map(|&d| dim_index("logsumexp", d, self.dims(), location))
            .collect::<Result<_>>()?;
        ds.sort_unstable();
        ds.dedup();
        let kept: Vec<usize> = (0..self.rank())
            .filter(|i| !ds.contains(i))
            .map(|i| self.dims()[i])
            .collect();
        s.reshape_at(&kept, location)
    }

    /// The same value, cut off from differentiation: [`crate::grad`] treats it as a constant
    /// (`torch.Tensor.detach`).
    #[track_caller]
    pub fn detach(&self) -> Result<Tensor> {
        Tensor::apply(Op::StopGradient, &[self])
    }

    /// The same value, computed only once every tensor of `deps` is (their values are unused):
    /// an ordering hint to XLA's scheduler, as JAX's `lax.optimization_barrier` and
    /// PyTorch/XLA's `xm.optimization_barrier_`. Gradients flow to `self` only. The optimizers
    /// read each parameter this way, after all the gradients, so that its donated buffer is
    /// updated in place rather than copied first.
    #[track_caller]
    pub fn after(&self, deps: &[Tensor]) -> Result<Tensor> {
        if deps.is_empty() {
            return Ok(self.clone());
        }
        let operands: Vec<&Tensor> = std::iter::once(self).chain(deps).collect();
        Tensor::apply(Op::After, &operands)
    }

    /// The same value, laid out over the devices as `sharding` says inside a partitioned step:
    /// JAX's `with_sharding_constraint`, for an activation the partitioner would otherwise lay
    /// out its own way. Its gradient is constrained the same way. In a step of one device it is
    /// the value itself. `sharding` is for this tensor's shape.
    #[track_caller]
    pub fn with_sharding_constraint(
        &self,
        sharding: &neuron_pc_compiler::sharding::Sharding,
    ) -> Result<Tensor> {
        if sharding.dims() != self.dims() {
            return Err(super::shape::shape_error(
                "sharding_constraint",
                format!("{:?}", self.dims()),
                format!("the sharding is for shape {:?}", sharding.dims()),
                std::panic::Location::caller(),
            ));
        }
        let dev = self.device_inner()?;
        if let Some(mesh) = dev.mesh().filter(|m| *m != sharding.mesh()) {
            return Err(Error::Placement {
                location: Location::caller(),
                message: format!(
                    "a sharding constraint over the mesh {} on a device whose mesh is {mesh}",
                    sharding.mesh()
                ),
            });
        }
        // a step whose output this is lays the output out this way (see `step_shardings`)
        dev.register_sharding(sharding);
        let op = Op::ShardingConstraint {
            sharding: sharding.hlo(),
        };
        Tensor::apply(op, &[self])
    }

    /// [`Tensor::with_sharding_constraint`] by a partition spec over the device's mesh (JAX's
    /// `with_sharding_constraint(x, P('data', None))`).
    #[track_caller]
    pub fn constrain(&self, spec: &neuron_pc_compiler::sharding::PartitionSpec) -> Result<Tensor> {
        let location = Location::caller();
        let dev = self.device_inner()?;
        let Some(mesh) = dev.mesh() else {
            return Err(Error::Placement {
                location,
                message: format!("constrain({spec}) on a device without a mesh"),
            });
        };
        let sharding = neuron_pc_compiler::sharding::Sharding::new(mesh, spec, self.dims())
            .map_err(|e| Error::Placement {
                location,
                message: e.to_string(),
            })?;
        self.with_sharding_constraint(&sharding)
    }

    /// `torch.gather(self, dim, index)`: `out[.., j, ..] = self[.., index[.., j, ..], ..]` with the
    /// index replacing position `dim`. `index` is an integer tensor of this tensor's rank whose
    /// other dimensions are at most this tensor's. Out-of-range indices select nothing (the
    /// result is 0 there) where PyTorch raises; index checks
    /// ([`crate::DeviceConfig::check_indices`]) make them an error naming this call.
    ///
    /// Composite: a one-hot comparison of `index` with the positions of `dim`, then a sum, so it
    /// costs `index.len() * self.dims()[dim]` elements; fine for label picking and small
    /// vocabularies, not for huge tables (use [`Tensor::index_select_rows`] there).
    #[track_caller]
    pub fn gather(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let location = Location::caller();
        let d = dim_index("gather", dim, self.dims(), location)?;
        let err = |message: String| {
            shape_error(
                "gather",
                format!("{}, {}", self.ty(), index.ty()),
                message,
                location,
            )
        };
        if !index.dtype().is_int() {
            return Err(err(format!(
                "the index must have an integer dtype, got {}",
                index.dtype()
            )));
        }
        if index.rank() != self.rank() {
            return Err(err("the index must have the input's rank".into()));
        }
        if let Some(i) = (0..self.rank()).find(|&i| i != d && index.dims()[i] > self.dims()[i]) {
            return Err(err(format!(
                "index dimension {i} ({}) is larger than the input's ({})",
                index.dims()[i],
                self.dims()[i]
            )));
        }
        // The input cut to the index's extent on every other dimension.
        let limit: Vec<usize> = (0..self.rank())
            .map(|i| {
                if i == d {
                    self.dims()[i]
                } else {
                    index.dims()[i]
                }
            })
            .collect();
        let src = if limit == self.dims() {
            self.clone()
        } else {
            self.slice_strided(&vec![0; self.rank()], &limit, &vec![1; self.rank()])?
        };
        let n = self.dims()[d];
        // [.., m, n, ..]: position d is the index's, d + 1 runs over the input's dimension d
        let mut wide = index.dims().to_vec();
        wide.insert(d + 1, n);
        let dev = self.device_inner()?;
        let positions = Tensor::apply_nullary(
            &dev,
            Op::Iota {
                dims: wide.clone(),
                dim: d + 1,
                dtype: index.dtype(),
            },
        )?;
        let hit = index.unsqueeze(d as isize + 1)?.eq(&positions)?;
        let spread = src
            .unsqueeze(d as isize)?
            .broadcast_to_at(&wide, location)?;
        let picked = Tensor::where_cond(&hit, &spread, &spread.zeros_like()?)?;
        let out = picked.reduce(ReduceOp::Sum, &[d as isize + 1], false, location)?;
        index.check_index_range("gather", "indices", n, None, location)?;
        Ok(out)
    }
}
