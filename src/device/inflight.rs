//! Asynchronous execution: `mark_step` launches a step and returns; its outputs carry the
//! step's completion. A read of an output, a donation of one, the bound on steps in flight and
//! the device's drop wait for it. A failure inside a step surfaces at that wait as an error
//! naming the `mark_step` that launched it.
//!
//! Execution time is measured from launch to completion by a callback on the step's event, so
//! the metrics stay honest however late the step is waited for.

use std::collections::VecDeque;
use std::panic::Location;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use neuron_pc_compiler::pjrt::Event;

use super::lock;
use crate::error::{Error, Result};

/// How long a thread that needs a result polls for it before it sleeps: a read of a short
/// step's output, or of a launch being made. Sleeping and being woken costs tens of µs on a
/// virtual machine's scheduler (the 2-core CI machine: a read of the host benchmark's step,
/// synced every step, took 47 µs sleeping and 14 µs polling); a longer wait pays at most this
/// much of a core. CUDA's default synchronization polls the same way while it has cores to
/// spare.
pub(crate) const POLL: Duration = Duration::from_micros(50);

/// Polls `done` until it holds or `limit` has passed (the caller then waits its own way).
pub(crate) fn poll_until(limit: Duration, done: impl Fn() -> bool) {
    let from = Instant::now();
    while !done() && from.elapsed() < limit {
        std::hint::spin_loop();
    }
}

/// One launched step (on every replica).
pub(crate) struct StepRun {
    /// One per replica still running at launch (none when the plugin reported the work
    /// complete).
    done: Vec<Event>,
    pub site: &'static Location<'static>,
    /// The device's step count when it was launched.
    pub step: u64,
    /// The graph's key, as logs show it.
    pub graph: String,
    pub launched: Instant,
    /// Set by the completion callback: when the device began it (see [`Busy`]), when it
    /// completed, and the error message if it failed.
    finished: Arc<OnceLock<(Instant, Instant, Option<String>)>>,
    /// When the device's latest step completed, shared by its steps.
    busy: Busy,
    /// The outcome of the first wait, so every later wait reports the same.
    waited: OnceLock<Option<String>>,
    /// The inputs it was given to update in place (their `DeviceData`, type-erased since
    /// `trace` imports this module), kept until it completes: some plugins
    /// (`xla-cpu-pjrt` 0.0.1) block a donated buffer's destruction until the step that took it
    /// ends, which held every launch back to one step in flight.
    donated: Mutex<Vec<Arc<dyn Send + Sync>>>,
}

impl StepRun {
    /// Tracks a launched step; registers the completion callbacks that timestamp it (when the
    /// last replica finishes; the first failure is kept).
    fn new(
        done: Vec<Event>,
        site: &'static Location<'static>,
        step: u64,
        graph: String,
        donated: Vec<Arc<dyn Send + Sync>>,
        busy: Busy,
    ) -> StepRun {
        let launched = Instant::now();
        let finished = Arc::new(OnceLock::new());
        if done.is_empty() {
            let _ = finished.set((launched, launched, None));
        }
        let remaining = Arc::new(AtomicUsize::new(done.len()));
        let failure: Arc<Mutex<Option<String>>> = Arc::default();
        for event in &done {
            let (slot, remaining, failure) = (finished.clone(), remaining.clone(), failure.clone());
            let busy = busy.clone();
            let registered = event.on_ready(move |status| {
                if let Err(e) = status {
                    lock(&failure).get_or_insert_with(|| e.to_string());
                }
                if remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let (from, at) = busy.completed(launched);
                    let _ = slot.set((from, at, lock(&failure).take()));
                }
            });
            if let Err(e) = registered {
                // Without the callback, completion is timed when the step is waited for.
                tracing::debug!("completion callback not registered ({e})");
            }
        }
        StepRun {
            done,
            site,
            step,
            graph,
            launched,
            finished,
            busy,
            waited: OnceLock::new(),
            donated: Mutex::new(donated),
        }
    }

    /// Waits for the step (see [`StepRun::wait`]), then frees the inputs it took.
    fn retire(&self) -> Result<()> {
        let waited = self.wait();
        drop(std::mem::take(&mut *lock(&self.donated)));
        waited
    }

    /// True once the step completed.
    pub fn is_finished(&self) -> bool {
        self.finished.get().is_some()
            || self.waited.get().is_some()
            || self.done.iter().all(|e| e.is_ready().unwrap_or(false))
    }

    /// Blocks until the step completed; its failure as an error naming its `mark_step`.
    pub fn wait(&self) -> Result<()> {
        let failure = self.waited.get_or_init(|| {
            let mut waited = Ok(());
            for e in &self.done {
                let w = e.wait();
                if waited.is_ok() {
                    waited = w;
                }
            }
            if self.finished.get().is_none() {
                let (from, at) = self.busy.completed(self.launched);
                let _ =
                    (self.finished).set((from, at, waited.as_ref().err().map(|e| e.to_string())));
            }
            waited.err().map(|e| e.to_string())
        });
        match failure {
            None => Ok(()),
            Some(message) => Err(Error::StepFailed {
                site: self.site,
                step: self.step,
                message: message.clone(),
            }),
        }
    }

    /// Launch to completion, in ms (None while running).
    pub fn execute_ms(&self) -> Option<f64> {
        let at = self.finished_at()?;
        Some(at.duration_since(self.launched).as_secs_f64() * 1e3)
    }

    /// When the step completed (None while running).
    pub fn finished_at(&self) -> Option<Instant> {
        self.finished.get().map(|(_, at, _)| *at)
    }

    /// When the device began the step, as far as the host can tell: its launch, or the
    /// completion of the step before it, whichever came later (None while running).
    pub fn began_at(&self) -> Option<Instant> {
        self.finished.get().map(|(from, _, _)| *from)
    }
}

