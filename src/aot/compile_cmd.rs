//! `neuron-pc compile -- <command>`: runs the job in extract mode and compiles each graph as
//! soon as its record appears, while the job is still running.

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use neuron_pc_compiler::flags::CompilerFlags;

use super::env::{cache_url, AotEnv, CACHE_URL_ENV};
use super::pool::{self, GraphJob, Source};
use super::report::RunReport;
use super::{signals, temp_dir, CompileOpts};

/// Extract-mode directory variable read by the lazy device.
pub const EXTRACT_DIR_ENV: &str = "NEURON_PC_EXTRACT_DIR";

#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    #[command(flatten)]
    pub opts: CompileOpts,
    /// The job to run (after `--`).
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// Graph records appearing in an extraction directory.
pub struct ExtractDir {
    dir: PathBuf,
    seen: HashSet<PathBuf>,
    pending: Vec<GraphJob>,
    child: Option<Child>,
    status: Option<ExitStatus>,
    stopped: bool,
}

impl ExtractDir {
    /// Watches `dir`; `child` is the job writing into it (none: the directory is complete).
    pub fn new(dir: PathBuf, child: Option<Child>) -> ExtractDir {
        ExtractDir {
            dir,
            seen: HashSet::new(),
            pending: Vec::new(),
            child,
            status: None,
            stopped: false,
        }
    }

    /// The job's exit status, once it exited.
    pub fn status(&self) -> Option<ExitStatus> {
        self.status
    }

    fn scan(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut new: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json") && !self.seen.contains(p))
            .collect();
        new.sort();
        for path in new {
            self.seen.insert(path.clone());
            match read_record(&path) {
                Ok(rec) => {
                    let mlir = self.dir.join(format!("{}.mlir", rec.key));
                    self.pending.push(GraphJob {
                        key: rec.key,
                        mlir,
                        nodes: rec.nodes,
                        origin: rec.site,
                    });
                }
                Err(e) => eprintln!("warning: {}: {e}", path.display()),
            }
        }
    }

    fn reap(&mut self) {
        if let Some(c) = &mut self.child {
            if let Ok(Some(s)) = c.try_wait() {
                self.status = Some(s);
                self.child = None;
            }
        }
    }
}

/// The fields of an extraction record (`GraphRecord` in the device's extract module, which is
/// private to the library) that the AOT commands read.
#[derive(serde::Deserialize, Debug, Clone)]
pub struct GraphRecord {
    pub key: String,
    #[serde(default)]
    pub nodes: usize,
    #[serde(default)]
    pub params: Vec<String>,
    /// The tensor name of each parameter, `""` when unnamed.
    #[serde(default)]
    pub param_names: Vec<String>,
    /// The cache key's components (flags, compiler identity).
    #[serde(default)]
    pub components: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub site: String,
}

/// Reads one `<key>.json` extraction record.
pub fn read_record(path: &Path) -> anyhow::Result<GraphRecord> {
    Ok(serde_json::from_slice(&std::fs::read(path)?)?)
}

impl Source for ExtractDir {
    fn poll(&mut self) -> Vec<GraphJob> {
        self.reap();
        self.scan();
        std::mem::take(&mut self.pending)
    }

    fn finished(&mut self) -> bool {
        self.reap();
        if self.child.is_some() {
            return false;
        }
        // The job is gone: whatever it wrote last must still be handed out.
        self.scan();
        self.pending.is_empty()
    }

    fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        if let Some(c) = &mut self.child {
            signals::interrupt(c.id());
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                if let Ok(Some(s)) = c.try_wait() {
                    self.status = Some(s);
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if self.status.is_none() {
                signals::kill_hard(c.id());
                self.status = c.wait().ok();
            }
            self.child = None;
        }
    }
}

