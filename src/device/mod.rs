//! The lazy device: tensors record operations; `mark_step` cuts the recorded work into one
//! graph, finds or compiles its executable, and runs it.
//!
//! ```
//! use neuron_pc::compile::CacheConfig;
//! use neuron_pc::{DeviceConfig, HostTensor, LazyDevice};
//! # fn main() -> neuron_pc::Result<()> {
//! // `LazyDevice::from_env()` reads the same settings from the environment.
//! let device = LazyDevice::new(DeviceConfig {
//!     cache: CacheConfig::disabled(), // executables in memory only
//!     ..DeviceConfig::default()       // the cpu plugin, one device
//! })?;
//! let x = device.tensor(&HostTensor::from_slice(&[1.0f32, 2.0, 3.0], &[3])?)?;
//! let y = x.mul(&x)?.sum_all()?; // recorded, not run yet
//! device.mark_step()?; // one graph: compiled, launched
//! assert_eq!(y.to_vec::<f32>()?, [14.0]);
//! let m = device.metrics();
//! assert_eq!((m.steps, m.compiles), (1, 1));
//! # Ok(()) }
//! ```

pub(crate) mod checks;
mod config;
mod create;
mod debug;
pub(crate) mod diagnose;
mod door;
mod executables;
mod inflight;
mod launch;
mod lock_order;
mod metrics;
mod open;
mod random;
pub mod rank_check;
pub(crate) mod replay;
mod step;
mod step_fn;
pub(crate) mod subgraph;
pub(crate) mod trace;
mod transfer;

use rustc_hash::FxHashMap as HashMap;
use std::panic::Location;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use neuron_pc_compiler::ir::{Op, ReplicaRule, TensorType};
use neuron_pc_compiler::pjrt::{Client, Device};
use neuron_pc_compiler::sharding::{Mesh, Sharding};

pub use config::{
    DeviceConfig, CHECK_INDICES_ENV, CPU_NUM_DEVICES_ENV, DEBUG_STEPS_ENV, DEVICES_ENV,
    EXTRACT_DIR_ENV, GRAPH_LOG_ENV, MAX_BYTES_IN_FLIGHT_ENV, MAX_IN_FLIGHT_ENV, NO_NEW_GRAPHS_ENV,
};
pub use create::{DATA_AXIS, EXPERT_AXIS};
pub use debug::TARGET as DEBUG_STEPS_LOG_TARGET;
pub(crate) use door::Tracked;
pub use metrics::Metrics;
pub use step_fn::StepFn;
pub use trace::Tensor;

use crate::compile::CachingCompiler;
use crate::error::{Error, Result};
use crate::timeline::{Timeline, HOST_TRACK};
use executables::{How, StepExecutable, StepShardings};
use inflight::InFlight;
use lock_order::{Lock, Ranked};
use trace::{Cell, DeviceData, Node, Recorder, Value};

/// A device that records tensor operations and runs them as compiled step graphs.
///
/// Cheap to clone (a handle). Tensors refer to it weakly: once every handle is dropped, its
/// tensors report [`Error::DeviceGone`].
#[derive(Clone)]
pub struct LazyDevice {
    pub(crate) inner: Arc<DeviceInner>,
}

