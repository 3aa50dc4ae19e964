//! Counters of what a device did, in the spirit of PyTorch/XLA's metrics report.

use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::inflight::StepRun;
use super::lock;
use super::trace::{Cell, Value};
use crate::timeline::DEVICE_TRACK;

thread_local! {
    /// This thread's spans since its last step that the metrics count as something other than
    /// tracing: waits for values and batches, steps cut by reads.
    static NOT_TRACING: RefCell<Vec<(Instant, Instant)>> = const { RefCell::new(Vec::new()) };
    /// This thread's waits for steps in order to read their values, in ms, ever.
    static READ_WAITS: std::cell::Cell<f64> = const { std::cell::Cell::new(0.0) };
}

/// Counts `ms` of this thread's time as a read's wait (see [`super::DeviceInner::reading`]).
pub(crate) fn count_read_wait(ms: f64) {
    READ_WAITS.with(|w| w.set(w.get() + ms));
}

/// The most spans a thread keeps: one that reads and never cuts a step (a logger, a replayed
/// loop's reads between replays are taken at each replay) drops its oldest, which no window
/// of a step could still need.
const NOT_TRACING_KEPT: usize = 1024;

/// Counts this thread's time from `from` to now as not tracing: `host_trace_ms` and the
/// timeline's `trace` spans (from a step's end to the next cut, on the loop's thread) leave it
/// out. Returns it, in ms.
pub(crate) fn not_tracing(from: Instant) -> f64 {
    let to = Instant::now();
    NOT_TRACING.with(|t| {
        let mut spans = t.borrow_mut();
        if spans.len() >= NOT_TRACING_KEPT {
            spans.drain(..NOT_TRACING_KEPT / 2);
        }
        spans.push((from, to));
    });
    super::ms(to - from)
}

/// This thread's spans counted by [`not_tracing`] since the last call, which starts the
/// count again (at a step's cut, and after a replayed step). A window clips them to itself
/// ([`tracing_parts`]), so spans from before it never count.
pub(crate) fn take_not_tracing() -> Vec<(Instant, Instant)> {
    NOT_TRACING.with(|t| std::mem::take(&mut *t.borrow_mut()))
}

/// The parts of `from..to` outside every span of `not`, in order.
pub(crate) fn tracing_parts(
    from: Instant,
    to: Instant,
    mut not: Vec<(Instant, Instant)>,
) -> Vec<(Instant, Instant)> {
    not.sort_by_key(|s| s.0);
    let mut parts = Vec::with_capacity(not.len() + 1);
    let mut at = from;
    for (a, b) in not {
        if a > at {
            parts.push((at, a.min(to)));
        }
        at = at.max(b);
        if at >= to {
            return parts;
        }
    }
    parts.push((at, to));
    parts
}

impl super::DeviceInner {
    /// Runs `read`, a tensor's read and the conversions around it, counting its time less its
    /// waits for steps as `host_read_ms` and as not tracing.
    pub(crate) fn reading<T>(&self, read: impl FnOnce() -> crate::Result<T>) -> crate::Result<T> {
        let began = Instant::now();
        let waited = READ_WAITS.with(std::cell::Cell::get);
        let out = read();
        let took = not_tracing(began) - (READ_WAITS.with(std::cell::Cell::get) - waited);
        lock(&self.metrics).host_read_ms += took.max(0.0);
        out
    }

    /// Adds the execution times of steps that left the in-flight queue to the metrics (and
    /// their executions to the timeline).
    pub(super) fn account(&self, done: &[Arc<StepRun>]) {
        if done.is_empty() {
            return;
        }
        let mut m = lock(&self.metrics);
        for r in done {
            m.execute_ms += r.execute_ms().unwrap_or(0.0);
            let (Some(from), Some(end)) = (r.began_at(), r.finished_at()) else {
                continue;
            };
            m.device_busy_ms += super::ms(end - from);
            if let Some(t) = &self.timeline {
                let queued = ("queued_ms", super::ms(from - r.launched).into());
                let step = [
                    ("graph", r.graph.clone().into()),
                    ("step", r.step.into()),
                    queued,
                ];
                t.span(DEVICE_TRACK, "execute", from, end, &step);
            }
        }
    }
}

