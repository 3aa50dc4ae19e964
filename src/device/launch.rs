//! Launching steps off the loop's thread. A step cut traces, keys and finds its executable,
//! hands the launch to the device's launch thread and returns, so that the loop records the
//! next step while the runtime's launch call runs: XLA's cpu client runs a program this small
//! inside that call, and a GPU client enqueues each of the program's kernels in it. PyTorch/XLA
//! schedules its executions off the Python thread for the same reason.
//!
//! The step's outputs exist at once, without buffers; the launch places them
//! (`DeviceData::placed`), and whatever needs a buffer (a read, a checkpoint's copy) waits for
//! that. Launches run in the order the steps were cut, so a step's inputs are placed before it
//! launches, and a bounded queue keeps the loop at most [`QUEUED`] launches ahead of the thread.
//! A launch that fails places its failure in its outputs and is the error of the next step cut,
//! `synchronize` or read.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe, Location};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use neuron_pc_compiler::pjrt::Buffer;

use super::executables::StepExecutable;
use super::inflight::{poll_until, Bound, POLL};
use super::trace::{DeviceData, Failure, Placed, Slot};
use super::{lock, ms, DeviceInner};
use crate::error::{Error, Result};
use crate::timeline::{HOST_TRACK, LAUNCH_TRACK};

/// Launches handed over and not yet made, past which a step cut waits for the launch thread.
pub(crate) const QUEUED: usize = 8;

/// One step's launch: its executable, its inputs (those in `keep` are not donated) and the
/// outputs to place.
pub(crate) struct Launch {
    exe: Arc<StepExecutable>,
    params: Vec<Arc<DeviceData>>,
    keep: Box<[usize]>,
    /// Their slots, not the values, so that a later step cut's donation count
    /// (`Arc::strong_count`) sees only the tensors holding them, while the launch places them
    /// too (an upgraded `Weak` held there counted: a whole step kept, a copy of every
    /// parameter, when the next cut's check fell in that window).
    outputs: Vec<Slot>,
    site: &'static Location<'static>,
    step: u64,
    /// When the step cut began building the launch (marshalling, on the loop's thread).
    marshal_from: Instant,
    /// Made: its outputs placed, or its failure placed in them (and noted).
    done: bool,
    /// The queue it was handed over through, where a launch dropped unmade notes its failure.
    handed: Option<Arc<Shared>>,
}

/// A launch handed over, with its device.
type Queued = (Arc<DeviceInner>, Launch);

impl Drop for Launch {
    fn drop(&mut self) {
        if self.handed.is_some() {
            // (a launch never made: one made gave its inputs back, `Shared::make`) before the
            // inputs' `Arc`s go (see `DeviceData::holders`)
            for p in &self.params {
                p.queued.fetch_sub(1, Ordering::Release);
            }
        }
        if self.done {
            return;
        }
        // A launch never made (a panic while making it) fails its step. The failure is noted
        // before any output shows it, so that a read reporting it (`Launcher::reported`) keeps
        // the next step cut from reporting it again; and its outputs fail rather than leave
        // their readers waiting.
        if let Some(shared) = &self.handed {
            lock(&shared.queue)
                .failure
                .get_or_insert_with(|| Failure::never_made(self.site, self.step));
        }
        for o in &self.outputs {
            let _ = o.set(Err(Failure::never_made(self.site, self.step)));
        }
    }
}

impl Failure {
    fn never_made(site: &'static Location<'static>, step: u64) -> Failure {
        Failure {
            site,
            step,
            message: "the launch thread failed while launching this step".into(),
        }
    }
}

#[derive(Default)]
struct Queue {
    /// Launches handed over and not yet taken up, in the order their steps were cut.
    pending: VecDeque<Queued>,
    /// Launches handed over and not yet made (those pending, and one being made).
    queued: usize,
    /// A launch is being made. Launches are made one at a time, in cut order, by the thread
    /// or by a thread that needs one made (`Launcher::drain`).
    making: bool,
    /// The first launch that failed since a step cut last reported one.
    failure: Option<Failure>,
    /// The device is gone: the thread ends.
    closed: bool,
    /// The thread waits for work; threads wait for a launch to be made. (A signal nobody waits
    /// for is a system call saved, a few µs a step.)
    thread_waits: bool,
    waiting: usize,
}

