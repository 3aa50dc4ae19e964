//! The hidden `__compile-worker` subcommand: a process that compiles programs one at a time, so
//! a compiler crash, hang or out-of-memory kill costs the graph it was compiling only.
//!
//! A worker loads the plugin and opens the cache once, then serves jobs until its stdin closes:
//! one JSON [`WorkerJob`] per input line, one [`RESULT_PREFIX`]-marked JSON [`WorkerResult`] per
//! job on stdout. Loading the plugin once per worker instead of once per graph is what lets
//! `--jobs 2` approach a 2x speed-up on many small graphs.
//!
//! The parent passes the effective flags in `NEURON_CC_FLAGS`; the worker recomputes each key
//! from the text, the options, the flags and its own compiler identity and refuses to store
//! anything when that key differs from the one it was asked for (a different plugin or flag
//! set would otherwise file an executable under someone else's key). Compiling and storing is
//! the library's [`neuron_pc::compile::CachingCompiler::obtain`], the same call the lazy
//! device makes, so leases, failure records and read-only caches behave the same in both.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use neuron_pc::compile::{CompileError, Source, Stored};
use neuron_pc_cache::EntryKey;
use neuron_pc_compiler::flags::CompilerFlags;

use super::env::AotEnv;

/// Test hook: a worker whose key starts with this prefix aborts (only in builds with the
/// `test-hooks` feature).
#[cfg(feature = "test-hooks")]
pub const CRASH_ENV: &str = "NEURON_PC_TEST_WORKER_CRASH";
/// Test hook: a worker whose key starts with this prefix sleeps for an hour (only in builds
/// with the `test-hooks` feature).
#[cfg(feature = "test-hooks")]
pub const HANG_ENV: &str = "NEURON_PC_TEST_WORKER_HANG";

/// Marks result lines on stdout, so stray output from the plugin cannot be taken for one.
pub const RESULT_PREFIX: &str = "NPC-WORKER-RESULT ";

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    #[arg(long)]
    pub cache: Option<String>,
}

/// One compilation asked of a worker.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct WorkerJob {
    /// The key the parent expects.
    pub key: EntryKey,
    /// The program text's file.
    pub mlir: PathBuf,
    /// The device of each replica of a data-parallel program (empty: one device).
    #[serde(default)]
    pub replicas: Vec<usize>,
    /// `replicas` are a mesh's devices, the program partitioned over them.
    #[serde(default)]
    pub partitioned: bool,
}

/// How a job ended in the worker.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum WorkerOutcome {
    /// Compiled and stored.
    Stored,
    /// Compiled; the cache is read-only, so nothing was stored.
    ReadOnly,
    /// Found in the cache (another process stored it meanwhile).
    Cached,
    /// Not compiled, or compiled and not stored (see the message).
    Failed,
}

/// What a worker reports back for one job.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone)]
pub struct WorkerResult {
    pub key: EntryKey,
    pub outcome: WorkerOutcome,
    pub compile_ms: f64,
    /// CPU time of the compilation, all threads: what it costs when nothing else competes.
    #[serde(default)]
    pub cpu_ms: f64,
    /// The worker's start-up (plugin load, client, cache): paid once per worker.
    #[serde(default)]
    pub ready_ms: f64,
    /// The compiler's (or the cache's) message when failed.
    #[serde(default)]
    pub message: String,
}

