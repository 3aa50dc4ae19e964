//! The summary after a compile run: a table on stdout (or one JSON object), and the exit status.

use super::pool::{short, PoolSummary};

/// Counts and timings of one run, as printed by `--json`.
#[derive(serde::Serialize, Debug)]
pub struct RunReport<'a> {
    /// Distinct graphs seen (every shard).
    pub found: usize,
    /// Already in the cache.
    pub cached: usize,
    pub compiled: usize,
    pub failed: usize,
    /// Left to other shards.
    pub other_shard: usize,
    /// Not compiled because of Ctrl-C.
    pub interrupted: usize,
    pub graphs: &'a [super::pool::GraphReport],
    /// Whole command, trial run included.
    pub wall_ms: f64,
    /// First worker start to last worker end.
    pub compile_wall_ms: f64,
    /// Sum of the compile times of the compiled graphs (compiling one by one).
    pub sum_compile_ms: f64,
    /// `sum_compile_ms / compile_wall_ms`.
    pub speedup: f64,
    pub jobs: usize,
    pub retries: usize,
    /// Worker processes started.
    pub workers_started: usize,
    /// The trial run's exit (compile only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trial_exit: Option<i32>,
    pub dry_run: bool,
    /// Why the command fails, if it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl<'a> RunReport<'a> {
    /// Builds the report; `trial_error` is the trial run's failure, if any.
    pub fn new(
        s: &'a PoolSummary,
        wall_ms: f64,
        jobs: usize,
        trial_exit: Option<i32>,
        trial_error: Option<String>,
        dry_run: bool,
    ) -> RunReport<'a> {
        let count = |o: &str| s.graphs.iter().filter(|g| g.outcome == o).count();
        let sum_compile_ms: f64 = s
            .graphs
            .iter()
            .filter(|g| g.outcome == "compiled")
            .map(|g| g.compile_ms)
            .sum();
        let speedup = if s.compile_wall_ms > 0.0 {
            sum_compile_ms / s.compile_wall_ms
        } else {
            0.0
        };
        let failed = count("failed");
        let error = if s.interrupted {
            Some("interrupted (Ctrl-C); graphs compiled so far are in the cache".to_string())
        } else if let Some(e) = trial_error {
            Some(e)
        } else if failed > 0 {
            Some(format!("{failed} graph(s) failed to compile"))
        } else {
            None
        };
        RunReport {
            found: s.graphs.len(),
            cached: count("cached"),
            compiled: count("compiled"),
            failed,
            other_shard: count("other-shard"),
            interrupted: count("interrupted"),
            graphs: &s.graphs,
            wall_ms,
            compile_wall_ms: s.compile_wall_ms,
            sum_compile_ms,
            speedup,
            jobs,
            retries: s.retries,
            workers_started: s.workers_started,
            trial_exit,
            dry_run,
            error,
        }
    }

    /// Prints the table or the JSON object; returns the exit status.
    pub fn print(&self, json: bool) -> anyhow::Result<i32> {
        if json {
            println!("{}", serde_json::to_string_pretty(self)?);
        } else {
            println!(
                "{:<14} {:>7} {:>11}  {:<12} ORIGIN",
                "GRAPH", "NODES", "COMPILE_MS", "OUTCOME"
            );
            for g in self.graphs {
                println!(
                    "{:<14} {:>7} {:>11.1}  {:<12} {}",
                    short(&g.key),
                    g.nodes,
                    g.compile_ms,
                    g.outcome,
                    g.origin
                );
                if let Some(m) = &g.message {
                    println!("{:<14} {}", "", first_line(m));
                }
            }
            println!(
                "total: {} found, {} compiled, {} cached, {} failed, {} other shard, {} interrupted",
                self.found, self.compiled, self.cached, self.failed, self.other_shard, self.interrupted
            );
            println!(
                "wall time {:.2} s; compile phase {:.2} s with {} job(s); one by one {:.2} s; speed-up {:.2}x",
                self.wall_ms / 1e3,
                self.compile_wall_ms / 1e3,
                self.jobs,
                self.sum_compile_ms / 1e3,
                self.speedup
            );
        }
        match &self.error {
            Some(e) => {
                eprintln!("error: {e}");
                Ok(if self.interrupted > 0 || e.starts_with("interrupted") {
                    130
                } else {
                    1
                })
            }
            None => Ok(0),
        }
    }
}

fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or("")
}
