//! The scheduler: takes graphs as a source yields them, skips cached and duplicate ones, and
//! compiles the rest in worker processes (`neuron-pc __compile-worker`), at most `jobs` at a
//! time. Workers are kept for the next graph, so each loads the plugin once. A worker killed by
//! a signal (the OOM killer's SIGKILL, a crash) has its graph retried once with one worker
//! fewer; a worker past the timeout is killed; either way, and on a compiler error, that graph
//! alone fails and the rest go on.

use std::collections::{HashSet, VecDeque};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use neuron_pc_cache::Lookup;

use super::env::AotEnv;
pub use super::jobs::{GraphJob, GraphReport, Outcome, PoolSummary};
use super::procs::{Busy, Message, Spawner, Worker};
use super::progress::Progress;
use super::worker::{WorkerOutcome, WorkerResult};
use super::{in_shard, signals};

/// Yields graphs over time.
pub trait Source {
    /// Graphs that appeared since the last call.
    fn poll(&mut self) -> Vec<GraphJob>;
    /// True when no more graphs will appear and every graph was handed out by `poll`.
    fn finished(&mut self) -> bool;
    /// Stop producing (Ctrl-C).
    fn stop(&mut self);
}

/// Settings of one scheduling run.
pub struct PoolConfig {
    pub jobs: usize,
    pub timeout: Duration,
    pub retry_failed: bool,
    pub shard: Option<(u64, u64)>,
    pub dry_run: bool,
    pub work_dir: PathBuf,
    /// Workers to start before any graph is known (their plugin loads while the job starts).
    pub prespawn: usize,
    /// Record each compile on this timeline (`--trace`), one track per worker.
    pub timeline: Option<std::sync::Arc<neuron_pc::timeline::Timeline>>,
}

/// The timeline track of worker `id`.
pub fn worker_track(id: usize) -> u64 {
    100 + id as u64
}

const POLL: Duration = Duration::from_millis(50);

