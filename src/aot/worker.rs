//! The hidden `__compile-worker` subcommand: compiles one program in its own process, so a
//! compiler crash, hang or out-of-memory kill costs that graph only.
//!
//! The parent passes the effective flags in `NEURON_CC_FLAGS`; the worker recomputes the key
//! from the text, the options, the flags and its own compiler identity and refuses to store
//! anything when that key differs from the one it was asked for (a different plugin or flag
//! set would otherwise file an executable under someone else's key).

use std::path::PathBuf;
use std::time::Instant;

use neuron_pc_compiler::flags::CompilerFlags;

use super::env::{store_key, AotEnv};

/// Test hook: a worker whose key starts with this prefix aborts (honoured only here).
pub const CRASH_ENV: &str = "NEURON_PC_TEST_WORKER_CRASH";
/// Test hook: a worker whose key starts with this prefix sleeps for an hour.
pub const HANG_ENV: &str = "NEURON_PC_TEST_WORKER_HANG";

/// Exit status of a worker whose compilation the compiler rejected (failure recorded).
pub const EXIT_REJECTED: i32 = 3;
/// Exit status of a worker that refused the job (key mismatch, unreadable program).
pub const EXIT_REFUSED: i32 = 4;

#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// The program text.
    #[arg(long)]
    pub mlir: PathBuf,
    /// The key the parent expects.
    #[arg(long)]
    pub key: String,
    /// Where to write the outcome (JSON).
    #[arg(long)]
    pub result: PathBuf,
    #[arg(long)]
    pub cache: Option<String>,
}

/// What a worker reports back.
#[derive(serde::Serialize, serde::Deserialize, Debug, Default)]
pub struct WorkerResult {
    pub ok: bool,
    pub compile_ms: f64,
    pub message: String,
}

fn write_result(path: &std::path::Path, r: &WorkerResult) {
    if let Ok(bytes) = serde_json::to_vec(r) {
        let _ = std::fs::write(path, bytes);
    }
}

fn matches_prefix(var: &str, key: &str) -> bool {
    std::env::var(var).is_ok_and(|p| !p.is_empty() && key.starts_with(&p))
}

pub fn run(args: WorkerArgs) -> anyhow::Result<i32> {
    let refuse = |message: String| {
        eprintln!("worker: {message}");
        write_result(
            &args.result,
            &WorkerResult {
                ok: false,
                compile_ms: 0.0,
                message,
            },
        );
        Ok(EXIT_REFUSED)
    };
    let text = match std::fs::read_to_string(&args.mlir) {
        Ok(t) => t,
        Err(e) => return refuse(format!("{}: {e}", args.mlir.display())),
    };
    let flags = CompilerFlags::from_env().map_err(|e| anyhow::anyhow!("NEURON_CC_FLAGS: {e}"))?;
    let env = AotEnv::open(flags, args.cache.as_deref())?;
    let key = env.key_of(&text);
    if key.hex != args.key {
        return refuse(format!(
            "key mismatch: asked for {} but this compiler and flags give {}",
            args.key, key.hex
        ));
    }
    if matches_prefix(CRASH_ENV, &key.hex) {
        std::process::abort();
    }
    if matches_prefix(HANG_ENV, &key.hex) {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
    let skey = store_key(&key.hex)?;
    let started = Instant::now();
    let compiled = env
        .client
        .compile(&text, &env.options)
        .and_then(|exe| exe.serialize());
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;
    match compiled {
        Ok(bytes) => {
            match env
                .cache
                .put(&skey, &bytes, &text, &key.components, compile_ms)
            {
                neuron_pc_cache::PutOutcome::Failed(m) => {
                    let message = format!("compiled but not stored: {m}");
                    write_result(
                        &args.result,
                        &WorkerResult {
                            ok: false,
                            compile_ms,
                            message,
                        },
                    );
                    Ok(EXIT_REFUSED)
                }
                _ => {
                    write_result(
                        &args.result,
                        &WorkerResult {
                            ok: true,
                            compile_ms,
                            message: String::new(),
                        },
                    );
                    Ok(0)
                }
            }
        }
        Err(e) => {
            let message = e.to_string();
            env.cache.put_failure(&skey, &message);
            write_result(
                &args.result,
                &WorkerResult {
                    ok: false,
                    compile_ms,
                    message,
                },
            );
            Ok(EXIT_REJECTED)
        }
    }
}