pub(crate) struct DeviceInner {
    /// Compiles (or finds in the cache) every new step graph; owns the PJRT client.
    compiler: CachingCompiler,
    /// The devices the replicas run on (one for a single-device job), replica `r` on
    /// `devices[r]`; on a mesh, mesh position `p` on `devices[p]`.
    devices: Vec<Device>,
    /// The device mesh every step program is partitioned over, if there is one.
    mesh: Option<Mesh>,
    config: DeviceConfig,
    /// The interner, the tensors that may hold pending values and the tensor ids: one lock
    /// per recorded op.
    recorder: Ranked<Recorder>,
    executables: Ranked<HashMap<Vec<u32>, Arc<StepExecutable>>>,
    metrics: Ranked<Metrics>,
    sites: Ranked<diagnose::Sites>,
    /// Optimizer state tensors, for the per-replica bytes in the metrics.
    optimizer_state: Ranked<Vec<Weak<Cell>>>,
    /// The tensors optimizers update, for the per-device parameter bytes in the metrics.
    parameters: Ranked<Vec<Weak<Cell>>>,
    /// Gradients kept between steps (accumulated sums), for the metrics.
    gradients: Ranked<Vec<Weak<Cell>>>,
    /// Index checks whose results are not read yet (see `checks.rs`).
    index_checks: Ranked<Vec<checks::IndexCheck>>,
    /// Checkpointed blocks the backward pass recomputes (see `nn::checkpoint`).
    remat: Ranked<Vec<Arc<trace::RematRegion>>>,
    /// The dtype matrix products are computed in while `LazyDevice::autocast` runs.
    autocast: Ranked<Option<neuron_pc_compiler::DType>>,
    /// The rank-agreement check of a multi-process run with a store.
    rank_check: Option<rank_check::RankCheck>,
    /// Launched steps that may still be running.
    in_flight: InFlight,
    /// The launch thread and the launches handed to it (see `launch.rs`).
    launcher: launch::Launcher,
    /// The phases of every step, when a timeline was asked for.
    timeline: Option<Timeline>,
    /// How many step walks ran and the last one's sizes; held while one runs (see
    /// `trace::WalkMark`).
    walks: Ranked<(u64, step::WalkSizes)>,
    /// When the last `mark_step` returned (the start of the next step's tracing).
    last_step_end: Ranked<Instant>,
    /// What launched steps left to free (see [`Retired`]).
    retired: Ranked<Retired>,
    /// Bumped by every change of a tensor's value that is not a step computing a pending one
    /// (`Tensor::assign`, a replayed step's writes): a step function replays only while its
    /// last call's bump is the latest.
    writes: std::sync::atomic::AtomicU64,
}

/// What launched steps leave behind: their walks, the recorded values their outputs replaced
/// (each step's whole trace) and the pending list's dead entries. Freeing these allocation by
/// allocation took over half of a memory-hit `mark_step` (the 600-op chain of
/// `examples/trace_cost.rs`), so it waits for the next point where the host would wait for
/// the device anyway (a read, a `synchronize`) and runs while the device computes. The next
/// step cut frees it at the latest, before it decides what to donate, so a reference held here
/// never changes that decision.
#[derive(Default)]
struct Retired {
    walks: Vec<step::Traced>,
    values: Vec<Value>,
    cells: Vec<Arc<Cell>>,
    dead: Vec<Weak<Cell>>,
}

impl std::fmt::Debug for LazyDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let d = &self.inner.devices;
        if let Some(mesh) = &self.inner.mesh {
            return write!(
                f,
                "LazyDevice({} devices {}..{}, mesh {mesh})",
                self.inner.client().platform_name(),
                d[0].0,
                d[0].0 + d.len()
            );
        }
        match d.len() {
            1 => write!(
                f,
                "LazyDevice({} device {})",
                self.inner.client().platform_name(),
                d[0].0
            ),
            n => write!(
                f,
                "LazyDevice({} devices {}..{}, {n} replicas)",
                self.inner.client().platform_name(),
                d[0].0,
                d[0].0 + n
            ),
        }
    }
}

/// A duration in milliseconds, for the metrics.
pub(crate) fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(crate) fn lock<L: Lock>(m: &L) -> L::Guard<'_> {
    // A panic while holding one of these locks leaves plain data behind; keep going.
    m.acquire()
}

impl LazyDevice {
    /// The configuration this device was created with.
    pub fn config(&self) -> &DeviceConfig {
        &self.inner.config
    }

    /// How many replicas of every step graph run in this process (1: a single-device job,
    /// or a mesh, whose program is one replica split over the mesh's devices).
    pub fn replicas(&self) -> usize {
        match self.inner.mesh {
            Some(_) => 1,
            None => self.inner.devices.len(),
        }
    }

