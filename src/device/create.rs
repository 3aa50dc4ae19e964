//! Creating tensors on a device: uploads, scalars, constants, ranges and random values.

use std::panic::Location;

use neuron_pc_compiler::ir::{Literal, Op};
use neuron_pc_compiler::sharding::{PartitionSpec, Sharding};
use neuron_pc_compiler::{DType, HostTensor};

use super::trace::Value;
use super::LazyDevice;
use super::Tensor;
use crate::error::{Error, Result};

/// The mesh axis a batch is split over on a mesh device ([`LazyDevice::shard`]), and the one
/// FSDP splits parameters over.
pub const DATA_AXIS: &str = "data";
/// The mesh axis expert parallelism splits a mixture's experts over; outside the experts it is
/// data parallel: [`LazyDevice::shard`] splits a batch over it too (MaxText's convention).
pub const EXPERT_AXIS: &str = "expert";

/// `host` cut along its first dimension into `n` equal blocks (`n` divides it).
/// The rows `local_rows` names: replicas `offset .. offset + replicas` of `global`, each
/// `batch / global` rows.
pub(crate) fn local_share(
    batch: usize,
    global: usize,
    offset: usize,
    replicas: usize,
) -> std::ops::Range<usize> {
    let b = batch / global.max(1);
    offset * b..(offset + replicas) * b
}

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

    /// Copies `host` to a mesh device split as `spec` says: each device receives only its
    /// block (PyTorch/XLA's `mark_sharding` on a new tensor, JAX's `device_put` with a
    /// `NamedSharding`). On a device without a mesh, an all-replicated spec uploads `host`
    /// whole and any other is an error.
    #[track_caller]
    pub fn tensor_sharded(&self, host: &HostTensor, spec: &PartitionSpec) -> Result<Tensor> {
        let location = Location::caller();
        let sharding = self.sharding_for(spec, host.dims(), location)?;
        let data = match &sharding {
            Some(s) => self.inner.upload_sharded(host, s)?,
            None => self.inner.upload(host, false)?,
        };
        Ok(self.holding(data))
    }

    /// The sharding `spec` gives a tensor of shape `dims` on this device's mesh; none when the
    /// spec splits nothing.
    pub(crate) fn sharding_for(
        &self,
        spec: &PartitionSpec,
        dims: &[usize],
        location: &'static Location<'static>,
    ) -> Result<Option<Sharding>> {
        let Some(mesh) = self.mesh() else {
            if spec.0.iter().all(Vec::is_empty) {
                return Ok(None);
            }
            return Err(Error::Placement {
                location,
                message: format!(
                    "a partition spec {spec} for a device without a mesh (see \
                     DeviceConfig::with_mesh)"
                ),
            });
        };
        let sharding = Sharding::new(mesh, spec, dims).map_err(|e| Error::Placement {
            location,
            message: e.to_string(),
        })?;
        Ok((!sharding.is_replicated()).then_some(sharding))
    }

    /// Zeros of shape `dims` laid out over the device's mesh as `spec` says (whole without a
    /// mesh, or where the spec splits nothing): a block of optimizer state each device holds a
    /// piece of.
    pub(crate) fn zeros_data_split(
        &self,
        dims: &[usize],
        dtype: DType,
        spec: &PartitionSpec,
    ) -> Result<Tensor> {
        match self.sharding_for(spec, dims, Location::caller())? {
            Some(s) => Ok(self.holding(self.inner.upload_zeros_sharded(dtype, &s, true, false)?)),
            None => self.zeros_data(dims, dtype, true),
        }
    }

    /// `host` laid out as `sharding` says, each replica's (process's) own value: a ZeRO-1
    /// block read back from a checkpoint.
    pub(crate) fn per_replica_sharded(
        &self,
        host: &HostTensor,
        sharding: &Sharding,
    ) -> Result<Tensor> {
        Ok(self.holding(self.inner.upload_sharded_as(host, sharding, true)?))
    }

    /// Zeros laid out like `like`'s value: its blocks on a mesh when it is sharded, else whole
    /// (`per_replica` as for [`LazyDevice::zeros_data`]). Optimizer state starts this way, so
    /// each moment is split as its parameter is.
    pub(crate) fn zeros_like_data(&self, like: &Tensor, per_replica: bool) -> Result<Tensor> {
        match like.sharding() {
            Some(s) => {
                let data = self
                    .inner
                    .upload_zeros_sharded(like.dtype(), &s, false, false)?;
                Ok(self.holding(data))
            }
            None => self.zeros_data(like.dims(), like.dtype(), per_replica),
        }
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
    ///
    /// On a mesh device the batch is split along its first dimension over the mesh's `data`
    /// and `expert` axes, those it has (whole on every device when it has neither); in a
    /// multi-process run each process's mesh takes its block of the global batch.
    #[track_caller]
    pub fn shard(&self, host: &HostTensor) -> Result<Tensor> {
        let location = Location::caller();
        let n = self.global_replicas();
        if self.mesh().is_some() && n == 1 {
            return self.shard_over_mesh(host, location);
        }
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
        if self.mesh().is_some() {
            // the processes are the replicas: this process's mesh takes its block
            let mine = split_rows(host, n)?.swap_remove(self.replica_offset());
            return self.shard_over_mesh(&mine, location);
        }
        let mut blocks = split_rows(host, n)?;
        let mine = self.replica_offset()..self.replica_offset() + self.replicas();
        self.from_replicas(&blocks.drain(mine).collect::<Vec<_>>())
    }

    /// `host` (this process's rows) split over the mesh's `data` and `expert` axes, or whole on
    /// every device when the mesh has neither.
    fn shard_over_mesh(
        &self,
        host: &HostTensor,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let axes: Vec<&str> = [DATA_AXIS, EXPERT_AXIS]
            .into_iter()
            .filter(|a| self.mesh().is_some_and(|m| m.axis_size(a).is_some()))
            .collect();
        let spec = match axes.is_empty() {
            false => PartitionSpec::new(&[&axes]),
            true => PartitionSpec::replicated(),
        };
        let sharding = self.sharding_for(&spec, host.dims(), location)?;
        let data = match &sharding {
            Some(s) => self.inner.upload_sharded(host, s)?,
            None => self.inner.upload(host, false)?,
        };
        Ok(self.holding(data))
    }

    /// The rows of a global batch of `batch` rows that [`LazyDevice::shard`] leaves on this
    /// process: every row in a one-process run (and on a mesh); in a multi-process run its
    /// replicas' blocks, `offset * b .. (offset + replicas) * b` with `b = batch / global
    /// replicas`. A data source builds only these rows for [`LazyDevice::shard_local`]. A
    /// batch that does not split over the replicas is an error.
    pub fn local_rows(&self, batch: usize) -> Result<std::ops::Range<usize>> {
        if self.mesh().is_some() && self.global_replicas() == 1 {
            return Ok(0..batch);
        }
        let global = self.global_replicas();
        if !batch.is_multiple_of(global) {
            return Err(Error::Config(format!(
                "a global batch of {batch} rows does not split over {global} replicas: make \
                 the batch size a multiple of the replica count"
            )));
        }
        Ok(local_share(
            batch,
            global,
            self.replica_offset(),
            self.replicas(),
        ))
    }

    /// [`LazyDevice::shard`] of a global batch of which `host` holds only this process's rows
    /// ([`LazyDevice::local_rows`]): the same tensor, without building or reading the other
    /// processes' rows.
    #[track_caller]
    pub fn shard_local(&self, host: &HostTensor) -> Result<Tensor> {
        let n = self.replicas();
        if self.mesh().is_some() {
            return self.shard_over_mesh(host, Location::caller());
        }
        if self.global_replicas() == n {
            return self.shard(host);
        }
        let rows = host.dims().first().copied().unwrap_or(0);
        if host.dims().is_empty() || !rows.is_multiple_of(n) {
            return Err(Error::Placement {
                location: Location::caller(),
                message: format!(
                    "cannot shard {}{:?} over this process's {n} replicas: the first dimension \
                     must divide by the replica count",
                    host.dtype(),
                    host.dims()
                ),
            });
        }
        self.from_replicas(&split_rows(host, n)?)
    }

    /// One value per replica (`hosts[r]` on replica `r`), all of one shape and dtype: a
    /// per-replica tensor.
    #[track_caller]
    pub fn from_replicas(&self, hosts: &[HostTensor]) -> Result<Tensor> {
        let location = Location::caller();
        if self.mesh().is_some() {
            return Err(Error::Placement {
                location,
                message: "from_replicas on a mesh device: place values with tensor_sharded \
                          (or shard a batch with shard)"
                    .into(),
            });
        }
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
