//! `--ckpt-dir`, `--resume`, `--keep-checkpoints`: training checkpoints in a directory or on S3,
//! saved in the background, the newest complete one picked on resume.

use anyhow::{bail, Context};
use neuron_pc::models::llama::LlamaForCausalLM;
use neuron_pc::optim::AdamW;
use neuron_pc::state;
use neuron_pc::state::{CheckpointOptions, Checkpoints};

use crate::Args;

/// The checkpoints `--ckpt-dir` names, if any.
pub fn open(args: &Args) -> anyhow::Result<Option<Checkpoints>> {
    let Some(dir) = &args.ckpt_dir else {
        if args.resume.is_some() || args.keep_checkpoints.is_some() {
            bail!("--resume and --keep-checkpoints need --ckpt-dir");
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
        ..Default::default()
    };
    Ok(Some(
        Checkpoints::open(dir, options).with_context(|| format!("--ckpt-dir {dir}"))?,
    ))
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
    if which == "auto" {
        return match ckpts.resume(model, opt)? {
            Some(r) => {
                println!("resumed from {} at step {}", r.location, r.checkpoint.step);
                Ok(r.checkpoint.step)
            }
            None => {
                println!(
                    "no checkpoint in {} yet: starting at step 0",
                    ckpts.describe()
                );
                Ok(0)
            }
        };
    }
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
    let sd = ckpts.load(info)?;
    let path = std::path::PathBuf::from(format!("{}/{}", ckpts.describe(), info.name));
    state::load_training(model, opt, &sd, &path)?;
    println!("resumed from {} at step {}", path.display(), info.step);
    Ok(info.step)
}
