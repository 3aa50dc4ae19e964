//! The example training job: a text encoder on a synthetic task, on the lazy device.
//!
//! ```sh
//! cargo run --release --example train_text_encoder -- --steps 300
//! cargo run --release --example train_text_encoder -- --steps 300 --devices 4
//! neuron-pc compile -- cargo run --release --example train_text_encoder -- --steps 5
//! ```
//!
//! One step graph holds forward, backward, the gradient all-reduce (data-parallel runs) and
//! the AdamW update; the learning rate is a device scalar, so the whole run compiles two graphs
//! (training and validation), once. With `--devices N` (or `NEURON_PC_DEVICES=N`) every step
//! runs on N replicas, each on its shard of the global batch.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;
use neuron_pc::data::{DeviceLoader, LastBatch};
use neuron_pc::models::{accuracy, SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::{average_gradients, AdamW, WarmupCosine};
use neuron_pc::state::{CheckpointOptions, Checkpoints};
use neuron_pc::tensor::Reduction;
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Tensor};

/// Train the example text encoder.
#[derive(Parser, Debug)]
struct Args {
    /// Training steps (in total, counting steps done before a resume).
    #[arg(long, default_value_t = 300)]
    steps: u64,
    /// The global batch: split over the replicas (`--devices`).
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
    /// Data-parallel replicas (devices of this process); default `NEURON_PC_DEVICES`, else 1.
    #[arg(long)]
    devices: Option<usize>,
    /// ZeRO-1: shard AdamW's moments over the replicas (each keeps 1/N of them).
    #[arg(long)]
    zero1: bool,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 8192)]
    vocab: usize,
    #[arg(long, default_value_t = 128)]
    embed: usize,
    #[arg(long, default_value_t = 32)]
    seq_len: usize,
    /// MLP widths, comma-separated.
    #[arg(long, default_value = "512,512,256", value_delimiter = ',')]
    mlp: Vec<usize>,
    #[arg(long, default_value_t = 64)]
    classes: usize,
    #[arg(long, default_value_t = 2e-3)]
    lr: f64,
    #[arg(long, default_value_t = 20)]
    warmup: u64,
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,
    /// Run a validation step every N steps (and after the last one).
    #[arg(long, default_value_t = 100)]
    val_every: u64,
    /// Validation batches per validation.
    #[arg(long, default_value_t = 4)]
    val_batches: u64,
    /// Save a checkpoint every M steps (0: only at the end).
    #[arg(long, default_value_t = 100)]
    ckpt_every: u64,
    /// Where checkpoints go: a directory or s3://bucket/prefix, one `step-<N>/` per checkpoint,
    /// written in the background; none: no checkpoints.
    #[arg(long)]
    ckpt_dir: Option<String>,
    /// Keep the newest K complete checkpoints (default: all).
    #[arg(long)]
    keep_checkpoints: Option<usize>,
    /// Continue from the newest complete checkpoint in --ckpt-dir, if there is one (`auto`,
    /// what `--resume` alone means).
    #[arg(long, num_args = 0..=1, default_missing_value = "auto")]
    resume: Option<String>,
    #[arg(long, default_value_t = 50)]
    log_every: u64,
    /// Print each step's loss as a JSON line (for tests and scripts).
    #[arg(long)]
    loss_log: bool,
    /// Print the metrics summary as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Also write the metrics as JSON to this file at the end (not in a trial run).
    #[arg(long)]
    metrics_file: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let process_start = Instant::now();
    let args = Args::parse();
    let mut device_config = DeviceConfig::from_env()?;
    if let Some(n) = args.devices {
        device_config.replicas = n;
    }
    let device = LazyDevice::new(device_config)?;
    let replicas = device.global_replicas();
    if !args.batch_size.is_multiple_of(replicas) {
        anyhow::bail!(
            "--batch-size {} does not split over {replicas} replicas: use a multiple of {replicas}",
            args.batch_size
        );
    }
    let config = TextEncoderConfig {
        vocab: args.vocab,
        embed: args.embed,
        seq_len: args.seq_len,
        mlp: args.mlp.clone(),
        classes: args.classes,
    };
    let model = TextEncoder::new(&device, config.clone(), args.seed)?;
    let named = model.parameters();
    let params: Vec<Tensor> = named.iter().map(|(_, t)| t.clone()).collect();
    let opt = if args.zero1 {
        AdamW::zero1(&device, &params, args.weight_decay)?
    } else {
        AdamW::new(&device, &params, args.weight_decay)?
    };
    let schedule = WarmupCosine {
        base_lr: args.lr,
        min_lr: args.lr * 0.05,
        warmup_steps: args.warmup,
        total_steps: args.steps,
    };

    let mut ckpts = match &args.ckpt_dir {
        Some(dir) => {
            let options = CheckpointOptions {
                keep: args.keep_checkpoints,
                ..Default::default()
            };
            let c = Checkpoints::open(dir, options).with_context(|| format!("--ckpt-dir {dir}"))?;
            if args.resume.is_none() {
                // before step 1, not at the first save
                c.start_fresh()?;
            }
            Some(c)
        }
        None => None,
    };
    let mut start_step = 0;
    match (args.resume.as_deref(), &ckpts) {
        (None, _) => {}
        (Some("auto"), Some(c)) => {
            if let Some(r) = c.resume(&model, &opt)? {
                start_step = r.checkpoint.step;
                println!("resumed from {} at step {start_step}", r.location);
            }
        }
        (Some(other), Some(_)) => anyhow::bail!("--resume {other}: expected auto"),
        (Some(_), None) => anyhow::bail!("--resume needs --ckpt-dir"),
    }

    let task = SyntheticTask::new(config, args.seed);
    let train_task = task.clone();
    let batch_size = args.batch_size;
    let batches = (start_step..args.steps).map(move |i| train_task.batch(0, i, batch_size));
    let loader = DeviceLoader::new(&device, batches, batch_size, LastBatch::Drop, 2);
    let extracting = device.is_trial_run();
    let mut first_step_at = None;
    let mut last_val = None;
    // Validation is not training: its time (a forward graph's compile or load, its batches and
    // reads) is left out of the throughput, so the figure is the training step's.
    let mut val_time = std::time::Duration::ZERO;

    // The training step as a step function: traced on its first two calls, then replayed
    // without tracing (see `LazyDevice::step_fn`). What changes between steps is an argument:
    // the batch and the learning rate. `opt` is shared with the checkpoint code below.
    let opt = RefCell::new(opt);
    let mut train_step = device.step_fn(|a: &[Tensor]| {
        // each replica's mean loss over its shard; its gradients averaged over the replicas
        // are the gradients of the global batch's mean loss
        let loss = model.loss(&a[0], &a[1], &a[2])?;
        let param_refs: Vec<&Tensor> = params.iter().collect();
        let grads = grad(&loss, &param_refs)?;
        // ZeRO-1 reduce-scatters each replica's own gradients inside its step
        let grads = if args.zero1 {
            grads
        } else {
            average_gradients(&grads)?
        };
        opt.borrow_mut().step(&params, &grads, &a[3])?;
        Ok(vec![loss.all_reduce(Reduction::Mean)?])
    });

    for (step, batch) in (start_step..args.steps).zip(loader) {
        let batch = batch?;
        let [ids, mask, labels] = &batch.tensors[..] else {
            anyhow::bail!("a batch has three tensors")
        };
        let lr = device.scalar(schedule.lr(step), DType::F32)?;
        // Like mark_step, the call launches the step and returns; reading the loss waits for
        // it. Read it only when it is printed, as PyTorch/XLA jobs do, so the next step's
        // launch overlaps this step's execution.
        let loss = train_step
            .call(&[ids.clone(), mask.clone(), labels.clone(), lr])?
            .remove(0);
        let log_due = (step + 1) % args.log_every == 0 || step + 1 == args.steps;
        let loss_value = if args.loss_log || log_due || first_step_at.is_none() {
            loss.item()?
        } else {
            f64::NAN
        };
        if first_step_at.is_none() {
            first_step_at = Some(process_start.elapsed());
        }
        if args.loss_log {
            println!("{{\"step\": {}, \"loss\": {loss_value:.9e}}}", step + 1);
        }
        if log_due {
            println!(
                "step {:>5}  loss {loss_value:.4}{}",
                step + 1,
                if extracting {
                    "  (the trial run: not real)"
                } else {
                    ""
                }
            );
        }
        if (step + 1) % args.val_every == 0 || step + 1 == args.steps {
            let val_start = Instant::now();
            let acc = validate(&device, &model, &task, args.val_batches, batch_size)?;
            val_time += val_start.elapsed();
            println!(
                "step {:>5}  validation accuracy {:.3} (chance {:.3}){}",
                step + 1,
                acc,
                1.0 / args.classes as f64,
                if extracting {
                    "  (the trial run: not real)"
                } else {
                    ""
                }
            );
            last_val = Some(acc).filter(|_| !extracting);
        }
        let ckpt_due = args.ckpt_every > 0 && (step + 1) % args.ckpt_every == 0;
        if let (true, Some(c)) = (ckpt_due || step + 1 == args.steps, &mut ckpts) {
            c.save(&model, &*opt.borrow(), step + 1)?;
        }
    }
    // The training clock stops when every step is done (the last loss was read, so this waits
    // for nothing more); what follows (the final checkpoint's wait) is not training.
    device.synchronize()?;
    let train_end = process_start.elapsed();
    if let Some(c) = &mut ckpts {
        c.wait()?;
    }

    let m = device.metrics();
    if let Some(path) = &args.metrics_file {
        // A trial run (`neuron-pc compile`) computes nothing: its metrics would replace a real
        // run's file with a run that never happened. The library skips its own writes
        // (checkpoints) the same way.
        if extracting {
            eprintln!(
                "the trial run: not writing {} (a trial run computes nothing)",
                path.display()
            );
        } else {
            std::fs::write(path, m.to_json())
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    let trained = args.steps.saturating_sub(start_step);
    let train_s = first_step_at.map_or(0.0, |t| {
        (train_end.as_secs_f64() - t.as_secs_f64() - val_time.as_secs_f64()).max(1e-9)
    });
    if args.json {
        println!("{}", m.to_json());
    } else {
        println!(
            "data-parallel: {replicas} replica(s), global batch {}, {} per replica{}",
            batch_size,
            batch_size / replicas,
            if args.zero1 {
                ", ZeRO-1 optimizer state"
            } else {
                ""
            }
        );
        if trained > 1 && train_s > 0.0 {
            // after the first step (compilation or cache load excluded), validation excluded
            let rate = (trained - 1) as f64 * batch_size as f64 / train_s;
            println!(
                "throughput {rate:.0} samples/s global, {:.0} per replica (after step 1, \
                 validation excluded)",
                rate / replicas as f64
            );
        }
        if let Some(acc) = last_val {
            println!("final validation accuracy {acc:.3}");
        }
        if let Some(t) = first_step_at {
            println!("time to first step {:.3} s", t.as_secs_f64());
        }
        print!("{}", m.report());
    }
    Ok(())
}

fn validate(
    device: &LazyDevice,
    model: &TextEncoder,
    task: &SyntheticTask,
    batches: u64,
    batch_size: usize,
) -> anyhow::Result<f64> {
    let mut total = 0.0;
    for i in 0..batches {
        let host = task.batch(1, i, batch_size);
        let t: Vec<Tensor> = host
            .iter()
            .map(|h| device.shard(h))
            .collect::<neuron_pc::Result<_>>()?;
        let acc = accuracy(&model.forward(&t[0], &t[1])?, &t[2])?.all_reduce(Reduction::Mean)?;
        device.mark_step()?;
        total += acc.item()?;
    }
    Ok(total / batches.max(1) as f64)
}