/// Runs until the source is finished and every queued graph is done (or Ctrl-C).
pub fn run(env: &AotEnv, cfg: &PoolConfig, source: &mut dyn Source) -> anyhow::Result<PoolSummary> {
    let mut s = Sched {
        env,
        cfg,
        summary: PoolSummary::default(),
        queue: VecDeque::new(),
        limit: cfg.jobs.max(1),
        first_start: None,
        last_end: None,
    };
    let mut seen: HashSet<neuron_pc_cache::EntryKey> = HashSet::new();
    let mut workers: Vec<Worker> = Vec::new();
    let mut progress = Progress::new(cfg.dry_run);
    let (tx, rx) = mpsc::channel::<Message>();
    let flags_text = {
        let mut f = env.compiler.flags().clone();
        f.retry_failed = false;
        f.cache_dir = None;
        f.to_string()
    };
    let mut spawner = Spawner::new(
        std::env::current_exe()?,
        flags_text,
        env.cache.url.clone(),
        cfg.work_dir.clone(),
        tx,
    );
    let mut inbox: Vec<Message> = Vec::new();
    if !cfg.dry_run {
        for _ in 0..cfg.prespawn.min(s.limit) {
            workers.push(spawner.spawn()?);
        }
    }
    loop {
        if signals::interrupted() {
            source.stop();
            for mut w in workers.drain(..) {
                w.kill();
                let sent: Vec<Message> = rx.try_iter().collect();
                let Some(b) = w.busy.take() else { continue };
                let done = sent
                    .into_iter()
                    .find(|m| m.worker == w.id && m.result.key == b.job.key);
                // A worker may have stored its entry just before it was stopped.
                let stored = env.cache().contains(&b.job.key);
                let (outcome, ms) = match done {
                    Some(m) if stored => (Outcome::Compiled, m.result.compile_ms),
                    _ if stored => (Outcome::Compiled, 0.0),
                    _ => (Outcome::Interrupted, 0.0),
                };
                s.summary
                    .graphs
                    .push(GraphReport::new(&b.job, outcome, ms, None));
            }
            for (job, _) in s.queue.drain(..) {
                s.summary
                    .graphs
                    .push(GraphReport::new(&job, Outcome::Interrupted, 0.0, None));
            }
            s.summary.interrupted = true;
            break;
        }
        for job in source.poll() {
            if seen.insert(job.key.clone()) {
                s.admit(job)?;
            }
        }
        inbox.extend(rx.try_iter());
        for m in inbox.drain(..) {
            if let Some(w) = workers.iter_mut().find(|w| w.id == m.worker) {
                if w.busy.as_ref().is_some_and(|b| b.job.key == m.result.key) {
                    if let Some(b) = w.busy.take() {
                        s.done(b, m.result)?;
                    }
                }
            }
        }
        let mut i = 0;
        while i < workers.len() {
            let overdue = workers[i]
                .busy
                .as_ref()
                .is_some_and(|b| b.started.elapsed() > cfg.timeout);
            if overdue {
                let mut w = workers.swap_remove(i);
                w.kill();
                if let Some(b) = w.busy.take() {
                    s.timed_out(b)?;
                }
                continue;
            }
            let Some(status) = workers[i].exited() else {
                i += 1;
                continue;
            };
            let mut w = workers.swap_remove(i);
            w.drain_reader();
            // A result it sent before it died still counts.
            for m in rx.try_iter() {
                let mine =
                    m.worker == w.id && w.busy.as_ref().is_some_and(|b| b.job.key == m.result.key);
                match w.busy.take() {
                    Some(b) if mine => s.done(b, m.result)?,
                    other => {
                        w.busy = other;
                        inbox.push(m);
                    }
                }
            }
            let tail = w.stderr_tail();
            if let Some(b) = w.busy.take() {
                s.died(b, status, &tail)?;
            }
        }
        // Fewer workers after a kill: let idle ones go.
        while workers.len() > s.limit {
            let Some(pos) = workers.iter().position(|w| w.busy.is_none()) else {
                break;
            };
            workers.swap_remove(pos).finish();
        }
        while !s.queue.is_empty() {
            let idx = match workers.iter().position(|w| w.busy.is_none()) {
                Some(i) => i,
                None if workers.len() < s.limit => {
                    workers.push(spawner.spawn()?);
                    workers.len() - 1
                }
                None => break,
            };
            let Some((job, attempt)) = s.queue.pop_front() else {
                break;
            };
            s.first_start.get_or_insert_with(Instant::now);
            // A worker that cannot take it has died: noticed next round, retried there.
            workers[idx].start(job, attempt);
        }
        let running = workers.iter().filter(|w| w.busy.is_some()).count();
        progress.show(&s.summary, s.queue.len(), running, false);
        if running == 0 && s.queue.is_empty() && source.finished() {
            break;
        }
        if let Ok(m) = rx.recv_timeout(POLL) {
            inbox.push(m);
        }
    }
    for w in workers {
        w.finish();
    }
    progress.show(&s.summary, 0, 0, true);
    let mut summary = s.summary;
    summary.workers_started = spawner.started();
    if let (Some(a), Some(b)) = (s.first_start, s.last_end) {
        summary.compile_wall_ms = b.duration_since(a).as_secs_f64() * 1e3;
    }
    Ok(summary)
}

/// The scheduler's bookkeeping.
struct Sched<'a> {
    env: &'a AotEnv,
    cfg: &'a PoolConfig,
    summary: PoolSummary,
    queue: VecDeque<(GraphJob, u32)>,
    limit: usize,
    first_start: Option<Instant>,
    last_end: Option<Instant>,
}