/// The queue and its two signals.
#[derive(Default)]
pub(crate) struct Shared {
    queue: Mutex<Queue>,
    /// For the thread: a launch was handed over, or the last one made left more pending.
    work: Condvar,
    /// For everyone else: a launch was made (room in the queue, a value placed).
    made: Condvar,
    /// Launches made, counted under the lock (a thread polls it before it waits on `made`).
    made_count: AtomicU64,
}

impl Shared {
    /// Takes the next launch to make, when none is being made.
    fn take(q: &mut Queue) -> Option<Queued> {
        if q.making {
            return None;
        }
        let next = q.pending.pop_front()?;
        q.making = true;
        Some(next)
    }

    /// Makes a launch taken (`take`); a panic fails its step (`Launch`'s drop notes the failure
    /// and places it in its outputs). A failure `make` returns is noted by `make`, also before
    /// any read sees it.
    fn make(&self, (dev, launch): Queued) -> MutexGuard<'_, Queue> {
        let inputs = catch_unwind(AssertUnwindSafe(|| dev.make(launch, true).1));
        // before the count, so that a flush leaves no launch holding the device
        drop(dev);
        let mut q = lock(&self.queue);
        // The inputs' holds go under the lock, where a donation check counts them
        // (`Launcher::counting`): it sees each both counted as queued and held, or neither.
        // A last hold gives its value back, freed once the lock is let go.
        let freed: Vec<DeviceData> = (inputs.unwrap_or_default().into_iter())
            .filter_map(|d| {
                d.queued.fetch_sub(1, Ordering::Relaxed);
                Arc::into_inner(d)
            })
            .collect();
        q.making = false;
        q.queued -= 1;
        self.made_count.fetch_add(1, Ordering::Relaxed);
        if q.waiting > 0 {
            self.made.notify_all();
        }
        if q.thread_waits && !q.pending.is_empty() {
            self.work.notify_one();
        }
        if freed.is_empty() {
            return q;
        }
        drop(q);
        drop(freed);
        lock(&self.queue)
    }

    /// Waits for a launch to be made.
    fn wait_made<'a>(&self, mut q: MutexGuard<'a, Queue>) -> MutexGuard<'a, Queue> {
        q.waiting += 1;
        let mut q = self.made.wait(q).unwrap_or_else(|p| p.into_inner());
        q.waiting -= 1;
        q
    }
}

/// A device's launch thread and the queue to it (none: launches are made by the step cut).
pub(crate) struct Launcher {
    thread: bool,
    shared: Arc<Shared>,
}

impl Launcher {
    /// A launcher with its own thread when `thread`, else one that makes launches in place.
    pub fn new(thread: bool) -> Launcher {
        let shared: Arc<Shared> = Arc::default();
        if !thread {
            return Launcher {
                thread: false,
                shared,
            };
        }
        let on_thread = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("neuron-pc launch".into())
            .spawn(move || {
                let s = &*on_thread;
                let mut q = lock(&s.queue);
                // ends when the device (the launcher's owner) is dropped
                while !q.closed {
                    match Shared::take(&mut q) {
                        Some(next) => {
                            drop(q);
                            q = s.make(next);
                        }
                        None => {
                            q.thread_waits = true;
                            q = s.work.wait(q).unwrap_or_else(|p| p.into_inner());
                            q.thread_waits = false;
                        }
                    }
                }
            });
        match spawned {
            Ok(_) => Launcher {
                thread: true,
                shared,
            },
            Err(e) => {
                tracing::warn!("no launch thread ({e}): steps launch on the loop's thread");
                Launcher::new(false)
            }
        }
    }