impl crate::LazyDevice {
    /// Counts a batch the loader handed over after waiting since `waiting`.
    pub(crate) fn record_batch_wait(&self, waiting: Instant) {
        let ms = not_tracing(waiting);
        let mut m = lock(&self.inner.metrics);
        m.batches_loaded += 1;
        m.batch_wait_ms += ms;
    }

    /// Counts a checkpoint save (`saved` or failed): `blocked_ms` of the loop, `n` bytes written.
    pub(crate) fn record_checkpoint(&self, saved: bool, blocked_ms: f64, write_ms: f64, n: u64) {
        let mut m = lock(&self.inner.metrics);
        m.checkpoint_saves += u64::from(saved);
        m.checkpoint_failures += u64::from(!saved);
        m.checkpoint_blocked_ms += blocked_ms;
        m.checkpoint_blocked_max_ms = m.checkpoint_blocked_max_ms.max(blocked_ms);
        m.checkpoint_write_ms += write_ms;
        m.checkpoint_bytes += n;
    }

    /// A snapshot of the counters (steps still running are not in `execute_ms` yet).
    pub fn metrics(&self) -> Metrics {
        // every step cut so far launched
        self.inner.launcher.flush_quietly();
        let done = self.inner.in_flight.retire_finished();
        self.inner.account(&done);
        let mut m = lock(&self.inner.metrics).clone();
        m.optimizer_state_bytes = registered_bytes(&self.inner.optimizer_state);
        m.parameter_bytes = registered_bytes(&self.inner.parameters);
        m.gradient_bytes = registered_bytes(&self.inner.gradients);
        m.prefetched = self.inner.compiler.prefetch_hits();
        if let Some(cache) = self.inner.compiler.cache() {
            let w = cache.wait_metrics();
            m.lease_wait_requests = w.requests;
            m.lease_requests_per_waiter_minute = w.requests_per_waiter_minute;
        }
        m
    }
}

