//! The lazy device: tensors record operations; `mark_step` cuts the recorded work into one
//! graph, finds or compiles its executable, and runs it.

mod config;
mod diagnose;
mod extract;
pub(crate) mod jit;
mod metrics;
mod step;
pub(crate) mod trace;

use rustc_hash::FxHashMap as HashMap;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use neuron_pc_compiler::ir::{Literal, Op, TensorType};
use neuron_pc_compiler::pjrt::{find_plugin, Buffer, Client, ClientOptions, Device, Plugin};
use neuron_pc_compiler::{DType, HostTensor};

pub use config::{
    DeviceConfig, CACHE_URL_ENV, DEBUG_STEPS_ENV, EXTRACT_DIR_ENV, GRAPH_LOG_ENV,
    NO_NEW_GRAPHS_ENV, USE_CACHE_ENV,
};
pub use metrics::Metrics;

use crate::error::{Error, Result};
use crate::tensor::{Cell, State, Tensor};
use jit::{Jit, StepExecutable};
use trace::{DeviceData, Interner};

/// A device that records tensor operations and runs them as compiled step graphs.
///
/// Cheap to clone (a handle). Tensors refer to it weakly: once every handle is dropped, its
/// tensors report [`Error::DeviceGone`].
#[derive(Clone)]
pub struct LazyDevice {
    pub(crate) inner: Arc<DeviceInner>,
}

pub(crate) struct DeviceInner {
    pub client: Client,
    pub device: Device,
    pub config: DeviceConfig,
    pub interner: Mutex<Interner>,
    /// Tensors that may hold pending values, pruned at every step.
    pub pending: Mutex<Vec<Weak<Cell>>>,
    pub executables: Mutex<HashMap<Vec<u32>, Arc<StepExecutable>>>,
    pub metrics: Mutex<Metrics>,
    pub jit: Jit,
    pub sites: Mutex<diagnose::Sites>,
    next_tensor_id: AtomicU64,
}

