//! The scheduler: takes graphs as a source yields them, skips cached and duplicate ones, and
//! compiles the rest in worker processes (`neuron-pc __compile-worker`), at most `jobs` at a
//! time, polling every 50 ms. A worker killed by a signal (the OOM killer's SIGKILL, a crash) is
//! retried once with one worker fewer; a worker past the timeout is killed; either way, and on a
//! compiler error, that graph alone fails and the rest go on.

use std::collections::{HashSet, VecDeque};
use std::io::{IsTerminal, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use neuron_pc_cache::Lookup;

use super::env::{store_key, AotEnv};
use super::worker::WorkerResult;
use super::{in_shard, signals, WORKER_SUBCOMMAND};

/// One graph to compile.
#[derive(Clone, Debug)]
pub struct GraphJob {
    pub key: String,
    pub mlir: PathBuf,
    /// Op count (from the extract record, or estimated from the text).
    pub nodes: usize,
    /// Where it came from: the mark_step site or the file name.
    pub origin: String,
}

/// Yields graphs over time.
pub trait Source {
    /// Graphs that appeared since the last call.
    fn poll(&mut self) -> Vec<GraphJob>;
    /// True when no more graphs will appear and every graph was handed out by `poll`.
    fn finished(&mut self) -> bool;
    /// Stop producing (Ctrl-C).
    fn stop(&mut self);
}

/// How one graph ended.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GraphReport {
    pub key: String,
    pub nodes: usize,
    pub origin: String,
    /// `compiled`, `cached`, `failed`, `found` (dry run), `other-shard`, `interrupted`.
    pub outcome: &'static str,
    pub compile_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Settings of one scheduling run.
pub struct PoolConfig {
    pub jobs: usize,
    pub timeout: Duration,
    pub retry_failed: bool,
    pub shard: Option<(u64, u64)>,
    pub dry_run: bool,
    pub work_dir: PathBuf,
}

/// What the run did.
#[derive(Debug, Default)]
pub struct PoolSummary {
    pub graphs: Vec<GraphReport>,
    /// From the first worker started to the last one finished.
    pub compile_wall_ms: f64,
    pub interrupted: bool,
    /// Workers retried after being killed by a signal.
    pub retries: usize,
}

struct Running {
    job: GraphJob,
    child: Child,
    started: Instant,
    attempt: u32,
    result: PathBuf,
    stderr: PathBuf,
}

const POLL: Duration = Duration::from_millis(50);

/// Runs until the source is finished and every queued graph is done (or Ctrl-C).
pub fn run(env: &AotEnv, cfg: &PoolConfig, source: &mut dyn Source) -> anyhow::Result<PoolSummary> {
    let mut summary = PoolSummary::default();
    let mut seen: HashSet<String> = HashSet::new();
    let mut queue: VecDeque<(GraphJob, u32)> = VecDeque::new();
    let mut running: Vec<Running> = Vec::new();
    let mut limit = cfg.jobs.max(1);
    let mut first_start: Option<Instant> = None;
    let mut last_end: Option<Instant> = None;
    let mut progress = Progress::new();
    let exe = std::env::current_exe()?;
    let flags_text = {
        let mut f = env.flags.clone();
        f.retry_failed = false;
        f.cache_dir = None;
        f.to_string()
    };
    loop {
        if signals::interrupted() {
            source.stop();
            for mut r in running.drain(..) {
                signals::kill_hard(r.child.id());
                let _ = r.child.wait();
                // A worker may have stored its entry just before it was stopped.
                let done: Option<WorkerResult> = std::fs::read(&r.result)
                    .ok()
                    .and_then(|b| serde_json::from_slice(&b).ok());
                let stored = env.cache.contains(&store_key(&r.job.key)?);
                let (outcome, ms) = match done {
                    Some(w) if stored => ("compiled", w.compile_ms),
                    _ if stored => ("compiled", 0.0),
                    _ => ("interrupted", 0.0),
                };
                summary.graphs.push(report(&r.job, outcome, ms, None));
            }
            for (job, _) in queue.drain(..) {
                summary.graphs.push(report(&job, "interrupted", 0.0, None));
            }
            summary.interrupted = true;
            break;
        }
        for job in source.poll() {
            if !seen.insert(job.key.clone()) {
                continue;
            }
            if !in_shard(&job.key, cfg.shard) {
                summary.graphs.push(report(&job, "other-shard", 0.0, None));
                continue;
            }
            match env.cache.get(&store_key(&job.key)?) {
                Lookup::Hit(_) => summary.graphs.push(report(&job, "cached", 0.0, None)),
                Lookup::Failed(f) if !cfg.retry_failed => {
                    let msg = format!(
                        "recorded failure (use --retry-failed): {}",
                        first_line(&f.message)
                    );
                    summary.graphs.push(report(&job, "failed", 0.0, Some(msg)));
                }
                _ if cfg.dry_run => summary.graphs.push(report(&job, "found", 0.0, None)),
                _ => queue.push_back((job, 0)),
            }
        }
        // Reap finished and overdue workers.
        let mut i = 0;
        while i < running.len() {
            let overdue = running[i].started.elapsed() > cfg.timeout;
            let status = match running[i].child.try_wait()? {
                Some(s) => Some(s),
                None if overdue => {
                    signals::kill_hard(running[i].child.id());
                    let _ = running[i].child.wait();
                    None
                }
                None => {
                    i += 1;
                    continue;
                }
            };
            let r = running.swap_remove(i);
            last_end = Some(Instant::now());
            let outcome: WorkerResult = std::fs::read(&r.result)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            match status {
                None => {
                    let msg = format!(
                        "timed out after {:.0} s (worker killed)",
                        cfg.timeout.as_secs_f64()
                    );
                    env.cache.put_failure(&store_key(&r.job.key)?, &msg);
                    summary.graphs.push(report(
                        &r.job,
                        "failed",
                        r.started.elapsed().as_secs_f64() * 1e3,
                        Some(msg),
                    ));
                }
                Some(s) if s.success() => {
                    summary
                        .graphs
                        .push(report(&r.job, "compiled", outcome.compile_ms, None))
                }
                Some(s) if s.signal().is_some() => {
                    let sig = s.signal().unwrap_or(0);
                    if r.attempt == 0 {
                        // Killed from outside (often the OOM killer): try again with fewer
                        // compilations competing for memory.
                        limit = limit.saturating_sub(1).max(1);
                        summary.retries += 1;
                        eprintln!(
                            "worker for {} killed by signal {sig}; retrying with {limit} worker(s)",
                            short(&r.job.key)
                        );
                        queue.push_front((r.job, 1));
                    } else {
                        let msg =
                            format!("worker killed by signal {sig} twice (crash or out of memory)");
                        env.cache.put_failure(&store_key(&r.job.key)?, &msg);
                        summary
                            .graphs
                            .push(report(&r.job, "failed", 0.0, Some(msg)));
                    }
                }
                Some(s) => {
                    let msg = if !outcome.message.is_empty() {
                        outcome.message
                    } else {
                        let err = std::fs::read_to_string(&r.stderr).unwrap_or_default();
                        format!(
                            "worker exited with {}: {}",
                            s.code().unwrap_or(-1),
                            last_line(&err)
                        )
                    };
                    summary
                        .graphs
                        .push(report(&r.job, "failed", outcome.compile_ms, Some(msg)));
                }
            }
        }
        while running.len() < limit {
            let Some((job, attempt)) = queue.pop_front() else {
                break;
            };
            first_start.get_or_insert_with(Instant::now);
            running.push(spawn(&exe, env, cfg, &flags_text, job, attempt)?);
        }
        progress.show(&summary, queue.len(), running.len(), false);
        if running.is_empty() && queue.is_empty() && source.finished() {
            break;
        }
        std::thread::sleep(POLL);
    }
    progress.show(&summary, 0, 0, true);
    if let (Some(a), Some(b)) = (first_start, last_end) {
        summary.compile_wall_ms = b.duration_since(a).as_secs_f64() * 1e3;
    }
    Ok(summary)
}

fn spawn(
    exe: &Path,
    env: &AotEnv,
    cfg: &PoolConfig,
    flags_text: &str,
    job: GraphJob,
    attempt: u32,
) -> anyhow::Result<Running> {
    let result = cfg
        .work_dir
        .join(format!("{}.{attempt}.result.json", job.key));
    let stderr = cfg.work_dir.join(format!("{}.{attempt}.stderr", job.key));
    let _ = std::fs::remove_file(&result);
    let mut cmd = Command::new(exe);
    cmd.arg(WORKER_SUBCOMMAND)
        .arg("--mlir")
        .arg(&job.mlir)
        .arg("--key")
        .arg(&job.key)
        .arg("--result")
        .arg(&result)
        .env("NEURON_CC_FLAGS", flags_text)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr)?);
    if let Some(u) = &env.cache_url {
        cmd.arg("--cache").arg(u);
    }
    let child = cmd.spawn()?;
    Ok(Running {
        job,
        child,
        started: Instant::now(),
        attempt,
        result,
        stderr,
    })
}

