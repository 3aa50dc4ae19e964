//! Ahead-of-time compilation: `neuron-pc compile`, `compile-graphs`, `run-graph`, `analyze`
//! and the hidden `__compile-worker` they run compilations in.

pub mod analyze;
pub mod compile_cmd;
pub mod env;
pub mod flag_mismatch;
pub mod graphs_cmd;
pub mod jobs;
pub mod npy;
pub mod pool;
pub mod procs;
pub mod progress;
pub mod report;
pub mod run_graph;
pub mod shard;
pub mod signals;
pub mod worker;

use std::path::PathBuf;

use neuron_pc_compiler::flags::{
    AutoCast, AutoCastType, CompilerFlags, FlagOverrides, ModelType, OptLevel, Target,
};

/// The name of the hidden subcommand a worker process runs.
pub const WORKER_SUBCOMMAND: &str = "__compile-worker";

/// Compiler flags given on the command line; each wins over `NEURON_CC_FLAGS`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct FlagArgs {
    /// Optimization level: O1, O2 or O3 (or 1, 2, 3).
    #[arg(long, value_parser = parse_optlevel)]
    pub optlevel: Option<OptLevel>,
    /// Compile target: cpu, cuda, trn1, trn2.
    #[arg(long, value_parser = parse_target)]
    pub target: Option<Target>,
    /// none, matmult or all.
    #[arg(long = "auto-cast", value_parser = parse_auto_cast)]
    pub auto_cast: Option<AutoCast>,
    /// bf16 or fp16.
    #[arg(long = "auto-cast-type", value_parser = parse_auto_cast_type)]
    pub auto_cast_type: Option<AutoCastType>,
    /// generic or transformer.
    #[arg(long = "model-type", value_parser = parse_model_type)]
    pub model_type: Option<ModelType>,
}

fn parse_optlevel(s: &str) -> Result<OptLevel, String> {
    OptLevel::from_name(s).ok_or_else(|| "expected O1, O2 or O3".to_string())
}

fn parse_auto_cast(s: &str) -> Result<AutoCast, String> {
    AutoCast::from_name(s).ok_or_else(|| format!("expected one of {}", AutoCast::supported()))
}

fn parse_auto_cast_type(s: &str) -> Result<AutoCastType, String> {
    AutoCastType::from_name(s)
        .ok_or_else(|| format!("expected one of {}", AutoCastType::supported()))
}

fn parse_model_type(s: &str) -> Result<ModelType, String> {
    ModelType::from_name(s).ok_or_else(|| format!("expected one of {}", ModelType::supported()))
}

/// As `NEURON_CC_FLAGS="--target ..."` reads it: any case.
fn parse_target(s: &str) -> Result<Target, String> {
    Target::from_name(&s.to_ascii_lowercase())
        .ok_or_else(|| "expected cpu, cuda, trn1 or trn2".to_string())
}

impl FlagArgs {
    /// Whether any compiler flag was given on the command line.
    pub fn any(&self) -> bool {
        self.optlevel.is_some()
            || self.target.is_some()
            || self.auto_cast.is_some()
            || self.auto_cast_type.is_some()
            || self.model_type.is_some()
    }

    /// `NEURON_CC_FLAGS` overlaid by these flags (and `--retry-failed`).
    pub fn effective(&self, retry_failed: bool) -> anyhow::Result<CompilerFlags> {
        let over = FlagOverrides {
            target: self.target,
            opt_level: self.optlevel,
            auto_cast: self.auto_cast,
            auto_cast_type: self.auto_cast_type,
            model_type: self.model_type,
            retry_failed: retry_failed.then_some(true),
            cache_dir: None,
            neuron: Default::default(),
        };
        CompilerFlags::from_env_and(&over).map_err(|e| anyhow::anyhow!("compiler flags: {e}"))
    }
}