    /// Runs a donation check (`DeviceData::holders`) where the launches handed over hold their
    /// inputs steadily: a launch made lets go of each input (its `Arc` and its queued count)
    /// under the same lock. Without it, a check between the two would see a hold as a holder and
    /// keep a value it could donate, a copy where training updates in place (timing, not safety:
    /// the counts were ordered so that a check never donates a held value).
    pub fn counting<R>(&self, check: impl FnOnce() -> R) -> R {
        let _q = lock(&self.shared.queue);
        check()
    }

    /// Launches handed over and not yet made.
    pub fn queued(&self) -> usize {
        lock(&self.shared.queue).queued
    }

    /// Makes the launches handed over, in order, on this thread, until `done()` or none is
    /// left; while the thread makes one, waits for it. A thread that needs a launch made (a
    /// read of its output, a flush) takes it up rather than wait for the launch thread to wake.
    pub fn drain(&self, done: impl Fn() -> bool) {
        let s = &*self.shared;
        let mut q = lock(&s.queue);
        while q.queued > 0 && !done() {
            match Shared::take(&mut q) {
                Some(next) => {
                    drop(q);
                    q = s.make(next);
                }
                None => {
                    // a launch call is short: poll for it before sleeping
                    let seen = s.made_count.load(Ordering::Relaxed);
                    drop(q);
                    poll_until(POLL, || {
                        done() || s.made_count.load(Ordering::Relaxed) != seen
                    });
                    q = lock(&s.queue);
                    // (counted under the lock: unchanged, the launch's signal is still to come)
                    if s.made_count.load(Ordering::Relaxed) == seen && !done() {
                        q = s.wait_made(q);
                    }
                }
            }
        }
    }

    /// Makes every launch handed over (see `drain`); the first that failed since the last
    /// report, as an error.
    pub fn flush(&self) -> Result<()> {
        self.drain(|| false);
        let failure = lock(&self.shared.queue).failure.take();
        failure.map_or(Ok(()), |f| Err(f.error()))
    }

    /// Makes every launch handed over, keeping any failure for a later report.
    pub fn flush_quietly(&self) {
        self.drain(|| false);
    }

    /// The failure of step `step` was reported (a read of its output): no step cut reports it
    /// again.
    pub fn reported(&self, step: u64) {
        let mut q = lock(&self.shared.queue);
        if q.failure.as_ref().is_some_and(|f| f.step == step) {
            q.failure = None;
        }
    }

    /// A launch that failed since the last report, as an error.
    pub fn take_failure(&self) -> Result<()> {
        let failure = lock(&self.shared.queue).failure.take();
        failure.map_or(Ok(()), |f| Err(f.error()))
    }

    /// Hands `launch` to the thread: the time spent waiting for room in the queue; the launch
    /// back when there is no thread.
    fn hand_over(
        &self,
        dev: &Arc<DeviceInner>,
        mut launch: Launch,
    ) -> std::result::Result<Duration, Launch> {
        if !self.thread {
            return Err(launch);
        }
        launch.handed = Some(self.shared.clone());
        for p in &launch.params {
            p.queued.fetch_add(1, Ordering::Relaxed);
        }
        let s = &*self.shared;
        let started = Instant::now();
        let mut q = lock(&s.queue);
        while q.pending.len() >= QUEUED {
            q = s.wait_made(q);
        }
        let waited = started.elapsed();
        q.pending.push_back((dev.clone(), launch));
        q.queued += 1;
        if q.thread_waits {
            s.work.notify_one();
        }
        Ok(waited)
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        // (every launch holds the device, so none is left)
        lock(&self.shared.queue).closed = true;
        self.shared.work.notify_one();
    }
}