/// The job's environment: extract mode plus the effective cache and flags, so it computes the
/// same keys the workers will.
pub fn job_command(
    argv: &[String],
    flags: &CompilerFlags,
    cache_url: Option<&str>,
    extract_dir: &Path,
    stdout_to_stderr: bool,
) -> anyhow::Result<Command> {
    let (prog, rest) = argv
        .split_first()
        .ok_or_else(|| anyhow::anyhow!("no command given after --"))?;
    let mut cmd = Command::new(prog);
    // The job runs without a persistent cache so it writes every graph, cached or not: the
    // report then counts cached graphs too, and the skip decision is made here, in one place.
    cmd.args(rest)
        .env(EXTRACT_DIR_ENV, extract_dir)
        .env("NEURON_PC_CACHE", "0");
    cmd.env("NEURON_CC_FLAGS", job_flags(flags));
    if let Some(u) = cache_url {
        cmd.env(CACHE_URL_ENV, u);
    }
    if stdout_to_stderr {
        // The job's prints must not mix with our table or JSON on stdout.
        cmd.stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?));
    }
    Ok(cmd)
}

/// The `NEURON_CC_FLAGS` value that makes a job compute the keys `flags` compile under: every
/// flag that enters the key, without the ones that only steer the cache (`--retry_failed_compilation`,
/// `--cache_dir`).
pub fn job_flags(flags: &CompilerFlags) -> String {
    let mut flags = flags.clone();
    flags.retry_failed = false;
    flags.cache_dir = None;
    flags.to_string()
}

/// An error when the local cache location `url` (a path or `file://` URL) is an existing file.
fn refuse_file_as_cache(url: &str) -> anyhow::Result<()> {
    if url.starts_with("s3://") {
        return Ok(());
    }
    let path = Path::new(url.strip_prefix("file://").unwrap_or(url));
    if path.exists() && !path.is_dir() {
        anyhow::bail!(
            "compile cache {}: it is a file, not a directory; name a directory (created if missing)",
            path.display()
        );
    }
    Ok(())
}

/// Describes a failed exit.
pub fn exit_reason(status: ExitStatus) -> Option<String> {
    if status.success() {
        None
    } else if let Some(sig) = status.signal() {
        Some(format!("the trial run was killed by signal {sig}"))
    } else {
        Some(format!(
            "the trial run exited with status {}",
            status.code().unwrap_or(-1)
        ))
    }
}

pub fn run(args: CompileArgs) -> anyhow::Result<i32> {
    let started = Instant::now();
    signals::install();
    let o = &args.opts;
    let flags = o.flags.effective(o.retry_failed)?;
    let url = cache_url(&flags, o.cache.as_deref());
    // The job starts before the cache is opened; a cache path that cannot work must stop the
    // command before the job prints anything.
    if let Some(u) = &url {
        refuse_file_as_cache(u)?;
    }
    let work = temp_dir("compile")?;
    let extract = work.join("graphs");
    std::fs::create_dir_all(&extract)?;
    // The job starts first: it runs while this process loads the plugin and opens the cache.
    // The job's stdout stays the job's stdout; only with --json, where stdout must hold one
    // JSON object, does it go to stderr.
    let child = job_command(&args.command, &flags, url.as_deref(), &extract, o.json)?
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {:?}: {e}", args.command[0]))?;
    let mut source = ExtractDir::new(extract, Some(child));
    let env = match AotEnv::open(flags, url.as_deref()) {
        Ok(e) => e,
        Err(e) => {
            source.stop();
            let _ = std::fs::remove_dir_all(&work);
            return Err(e);
        }
    };
    let cfg = o.pool_config(work.clone(), !o.dry_run as usize);
    let jobs = cfg.jobs;
    let summary = pool::run(&env, &cfg, &mut source)?;
    let status = source.status();
    let trial_error = if summary.interrupted {
        None
    } else {
        status.and_then(exit_reason)
    };
    let report = RunReport::new(
        &summary,
        started.elapsed().as_secs_f64() * 1e3,
        jobs,
        status.and_then(|s| s.code()),
        trial_error,
        o.dry_run,
    );
    let report = report.with_run_flags(job_flags(&env.flags), o.flags.any());
    let code = report.print(o.json)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(code)
}
