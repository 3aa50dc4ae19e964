//! Creating tensors on a device: uploads, scalars, constants, ranges and random values.

use std::panic::Location;

use neuron_pc_compiler::ir::{Literal, Op};
use neuron_pc_compiler::{DType, HostTensor};

use super::Tensor;
use crate::device::trace::Value;
use crate::device::LazyDevice;
use crate::error::{Error, Result};

/// `host` cut along its first dimension into `n` equal blocks (`n` divides it).
pub(crate) fn split_rows(host: &HostTensor, n: usize) -> Result<Vec<HostTensor>> {
    let rows = host.dims()[0];
    let block = rows / n;
    let bytes = host.bytes();
    let per_row = bytes.len() / rows.max(1);
    let mut dims = host.dims().to_vec();
    dims[0] = block;
    (0..n)
        .map(|r| {
            let part = bytes[r * block * per_row..(r + 1) * block * per_row].to_vec();
            HostTensor::from_bytes(host.dtype(), &dims, part).map_err(Error::from)
        })
        .collect()
}

impl LazyDevice {
    /// Copies `host` to the device; the tensor holds device data (nothing pending). On a
    /// data-parallel device every replica gets the same copy (a replicated value: parameters,
    /// scalars, anything every replica needs whole).
    pub fn tensor(&self, host: &HostTensor) -> Result<Tensor> {
        let data = self.inner.upload(host, false)?;
        Ok(self.holding(data))
    }

    /// Zeros held as device data, not a graph constant: the starting value of state a step
    /// updates (optimizer moments, accumulated gradients). `per_replica`: each replica's own
    /// copy, free to diverge (ZeRO-1 blocks, local gradient sums); else replicated. Copied
    /// from the kernel's zero pages, not a heap block (`Client::zeros_buffer`).
    pub(crate) fn zeros_data(
        &self,
        dims: &[usize],
        dtype: DType,
        per_replica: bool,
    ) -> Result<Tensor> {
        let data = self.inner.upload_zeros(dtype, dims, per_replica, false)?;
        Ok(self.holding(data))
    }

    /// Splits `host` along its first dimension into one equal block per replica, replica `r`
    /// getting block `r` (a per-replica value: each replica's shard of a global batch). On
    /// one device the tensor is `host` whole. In a multi-process run `host` is the global
    /// batch, split over every process's replicas; this process keeps its replicas' blocks.
    #[track_caller]
    pub fn shard(&self, host: &HostTensor) -> Result<Tensor> {
        let location = Location::caller();
        let n = self.global_replicas();
        let rows = host.dims().first().copied().unwrap_or(0);
        if host.dims().is_empty() || !rows.is_multiple_of(n) {
            return Err(Error::Placement {
                location,
                message: format!(
                    "cannot shard {}{:?} over {n} replicas: the first dimension must divide \
                     by the replica count",
                    host.dtype(),
                    host.dims()
                ),
            });
        }
        let mut blocks = split_rows(host, n)?;
        let mine = self.replica_offset()..self.replica_offset() + self.replicas();
        self.from_replicas(&blocks.drain(mine).collect::<Vec<_>>())
    }

    /// One value per replica (`hosts[r]` on replica `r`), all of one shape and dtype: a
    /// per-replica tensor.
    #[track_caller]
    pub fn from_replicas(&self, hosts: &[HostTensor]) -> Result<Tensor> {
        let location = Location::caller();
        let n = self.replicas();
        let first = hosts.first();
        let same = first.is_some_and(|f| {
            hosts
                .iter()
                .all(|h| h.dtype() == f.dtype() && h.dims() == f.dims())
        });
        if hosts.len() != n || !same {
            let shapes: Vec<String> = hosts
                .iter()
                .map(|h| format!("{}{:?}", h.dtype(), h.dims()))
                .collect();
            return Err(Error::Placement {
                location,
                message: format!(
                    "from_replicas needs {n} values of one type (one per replica), got [{}]",
                    shapes.join(", ")
                ),
            });
        }
        let refs: Vec<&HostTensor> = hosts.iter().collect();
        let data = self.inner.upload_replicas(&refs, true, false)?;
        Ok(self.holding(data))
    }

    fn holding(&self, data: std::sync::Arc<crate::device::trace::DeviceData>) -> Tensor {
        Tensor {
            cell: self
                .inner
                .new_cell(self.inner.interned(data.ty()), Value::Data(data)),
        }
    }

    /// The index of the replica running the step (`u32` scalar, per-replica; 0 on one
    /// device).
    #[track_caller]
    pub fn replica_index(&self) -> Result<Tensor> {
        Tensor::apply_nullary(&self.inner, Op::ReplicaId)
    }

    /// A scalar on the device, for values that change between steps (learning rate, step
    /// count, loss scale, seeds): it enters the graph as an input, so changing it does not make
    /// a new graph. Plain Rust numbers used in ops become constants of the graph instead.
    pub fn scalar(&self, value: f64, dtype: DType) -> Result<Tensor> {
        self.tensor(&HostTensor::from_f64s(dtype, &[value], &[])?)
    }

    /// Copies `values` (shape `dims`) to the device.
    pub fn from_slice<T: neuron_pc_compiler::Element>(
        &self,
        values: &[T],
        dims: &[usize],
    ) -> Result<Tensor> {
        self.tensor(&HostTensor::from_slice(values, dims)?)
    }

    /// A tensor filled with `value` (recorded as a constant of the graph).
    #[track_caller]
    pub fn full(&self, value: f64, dims: &[usize], dtype: DType) -> Result<Tensor> {
        Tensor::apply_nullary(
            &self.inner,
            Op::Constant(Literal::splat(dtype, value, dims)),
        )
    }

    /// Zeros (a constant of the graph).
    #[track_caller]
    pub fn zeros(&self, dims: &[usize], dtype: DType) -> Result<Tensor> {
        self.full(0.0, dims, dtype)
    }

    /// Ones (a constant of the graph).
    #[track_caller]
    pub fn ones(&self, dims: &[usize], dtype: DType) -> Result<Tensor> {
        self.full(1.0, dims, dtype)
    }

    /// `0, 1, ..., n-1`.
    #[track_caller]
    pub fn arange(&self, n: usize, dtype: DType) -> Result<Tensor> {
        Tensor::apply_nullary(
            &self.inner,
            Op::Iota {
                dims: vec![n],
                dim: 0,
                dtype,
            },
        )
    }

    /// Uniform values in [0, 1) from a counter-based generator keyed by `key` (a `u32[2]`
    /// device tensor, so a new key per step does not make a new graph).
    #[track_caller]
    pub fn rand(&self, key: &Tensor, dims: &[usize]) -> Result<Tensor> {
        let bits = Tensor::apply(
            Op::RandomBits {
                dims: dims.to_vec(),
            },
            &[key],
        )?;
        // The top 24 bits give every float32 in [0, 1) with spacing 2^-24.
        let top = bits.div(&bits.constant_like(256.0)?)?;
        top.to_dtype(DType::F32)?.mul_scalar(1.0 / 16_777_216.0)
    }

    /// A `u32[2]` key for [`LazyDevice::rand`] and dropout, from a seed.
    pub fn key(&self, seed: u64) -> Result<Tensor> {
        self.from_slice(&[(seed >> 32) as u32, seed as u32], &[2])
    }
}