/// A snapshot of a device's counters (see [`crate::LazyDevice::metrics`]).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Metrics {
    /// `mark_step` calls (a step function's calls included).
    pub steps: u64,
    /// Syncs caused by reading a pending value (`to_vec`, `item`): steps cut outside
    /// `mark_step`.
    pub implicit_syncs: u64,
    /// Of the steps, those a step function (`LazyDevice::step_fn`) replayed without tracing.
    #[serde(default)]
    pub replayed_steps: u64,
    /// Executions that found nothing to run.
    pub empty_steps: u64,
    /// Distinct graphs seen in this process.
    pub graphs_seen: u64,
    /// Executables found in this process's memory.
    pub memory_hits: u64,
    /// Executables loaded from the persistent cache's local tier (a directory).
    pub disk_hits: u64,
    /// Executables loaded from the persistent cache's remote tier (S3).
    pub remote_hits: u64,
    /// Of the disk hits, executables loaded ahead on a thread while the job initialised,
    /// named by the hint of the program's previous run (`src/compile/prefetch.rs`).
    #[serde(default)]
    pub prefetched: u64,
    /// Executables another process compiled while this one waited for its lock.
    pub waited_for_others: u64,
    /// Requests to the shared (S3) cache made while waiting on other processes' leases.
    #[serde(default)]
    pub lease_wait_requests: u64,
    /// [`Metrics::lease_wait_requests`] per waiter per minute of waiting (what a fleet of
    /// waiters costs the store).
    #[serde(default)]
    pub lease_requests_per_waiter_minute: f64,
    /// Compilations done here (JIT).
    pub compiles: u64,
    /// Total wall time of [`Metrics::compiles`], in ms.
    pub compile_ms: f64,
    /// Time spent loading serialized executables, in ms.
    pub load_ms: f64,
    /// Graphs whose compilation failed.
    pub compile_failures: u64,
    /// Values the last executed graph produced (live pending tensors only; dropped ones are
    /// not computed).
    pub last_step_outputs: u64,
    /// Ops in the last step graph as traced (before the compiler's passes): what grows with a
    /// model's depth unless its layers are scanned.
    pub last_step_ops: u64,
    /// Bytes of StableHLO text of the last program lowered (after the graph passes): the
    /// size of what the compiler is handed.
    pub last_program_bytes: u64,
    /// Input buffers donated to outputs (in-place updates that needed no copy).
    pub donated_buffers: u64,
    /// Executions (steps launched).
    pub executions: u64,
    /// Total wall time of the finished executions (launch to results ready), in ms.
    pub execute_ms: f64,
    /// The device's time on those executions, in ms: each from its launch or the completion
    /// of the step before it, whichever was later, to its completion. With steps queued ahead,
    /// launch to completion (`execute_ms`) also counts each step's wait for the ones before.
    #[serde(default)]
    pub device_busy_ms: f64,
    /// Batches a [`crate::data::DeviceLoader`] handed to the training loop.
    #[serde(default)]
    pub batches_loaded: u64,
    /// The time the loop waited for those batches, in ms (what the loader's background thread
    /// did not hide).
    #[serde(default)]
    pub batch_wait_ms: f64,
    /// The host's time in the steps, in ms, split by what it did (the timeline has the same
    /// phases): recording a traced step, from the last step's end to its cut (the loop's own
    /// code, and the ops it records).
    #[serde(default)]
    pub host_trace_ms: f64,
    /// The step cut's walk of the recorded graph, which writes its identity (the key).
    #[serde(default)]
    pub host_key_ms: f64,
    /// Finding the executable by that identity (a replayed step: checking the step
    /// function's plan and gathering its inputs).
    #[serde(default)]
    pub host_lookup_ms: f64,
    /// Building the launch's arguments (which inputs are donated, the buffers of each device).
    #[serde(default)]
    pub host_marshal_ms: f64,
    /// The runtime's launch call (PJRT execute: on cpu, a program this small runs inside it).
    #[serde(default)]
    pub host_launch_ms: f64,
    /// After the launch: outputs wrapped and stored in their tensors, steps retired.
    #[serde(default)]
    pub host_finish_ms: f64,
    /// Reading tensors' values (`to_host`, `to_vec`, `item`, `to_host_replicas`), on any
    /// thread: the copies, conversions and bookkeeping, less the waits for steps
    /// ([`Self::read_wait_ms`]) and any step the read cut. Not in `host_trace_ms`.
    #[serde(default)]
    pub host_read_ms: f64,
    /// `mark_step` waiting for a step in flight, past the in-flight bounds (the device's time,
    /// not the host's).
    #[serde(default)]
    pub in_flight_wait_ms: f64,
    /// The device's launch thread (see [`crate::DeviceConfig::launch_thread`]), off the loop's
    /// thread: its time in the runtime's launch calls and their bookkeeping, in ms (with it on,
    /// `host_launch_ms` stays 0).
    #[serde(default)]
    pub launch_thread_ms: f64,
    /// The launch thread waiting for steps in flight, past the in-flight bounds, in ms.
    #[serde(default)]
    pub launch_thread_wait_ms: f64,
    /// The host waiting for steps to finish in order to read their values (`to_vec`, `item`,
    /// a checkpoint's copy) or in `synchronize`, in ms, on any thread: the device's time, not
    /// the host's. A loop's own waits are not in its `host_trace_ms`.
    #[serde(default)]
    pub read_wait_ms: f64,
    /// The most steps a device left in flight when `mark_step` returned.
    #[serde(default)]
    pub peak_steps_in_flight: u64,
    /// The most bytes per device the outputs of steps in flight held (see
    /// [`crate::DeviceConfig::max_bytes_in_flight`]).
    #[serde(default)]
    pub peak_bytes_in_flight: u64,
    /// Checkpoints saved ([`crate::state::Checkpoints::save`]), in the background or not:
    /// committed (this process's part written, in a run of several).
    #[serde(default)]
    pub checkpoint_saves: u64,
    /// Saves that failed (each a warning, or the error of the last one) or were skipped (the
    /// one before still writing): not in `checkpoint_saves`.
    #[serde(default)]
    pub checkpoint_failures: u64,
    /// The time those saves blocked the training loop, in ms: taking the snapshot and waiting
    /// for the save before to finish; a background save's writing is not in it.
    #[serde(default)]
    pub checkpoint_blocked_ms: f64,
    /// The longest one save blocked the loop, in ms.
    #[serde(default)]
    pub checkpoint_blocked_max_ms: f64,
    /// The time the saves took to write their files, in ms (on the writer's thread when in
    /// the background).
    #[serde(default)]
    pub checkpoint_write_ms: f64,
    /// Bytes of the files those saves wrote (this process's).
    #[serde(default)]
    pub checkpoint_bytes: u64,
    /// Host-to-device transfers, one per device buffer.
    pub transfers_to_device: u64,
    /// Bytes of the host-to-device transfers.
    pub bytes_to_device: u64,
    /// Device-to-host transfers (reads of values).
    pub transfers_to_host: u64,
    /// Bytes of the device-to-host transfers.
    pub bytes_to_host: u64,
    /// The trial run: graphs written for ahead-of-time compilation.
    pub graphs_extracted: u64,
    /// The trial run: values read back from zero-filled stand-ins (never real results).
    pub zero_filled_reads: u64,
    /// New graphs at a mark_step site that had already run (the recompilation diagnostic fired).
    pub recompiles_after_warmup: u64,
    /// Why the persistent compile cache (or its shared tier) was not usable at start, if so.
    #[serde(default)]
    pub cache_unavailable: Option<String>,
    /// Replicas of every step in this process (1 on a mesh).
    #[serde(default)]
    pub replicas: usize,
    /// Replicas of every step in the whole run: [`Metrics::replicas`] times the processes.
    #[serde(default)]
    pub global_replicas: usize,
    /// Devices every step program is partitioned over (the mesh's size; 1 without a mesh).
    #[serde(default)]
    pub partitions: usize,
    /// This process's rank, from the launcher (0 without one).
    #[serde(default)]
    pub rank: usize,
    /// The processes of the run, from the launcher (1 without one).
    #[serde(default)]
    pub world_size: usize,
    /// Bytes of optimizer state (AdamW's moments, SGD's momentum) one replica holds, measured
    /// from the device buffers: 1/N of the whole with ZeRO-1 over N replicas.
    #[serde(default)]
    pub optimizer_state_bytes: u64,
    /// Bytes of the parameters (the tensors optimizers update) one device holds, measured from
    /// the device buffers.
    #[serde(default)]
    pub parameter_bytes: u64,
    /// Bytes of the gradients one device keeps between steps (`GradAccumulator`'s sums;
    /// gradients used within their step are in `step_temp_bytes`), from the device buffers.
    #[serde(default)]
    pub gradient_bytes: u64,
    /// The largest temporary buffers of a step run here, per device: the activations kept for
    /// the backward pass, the gradients used within the step (a gradient still held at
    /// `mark_step` is an output instead), workspaces; from the compiler's buffer assignment.
    #[serde(default)]
    pub step_temp_bytes: u64,
    /// The most one step needed at once on a device: its arguments, its outputs not written over
    /// a donated argument, its temporaries and code (the compiled memory statistics).
    #[serde(default)]
    pub step_peak_bytes: u64,
}