/// The completion of a device's latest step, shared by its steps. A device runs its steps one
/// after the other (a GPU's stream; on cpu, steps that donate each other's outputs), so a step
/// queued behind another begins when that one completes: from then to its own completion is
/// the device's time on it, where launch to completion also counts the queue.
#[derive(Clone, Default)]
pub(crate) struct Busy(Arc<Mutex<Option<Instant>>>);

impl Busy {
    /// A step launched at `launched` completed now: when it began, and now.
    fn completed(&self, launched: Instant) -> (Instant, Instant) {
        let mut latest = lock(&self.0);
        let now = Instant::now().max(latest.unwrap_or(launched));
        let from = latest.map_or(launched, |l| l.max(launched));
        *latest = Some(now);
        (from, now)
    }
}

/// How much a device may have in flight before `mark_step` waits for the oldest step.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bound {
    /// Steps launched and not known to be complete (1: execution is synchronous).
    pub steps: usize,
    /// Bytes per device of the outputs those steps allocated (outputs that reuse a donated
    /// input allocate nothing). The newest step is never held back by it.
    pub bytes: u64,
}

/// The steps of one device that may still be running, oldest first, each with the bytes its
/// launch allocated per device.
#[derive(Default)]
pub(crate) struct InFlight {
    runs: Mutex<Queue>,
    busy: Busy,
}

#[derive(Default)]
struct Queue {
    runs: VecDeque<(Arc<StepRun>, u64)>,
    bytes: u64,
}

impl Queue {
    fn pop(&mut self) -> Option<Arc<StepRun>> {
        let (run, bytes) = self.runs.pop_front()?;
        self.bytes -= bytes;
        Some(run)
    }

    /// Waits for the oldest step and takes it out, into `retired`, its failure into `result`
    /// unless an earlier one is there; false when there was none.
    fn retire_oldest(&mut self, retired: &mut Vec<Arc<StepRun>>, result: &mut Result<()>) -> bool {
        let Some(oldest) = self.pop() else {
            return false;
        };
        let r = oldest.retire();
        if result.is_ok() {
            *result = r;
        }
        retired.push(oldest);
        true
    }

    fn front_finished(&self) -> bool {
        self.runs.front().is_some_and(|(r, _)| r.is_finished())
    }
}

/// What a push found: the steps that left the queue (for their execution time), what stays in
/// flight, and the first failure waited for.
pub(crate) struct Pushed {
    pub retired: Vec<Arc<StepRun>>,
    pub steps: usize,
    pub bytes: u64,
    pub result: Result<()>,
}

impl InFlight {
    /// Tracks a step just launched, which completes when `done` are ready (see
    /// [`StepRun`]); `donated` are the inputs it updates in place.
    pub fn run(
        &self,
        done: Vec<Event>,
        site: &'static Location<'static>,
        step: u64,
        graph: String,
        donated: Vec<Arc<dyn Send + Sync>>,
    ) -> StepRun {
        StepRun::new(done, site, step, graph, donated, self.busy.clone())
    }

    /// Waits for the oldest steps until fewer than `steps` (at least 1) are in flight, so
    /// that the next launch makes no more than `steps`: the steps that left, and the first
    /// failure waited for.
    pub fn make_room(&self, steps: usize) -> (Vec<Arc<StepRun>>, Result<()>) {
        let mut q = lock(&self.runs);
        let mut retired = Vec::new();
        let mut result = Ok(());
        while q.runs.len() >= steps.max(1) && q.retire_oldest(&mut retired, &mut result) {}
        (retired, result)
    }

    /// Adds a launched step that allocated `bytes` per device; while more than `bound` is in
    /// flight, waits for the oldest steps.
    pub fn push(&self, run: Arc<StepRun>, bytes: u64, bound: Bound) -> Pushed {
        let mut q = lock(&self.runs);
        q.runs.push_back((run, bytes));
        q.bytes += bytes;
        let mut retired = Vec::new();
        let mut result = Ok(());
        while (q.runs.len() > bound.steps.max(1)
            || (q.runs.len() > 1 && q.bytes > bound.bytes)
            || q.front_finished())
            && q.retire_oldest(&mut retired, &mut result)
        {}
        Pushed {
            retired,
            steps: q.runs.len(),
            bytes: q.bytes,
            result,
        }
    }

    /// Waits for every step in flight (the device's drop, `synchronize`).
    pub fn drain(&self) -> (Vec<Arc<StepRun>>, Result<()>) {
        let runs: Vec<Arc<StepRun>> = {
            let mut q = lock(&self.runs);
            q.bytes = 0;
            q.runs.drain(..).map(|(r, _)| r).collect()
        };
        let mut result = Ok(());
        for r in &runs {
            let w = r.retire();
            if result.is_ok() {
                result = w;
            }
        }
        (runs, result)
    }

    /// Steps that completed, removed from the queue (without blocking).
    pub fn retire_finished(&self) -> Vec<Arc<StepRun>> {
        let mut q = lock(&self.runs);
        let mut out = Vec::new();
        while q.front_finished() {
            if let Some(r) = q.pop() {
                let _ = r.retire();
                out.push(r);
            }
        }
        out
    }
}