impl Sched<'_> {
    /// A newly found graph: other shard, cached, recorded failure, dry run, or queued.
    fn admit(&mut self, job: GraphJob) -> anyhow::Result<()> {
        let g = &mut self.summary.graphs;
        if !in_shard(&job.key, self.cfg.shard) {
            g.push(GraphReport::new(&job, Outcome::OtherShard, 0.0, None));
            return Ok(());
        }
        match self.env.cache().get(&job.key) {
            Lookup::Hit(_) => g.push(GraphReport::new(&job, Outcome::Cached, 0.0, None)),
            Lookup::Failed(f) if !self.cfg.retry_failed => {
                let msg = format!(
                    "recorded failure (use --retry-failed): {}",
                    first_line(&f.message)
                );
                g.push(GraphReport::new(&job, Outcome::Failed, 0.0, Some(msg)));
            }
            _ if self.cfg.dry_run => {
                g.push(GraphReport::new(&job, Outcome::WouldCompile, 0.0, None))
            }
            _ => self.queue.push_back((job, 0)),
        }
        Ok(())
    }

    /// A worker answered.
    /// Puts `b`'s compile on the timeline, if there is one.
    fn trace(&self, b: &Busy, outcome: Outcome) {
        if let Some(t) = &self.cfg.timeline {
            t.span(
                worker_track(b.worker),
                "compile",
                b.started,
                Instant::now(),
                &[
                    ("graph", b.job.key.short().into()),
                    ("outcome", outcome.as_str().into()),
                    ("origin", b.job.origin.clone().into()),
                ],
            );
        }
    }

    fn done(&mut self, b: Busy, r: WorkerResult) -> anyhow::Result<()> {
        self.last_end = Some(Instant::now());
        // A worker started ahead of the graphs loads its plugin outside the compile window;
        // the one-by-one estimate then must not count a start-up either.
        if self.cfg.prespawn == 0
            && r.ready_ms > 0.0
            && (self.summary.worker_ready_ms == 0.0 || r.ready_ms < self.summary.worker_ready_ms)
        {
            self.summary.worker_ready_ms = r.ready_ms;
        }
        let (outcome, message) = match r.outcome {
            WorkerOutcome::Stored => (Outcome::Compiled, None),
            WorkerOutcome::ReadOnly => (Outcome::ReadOnly, None),
            WorkerOutcome::Cached => (Outcome::Cached, None),
            WorkerOutcome::Failed => (Outcome::Failed, Some(r.message)),
        };
        self.trace(&b, outcome);
        let mut g = GraphReport::new(&b.job, outcome, r.compile_ms, message);
        g.cpu_ms = r.cpu_ms;
        self.summary.graphs.push(g);
        Ok(())
    }

    fn timed_out(&mut self, b: Busy) -> anyhow::Result<()> {
        self.last_end = Some(Instant::now());
        self.trace(&b, Outcome::Failed);
        let msg = format!(
            "timed out after {:.0} s (worker killed)",
            self.cfg.timeout.as_secs_f64()
        );
        self.env.cache().put_failure(&b.job.key, &msg);
        let ms = b.started.elapsed().as_secs_f64() * 1e3;
        self.summary
            .graphs
            .push(GraphReport::new(&b.job, Outcome::Failed, ms, Some(msg)));
        Ok(())
    }

    /// A worker died while compiling `b`; `tail` is its last stderr line for that job.
    fn died(&mut self, b: Busy, status: ExitStatus, tail: &str) -> anyhow::Result<()> {
        self.last_end = Some(Instant::now());
        self.trace(&b, Outcome::Failed);
        let with_tail = |m: String| {
            if tail.is_empty() {
                m
            } else {
                format!("{m}: {tail}")
            }
        };
        match status.signal() {
            Some(sig) if b.attempt == 0 => {
                // Killed from outside (often the OOM killer): try again with fewer
                // compilations competing for memory.
                self.limit = self.limit.saturating_sub(1).max(1);
                self.summary.retries += 1;
                tracing::warn!(
                    "worker compiling {} killed by signal {sig}; retrying with {} worker(s)",
                    b.job.key.short(),
                    self.limit
                );
                self.queue.push_front((b.job, 1));
            }
            Some(sig) => {
                let msg = with_tail(format!(
                    "worker killed by signal {sig} twice (crash or out of memory)"
                ));
                self.env.cache().put_failure(&b.job.key, &msg);
                self.summary
                    .graphs
                    .push(GraphReport::new(&b.job, Outcome::Failed, 0.0, Some(msg)));
            }
            None => {
                let msg = with_tail(format!(
                    "worker exited with status {}",
                    status.code().unwrap_or(-1)
                ));
                self.summary
                    .graphs
                    .push(GraphReport::new(&b.job, Outcome::Failed, 0.0, Some(msg)));
            }
        }
        Ok(())
    }
}

fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}