#[cfg(feature = "test-hooks")]
fn test_hooks(key: &EntryKey) {
    let matches =
        |var: &str| std::env::var(var).is_ok_and(|p| !p.is_empty() && key.as_str().starts_with(&p));
    if matches(CRASH_ENV) {
        // What a crashing compiler leaves on stderr; the parent records it with the failure.
        eprintln!("injected compiler crash ({CRASH_ENV})");
        std::process::abort();
    }
    if matches(HANG_ENV) {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

pub fn run(args: WorkerArgs) -> anyhow::Result<i32> {
    let started = Instant::now();
    let mut flags = CompilerFlags::from_env().map_err(|e| anyhow::anyhow!("{e}"))?;
    // The parent sends only graphs it decided to compile, recorded failures included when the
    // user asked to retry them.
    flags.retry_failed = true;
    // a worker exits when its graphs are compiled: freed memory need not go back after each
    neuron_pc_compiler::pjrt::set_release_after_compile(false);
    let mut env = AotEnv::open(flags.clone(), args.cache.as_deref())?;
    let ready_ms = started.elapsed().as_secs_f64() * 1e3;
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let job: WorkerJob = serde_json::from_str(&line)
            .map_err(|e| anyhow::anyhow!("bad job line {line:?}: {e}"))?;
        // A data-parallel program names devices this client may not have (the cpu client
        // makes as many as asked for): reopen with enough.
        let needed = job.replicas.iter().max().map_or(0, |&d| d + 1);
        if needed > env.compiler.client().device_count() {
            env = AotEnv::open_with_devices(flags.clone(), args.cache.as_deref(), needed)?;
        }
        let mut result = compile_one(&env, &job);
        result.ready_ms = ready_ms;
        writeln!(out, "{RESULT_PREFIX}{}", serde_json::to_string(&result)?)?;
        out.flush()?;
    }
    Ok(0)
}

fn compile_one(env: &AotEnv, job: &WorkerJob) -> WorkerResult {
    let result = |outcome, compile_ms, cpu_ms, message: String| WorkerResult {
        key: job.key.clone(),
        outcome,
        compile_ms,
        cpu_ms,
        ready_ms: 0.0,
        message,
    };
    let text = match std::fs::read_to_string(&job.mlir) {
        Ok(t) => t,
        Err(e) => {
            let m = format!("{}: {e}", job.mlir.display());
            return result(WorkerOutcome::Failed, 0.0, 0.0, m);
        }
    };
    let program = if job.partitioned {
        env.compiler.program_partitioned_on(text, &job.replicas)
    } else {
        env.compiler.program_on(text, &job.replicas)
    };
    if program.key.store != job.key {
        let m = format!(
            "key mismatch: asked for {} but this compiler and flags give {}",
            job.key, program.key
        );
        return result(WorkerOutcome::Failed, 0.0, 0.0, m);
    }
    #[cfg(feature = "test-hooks")]
    test_hooks(&job.key);
    let started = Instant::now();
    let cpu_started = process_cpu_ms();
    let obtained = env.compiler.obtain(&program);
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;
    let cpu_ms = process_cpu_ms() - cpu_started;
    match obtained {
        Ok(o) => match (o.source, o.stored) {
            (Source::Compiled, Stored::Yes) => {
                result(WorkerOutcome::Stored, o.compile_ms, cpu_ms, String::new())
            }
            (Source::Compiled, Stored::ReadOnly) => {
                result(WorkerOutcome::ReadOnly, o.compile_ms, cpu_ms, String::new())
            }
            (Source::Compiled, Stored::Failed(why)) => {
                let m = format!("compiled but not stored: {why}");
                result(WorkerOutcome::Failed, o.compile_ms, cpu_ms, m)
            }
            (Source::Compiled, Stored::NoCache | Stored::NotApplicable) => {
                let m = "compiled but not stored: no cache is open".to_string();
                result(WorkerOutcome::Failed, o.compile_ms, cpu_ms, m)
            }
            (Source::Disk | Source::Remote | Source::Waited, _) => {
                result(WorkerOutcome::Cached, 0.0, 0.0, String::new())
            }
        },
        Err(e @ (CompileError::Compiler(_) | CompileError::Recorded(_))) => {
            result(WorkerOutcome::Failed, compile_ms, cpu_ms, e.to_string())
        }
    }
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
}

/// Linux's clock id for the CPU time of the whole process (every thread).
const CLOCK_PROCESS_CPUTIME_ID: i32 = 2;

/// CPU time this process has used, in ms (0 if the clock is unavailable).
pub fn process_cpu_ms() -> f64 {
    let mut t = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec (two 64-bit fields, the layout of struct
    // timespec on the 64-bit Linux targets this crate builds for); the call writes only it.
    let rc = unsafe { clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    if rc != 0 {
        return 0.0;
    }
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}
