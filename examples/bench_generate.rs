//! Time per generated token at a large vocabulary, picking on the device (what `generate`
//! does) against picking on the host (the logits read back, then `Sampling::pick_on_host` per
//! row, what `generate` did before tokens were picked on the device):
//! `cargo run --release --example bench_generate -- --vocab 32000`.
//!
//! The host row is measured as greedy decoding on the device (no sort) plus, per token, a
//! `[b, vocab]` logits read and the host pick, which is the work the old loop did on top.

use std::time::Instant;

use clap::Parser;
use neuron_pc::models::llama::{GenerateOptions, LlamaConfig, LlamaForCausalLM, Sampling};
use neuron_pc::nn::{HostRng, VarBuilder};
use neuron_pc::LazyDevice;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 32000)]
    vocab: usize,
    #[arg(long, default_value_t = 64)]
    hidden: usize,
    #[arg(long, default_value_t = 2)]
    batch: usize,
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Sample from the k most likely tokens only (none: all).
    #[arg(long)]
    top_k: Option<usize>,
    /// Nucleus sampling's share (none: no cut).
    #[arg(long)]
    top_p: Option<f64>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let device = LazyDevice::from_env()?;
    let config = LlamaConfig::new(args.vocab, args.hidden, args.hidden * 2, 2, 4, 2)?;
    let model = LlamaForCausalLM::from_vb(&VarBuilder::random(&device, 0), &config)?;
    let prompts: Vec<Vec<i32>> = (0..args.batch).map(|r| vec![1 + r as i32; 8]).collect();
    let sampled = Sampling::Sample {
        temperature: 0.8,
        top_k: args.top_k,
        top_p: args.top_p,
        seed: 3,
    };
    let run = |sampling: &Sampling| -> anyhow::Result<f64> {
        let mut o = GenerateOptions::greedy(args.tokens);
        o.buckets = vec![8];
        o.sampling = sampling.clone();
        let t = Instant::now();
        model.generate(&prompts, &o)?;
        Ok(t.elapsed().as_secs_f64() * 1e3 / args.tokens as f64)
    };
    // the host's share per token: one [b, vocab] read and b host picks
    let mut rng = HostRng::new(1);
    let noise: Vec<f32> = (0..args.batch * args.vocab)
        .map(|_| rng.uniform() as f32 * 8.0)
        .collect();
    let logits = device.from_slice(&noise, &[args.batch, args.vocab])?;
    let host_pick = || -> anyhow::Result<f64> {
        let mut rng = HostRng::new(3);
        let t = Instant::now();
        for _ in 0..args.tokens {
            let v = logits.to_host()?.to_f64_vec();
            for row in v.chunks(args.vocab) {
                sampled.pick_on_host(row, Some(&mut rng));
            }
        }
        Ok(t.elapsed().as_secs_f64() * 1e3 / args.tokens as f64)
    };
    device.mark_step()?;
    run(&Sampling::Greedy)?;
    run(&sampled)?;
    let (mut greedy, mut device_pick, mut host) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.rounds {
        greedy.push(run(&Sampling::Greedy)?);
        device_pick.push(run(&sampled)?);
        host.push(host_pick()?);
    }
    let (g, d, h) = (median(greedy), median(device_pick), median(host));
    println!(
        "vocab {} batch {}: ms per token (medians of {} rounds of {} tokens)",
        args.vocab, args.batch, args.rounds, args.tokens
    );
    println!("  greedy, argmax on the device:             {g:.3}");
    let what = format!("top_k {:?}, top_p {:?}", args.top_k, args.top_p);
    println!("  {what}, picked on the device (now):  {d:.3}");
    println!(
        "  {what}, picked on the host (before): {:.3}  (greedy + {h:.3})",
        g + h
    );
    Ok(())
}
