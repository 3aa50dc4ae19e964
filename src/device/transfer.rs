//! Moving values between the host and the device: uploads (whole on every device, one value
//! per replica, or each mesh position's block of a sharded value), zeros, and reads (a
//! replica's buffer, or a sharded value's blocks put together).

use std::sync::Arc;
use std::time::Instant;

use neuron_pc_compiler::ir::TensorType;
use neuron_pc_compiler::pjrt::Buffer;
use neuron_pc_compiler::sharding::Sharding;
use neuron_pc_compiler::{DType, HostTensor};

use super::inflight::StepRun;
use super::trace::{DeviceData, Placed};
use super::{lock, DeviceInner};
use crate::error::Result;

impl DeviceInner {
    /// Copies `host` to every replica's device (a replicated value).
    pub(crate) fn upload(&self, host: &HostTensor, zero_filled: bool) -> Result<Arc<DeviceData>> {
        let copies = vec![host; self.devices.len()];
        self.upload_replicas(&copies, false, zero_filled)
    }

    /// Copies each mesh position's block of `host` (as `sharding` splits it) to its device.
    pub(crate) fn upload_sharded(
        &self,
        host: &HostTensor,
        sharding: &Sharding,
    ) -> Result<Arc<DeviceData>> {
        self.upload_sharded_as(host, sharding, false)
    }

