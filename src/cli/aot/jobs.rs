//! What the scheduler, the worker processes, the progress bar and the report share: a graph to
//! compile, how it ended, and the run's summary.

use std::path::PathBuf;

use neuron_pc_cache::EntryKey;

/// One graph to compile.
#[derive(Clone, Debug)]
pub struct GraphJob {
    pub key: EntryKey,
    pub mlir: PathBuf,
    /// Op count (from the extract record, or estimated from the text).
    pub nodes: usize,
    /// Where it came from: the mark_step site or the file name.
    pub origin: String,
    /// The device of each replica (data-parallel programs; empty: one device).
    pub replicas: Vec<usize>,
    /// `replicas` are a mesh's devices (a partitioned program).
    pub partitioned: bool,
}

/// How one graph ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Compiled and stored.
    Compiled,
    /// Compiled, but the cache is read-only: nothing was stored.
    ReadOnly,
    /// Already in the cache (or stored by another process meanwhile).
    Cached,
    /// The compiler failed, a failure was recorded earlier, or storing failed.
    Failed,
    /// Dry run: would be compiled.
    WouldCompile,
    /// Belongs to another `--shard`.
    OtherShard,
    /// Ctrl-C came first.
    Interrupted,
}

impl Outcome {
    /// The word tables and JSON use.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Compiled => "compiled",
            Outcome::ReadOnly => "read-only",
            Outcome::Cached => "cached",
            Outcome::Failed => "failed",
            Outcome::WouldCompile => "would-compile",
            Outcome::OtherShard => "other-shard",
            Outcome::Interrupted => "interrupted",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one graph ended, with its figures.
#[derive(Clone, Debug, serde::Serialize)]
pub struct GraphReport {
    pub key: EntryKey,
    pub nodes: usize,
    pub origin: String,
    pub outcome: Outcome,
    pub compile_ms: f64,
    /// The compiler's CPU time (0 when not compiled here).
    pub cpu_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl GraphReport {
    /// The report of `job` ending as `outcome`.
    pub fn new(job: &GraphJob, outcome: Outcome, compile_ms: f64, message: Option<String>) -> Self {
        GraphReport {
            key: job.key.clone(),
            nodes: job.nodes,
            origin: job.origin.clone(),
            outcome,
            compile_ms,
            cpu_ms: 0.0,
            message,
        }
    }
}

/// What a scheduling run did.
#[derive(Debug, Default)]
pub struct PoolSummary {
    pub graphs: Vec<GraphReport>,
    /// From the first worker started to the last one finished.
    pub compile_wall_ms: f64,
    pub interrupted: bool,
    /// Workers retried after being killed by a signal.
    pub retries: usize,
    /// Worker processes started (each loads the plugin once).
    pub workers_started: usize,
    /// The shortest worker start-up seen (what compiling one by one in one process pays once);
    /// 0 when a worker was started ahead of the graphs.
    pub worker_ready_ms: f64,
}

impl PoolSummary {
    /// Graphs that ended as `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.graphs.iter().filter(|g| g.outcome == outcome).count()
    }
}
