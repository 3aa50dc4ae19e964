//! Checkpoint saves in the background against synchronous ones (`scripts/bench ckpt`), on the
//! 160M Llama of `scripts/bench memory` (hidden 1024, 8 layers, 16 heads over 8 kv heads,
//! SwiGLU 2816, vocabulary 32000; fp32, AdamW) trained on a small random batch.
//!
//! After `--warmup` steps, each of `--rounds` rounds (one directory per kind under `--dir`,
//! default a fresh one in the temp directory, deleted at the end):
//! - a synchronous save (`background: false`): the whole `save` call;
//! - a background save: the `save` call (the time it blocked the loop), then
//!   `--steps-during` training steps, each timed (synced), while the writer thread is at work,
//!   then `wait()`; the write time is the device metrics' `checkpoint_write_ms`;
//! - the same number of steps with no save in flight (the baseline step).
//!
//! Prints one line, `RESULT state_mib=.. sync_save_ms=.. blocked_ms=.. blocked_pct=..
//! write_ms=.. wait_ms=.. step_ms=.. step_during_write_ms=..` (medians over the rounds;
//! `wait_ms`: what `wait()` still waited after the steps), then a short table.
//!
//! `cargo run --release --example bench_ckpt [-- --rounds 3 --steps-during 3 --dir /tmp/x]`

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM};
use neuron_pc::nn::{HostRng, Module, VarBuilder};
use neuron_pc::optim::AdamW;
use neuron_pc::state::{CheckpointOptions, Checkpoints};
use neuron_pc::{grad, DType, DeviceConfig, HostTensor, LazyDevice, Tensor};

/// Time checkpoint saves of a 160M Llama and AdamW, in the background and not.
#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value_t = 1024)]
    hidden: usize,
    #[arg(long, default_value_t = 8)]
    layers: usize,
    #[arg(long, default_value_t = 16)]
    heads: usize,
    #[arg(long, default_value_t = 8)]
    kv_heads: usize,
    #[arg(long, default_value_t = 2816)]
    intermediate: usize,
    #[arg(long, default_value_t = 32000)]
    vocab: usize,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[arg(long, default_value_t = 128)]
    seq: usize,
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Rounds of (synchronous save, background save, baseline steps).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Steps timed right after each background save, and baseline steps per round.
    #[arg(long, default_value_t = 3)]
    steps_during: usize,
    /// Where the checkpoint directories go (default: a new one in the temp directory).
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.rounds > 0 && args.steps_during > 0, "nothing to time");
    let device = LazyDevice::new(DeviceConfig::from_env()?)?;
    let mut config = LlamaConfig::new(
        args.vocab,
        args.hidden,
        args.intermediate,
        args.layers,
        args.heads,
        args.kv_heads,
    )?;
    config.rms_norm_eps = 1e-5;
    config.max_position_embeddings = args.seq.max(config.max_position_embeddings);
    let model = LlamaForCausalLM::from_vb(&VarBuilder::random(&device, 0), &config)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&device, &params, 0.01)?;
    let mut rng = HostRng::new(1);
    let ids: Vec<i32> = (0..args.batch * args.seq)
        .map(|_| (rng.next_u64() % args.vocab as u64) as i32)
        .collect();
    let ids = device.tensor(&HostTensor::from_slice(&ids, &[args.batch, args.seq])?)?;
    let lr = device.scalar(1e-3, DType::F32)?;
    // one training step, waited for; its wall time in ms
    let step = |opt: &mut AdamW| -> anyhow::Result<f64> {
        let t = Instant::now();
        let loss = model.loss(&ids, None, &ids)?;
        let grads = grad(&loss, &params.iter().collect::<Vec<_>>())?;
        opt.step(&params, &grads, &lr)?;
        device.mark_step()?;
        device.synchronize()?;
        Ok(ms(t))
    };
    for _ in 0..args.warmup.max(1) {
        step(&mut opt)?;
    }

    let root = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("neuron-pc-bench-ckpt-{}", std::process::id()))
    });
    let dir = |kind: &str| root.join(kind).to_string_lossy().into_owned();
    let options = |background| CheckpointOptions {
        keep: Some(1),
        background,
        ..Default::default()
    };
    let mut sync = Checkpoints::open(&dir("sync"), options(false))?;
    let mut bg = Checkpoints::open(&dir("background"), options(true))?;
    let (mut sync_ms, mut blocked_ms, mut write_ms, mut wait_ms) = (vec![], vec![], vec![], vec![]);
    let (mut during, mut alone) = (vec![], vec![]);
    let mut state_bytes = 0;
    for round in 1..=args.rounds as u64 {
        let before = device.metrics();
        let t = Instant::now();
        sync.save(&model, &opt, round)?;
        sync_ms.push(ms(t));
        state_bytes = device.metrics().checkpoint_bytes - before.checkpoint_bytes;

        let before = device.metrics();
        let t = Instant::now();
        bg.save(&model, &opt, round)?;
        blocked_ms.push(ms(t));
        for _ in 0..args.steps_during {
            during.push(step(&mut opt)?);
        }
        let t = Instant::now();
        bg.wait()?
            .ok_or_else(|| anyhow::anyhow!("the background save vanished"))?;
        wait_ms.push(ms(t));
        write_ms.push(device.metrics().checkpoint_write_ms - before.checkpoint_write_ms);

        for _ in 0..args.steps_during {
            alone.push(step(&mut opt)?);
        }
    }
    drop((sync, bg));
    std::fs::remove_dir_all(&root)?;

    let m = device.metrics();
    let state_mib = state_bytes as f64 / 1048576.0;
    let (sync_med, blocked_med) = (median(sync_ms), median(blocked_ms));
    let (write_med, wait_med) = (median(write_ms), median(wait_ms));
    let (step_med, during_med) = (median(alone), median(during.clone()));
    let pct = 100.0 * blocked_med / sync_med;
    println!(
        "RESULT state_mib={state_mib:.1} sync_save_ms={sync_med:.1} blocked_ms={blocked_med:.2} \
         blocked_pct={pct:.2} write_ms={write_med:.1} wait_ms={wait_med:.1} \
         step_ms={step_med:.1} step_during_write_ms={during_med:.1}"
    );
    println!(
        "{} parameters, {state_mib:.1} MiB a checkpoint; medians of {} rounds, {} steps each",
        config.num_parameters(),
        args.rounds,
        args.steps_during
    );
    println!("| measure | ms |");
    println!("| --- | --- |");
    println!("| synchronous save (whole call) | {sync_med:.1} |");
    println!("| background save: save() blocked | {blocked_med:.2} ({pct:.2}% of sync) |");
    println!("| background save: write on its thread | {write_med:.1} |");
    println!("| background save: wait() after the steps | {wait_med:.1} |");
    println!("| step, no save in flight | {step_med:.1} |");
    println!("| step, during the background write | {during_med:.1} |");
    let by_position: Vec<String> = (0..args.steps_during)
        .map(|k| {
            let nth = during.iter().skip(k).step_by(args.steps_during).copied();
            format!("{:.1}", median(nth.collect()))
        })
        .collect();
    println!(
        "steps after a background save, 1st, 2nd, ...: {} ms",
        by_position.join(", ")
    );
    println!(
        "(saves {}, compiles {}, blocked max {:.2} ms)",
        m.checkpoint_saves, m.compiles, m.checkpoint_blocked_max_ms
    );
    Ok(())
}