    /// [`DeviceInner::upload_sharded`]; `per_replica`: each replica's (process's) own value,
    /// free to diverge (a ZeRO-1 block), else the same on every replica.
    pub(crate) fn upload_sharded_as(
        &self,
        host: &HostTensor,
        sharding: &Sharding,
        per_replica: bool,
    ) -> Result<Arc<DeviceData>> {
        if sharding.is_replicated() {
            let copies = vec![host; self.devices.len()];
            return self.upload_replicas(&copies, per_replica, false);
        }
        let started = Instant::now();
        let buffers = (self.devices.iter().enumerate())
            .map(|(p, &d)| {
                Ok(self
                    .client()
                    .buffer_from_host(&sharding.block(host, p)?, d)?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(self.transferred(started, buffers, per_replica, Some(sharding), false))
    }

    /// Zeros laid out as `sharding` says, each device holding its block (`per_replica` as for
    /// [`DeviceInner::upload_sharded_as`]).
    pub(crate) fn upload_zeros_sharded(
        &self,
        dtype: DType,
        sharding: &Sharding,
        per_replica: bool,
        zero_filled: bool,
    ) -> Result<Arc<DeviceData>> {
        let started = Instant::now();
        let block = sharding.shard_dims();
        let buffers = (self.devices.iter())
            .map(|&d| self.client().zeros_buffer(dtype, &block, d))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(self.transferred(started, buffers, per_replica, Some(sharding), zero_filled))
    }

    /// Copies `hosts[r]` to replica `r`'s device (all of one type).
    pub(crate) fn upload_replicas(
        &self,
        hosts: &[&HostTensor],
        per_replica: bool,
        zero_filled: bool,
    ) -> Result<Arc<DeviceData>> {
        debug_assert_eq!(hosts.len(), self.devices.len());
        let started = Instant::now();
        let buffers = hosts
            .iter()
            .zip(&self.devices)
            .map(|(h, &d)| self.client().buffer_from_host(h, d))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(self.transferred(started, buffers, per_replica, None, zero_filled))
    }

    /// Zeros on every replica's device, copied from zero pages rather than a heap block
    /// (`Client::zeros_buffer`): optimizer state and other buffers that start at zero.
    /// `per_replica`: each replica's own value (its copy may diverge), else replicated.
    pub(crate) fn upload_zeros(
        &self,
        dtype: DType,
        dims: &[usize],
        per_replica: bool,
        zero_filled: bool,
    ) -> Result<Arc<DeviceData>> {
        let started = Instant::now();
        let buffers = (self.devices.iter())
            .map(|&d| self.client().zeros_buffer(dtype, dims, d))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(self.transferred(started, buffers, per_replica, None, zero_filled))
    }

    /// Records the transfer of `buffers` (begun at `started`) in the timeline and the metrics,
    /// and wraps them as one value.
    fn transferred(
        &self,
        started: Instant,
        buffers: Vec<Buffer>,
        per_replica: bool,
        sharding: Option<&Sharding>,
        zero_filled: bool,
    ) -> Arc<DeviceData> {
        self.phase("transfer to device", started, None);
        {
            let mut m = lock(&self.metrics);
            m.transfers_to_device += buffers.len() as u64;
            m.bytes_to_device += buffers
                .iter()
                .map(|b| b.size_in_bytes() as u64)
                .sum::<u64>();
        }
        let sharding = sharding.cloned().map(Arc::new);
        self.wrap_buffers(buffers, per_replica, sharding, zero_filled, None)
    }

    /// One value from its buffers (one per device); `sharding`: the blocks of a sharded value.
    pub(crate) fn wrap_buffers(
        &self,
        buffers: Vec<Buffer>,
        per_replica: bool,
        sharding: Option<Arc<Sharding>>,
        zero_filled: bool,
        producer: Option<Arc<StepRun>>,
    ) -> Arc<DeviceData> {
        let b = &buffers[0];
        let dims = sharding
            .as_ref()
            .map_or_else(|| b.dims().to_vec(), |s| s.dims().to_vec());
        let ty = TensorType::new(b.dtype(), dims);
        let placed = Placed { buffers, producer };
        self.value(
            ty,
            Some(placed),
            per_replica,
            sharding.as_ref(),
            zero_filled,
        )
    }

    /// A step's output `ty` (the whole value's type) before the step is launched: its buffers
    /// are placed by the launch (see `launch.rs`).
    pub(crate) fn unplaced(
        &self,
        ty: &TensorType,
        per_replica: bool,
        sharding: Option<&Arc<Sharding>>,
        zero_filled: bool,
    ) -> Arc<DeviceData> {
        self.value(ty.clone(), None, per_replica, sharding, zero_filled)
    }

    /// A value of type `ty` whose buffers are (or will be) `placed`, its type and sharding
    /// interned.
    fn value(
        &self,
        ty: TensorType,
        placed: Option<Placed>,
        per_replica: bool,
        sharding: Option<&Arc<Sharding>>,
        zero_filled: bool,
    ) -> Arc<DeviceData> {
        let mut rec = lock(&self.recorder);
        let ty_id = rec.interner.ty(&ty);
        let (sharding_id, sharding) = match sharding.filter(|s| !s.is_replicated()) {
            Some(s) => {
                let (id, shared) = rec.interner.sharding(s);
                (id, Some(shared))
            }
            None => (0, None),
        };
        drop(rec);
        Arc::new(DeviceData::new(
            ty,
            placed,
            sharding,
            sharding_id,
            per_replica,
            zero_filled,
            ty_id,
        ))
    }

    /// Copies the whole value to the host: the first device's buffer, or every block of a
    /// sharded value put together.
    pub(crate) fn download_whole(&self, data: &DeviceData) -> Result<HostTensor> {
        let Some(sharding) = &data.sharding else {
            return self.download(data, 0);
        };
        let blocks = (0..data.buffers()?.len())
            .map(|p| self.download(data, p))
            .collect::<Result<Vec<_>>>()?;
        Ok(sharding.assemble(&blocks)?)
    }

    /// Copies replica `replica`'s value to the host (on a mesh: position `replica`'s block).
    pub(crate) fn download(&self, data: &DeviceData, replica: usize) -> Result<HostTensor> {
        let mut wait_ms = 0.0;
        if !data.is_placed() {
            let waited = Instant::now();
            self.placed(data)?;
            self.phase("wait (launch)", waited, None);
            wait_ms += super::metrics::not_tracing(waited);
        }
        let placed = self.placed(data)?;
        if let Some(p) = &placed.producer {
            self.free_retired();
            let waited = Instant::now();
            super::inflight::poll_until(super::inflight::POLL, || p.is_finished());
            p.wait()?;
            self.phase("wait", waited, Some(&p.graph));
            wait_ms += super::metrics::not_tracing(waited);
        }
        let started = Instant::now();
        let host = placed.buffers[replica].to_host()?;
        self.phase("transfer to host", started, None);
        super::metrics::count_read_wait(wait_ms);
        let mut m = lock(&self.metrics);
        m.read_wait_ms += wait_ms;
        m.transfers_to_host += 1;
        m.bytes_to_host += host.bytes().len() as u64;
        if data.zero_filled {
            m.zero_filled_reads += 1;
            if m.zero_filled_reads == 1 {
                tracing::warn!(
                    "the trial run: reading a zero-filled stand-in value (not a real result)"
                );
            }
        }
        Ok(host)
    }

    /// Waits for every step in flight (`synchronize`), counted as a read's wait.
    pub(crate) fn wait_for_all(&self) -> Result<()> {
        self.free_retired();
        let waited = Instant::now();
        let launched = self.launcher.flush();
        let (done, result) = self.in_flight.drain();
        let wait_ms = super::metrics::not_tracing(waited);
        lock(&self.metrics).read_wait_ms += wait_ms;
        self.account(&done);
        launched.and(result)
    }

    /// Copies replica `replica`'s value to the host once its step is done, outside the
    /// metrics and the timeline (the device's own bookkeeping reads, such as index checks).
    pub(crate) fn download_quietly(&self, data: &DeviceData, replica: usize) -> Result<HostTensor> {
        let placed = self.placed(data)?;
        if let Some(p) = &placed.producer {
            p.wait()?;
        }
        Ok(placed.buffers[replica].to_host()?)
    }

    /// `data`'s buffers once its step was launched; a failed launch's error, which no step cut
    /// reports again.
    fn placed<'a>(&self, data: &'a DeviceData) -> Result<&'a Placed> {
        if !data.is_placed() {
            // its launch and those before it made here, unless the launch thread has them
            self.launcher.drain(|| data.is_placed());
        }
        data.placed().inspect_err(|e| {
            if let crate::error::Error::StepFailed { step, .. } = e {
                self.launcher.reported(*step);
            }
        })
    }
}