fn report(
    job: &GraphJob,
    outcome: &'static str,
    compile_ms: f64,
    message: Option<String>,
) -> GraphReport {
    GraphReport {
        key: job.key.clone(),
        nodes: job.nodes,
        origin: job.origin.clone(),
        outcome,
        compile_ms,
        message,
    }
}

/// The first 12 hex digits of a key.
pub fn short(key: &str) -> &str {
    key.get(..12).unwrap_or(key)
}

fn first_line(s: &str) -> String {
    s.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}

fn last_line(s: &str) -> String {
    s.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .to_string()
}

/// The progress line: redrawn in place on a terminal, else a plain line every 2 s on change.
struct Progress {
    tty: bool,
    last: Instant,
    last_text: String,
}

impl Progress {
    fn new() -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            last: Instant::now(),
            last_text: String::new(),
        }
    }

    fn show(&mut self, s: &PoolSummary, queued: usize, running: usize, last: bool) {
        let count = |o: &str| s.graphs.iter().filter(|g| g.outcome == o).count();
        let text = format!(
            "found {} | compiled {} | cached {} | failed {} | running {} | queued {}",
            s.graphs.len() + queued + running,
            count("compiled"),
            count("cached"),
            count("failed"),
            running,
            queued
        );
        let mut err = std::io::stderr();
        if self.tty {
            if text != self.last_text || last {
                let _ = write!(err, "\r\x1b[2K{text}");
                if last {
                    let _ = writeln!(err);
                }
            }
        } else if text != self.last_text && (last || self.last.elapsed() >= Duration::from_secs(2))
        {
            let _ = writeln!(err, "[neuron-pc compile] {text}");
            self.last = Instant::now();
        } else {
            return;
        }
        self.last_text = text;
    }
}