/// Options shared by `compile` and `compile-graphs`.
#[derive(clap::Args, Clone, Debug)]
pub struct CompileOpts {
    /// Compile cache URL (over NEURON_COMPILE_CACHE_URL).
    #[arg(long)]
    pub cache: Option<String>,
    /// Worker processes; default min(cores, MemAvailable / 2 GiB).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Kill a compilation after this many seconds and record it as failed.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Compile graphs whose failure is recorded in the cache again.
    #[arg(long = "retry-failed")]
    pub retry_failed: bool,
    /// Compile only the graphs of shard I of N (key's first 8 bytes, big-endian, mod N == I).
    /// `auto` takes I and N from the array job's variables (Slurm's SLURM_ARRAY_TASK_*);
    /// `auto/N` for AWS Batch (AWS_BATCH_JOB_ARRAY_INDEX) and Kubernetes Indexed Jobs
    /// (JOB_COMPLETION_INDEX), which export the index only.
    #[arg(long, value_parser = shard::parse, value_name = "I/N|auto[/N]")]
    pub shard: Option<shard::ShardArg>,
    /// Find graphs and report; compile nothing.
    #[arg(long = "dry-run")]
    pub dry_run: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub flags: FlagArgs,
}

impl CompileOpts {
    /// `--shard` resolved against the environment; on a bad value, the one error line is
    /// printed and the error is the exit status (2, a usage error).
    pub fn shard(&self) -> Result<Option<shard::Shard>, i32> {
        shard::from_env(self.shard).map_err(|e| {
            eprintln!("error: {e}");
            2
        })
    }

    /// The worker pool's settings for these options; `prespawn` workers start before any
    /// graph is known; `shard` is [`CompileOpts::shard`]'s.
    pub fn pool_config(
        &self,
        work_dir: std::path::PathBuf,
        prespawn: usize,
        shard: Option<shard::Shard>,
    ) -> pool::PoolConfig {
        pool::PoolConfig {
            jobs: self.jobs.unwrap_or_else(default_jobs).max(1),
            timeout: std::time::Duration::from_secs_f64(self.timeout.max(0.001)),
            retry_failed: self.retry_failed,
            shard: shard.map(|s| s.pair()),
            dry_run: self.dry_run,
            work_dir,
            prespawn,
            timeline: None,
        }
    }
}

/// Whether a key belongs to shard `(i, n)`: its first 8 bytes as a big-endian number, mod n.
pub fn in_shard(key: &neuron_pc_cache::EntryKey, shard: Option<(u64, u64)>) -> bool {
    let Some((i, n)) = shard else { return true };
    // A valid key is 64 hex characters, so its first 16 always parse.
    let head = u64::from_str_radix(&key.as_str()[..16], 16).unwrap_or(0);
    head % n == i
}

/// Bytes of free memory one compilation is budgeted: XLA CPU compiles of the example step take
/// a few hundred MiB; 2 GiB leaves room for large graphs and Neuron's heavier compiler.
pub const PER_COMPILE_BUDGET: u64 = 2 << 30;

/// min(cores, MemAvailable / budget), at least 1.
pub fn default_jobs() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let by_mem = mem_available().map_or(cores, |b| (b / PER_COMPILE_BUDGET) as usize);
    cores.min(by_mem).max(1)
}

/// MemAvailable from /proc/meminfo, in bytes.
pub fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A fresh private directory under the system temp dir.
pub fn temp_dir(tag: &str) -> anyhow::Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("neuron-pc-{tag}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_read_in_any_case_as_neuron_cc_flags_reads_them() {
        assert_eq!(parse_target("TRN1"), Ok(Target::Trn1));
        assert_eq!(parse_target("cpu"), Ok(Target::Cpu));
        assert!(parse_target("tpu").is_err());
    }

    #[test]
    fn shards_partition_keys() {
        let keys: Vec<neuron_pc_cache::EntryKey> = (0..50u64)
            .map(|i| {
                let hex = format!(
                    "{:016x}{}",
                    i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    "0".repeat(48)
                );
                neuron_pc_cache::EntryKey::parse(&hex).unwrap()
            })
            .collect();
        for k in &keys {
            let owners = (0..3).filter(|&i| in_shard(k, Some((i, 3)))).count();
            assert_eq!(owners, 1);
        }
    }
}