impl DeviceInner {
    /// Launches `exe` over `inputs`' parameters (one value per parameter), donating every
    /// parameter the program aliases except those in its `keep` list (ascending); one value per
    /// output, placed by the launch. The host waits for no input's step: the runtime orders the
    /// executions by their buffers, a donated one too. The host's time from `marshal_from` to
    /// the hand-over (or, launching in place, to the launch call) counts as marshalling.
    /// `in_place`: made on this thread once the launches handed over are made, whatever the
    /// configuration (a replayed step, whose host work is too small to gain from the hand-over:
    /// measured in `examples/bench_host.rs`). A launch made in place (no launch thread, or
    /// `in_place`) reports its failure at once.
    pub(super) fn launch(
        self: &Arc<Self>,
        exe: &Arc<StepExecutable>,
        inputs: (Vec<Arc<DeviceData>>, Vec<usize>),
        per_replica: &[bool],
        site: &'static Location<'static>,
        marshal_from: Instant,
        in_place: bool,
    ) -> Result<Vec<Arc<DeviceData>>> {
        let (params, keep) = inputs;
        let step = lock(&self.metrics).steps;
        if exe.loaded.is_none() {
            return Err(Error::StepFailed {
                site,
                step,
                message: "the trial run: there is no executable to launch".into(),
            });
        }
        if exe.output_types.len() != per_replica.len() {
            return Err(Error::StepFailed {
                site,
                step,
                message: format!(
                    "the executable has {} outputs, {} expected",
                    exe.output_types.len(),
                    per_replica.len()
                ),
            });
        }
        let zero_filled = params.iter().any(|d| d.zero_filled);
        let outputs: Vec<Arc<DeviceData>> = (exe.output_types.iter().zip(per_replica))
            .enumerate()
            .map(|(k, (ty, &p))| self.unplaced(ty, p, exe.out_sharding(k), zero_filled))
            .collect();
        let launch = Launch {
            exe: exe.clone(),
            params,
            keep: keep.into_boxed_slice(),
            outputs: outputs.iter().map(|o| o.slot()).collect(),
            site,
            step,
            marshal_from,
            done: false,
            handed: None,
        };
        let handed = if in_place {
            // after the launches handed over before it
            self.launcher.flush()?;
            Err(launch)
        } else {
            self.launcher.hand_over(self, launch)
        };
        match handed {
            Ok(waited) => {
                if let Some(t) = &self.timeline {
                    // the wait for room in the queue is a span of its own
                    let now = Instant::now();
                    t.span(HOST_TRACK, "marshal", marshal_from, now - waited, &[]);
                    if waited.as_micros() > 50 {
                        t.span(HOST_TRACK, "wait (launch queue)", now - waited, now, &[]);
                    }
                }
                let mut m = lock(&self.metrics);
                m.host_marshal_ms += ms(marshal_from.elapsed().saturating_sub(waited));
                m.in_flight_wait_ms += ms(waited);
            }
            Err(launch) => self.make(launch, false).0.map_err(|f| f.error())?,
        }
        Ok(outputs)
    }

    /// Makes `launch` (`on_thread`: on the launch thread, else in place) and places its
    /// outputs; its failure placed in every output. Its inputs come back for the caller to let
    /// go of (`Shared::make`).
    fn make(
        &self,
        mut launch: Launch,
        on_thread: bool,
    ) -> (std::result::Result<(), Failure>, Vec<Arc<DeviceData>>) {
        let fail = |message: String| Failure {
            site: launch.site,
            step: launch.step,
            message,
        };
        let made = self.make_placing(&launch, on_thread).map_err(|e| {
            if let Error::StepFailed {
                site,
                step,
                message,
            } = e
            {
                Failure {
                    site,
                    step,
                    message,
                }
            } else {
                fail(e.to_string())
            }
        });
        if let Err(f) = &made {
            if on_thread {
                // before a read can see it in an output and mark it reported
                let mut q = lock(&self.launcher.shared.queue);
                q.failure.get_or_insert_with(|| f.clone());
            }
            for o in &launch.outputs {
                let _ = o.set(Err(f.clone()));
            }
        }
        launch.done = true;
        (made, std::mem::take(&mut launch.params))
    }

