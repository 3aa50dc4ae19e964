//! `--ckpt-dir`, `--resume`, `--keep-checkpoints`: training checkpoints in a directory or on S3,
//! saved in the background, the newest complete one picked on resume.

use anyhow::{bail, Context};
use neuron_pc::models::llama::LlamaForCausalLM;
use neuron_pc::optim::AdamW;
use neuron_pc::state::{CheckpointOptions, Checkpoints};

use crate::Args;

/// The checkpoints `--ckpt-dir` names, if any.
pub fn open(args: &Args) -> anyhow::Result<Option<Checkpoints>> {
    let Some(dir) = &args.ckpt_dir else {
        if args.resume.is_some() || args.keep_checkpoints.is_some() || args.adopt_run {
            bail!("--resume, --adopt-run and --keep-checkpoints need --ckpt-dir");
        }
        return Ok(None);
    };
    let shard_size = neuron_pc_cache::parse_size(&args.ckpt_shard_size)
        .filter(|s| *s > 0)
        .with_context(|| {
            format!(
                "--ckpt-shard-size {:?}: expected a size like 2G, 500M or 1048576",
                args.ckpt_shard_size
            )
        })?;
    let options = CheckpointOptions {
        keep: args.keep_checkpoints,
        shard_size,
        background: !args.ckpt_sync,
        adopt_run: args.adopt_run,
        ..Default::default()
    };
    let ckpts = Checkpoints::open(dir, options).with_context(|| format!("--ckpt-dir {dir}"))?;
    if args.resume.is_none() {
        // before step 1: a run from scratch never saves among checkpoints already there
        ckpts
            .start_fresh()
            .with_context(|| format!("--ckpt-dir {dir}"))?;
    }
    Ok(Some(ckpts))
}

/// Loads what `--resume` asks for; the step to continue from (0: nothing to resume).
pub fn resume(
    ckpts: Option<&Checkpoints>,
    which: Option<&str>,
    model: &LlamaForCausalLM,
    opt: &AdamW,
) -> anyhow::Result<u64> {
    let (Some(ckpts), Some(which)) = (ckpts, which) else {
        return Ok(0);
    };
    let before = memory::start();
    let resumed = if which == "auto" {
        match ckpts.resume(model, opt)? {
            Some(r) => r,
            None => {
                println!(
                    "no checkpoint in {} yet: starting at step 0",
                    ckpts.describe()
                );
                return Ok(0);
            }
        }
    } else {
        let all = ckpts.list()?;
        let Some(info) = all.iter().find(|c| c.name == which) else {
            let names: Vec<&str> = all.iter().map(|c| c.name.as_str()).collect();
            bail!(
                "--resume {which}: no complete checkpoint of that name in {} (there are: {})",
                ckpts.describe(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            );
        };
        ckpts.resume_from(info, model, opt)?
    };
    println!(
        "resumed from {} at step {}",
        resumed.location, resumed.checkpoint.step
    );
    println!("continuing run {}", ckpts.run_id());
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    let grew = match (before, memory::peak_kib()) {
        (Some(b), Some(peak)) => format!(
            "; resident memory at most {:.1} MiB above the {:.1} MiB before",
            peak.saturating_sub(b) as f64 / 1024.0,
            b as f64 / 1024.0
        ),
        _ => String::new(),
    };
    println!(
        "resume read {:.3} MiB of the checkpoint's {:.3} MiB ({:.1}%){grew}",
        mib(resumed.read_bytes),
        mib(resumed.state_bytes),
        100.0 * resumed.read_bytes as f64 / resumed.state_bytes.max(1) as f64
    );
    Ok(resumed.checkpoint.step)
}

/// The resident memory a resume adds, on Linux: the kernel's high-water mark (`VmHWM`) is
/// reset before it (`/proc/self/clear_refs`) and read after.
mod memory {
    fn status_kib(field: &str) -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Resets the high-water mark; the resident memory now, in KiB.
    pub fn start() -> Option<u64> {
        std::fs::write("/proc/self/clear_refs", "5").ok()?;
        status_kib("VmRSS:")
    }

    /// The most resident memory since [`start`], in KiB.
    pub fn peak_kib() -> Option<u64> {
        status_kib("VmHWM:")
    }
}