    /// Runs `f` with matrix products computed in `dtype` (bfloat16 or float16), as
    /// `torch.autocast(device_type, dtype)` does: every matmul, `linear`, `dot_general` and
    /// convolution recorded meanwhile casts its float32 operands to `dtype` first, and gives a
    /// result of `dtype`. Everything else keeps its operands' dtype, so float32 parameters
    /// (master weights) stay float32, their gradients come back float32 through the casts,
    /// and what a model computes in float32 on purpose (norm statistics, softmax, the loss)
    /// stays so. `None` turns autocasting off inside `f`. The previous setting is restored
    /// when `f` returns, errors or panics.
    pub fn autocast<T>(
        &self,
        dtype: Option<neuron_pc_compiler::DType>,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        use neuron_pc_compiler::DType;
        if let Some(d) = dtype.filter(|d| !matches!(d, DType::BF16 | DType::F16)) {
            return Err(Error::Config(format!(
                "autocast: {d} is not a lower precision to compute in (bf16 or f16)"
            )));
        }
        struct Restore<'a>(&'a Ranked<Option<DType>>, Option<DType>);
        impl Drop for Restore<'_> {
            fn drop(&mut self) {
                *lock(self.0) = self.1;
            }
        }
        let previous = std::mem::replace(&mut *lock(&self.inner.autocast), dtype);
        let _restore = Restore(&self.inner.autocast, previous);
        f()
    }

    /// The dtype matrix products are computed in now (see [`LazyDevice::autocast`]).
    pub fn autocast_dtype(&self) -> Option<neuron_pc_compiler::DType> {
        *lock(&self.inner.autocast)
    }

    /// The device mesh step programs are partitioned over (see [`DeviceConfig::mesh`]).
    pub fn mesh(&self) -> Option<&Mesh> {
        self.inner.mesh.as_ref()
    }

    /// How many devices the PJRT client exposes. On cpu the client is created with the devices
    /// this run uses (`device_index + replicas`, or `cpu_device_count` if larger), so the
    /// plugin sizes its thread pools for them.
    pub fn client_devices(&self) -> usize {
        self.inner.client().device_count()
    }

    /// Replicas in the whole run: [`LazyDevice::replicas`] times the processes of a
    /// multi-process launch (see [`crate::topology`]).
    pub fn global_replicas(&self) -> usize {
        self.inner.global_replicas()
    }

    /// The global index of this process's first replica.
    pub fn replica_offset(&self) -> usize {
        let t = &self.inner.config.topology;
        t.global_replica_offset(self.replicas())
    }

    /// Waits for every launched step; the first failure among them, naming its `mark_step`.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.wait_for_all()?;
        self.inner.poll_index_checks(true)
    }

    /// Runs everything pending: one graph over every live tensor with a pending value.
    #[track_caller]
    pub fn mark_step(&self) -> Result<()> {
        self.inner.cut_step(Location::caller(), None)
    }
}

impl DeviceInner {
    /// The PJRT client of the device's target.
    pub(crate) fn client(&self) -> &Client {
        self.compiler.client()
    }

    /// Replicas of the whole run (collectives span them all).
    pub(crate) fn global_replicas(&self) -> usize {
        self.compiler.global_replicas()
    }

    /// A new cell holding `value`; a pending one joins the next step's outputs.
    pub(crate) fn new_cell(self: &Arc<Self>, ty: Arc<TensorType>, value: Value) -> Arc<Cell> {
        self.new_cell_locked(&mut lock(&self.recorder), ty, value)
    }

    /// [`DeviceInner::new_cell`] with the recording lock held.
    fn new_cell_locked(
        self: &Arc<Self>,
        rec: &mut Recorder,
        ty: Arc<TensorType>,
        value: Value,
    ) -> Arc<Cell> {
        let pending = value.is_pending();
        let cell = Arc::new(Cell {
            id: rec.next_id,
            ty,
            device: Arc::downgrade(self),
            value: Mutex::new(value),
            donor: Mutex::new(None),
            name: Mutex::new(None),
        });
        rec.next_id += 1;
        if pending {
            rec.track(Arc::downgrade(&cell));
        }
        cell
    }

    /// A cell over an existing value that is not registered as pending: it never becomes a
    /// step output by itself (intermediate values during differentiation).
    pub(crate) fn detached_cell(self: &Arc<Self>, value: Value, ty: TensorType) -> Arc<Cell> {
        self.detached_cell_of(value, self.interned(ty))
    }

    /// Records `op` (of result type `ty`) over `operands` as a new pending cell.
    pub(crate) fn record(
        self: &Arc<Self>,
        op: Op,
        ty: TensorType,
        operands: trace::Operands,
        site: &'static Location<'static>,
    ) -> Arc<Cell> {
        let per_replica = self.result_per_replica(&op, &operands);
        let mut rec = lock(&self.recorder);
        let (op_id, ty) = rec.interner.op(op, ty);
        self.record_interned(&mut rec, op_id, per_replica, ty, operands, site)
    }