impl std::fmt::Debug for LazyDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "LazyDevice({} device {})",
            self.inner.client.platform_name(),
            self.inner.device.0
        )
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these locks leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl LazyDevice {
    /// A device configured from the environment (see [`DeviceConfig::from_env`]).
    pub fn from_env() -> Result<LazyDevice> {
        LazyDevice::new(DeviceConfig::from_env()?)
    }

    /// A device with an explicit configuration.
    pub fn new(config: DeviceConfig) -> Result<LazyDevice> {
        crate::logging::init_default();
        let target = config.target();
        let plugin = Plugin::load(&find_plugin(target)?)?;
        let client = Client::new(
            &plugin,
            &ClientOptions {
                cpu_device_count: config.cpu_device_count,
            },
        )?;
        if config.device_index >= client.device_count() {
            return Err(Error::Config(format!(
                "device index {} out of range: the {target} client has {} devices",
                config.device_index,
                client.device_count()
            )));
        }
        let jit = Jit::new(&client, &config)?;
        Ok(LazyDevice {
            inner: Arc::new(DeviceInner {
                device: Device(config.device_index),
                client,
                interner: Mutex::new(Interner::default()),
                pending: Mutex::new(Vec::new()),
                executables: Mutex::new(HashMap::default()),
                metrics: Mutex::new(Metrics {
                    cache_unavailable: jit.cache_unavailable.clone(),
                    ..Metrics::default()
                }),
                jit,
                sites: Mutex::new(diagnose::Sites::default()),
                next_tensor_id: AtomicU64::new(0),
                config,
            }),
        })
    }

    /// The configuration this device was created with.
    pub fn config(&self) -> &DeviceConfig {
        &self.inner.config
    }

    /// True in extract mode (values are zero-filled stand-ins; nothing is executed).
    pub fn is_extracting(&self) -> bool {
        self.inner.config.extract_dir.is_some()
    }

    /// A snapshot of the counters.
    pub fn metrics(&self) -> Metrics {
        lock(&self.inner.metrics).clone()
    }

    /// Copies `host` to the device; the tensor holds device data (nothing pending).
    pub fn tensor(&self, host: &HostTensor) -> Result<Tensor> {
        let data = self.inner.upload(host, false)?;
        Ok(self.inner.new_tensor(data.ty(), State::Data(data)))
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

    /// Runs everything pending: one graph over every live tensor with a pending value.
    #[track_caller]
    pub fn mark_step(&self) -> Result<()> {
        let site = Location::caller();
        let cells = self.inner.take_pending();
        lock(&self.inner.metrics).steps += 1;
        self.inner.sync(cells, site, true)
    }
}

impl DeviceInner {
    pub(crate) fn new_tensor(self: &Arc<Self>, ty: TensorType, state: State) -> Tensor {
        let pending = matches!(state, State::Pending(_));
        let cell = Arc::new(Cell {
            id: self.next_tensor_id.fetch_add(1, Ordering::Relaxed),
            ty,
            device: Arc::downgrade(self),
            state: Mutex::new(state),
            donor: Mutex::new(None),
        });
        if pending {
            lock(&self.pending).push(Arc::downgrade(&cell));
        }
        Tensor { cell }
    }

    /// Registers a tensor that became pending again (an in-place update).
    pub(crate) fn register_pending(&self, cell: &Arc<Cell>) {
        lock(&self.pending).push(Arc::downgrade(cell));
    }

    pub(crate) fn upload(&self, host: &HostTensor, zero_filled: bool) -> Result<Arc<DeviceData>> {
        let buffer = self.client.buffer_from_host(host, self.device)?;
        {
            let mut m = lock(&self.metrics);
            m.transfers_to_device += 1;
            m.bytes_to_device += host.bytes().len() as u64;
        }
        Ok(self.wrap_buffer(buffer, zero_filled))
    }

    pub(crate) fn wrap_buffer(&self, buffer: Buffer, zero_filled: bool) -> Arc<DeviceData> {
        let ty = TensorType::new(buffer.dtype(), buffer.dims().to_vec());
        let ty_id = lock(&self.interner).ty(&ty);
        Arc::new(DeviceData {
            buffer,
            zero_filled,
            ty_id,
        })
    }

    pub(crate) fn download(&self, data: &DeviceData) -> Result<HostTensor> {
        let host = data.buffer.to_host()?;
        let mut m = lock(&self.metrics);
        m.transfers_to_host += 1;
        m.bytes_to_host += host.bytes().len() as u64;
        if data.zero_filled {
            m.zero_filled_reads += 1;
            if m.zero_filled_reads == 1 {
                tracing::warn!(
                    "extract mode: reading a zero-filled stand-in value (not a real result)"
                );
            }
        }
        Ok(host)
    }

    /// Every live tensor with a pending value, in creation order; forgets dropped ones.
    fn take_pending(&self) -> Vec<Arc<Cell>> {
        let weak = std::mem::take(&mut *lock(&self.pending));
        let mut cells: Vec<Arc<Cell>> = weak
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| matches!(*lock(&c.state), State::Pending(_)))
            .collect();
        cells.sort_by_key(|c| c.id);
        cells.dedup_by_key(|c| c.id);
        cells
    }

    /// Computes the pending values of `cells` as one graph and stores the results in them.
    pub(crate) fn sync(
        self: &Arc<Self>,
        cells: Vec<Arc<Cell>>,
        site: &'static Location<'static>,
        explicit: bool,
    ) -> Result<()> {
        let started = Instant::now();
        let roots: Vec<_> = cells
            .iter()
            .filter_map(|c| match &*lock(&c.state) {
                State::Pending(node) => Some(node.clone()),
                State::Data(_) => None,
            })
            .collect();
        if roots.is_empty() {
            lock(&self.metrics).empty_steps += 1;
            return Ok(());
        }
        if !explicit {
            lock(&self.metrics).implicit_syncs += 1;
        }
        let mut traced = step::trace(&roots);
        let aliases = traced.donations(&cells);
        let known = lock(&self.executables).get(&traced.identity).cloned();
        let (exe, how) = match known {
            Some(exe) => {
                lock(&self.metrics).memory_hits += 1;
                (exe, jit::Obtained::Memory)
            }
            None => {
                let graph = traced.to_graph(&lock(&self.interner))?;
                diagnose::check_new_graph(self, site, &graph)?;
                let (exe, how) = self.jit.obtain(self, &graph, &aliases, site)?;
                lock(&self.metrics).graphs_seen += 1;
                lock(&self.executables).insert(traced.identity.clone(), exe.clone());
                (exe, how)
            }
        };
        drop(roots);
        let outputs = self.run(&exe, &mut traced, &aliases)?;
        for (cell, data) in cells.iter().zip(outputs) {
            *lock(&cell.state) = State::Data(data);
            *lock(&cell.donor) = None;
        }
        diagnose::step_done(self, site);
        if self.config.debug_steps {
            tracing::info!(
                "mark_step at {site}: graph {} ({} ops), {how:?}, {:.3} ms",
                &exe.key[..12.min(exe.key.len())],
                traced.op_count,
                started.elapsed().as_secs_f64() * 1e3
            );
        }
        Ok(())
    }

    /// Executes (or, in extract mode, stands in zero-filled outputs for) one traced graph.
    fn run(
        &self,
        exe: &StepExecutable,
        traced: &mut step::Traced,
        aliases: &[(usize, usize)],
    ) -> Result<Vec<Arc<DeviceData>>> {
        let Some(loaded) = &exe.loaded else {
            return exe
                .output_types
                .iter()
                .map(|ty| self.upload(&HostTensor::zeros(ty.dtype, &ty.dims), true))
                .collect();
        };
        // A parameter may be donated when the graph's own operands are its only holders
        // besides the parameter list; anything else (another tensor holding the same data,
        // a recorded node outside this graph) keeps it.
        let keep: Vec<usize> = (0..traced.params.len())
            .filter(|&i| {
                !aliases.iter().any(|&(p, _)| p == i)
                    || Arc::strong_count(&traced.params[i]) != 1 + traced.data_refs[i]
            })
            .collect();
        let args: Vec<&Buffer> = traced.params.iter().map(|d| &d.buffer).collect();
        let t = Instant::now();
        let outs = loaded.execute_donating(&args, &keep)?;
        let zero_filled = traced.params.iter().any(|d| d.zero_filled);
        let result: Vec<Arc<DeviceData>> = outs
            .into_iter()
            .map(|b| self.wrap_buffer(b, zero_filled))
            .collect();
        let mut m = lock(&self.metrics);
        m.donated_buffers += (traced.params.len() - keep.len()) as u64;
        m.last_step_outputs = result.len() as u64;
        m.executions += 1;
        m.execute_ms += metrics::ms(t.elapsed());
        Ok(result)
    }
}
