//! `neuron-pc compile-graphs FILE|DIR...`: StableHLO text from any frontend into the cache.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::pool::{self, GraphJob, Source};
use super::report::RunReport;
use super::{env::AotEnv, signals, temp_dir, CompileOpts};

#[derive(clap::Args, Debug)]
pub struct CompileGraphsArgs {
    /// `.mlir` files, or directories searched (recursively) for them.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    #[command(flatten)]
    pub opts: CompileOpts,
}

/// Collects the program files named by `paths` (directories: every `*.mlir` below them).
pub fn collect(paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in paths {
        let meta = std::fs::metadata(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        if meta.is_dir() {
            let mut found = Vec::new();
            walk(p, &mut found)?;
            found.sort();
            out.extend(found);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for e in std::fs::read_dir(dir)? {
        let path = e?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|x| x == "mlir") {
            out.push(path);
        }
    }
    Ok(())
}

/// Ops in a program, estimated from its text: lines that assign a result (`%x = op ...`).
pub fn count_ops(text: &str) -> usize {
    text.lines()
        .filter(|l| l.trim_start().starts_with('%') && l.contains(" = "))
        .count()
}

struct Files(Vec<GraphJob>);

impl Source for Files {
    fn poll(&mut self) -> Vec<GraphJob> {
        std::mem::take(&mut self.0)
    }
    fn finished(&mut self) -> bool {
        self.0.is_empty()
    }
    fn stop(&mut self) {
        self.0.clear();
    }
}

pub fn run(args: CompileGraphsArgs) -> anyhow::Result<i32> {
    let started = Instant::now();
    signals::install();
    let o = &args.opts;
    let shard = match o.shard() {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let flags = o.flags.effective(o.retry_failed)?;
    // No job runs here to name the neuronx-cc flags that mean nothing on this target.
    flags.warn_unused_neuron_flags();
    let env = AotEnv::open(flags, o.cache.as_deref())?;
    let mut jobs_list = Vec::new();
    for path in collect(&args.paths)? {
        let text = std::fs::read_to_string(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let key = env.compiler.key_of(&text);
        jobs_list.push(GraphJob {
            key: key.store,
            nodes: count_ops(&text),
            origin: path.display().to_string(),
            mlir: path,
            replicas: Vec::new(),
            partitioned: false,
        });
    }
    let work = temp_dir("compile-graphs")?;
    let cfg = o.pool_config(work.clone(), 0, shard);
    let jobs = cfg.jobs;
    let summary = pool::run(&env, &cfg, &mut Files(jobs_list))?;
    let report = RunReport::new(
        &summary,
        started.elapsed().as_secs_f64() * 1e3,
        jobs,
        None,
        None,
        o.dry_run,
    )
    .with_shard(shard);
    let code = report.print(o.json)?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(code)
}