    /// Records op `op_id` (interned, of result type `ty`) over `operands` at `site`, with the
    /// recording lock held.
    pub(crate) fn record_interned(
        self: &Arc<Self>,
        rec: &mut Recorder,
        op_id: u32,
        per_replica: bool,
        ty: Arc<TensorType>,
        operands: trace::Operands,
        site: &'static Location<'static>,
    ) -> Arc<Cell> {
        let node = Arc::new(Node::at(op_id, per_replica, operands, Some(site)));
        self.new_cell_locked(rec, ty, Value::Node(node))
    }

    /// Whether `op`'s result may differ between replicas: the replica index does; a
    /// collective over one group of every replica gives all the same value; any other op
    /// differs where an operand does.
    pub(crate) fn result_per_replica(&self, op: &Op, operands: &[Value]) -> bool {
        let any = || operands.iter().any(Value::is_per_replica);
        let everyone =
            |groups: &[Vec<usize>]| groups.len() == 1 && groups[0].len() == self.global_replicas();
        let trivial = |groups: &[Vec<usize>]| groups.iter().all(|g| g.len() == 1);
        match op.replicas() {
            ReplicaRule::Distinct => true,
            ReplicaRule::Local => any(),
            ReplicaRule::FirstOperand => operands[0].is_per_replica(),
            ReplicaRule::Groups {
                groups,
                agree: true,
            } => !everyone(groups) && (!trivial(groups) || any()),
            ReplicaRule::Groups {
                groups,
                agree: false,
            } => !trivial(groups) || any(),
        }
    }

    /// The device's shared copy of `ty`.
    pub(crate) fn interned(&self, ty: TensorType) -> Arc<TensorType> {
        lock(&self.recorder).interner.ty_arc(ty)
    }

    /// Registers a tensor that became pending again (an in-place update).
    pub(crate) fn register_pending(&self, cell: &Arc<Cell>) {
        lock(&self.recorder).track(Arc::downgrade(cell));
    }

    /// Records a host-side phase on the timeline, if there is one.
    pub(crate) fn phase(&self, name: &str, start: Instant, graph: Option<&str>) {
        if let Some(t) = &self.timeline {
            let args: Vec<(&str, serde_json::Value)> =
                graph.map(|g| ("graph", g.into())).into_iter().collect();
            t.span(HOST_TRACK, name, start, Instant::now(), &args);
        }
    }

    /// Every live tensor with a pending value, in creation order; forgets dropped ones.
    fn take_pending(&self) -> Vec<Arc<Cell>> {
        let weak = {
            // the next step's list, allocated at this one's length
            let mut rec = lock(&self.recorder);
            let next = Vec::with_capacity(rec.pending.len());
            rec.prune_at = 2 * rec.pending.len();
            std::mem::replace(&mut rec.pending, next)
        };
        let mut cells: Vec<Arc<Cell>> = weak
            .iter()
            .filter_map(Weak::upgrade)
            .filter(|c| lock(&c.value).is_pending())
            .collect();
        cells.sort_by_key(|c| c.id);
        cells.dedup_by_key(|c| c.id);
        // the dropped tensors' cells are freed with the step's trace (see `Retired`)
        lock(&self.retired).dead.extend(weak);
        cells
    }

    /// An explicit step cut (`mark_step`, a traced step function call): every live pending
    /// tensor computed as one graph, described in `capture` when given and a step ran.
    fn cut_step(
        self: &Arc<Self>,
        site: &'static Location<'static>,
        capture: Option<&mut Option<replay::Captured>>,
    ) -> Result<()> {
        self.launcher.take_failure()?;
        self.poll_index_checks(false)?;
        // before this step's pending list joins what is retired (see `Retired`)
        self.free_retired();
        let cells = self.take_pending();
        lock(&self.metrics).steps += 1;
        self.sync_captured(cells, site, true, capture)
    }

    /// Makes `data` the value of `cell` (a step's output), passing on the tensor's name so
    /// later graphs can name the input; returns the value it replaced.
    fn store_output(cell: &Cell, data: Arc<DeviceData>) -> Value {
        if let Some(n) = lock(&cell.name).clone() {
            *lock(&data.name) = Some(n);
        }
        let old = std::mem::replace(&mut *lock(&cell.value), Value::Data(data));
        *lock(&cell.donor) = None;
        old
    }

    /// Computes the pending values of `cells` as one graph and stores the results in them.
    pub(crate) fn sync(
        self: &Arc<Self>,
        cells: Vec<Arc<Cell>>,
        site: &'static Location<'static>,
        explicit: bool,
    ) -> Result<()> {
        self.sync_captured(cells, site, explicit, None)
    }