    fn make_placing(&self, launch: &Launch, on_thread: bool) -> Result<()> {
        let Launch {
            exe,
            params,
            keep,
            site,
            step,
            ..
        } = launch;
        let (site, step) = (*site, *step);
        let track = if on_thread { LAUNCH_TRACK } else { HOST_TRACK };
        let started = Instant::now();
        let loaded = exe.loaded.as_ref().expect("checked by the step cut");
        // A value whose launch or step failed fails every step that uses it (a step still
        // running is ordered before this one by the runtime: PJRT waits for an input buffer's
        // definition, a donated buffer's too, as for a launch of `jax.jit`).
        let mut placed = Vec::with_capacity(params.len());
        for d in params {
            let p = d.placed()?;
            if let Some(r) = p.producer.as_ref().filter(|r| r.is_finished()) {
                r.wait()?;
            }
            placed.push(p);
        }
        // No more than the bound's steps run at once: the oldest are waited for before this
        // one launches (XLA's cpu client blocks a 33rd execution inside the launch call).
        let room_from = Instant::now();
        let (room, freed) = self.in_flight.make_room(self.config.max_steps_in_flight);
        let room_wait = room_from.elapsed();
        if room_wait.as_micros() > 50 {
            self.span(track, "wait (steps in flight)", room_from, None);
        }
        self.account(&room);
        freed?;
        let args: Vec<Vec<&Buffer>> = (0..self.devices.len())
            .map(|r| placed.iter().map(|p| &p.buffers[r]).collect())
            .collect();
        let launch_started = Instant::now();
        let launched = loaded
            .launch_replicated(&args, keep)
            .map_err(|e| Error::StepFailed {
                site,
                step,
                message: e.to_string(),
            })?;
        let launched_at = Instant::now();
        let graph = exe.key.short().to_string();
        if let Some(t) = self.timeline.as_ref().filter(|_| !on_thread) {
            // up to the wait for room (a span of its own), as the metric counts it
            t.span(track, "marshal", launch.marshal_from, room_from, &[]);
        }
        self.span(track, "launch", launch_started, Some(&graph));
        // The inputs it updates in place (`keep` is in ascending order, as both callers build
        // it). What it allocated on each device: its outputs, less those inputs, each aliased to
        // one output of its size.
        let mut held: Vec<Arc<dyn Send + Sync>> = Vec::with_capacity(params.len() - keep.len());
        let mut donated = 0;
        for (i, (d, p)) in params.iter().zip(&placed).enumerate() {
            if keep.binary_search(&i).is_err() {
                donated += p.buffers.first().map_or(0, Buffer::size_in_bytes);
                held.push(d.clone());
            }
        }
        drop(placed);
        let outputs: usize = launched
            .outputs
            .first()
            .map_or(0, |o| o.iter().map(Buffer::size_in_bytes).sum());
        let new_bytes = outputs.saturating_sub(donated) as u64;
        if launched
            .outputs
            .iter()
            .any(|o| o.len() != launch.outputs.len())
        {
            return Err(Error::StepFailed {
                site,
                step,
                message: format!(
                    "the executable returned {:?} outputs per replica, {} expected",
                    launched.outputs.iter().map(Vec::len).collect::<Vec<_>>(),
                    launch.outputs.len()
                ),
            });
        }
        // Output `k` of every replica becomes one value; the buffers of an output nobody holds
        // any more stay with the step until it completes.
        let mut per_device: Vec<std::vec::IntoIter<Buffer>> =
            launched.outputs.into_iter().map(Vec::into_iter).collect();
        let mut values = Vec::with_capacity(launch.outputs.len());
        for o in &launch.outputs {
            let buffers: Vec<Buffer> = per_device.iter_mut().filter_map(Iterator::next).collect();
            // the value holds its slot too while it lives
            if Arc::strong_count(o) > 1 {
                values.push((o, buffers));
            } else {
                held.push(Arc::new(buffers));
            }
        }
        let run = Arc::new(self.in_flight.run(launched.done, site, step, graph, held));
        for (o, buffers) in values {
            let _ = o.set(Ok(Placed {
                buffers,
                producer: Some(run.clone()),
            }));
        }
        let bound_started = Instant::now();
        let bound = Bound {
            steps: self.config.max_steps_in_flight,
            bytes: self.config.max_bytes_in_flight,
        };
        let pushed = self.in_flight.push(run, new_bytes, bound);
        let waited = bound_started.elapsed();
        if pushed.retired.len() > 1 || waited.as_micros() > 50 {
            self.span(track, "wait (steps in flight)", bound_started, None);
        }
        {
            let mut m = lock(&self.metrics);
            if on_thread {
                m.launch_thread_ms += ms(started.elapsed().saturating_sub(waited + room_wait));
                m.launch_thread_wait_ms += ms(waited + room_wait);
            } else {
                let marshal = launch_started.saturating_duration_since(launch.marshal_from);
                m.host_marshal_ms += ms(marshal.saturating_sub(room_wait));
                m.host_launch_ms += ms(launched_at - launch_started);
                m.in_flight_wait_ms += ms(waited + room_wait);
                m.host_finish_ms += ms(launched_at.elapsed().saturating_sub(waited));
            }
            m.donated_buffers += (params.len() - keep.len()) as u64;
            m.last_step_outputs = launch.outputs.len() as u64;
            m.executions += 1;
            m.peak_steps_in_flight = m.peak_steps_in_flight.max(pushed.steps as u64);
            m.peak_bytes_in_flight = m.peak_bytes_in_flight.max(pushed.bytes);
            if let Some(mem) = &exe.memory {
                m.step_temp_bytes = m.step_temp_bytes.max(mem.temp);
                m.step_peak_bytes = m.step_peak_bytes.max(mem.total());
            }
        }
        self.account(&pushed.retired);
        pushed.result
    }

