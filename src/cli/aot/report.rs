//! The summary after a compile run: a table on stdout (or one JSON object), and the exit status.

use super::jobs::{GraphReport, Outcome, PoolSummary};

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
    /// This process's shard (`--shard`), and where `auto` found it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shard: Option<super::shard::Shard>,
    /// Not compiled because of Ctrl-C.
    pub interrupted: usize,
    /// Compiled but not stored: the cache is read-only.
    pub read_only: usize,
    pub graphs: &'a [GraphReport],
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
    /// Compiler CPU time of the graphs compiled (all threads of every worker).
    pub compile_cpu_ms: f64,
    /// min(jobs, cores): the cores the compile phase could use.
    pub cores_used: usize,
    /// `compile_cpu_ms / (compile_wall_ms x cores_used)`: how busy the compile phase kept the
    /// cores it had (1.0 = every core compiling the whole time).
    pub compile_efficiency: f64,
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
        let count = |o: Outcome| s.count(o);
        let sum_compile_ms: f64 = s
            .graphs
            .iter()
            .filter(|g| g.outcome == Outcome::Compiled)
            .map(|g| g.compile_ms)
            .sum();
        let one_by_one_ms: f64 = s
            .graphs
            .iter()
            .filter(|g| g.outcome == Outcome::Compiled)
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
        let failed = count(Outcome::Failed);
        let compile_cpu_ms: f64 = s
            .graphs
            .iter()
            .filter(|g| matches!(g.outcome, Outcome::Compiled | Outcome::ReadOnly))
            .map(|g| g.cpu_ms)
            .sum();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cores_used = jobs.clamp(1, cores);
        let compile_efficiency = if s.compile_wall_ms > 0.0 {
            compile_cpu_ms / (s.compile_wall_ms * cores_used as f64)
        } else {
            0.0
        };
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
            cached: count(Outcome::Cached),
            compiled: count(Outcome::Compiled),
            failed,
            other_shard: count(Outcome::OtherShard),
            shard: None,
            interrupted: count(Outcome::Interrupted),
            read_only: count(Outcome::ReadOnly),
            graphs: &s.graphs,
            wall_ms,
            compile_wall_ms: s.compile_wall_ms,
            sum_compile_ms,
            one_by_one_ms,
            speedup,
            compile_cpu_ms,
            cores_used,
            compile_efficiency,
            jobs,
            retries: s.retries,
            workers_started: s.workers_started,
            trial_exit,
            dry_run,
            would_compile: count(Outcome::WouldCompile),
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

    /// Adds this process's shard.
    pub fn with_shard(mut self, shard: Option<super::shard::Shard>) -> RunReport<'a> {
        self.shard = shard;
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
                    g.key.short(),
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
                "total: {} found, {} compiled, {} cached, {} failed, {} other shard, \
                 {} interrupted",
                self.found,
                self.compiled,
                self.cached,
                self.failed,
                self.other_shard,
                self.interrupted
            );
            if let Some(s) = &self.shard {
                let from = s.from.map(|v| format!(" (from {v})")).unwrap_or_default();
                println!("shard {}/{}{from}", s.index, s.count);
            }
            if self.read_only > 0 {
                println!(
                    "{} graph(s) compiled but not stored: the cache is read-only",
                    self.read_only
                );
            }
            if self.dry_run {
                println!(
                    "dry run: {} found, {} cached, {} would compile, {} failed before, \
                     {} other shard; wall time {:.2} s",
                    self.found,
                    self.cached,
                    self.would_compile,
                    self.failed,
                    self.other_shard,
                    self.wall_ms / 1e3
                );
            } else if self.compiled + self.read_only + self.failed == 0 {
                println!("wall time {:.2} s; nothing to compile", self.wall_ms / 1e3);
            } else {
                println!(
                    "wall time {:.2} s; compile phase {:.2} s with {} job(s); \
                     one by one (est.) {:.2} s; speed-up {:.2}x",
                    self.wall_ms / 1e3,
                    self.compile_wall_ms / 1e3,
                    self.jobs,
                    self.one_by_one_ms / 1e3,
                    self.speedup
                );
                println!(
                    "compile efficiency {:.2} (compiler CPU {:.2} s over {:.2} s x {} core(s))",
                    self.compile_efficiency,
                    self.compile_cpu_ms / 1e3,
                    self.compile_wall_ms / 1e3,
                    self.cores_used
                );
            }
        }
        if let (Some(f), true) = (&self.neuron_cc_flags, self.flags_from_command_line) {
            // On stderr with --json (stdout holds one JSON object, which has the field).
            let line = format!(
                "the real run must use these compiler flags to find these executables:\n\
                 NEURON_CC_FLAGS={}",
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

/// `s` in single quotes for a POSIX shell.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::super::jobs::GraphJob;
    use super::*;

    fn g(outcome: Outcome, compile_ms: f64, cpu_ms: f64) -> GraphReport {
        let job = GraphJob {
            key: neuron_pc_cache::EntryKey::parse(&"0".repeat(64)).unwrap(),
            mlir: Default::default(),
            nodes: 1,
            origin: String::new(),
            replicas: Vec::new(),
            partitioned: false,
        };
        let mut r = GraphReport::new(&job, outcome, compile_ms, None);
        r.cpu_ms = cpu_ms;
        r
    }

    #[test]
    fn speedup_counts_stretched_compiles_at_their_cpu_time() {
        let s = PoolSummary {
            // Stretched to 2 s by a competing compile but 1 s of CPU; no CPU figure; a
            // multi-threaded compile (CPU over wall); a failure, not counted.
            graphs: vec![
                g(Outcome::Compiled, 2000.0, 1000.0),
                g(Outcome::Compiled, 500.0, 0.0),
                g(Outcome::Compiled, 300.0, 600.0),
                g(Outcome::Failed, 900.0, 900.0),
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
        // CPU 1000 + 0 + 600 of the compiled graphs over 1 s with min(2 jobs, cores) cores.
        assert_eq!(r.compile_cpu_ms, 1600.0);
        let cores = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(2);
        assert_eq!(r.cores_used, cores);
        assert!((r.compile_efficiency - 1600.0 / (1000.0 * cores as f64)).abs() < 1e-12);
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
