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
    /// Sum of the compile times of the compiled graphs, as measured while running in parallel.
    pub sum_compile_ms: f64,
    /// Estimated time to compile them one by one in one worker: one worker start-up plus, per
    /// graph, the smaller of its compile time and its compiler CPU time, so compilations slowed
    /// by competing for cores are not counted at their stretched length (which would inflate
    /// the speed-up).
    pub one_by_one_ms: f64,
    /// `one_by_one_ms / compile_wall_ms`.
    pub speedup: f64,
    pub jobs: usize,
    pub retries: usize,
    /// Worker processes started.
    pub workers_started: usize,
    /// The trial run's exit (compile only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trial_exit: Option<i32>,
    pub dry_run: bool,
    /// Dry run: graphs neither cached nor failed nor in another shard, which a real run of
    /// `compile` would compile.
    pub would_compile: usize,
    /// The `NEURON_CC_FLAGS` the real run must use to find what was compiled (compile only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron_cc_flags: Option<String>,
    /// The flags came (at least partly) from the command line, so the real run's environment
    /// does not already hold them.
    #[serde(skip)]
    pub flags_from_command_line: bool,
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
        let one_by_one_ms: f64 = s
            .graphs
            .iter()
            .filter(|g| g.outcome == "compiled")
            .map(|g| {
                if g.cpu_ms > 0.0 {
                    g.compile_ms.min(g.cpu_ms)
                } else {
                    g.compile_ms
                }
            })
            .sum::<f64>()
            + s.worker_ready_ms;
        let speedup = if s.compile_wall_ms > 0.0 {
            one_by_one_ms / s.compile_wall_ms
        } else {
            0.0
        };
        let failed = count("failed");
        let error = if s.interrupted {
            Some("interrupted (Ctrl-C); graphs compiled so far are in the cache".to_string())
        } else {
            let failures = (failed > 0).then(|| format!("{failed} graph(s) failed to compile"));
            match (trial_error, failures) {
                (Some(t), Some(f)) => Some(format!("{t}; {f}")),
                (t, f) => t.or(f),
            }
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
            one_by_one_ms,
            speedup,
            jobs,
            retries: s.retries,
            workers_started: s.workers_started,
            trial_exit,
            dry_run,
            would_compile: count(WOULD_COMPILE),
            neuron_cc_flags: None,
            flags_from_command_line: false,
            error,
        }
    }

    /// Adds the flags the real run must use; `from_command_line` makes the text report print
    /// them as a line to copy.
    pub fn with_run_flags(mut self, flags: String, from_command_line: bool) -> RunReport<'a> {
        self.neuron_cc_flags = Some(flags);
        self.flags_from_command_line = from_command_line;
        self
    }

    /// Prints the table or the JSON object; returns the exit status.
    pub fn print(&self, json: bool) -> anyhow::Result<i32> {
        if json {
            println!("{}", serde_json::to_string_pretty(self)?);
        } else {
            println!(
                "{:<14} {:>7} {:>11}  {:<13} ORIGIN",
                "GRAPH", "NODES", "COMPILE_MS", "OUTCOME"
            );
            for g in self.graphs {
                println!(
                    "{:<14} {:>7} {:>11.1}  {:<13} {}",
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
            if self.dry_run {
                println!(
                    "dry run: {} found, {} cached, {} would compile, {} failed before, {} other shard; wall time {:.2} s",
                    self.found,
                    self.cached,
                    self.would_compile,
                    self.failed,
                    self.other_shard,
                    self.wall_ms / 1e3
                );
            } else if self.compiled + self.failed == 0 {
                println!("wall time {:.2} s; nothing to compile", self.wall_ms / 1e3);
            } else {
                println!(
                    "wall time {:.2} s; compile phase {:.2} s with {} job(s); one by one (est.) {:.2} s; speed-up {:.2}x",
                    self.wall_ms / 1e3,
                    self.compile_wall_ms / 1e3,
                    self.jobs,
                    self.one_by_one_ms / 1e3,
                    self.speedup
                );
            }
        }
        if let (Some(f), true) = (&self.neuron_cc_flags, self.flags_from_command_line) {
            // On stderr with --json (stdout holds one JSON object, which has the field).
            let line = format!(
                "the real run must use these compiler flags to find these executables:\nNEURON_CC_FLAGS={}",
                shell_quote(f)
            );
            if json {
                eprintln!("{line}");
            } else {
                println!("{line}");
            }
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

/// The outcome of a graph a dry run would compile.
pub const WOULD_COMPILE: &str = "would-compile";

/// `s` in single quotes for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::super::pool::{GraphReport, PoolSummary};
    use super::*;

    fn g(outcome: &'static str, compile_ms: f64, cpu_ms: f64) -> GraphReport {
        GraphReport {
            key: "k".into(),
            nodes: 1,
            origin: String::new(),
            outcome,
            compile_ms,
            cpu_ms,
            message: None,
        }
    }

    #[test]
    fn speedup_counts_stretched_compiles_at_their_cpu_time() {
        let s = PoolSummary {
            // Stretched to 2 s by a competing compile but 1 s of CPU; no CPU figure; a
            // multi-threaded compile (CPU over wall); a failure, not counted.
            graphs: vec![
                g("compiled", 2000.0, 1000.0),
                g("compiled", 500.0, 0.0),
                g("compiled", 300.0, 600.0),
                g("failed", 900.0, 900.0),
            ],
            compile_wall_ms: 1000.0,
            worker_ready_ms: 200.0,
            ..PoolSummary::default()
        };
        let r = RunReport::new(&s, 1000.0, 2, None, None, false);
        // One worker start-up plus 1000 + 500 + 300.
        assert_eq!(r.one_by_one_ms, 2000.0);
        assert_eq!(r.sum_compile_ms, 2800.0);
        assert!((r.speedup - 2.0).abs() < 1e-12);
        assert_eq!(r.error.as_deref(), Some("1 graph(s) failed to compile"));
        let both = RunReport::new(
            &s,
            1.0,
            2,
            Some(3),
            Some("the trial run exited".into()),
            false,
        );
        assert_eq!(
            both.error.as_deref(),
            Some("the trial run exited; 1 graph(s) failed to compile")
        );
    }
}