/// Bytes one device holds of the registered tensors (optimizer state, parameters): the first
/// device's buffer of each live tensor whose value is computed (pending ones count by type).
pub(super) fn registered_bytes(list: &super::lock_order::Ranked<Vec<Weak<Cell>>>) -> u64 {
    lock(list)
        .iter()
        .filter_map(Weak::upgrade)
        .map(|c| match &*lock(&c.value) {
            Value::Data(d) => d.device_bytes(),
            Value::Node(_) => c.ty.size_in_bytes() as u64,
        })
        .sum()
}

impl Metrics {
    /// A human-readable report, one counter per line.
    pub fn report(&self) -> String {
        let hits = self.memory_hits + self.disk_hits + self.remote_hits;
        let mut s = String::new();
        let mut line = |k: &str, v: String| s.push_str(&format!("{k:<26} {v}\n"));
        if self.partitions > 1 {
            line("partitions (mesh)", self.partitions.to_string());
        }
        if self.global_replicas > 1 {
            line(
                "replicas",
                format!(
                    "{} in this process, {} in the run (rank {} of {})",
                    self.replicas, self.global_replicas, self.rank, self.world_size
                ),
            );
        }
        line(
            "steps",
            format!(
                "{} (+{} implicit syncs, {} empty)",
                self.steps, self.implicit_syncs, self.empty_steps
            ),
        );
        if self.replayed_steps > 0 {
            line("replayed steps", self.replayed_steps.to_string());
        }
        line("graphs seen", self.graphs_seen.to_string());
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        if self.parameter_bytes > 0 {
            line(
                "parameters",
                format!("{:.2} MiB per device", mib(self.parameter_bytes)),
            );
        }
        if self.gradient_bytes > 0 {
            line(
                "kept gradients",
                format!("{:.2} MiB per device", mib(self.gradient_bytes)),
            );
        }
        if self.optimizer_state_bytes > 0 {
            line(
                "optimizer state",
                format!("{:.2} MiB per device", mib(self.optimizer_state_bytes)),
            );
        }
        if self.step_peak_bytes > 0 {
            line(
                "step memory (largest)",
                format!(
                    "{:.2} MiB per device, {:.2} MiB of it temporaries",
                    mib(self.step_peak_bytes),
                    mib(self.step_temp_bytes)
                ),
            );
        }
        line(
            "compiles (JIT)",
            format!("{} in {:.1} ms", self.compiles, self.compile_ms),
        );
        line("compile failures", self.compile_failures.to_string());
        line(
            "cache hits",
            format!(
                "{hits} (memory {}, disk {}, remote {})",
                self.memory_hits, self.disk_hits, self.remote_hits
            ),
        );
        line("executable loads", format!("{:.1} ms", self.load_ms));
        let host = self.host_trace_ms
            + self.host_key_ms
            + self.host_lookup_ms
            + self.host_marshal_ms
            + self.host_launch_ms
            + self.host_finish_ms
            + self.host_read_ms;
        if host > 0.0 {
            line(
                "host time in steps",
                format!(
                    "{host:.1} ms: trace {:.1}, key {:.1}, lookup {:.1}, marshal {:.1}, launch \
                     {:.1}, finish {:.1}, reads {:.1}",
                    self.host_trace_ms,
                    self.host_key_ms,
                    self.host_lookup_ms,
                    self.host_marshal_ms,
                    self.host_launch_ms,
                    self.host_finish_ms,
                    self.host_read_ms
                ),
            );
        }
        if self.launch_thread_ms > 0.0 {
            line(
                "launch thread",
                format!(
                    "{:.1} ms launching, {:.1} ms waiting for steps in flight",
                    self.launch_thread_ms, self.launch_thread_wait_ms
                ),
            );
        }
        line(
            "executions",
            format!(
                "{} in {:.1} ms, launch to completion (the device busy {:.1} ms)",
                self.executions, self.execute_ms, self.device_busy_ms
            ),
        );
        if self.batches_loaded > 0 {
            line(
                "batch wait",
                format!(
                    "{:.1} ms over {} batches from the loader",
                    self.batch_wait_ms, self.batches_loaded
                ),
            );
        }
        if self.read_wait_ms > 0.0 {
            line(
                "read wait",
                format!(
                    "{:.1} ms waiting for steps to finish to read their values",
                    self.read_wait_ms
                ),
            );
        }
        if self.peak_steps_in_flight > 0 {
            line(
                "in flight (peak)",
                format!(
                    "{} steps, {:.2} MiB of outputs",
                    self.peak_steps_in_flight,
                    self.peak_bytes_in_flight as f64 / (1 << 20) as f64
                ),
            );
        }
        if self.checkpoint_saves + self.checkpoint_failures > 0 {
            let failed = match self.checkpoint_failures {
                0 => String::new(),
                n => format!(" ({n} not saved: failed or skipped)"),
            };
            line(
                "checkpoints",
                format!(
                    "{} saved{failed}, {:.2} MiB; loop blocked {:.1} ms in all (longest {:.1} \
                     ms), writing took {:.1} ms",
                    self.checkpoint_saves,
                    mib(self.checkpoint_bytes),
                    self.checkpoint_blocked_ms,
                    self.checkpoint_blocked_max_ms,
                    self.checkpoint_write_ms
                ),
            );
        }
        line(
            "to device",
            format!(
                "{} transfers, {} bytes",
                self.transfers_to_device, self.bytes_to_device
            ),
        );
        line(
            "to host",
            format!(
                "{} transfers, {} bytes",
                self.transfers_to_host, self.bytes_to_host
            ),
        );
        if self.graphs_extracted > 0 || self.zero_filled_reads > 0 {
            line("graphs extracted", self.graphs_extracted.to_string());
            line("zero-filled reads", self.zero_filled_reads.to_string());
        }
        line(
            "recompiles after warm-up",
            self.recompiles_after_warmup.to_string(),
        );
        if let Some(why) = &self.cache_unavailable {
            line("cache unavailable", why.clone());
        }
        if self.lease_wait_requests > 0 {
            line(
                "lease waits",
                format!(
                    "{} shared-store requests ({:.0} per waiter-minute)",
                    self.lease_wait_requests, self.lease_requests_per_waiter_minute
                ),
            );
        }
        s
    }