    /// A span of track `track` from `start` to now, with the step's graph when given.
    fn span(&self, track: u64, name: &str, start: Instant, graph: Option<&str>) {
        if let Some(t) = &self.timeline {
            let args: Vec<(&str, serde_json::Value)> =
                graph.map(|g| ("graph", g.into())).into_iter().collect();
            t.span(track, name, start, Instant::now(), &args);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::{CacheConfig, ProgramKey};
    use crate::{DType, DeviceConfig, LazyDevice};
    use neuron_pc_compiler::ir::TensorType;
    use neuron_pc_compiler::key::ExecutableKey;

    /// A launch that panics on the thread (an executable without its program, which a step cut
    /// never hands over) fails its step once: its output holds the failure with the step's site,
    /// a read's report leaves nothing for the next step cut, and the thread serves later steps.
    #[test]
    fn a_panic_on_the_launch_thread_fails_its_step_once() {
        let device = LazyDevice::new(DeviceConfig {
            cache: CacheConfig::disabled(),
            launch_thread: true,
            ..DeviceConfig::default()
        })
        .unwrap();
        let inner = &device.inner;
        let ty = TensorType::new(DType::F32, vec![]);
        let key = ExecutableKey {
            hex: "0".repeat(64),
            components: Default::default(),
        };
        let exe = Arc::new(StepExecutable {
            loaded: None,
            key: ProgramKey::new(key),
            output_types: vec![ty.clone()],
            memory: None,
            out_shardings: vec![],
        });
        let out = inner.unplaced(&ty, false, None, false);
        let site = Location::caller();
        let launch = Launch {
            exe,
            params: vec![],
            keep: Box::new([]),
            outputs: vec![out.slot()],
            site,
            step: 7,
            marshal_from: Instant::now(),
            done: false,
            handed: None,
        };
        assert!(inner.launcher.hand_over(inner, launch).is_ok());
        let Err(Error::StepFailed { site: at, step, .. }) = out.placed() else {
            panic!("the output of a launch that panicked was placed");
        };
        assert_eq!((step, at.line()), (7, site.line()));
        // what a read of the output does with its failure
        inner.launcher.reported(step);
        assert!(
            inner.launcher.flush().is_ok(),
            "the failure was reported twice"
        );
        let x = device.scalar(3.0, DType::F32).unwrap();
        let y = x.mul(&x).unwrap();
        device.mark_step().unwrap();
        assert_eq!(y.to_vec::<f32>().unwrap(), [9.0]);
    }
}