    /// [`DeviceInner::sync`], describing the step in `capture` when it ran one (for step
    /// functions, `replay.rs`).
    fn sync_captured(
        self: &Arc<Self>,
        mut cells: Vec<Arc<Cell>>,
        site: &'static Location<'static>,
        explicit: bool,
        capture: Option<&mut Option<replay::Captured>>,
    ) -> Result<()> {
        let started = Instant::now();
        if !explicit {
            // (a `mark_step` freed them before taking its pending list)
            self.free_retired();
            // A read computes the index checks recorded so far with its value, so the read
            // can report them (a mark_step's pending list holds them already).
            self.pending_check_cells(&mut cells);
        }
        let roots: Vec<_> = cells
            .iter()
            .filter_map(|c| match &*lock(&c.value) {
                Value::Node(node) => Some(node.clone()),
                Value::Data(_) => None,
            })
            .collect();
        if roots.is_empty() {
            lock(&self.metrics).empty_steps += 1;
            debug::log_empty_step(self, site);
            return Ok(());
        }
        if !explicit {
            lock(&self.metrics).implicit_syncs += 1;
            debug::warn_implicit_sync(self, site);
        }
        // from the last step's end, less the loop's waits and the steps its reads cut
        let tracing = if explicit {
            let from = *lock(&self.last_step_end);
            metrics::tracing_parts(from, started, metrics::take_not_tracing())
        } else {
            Vec::new()
        };
        if let Some(t) = &self.timeline {
            for (a, b) in &tracing {
                t.span(HOST_TRACK, "trace", *a, *b, &[]);
            }
        }
        let mut traced = {
            let mut walks = lock(&self.walks);
            walks.0 += 1;
            let traced = step::trace(&roots, walks.0, walks.1);
            walks.1 = traced.sizes();
            traced
        };
        let aliases = traced.donations(&cells);
        let per_replica: Vec<bool> = roots.iter().map(|n| n.per_replica).collect();
        let keyed = Instant::now();
        let known = lock(&self.executables).get(&traced.identity).cloned();
        let found = Instant::now();
        if let Some(t) = &self.timeline {
            t.span(HOST_TRACK, "step cut", started, found, &[]);
            t.span(HOST_TRACK, "key", started, keyed, &[]);
            t.span(HOST_TRACK, "lookup", keyed, found, &[]);
        }
        let (exe, how) = match known {
            Some(exe) => {
                let mut m = lock(&self.metrics);
                m.memory_hits += 1;
                m.host_key_ms += ms(keyed - started);
                m.host_lookup_ms += ms(found - keyed);
                (exe, How::Memory)
            }
            None => {
                let graph = traced.to_graph(&lock(&self.recorder).interner)?;
                let names = traced.param_names();
                diagnose::check_new_graph(self, site, explicit, &graph, &names, &roots)?;
                let shardings = self
                    .mesh
                    .as_ref()
                    .map(|_| self.step_shardings(&traced, &aliases));
                let (exe, how) =
                    executables::obtain(self, &graph, &aliases, shardings, site, &names)?;
                lock(&self.metrics).graphs_seen += 1;
                lock(&self.executables).insert(traced.identity.clone(), exe.clone());
                (exe, how)
            }
        };
        drop(roots);
        // marshalling starts here, after a compile or cache load (counted as those)
        let ready = Instant::now();
        let outputs = self.run(&exe, &mut traced, &aliases, &per_replica, site, ready)?;
        let ran = Instant::now();
        if let Some(capture) = capture {
            *capture = Some(replay::Captured {
                identity: traced.identity.clone(),
                exe: exe.clone(),
                params: traced.params.clone(),
                outputs: cells.clone(),
                out_data: outputs.iter().map(Arc::downgrade).collect(),
                aliases: aliases.clone(),
                per_replica: per_replica.clone(),
            });
        }
        let mut replaced = Vec::with_capacity(cells.len());
        for (cell, data) in cells.iter().zip(outputs) {
            replaced.push(Self::store_output(cell, data));
        }
        diagnose::step_done(self, site);
        debug::log_step(
            self,
            &debug::StepCut {
                site,
                explicit,
                key: exe.key.hex(),
                ops: traced.op_count,
                how,
                elapsed: started.elapsed(),
            },
        );
        let end = Instant::now();
        {
            let mut m = lock(&self.metrics);
            m.last_step_ops = traced.op_count as u64;
            m.host_finish_ms += ms(end - ran);
            m.host_trace_ms += tracing.iter().map(|(a, b)| ms(*b - *a)).sum::<f64>();
        }
        if !explicit {
            metrics::not_tracing(started);
        }
        {
            let mut retired = lock(&self.retired);
            retired.walks.push(traced);
            retired.values.append(&mut replaced);
            retired.cells.append(&mut cells);
        }
        if explicit {
            *lock(&self.last_step_end) = end;
        }
        Ok(())
    }

