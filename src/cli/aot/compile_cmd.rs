//! `neuron-pc compile -- <command>`: runs the job as a trial run and compiles each graph as
//! soon as its record appears, while the job is still running.

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use neuron_pc::compile::extract::GraphRecord;
use neuron_pc::compile::{CacheConfig, CACHE_URL_ENV, USE_CACHE_ENV};
use neuron_pc::timeline::{Timeline, TRACE_ENV};
use neuron_pc_cache::EntryKey;
use neuron_pc_compiler::flags::CompilerFlags;

use super::env::AotEnv;
use super::pool::{self, GraphJob, Source};
use super::report::RunReport;
use super::{signals, temp_dir, CompileOpts};

pub use neuron_pc::device::EXTRACT_DIR_ENV;

/// The timeline track of the trial run as a whole.
const TRIAL_TRACK: u64 = 0;

#[derive(clap::Args, Debug)]
pub struct CompileArgs {
    #[command(flatten)]
    pub opts: CompileOpts,
    /// Write a Chrome trace-event timeline (Perfetto, chrome://tracing) of the trial run's
    /// device phases and each worker's compiles to this file.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Trace the graphs of a run of N processes on one node: the trial runs once, as rank 0
    /// of N (torchrun's variables), and every rank of such a run compiles the same programs.
    /// Run the command again with another N for a restart at another world size.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub world_size: Option<u32>,
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
            let read = GraphRecord::read(&path).and_then(|rec| {
                let key = EntryKey::parse(&rec.key).map_err(std::io::Error::other)?;
                Ok((rec, key))
            });
            match read {
                Ok((rec, key)) => {
                    let mlir = self.dir.join(format!("{key}.mlir"));
                    self.pending.push(GraphJob {
                        key,
                        mlir,
                        nodes: rec.nodes,
                        origin: rec.site,
                        replicas: rec.replicas,
                        partitioned: rec.partitioned,
                    });
                }
                Err(e) => tracing::warn!("extracted graph {}: {e}", path.display()),
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
                let _ = c.kill();
                self.status = c.wait().ok();
            }
            self.child = None;
        }
    }
}

/// The job's environment: the trial run plus the effective cache and flags, so it computes the
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
        .env(USE_CACHE_ENV, "0");
    cmd.env(neuron_pc_compiler::flags::NEURON_CC_FLAGS, job_flags(flags));
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
/// flag that enters the key, without the ones that only steer the cache
/// (`--retry_failed_compilation`, `--cache_dir`).
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
            "compile cache {}: it is a file, not a directory; \
             name a directory (created if missing)",
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
    // Before the job starts: a shard that cannot be known stops the command with nothing run.
    let shard = match o.shard() {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let flags = o.flags.effective(o.retry_failed)?;
    let url = CacheConfig::resolve(o.cache.as_deref(), &flags)?.url;
    // The job starts before the cache is opened; a cache path that cannot work must stop the
    // command before the job prints anything.
    if let Some(u) = &url {
        refuse_file_as_cache(u)?;
    }
    let work = temp_dir("compile")?;
    let extract = work.join("graphs");
    std::fs::create_dir_all(&extract)?;
    let timeline = args.trace.as_ref().map(|p| {
        let t = Timeline::new(p);
        t.name_track(TRIAL_TRACK, "trial run (whole job)");
        std::sync::Arc::new(t)
    });
    let job_trace = work.join("trial-timeline.json");
    // The job starts first: it runs while this process loads the plugin and opens the cache.
    // The job's stdout stays the job's stdout; only with --json, where stdout must hold one
    // JSON object, does it go to stderr.
    let mut cmd = job_command(&args.command, &flags, url.as_deref(), &extract, o.json)?;
    if let Some(n) = args.world_size {
        let n = n.to_string();
        cmd.envs([("RANK", "0"), ("LOCAL_RANK", "0"), ("GROUP_RANK", "0")])
            .envs([("WORLD_SIZE", n.as_str()), ("LOCAL_WORLD_SIZE", &n)]);
    }
    if timeline.is_some() {
        cmd.env(TRACE_ENV, &job_trace);
    }
    let trial_started = Instant::now();
    let child = cmd
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
    let mut cfg = o.pool_config(work.clone(), !o.dry_run as usize, shard);
    cfg.timeline = timeline.clone();
    let jobs = cfg.jobs;
    let summary = pool::run(&env, &cfg, &mut source)?;
    let status = source.status();
    if let Some(t) = &timeline {
        t.span(TRIAL_TRACK, "trial run", trial_started, Instant::now(), &[]);
        for w in 0..summary.workers_started {
            t.name_track(pool::worker_track(w), &format!("compile worker {w}"));
        }
        match neuron_pc::timeline::read(&job_trace) {
            Ok(events) => t.extend(events),
            Err(e) => tracing::warn!("the trial run's timeline: {e}"),
        }
        if let Err(e) = t.write() {
            tracing::error!("timeline {}: {e}", t.path().display());
        }
    }
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
    let report = report
        .with_run_flags(job_flags(env.compiler.flags()), o.flags.any())
        .with_shard(shard);
    let code = report.print(o.json)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(code)
}