    /// The counters as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::{not_tracing, take_not_tracing, tracing_parts, NOT_TRACING_KEPT};
    use std::time::{Duration, Instant};

    #[test]
    fn a_thread_that_reads_and_never_cuts_keeps_a_bounded_list() {
        std::thread::spawn(|| {
            let first = Instant::now();
            for _ in 0..3 * NOT_TRACING_KEPT {
                not_tracing(Instant::now());
            }
            let last = Instant::now();
            not_tracing(last);
            let kept = take_not_tracing();
            assert!(kept.len() <= NOT_TRACING_KEPT, "{} spans kept", kept.len());
            assert!(kept[0].0 > first, "the oldest are the ones dropped");
            assert_eq!(kept.last().unwrap().0, last);
            assert!(take_not_tracing().is_empty());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn tracing_is_the_window_less_the_spans_that_are_not() {
        let t0 = Instant::now();
        let at = |us: u64| t0 + Duration::from_micros(us);
        let us = |parts: Vec<(Instant, Instant)>| -> Vec<(u128, u128)> {
            (parts.iter())
                .map(|(a, b)| ((*a - t0).as_micros(), (*b - t0).as_micros()))
                .collect()
        };
        assert_eq!(us(tracing_parts(at(10), at(100), vec![])), [(10, 100)]);
        // two waits inside, given out of order
        let waits = vec![(at(60), at(70)), (at(20), at(30))];
        assert_eq!(
            us(tracing_parts(at(10), at(100), waits)),
            [(10, 20), (30, 60), (70, 100)]
        );
        // a span from before the window, overlapping spans, a span past its end
        let waits = vec![
            (at(0), at(15)),
            (at(40), at(55)),
            (at(50), at(60)),
            (at(90), at(120)),
        ];
        assert_eq!(
            us(tracing_parts(at(10), at(100), waits)),
            [(15, 40), (60, 90)]
        );
        // the whole window waited
        assert!(tracing_parts(at(10), at(100), vec![(at(5), at(100))]).is_empty());
    }
}