    /// On a mesh, the sharding of each parameter (its data's) and output of a step: an output
    /// updating a parameter in place keeps that parameter's, a sharding constraint's output
    /// takes the constraint's, and any other output is whole on every device. All three follow
    /// from the step's identity (parameter shardings, donation pairs, ops), so the executable
    /// found under an identity always has the right ones.
    fn step_shardings(&self, traced: &step::Traced, aliases: &[(usize, usize)]) -> StepShardings {
        let params: Vec<Option<Arc<Sharding>>> =
            traced.params.iter().map(|d| d.sharding.clone()).collect();
        let rec = lock(&self.recorder);
        let outputs = (0..traced.output_count())
            .map(|j| match aliases.iter().find(|&&(_, o)| o == j) {
                Some(&(i, _)) => params[i].clone(),
                None => traced
                    .output_constraint(&rec.interner, j)
                    .filter(|s| !s.is_replicated()),
            })
            .collect();
        StepShardings { params, outputs }
    }

    /// Frees what launched steps left behind (see [`Retired`]).
    pub(crate) fn free_retired(&self) {
        let retired = std::mem::take(&mut *lock(&self.retired));
        drop(retired);
    }

    /// Executes (or, in a trial run, stands in zero-filled outputs for) one traced graph.
    fn run(
        self: &Arc<Self>,
        exe: &Arc<StepExecutable>,
        traced: &mut step::Traced,
        aliases: &[(usize, usize)],
        per_replica: &[bool],
        site: &'static Location<'static>,
        ready: Instant,
    ) -> Result<Vec<Arc<DeviceData>>> {
        if exe.loaded.is_none() {
            return (exe.output_types.iter().zip(per_replica))
                .enumerate()
                .map(|(k, (ty, &p))| match exe.out_sharding(k) {
                    Some(s) => self.upload_zeros_sharded(ty.dtype, s, p, true),
                    None => self.upload_zeros(ty.dtype, &ty.dims, p, true),
                })
                .collect();
        };
        // A parameter may be donated when the graph's own operands are its only holders
        // besides the parameter list; anything else (another tensor holding the same data,
        // a recorded node outside this graph) keeps it. A launch still queued that reads it
        // (a step that reads a value, then one that updates it in place: gradient
        // accumulation) does not count: it is made, and lets go, before this one.
        let kept = |i: usize| {
            !aliases.iter().any(|&(p, _)| p == i)
                || DeviceData::holders(&traced.params[i]) != 1 + traced.data_refs[i]
        };
        let keep: Vec<usize> =
            (self.launcher).counting(|| (0..traced.params.len()).filter(|&i| kept(i)).collect());
        self.launch(
            exe,
            (traced.params.clone(), keep),
            per_replica,
            site,
            ready,
            false,
        )
    }
}

impl Drop for LazyDevice {
    fn drop(&mut self) {
        // The last handle (each launch handed over holds one too): the launches are made here,
        // so that the device is dropped on this thread, its timeline written before it returns.
        let launcher = &self.inner.launcher;
        if Arc::strong_count(&self.inner) <= 1 + launcher.queued() {
            launcher.flush_quietly();
        }
    }
}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // Steps still running write into buffers this device owns: wait for them.
        let (done, result) = self.in_flight.drain();
        if let Err(e) = result {
            tracing::error!("a step failed and its values were never read: {e}");
        } else if let Err(e) = self.poll_index_checks(true) {
            tracing::error!("{e}");
        }
        self.account(&done);
        self.free_retired();
        if let Some(t) = self
            .timeline
            .as_ref()
            .filter(|t| !crate::trial::skip_overwrite("timeline", t.path()))
        {
            match t.write() {
                Ok(()) => tracing::info!("timeline written to {}", t.path().display()),
                Err(e) => tracing::error!("timeline {}: {e}", t.path().display()),
            }
        }
    }
}
