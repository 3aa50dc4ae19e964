//! Data-parallel overhead on this machine: the example model's training step on N = 1, 2 and 4
//! replicas (cpu devices of one process), the global batch fixed and sharded over the replicas,
//! gradients averaged inside the step graph before AdamW. Prints, per N: the compile time of
//! the step graph, the synced and pipelined step time (medians) and throughput.
//!
//! `cargo run --release --example bench_dp [-- --batch 64 --steps 60 --replicas 1,2,4]` (run by
//! `scripts/bench`). On a 2-core machine the point is the overhead, not a speed-up: all
//! replicas share the same two cores.

use std::time::Instant;

use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::{average_gradients, AdamW};
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Tensor};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

struct Figures {
    replicas: usize,
    compile_ms: f64,
    synced_ms: f64,
    pipelined_ms: f64,
}

fn run(replicas: usize, batch: usize, steps: usize) -> anyhow::Result<Figures> {
    let device = LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        replicas,
        ..DeviceConfig::default()
    })?;
    let config = TextEncoderConfig::default();
    let model = TextEncoder::new(&device, config.clone(), 0)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&device, &params, 0.01)?;
    let task = SyntheticTask::new(config, 0);
    let batches: Vec<Vec<Tensor>> = (0..4u64)
        .map(|i| {
            task.batch(0, i, batch)
                .iter()
                .map(|h| device.shard(h))
                .collect::<neuron_pc::Result<_>>()
        })
        .collect::<neuron_pc::Result<_>>()?;
    let step = |i: usize, opt: &mut AdamW| -> anyhow::Result<()> {
        let b = &batches[i % batches.len()];
        let lr = device.scalar(1e-3, DType::F32)?;
        let loss = model.loss(&b[0], &b[1], &b[2])?;
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = average_gradients(&grad(&loss, &refs)?)?;
        opt.step(&params, &grads, &lr)?;
        device.mark_step()?;
        Ok(())
    };
    step(0, &mut opt)?;
    device.synchronize()?;
    let compile_ms = device.metrics().compile_ms;
    let mut synced = Vec::new();
    for i in 0..steps {
        let t = Instant::now();
        step(i, &mut opt)?;
        device.synchronize()?;
        synced.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let mut pipelined = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        for i in 0..steps {
            step(i, &mut opt)?;
        }
        device.synchronize()?;
        pipelined.push(t.elapsed().as_secs_f64() * 1e3 / steps as f64);
    }
    assert_eq!(device.metrics().compiles, 1, "one step graph");
    Ok(Figures {
        replicas,
        compile_ms,
        synced_ms: median(synced),
        pipelined_ms: median(pipelined),
    })
}

fn main() -> anyhow::Result<()> {
    let mut batch = 64;
    let mut steps = 60;
    let mut replicas = vec![1, 2, 4];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))
        };
        match a.as_str() {
            "--batch" => batch = value()?.parse()?,
            "--steps" => steps = value()?.parse()?,
            "--replicas" => {
                replicas = value()?
                    .split(',')
                    .map(str::parse)
                    .collect::<Result<_, _>>()?
            }
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let figures: Vec<Figures> = replicas
        .iter()
        .map(|&n| run(n, batch, steps))
        .collect::<anyhow::Result<_>>()?;
    let base = &figures[0];
    println!(
        "| replicas | per-replica batch | compile ms (vs N=1) | synced step ms | pipelined step \
         ms | samples/s (pipelined) | per replica |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for f in &figures {
        let rate = batch as f64 / (f.pipelined_ms / 1e3);
        println!(
            "| {} | {} | {:.0} ({:.2}x) | {:.2} | {:.2} | {:.0} | {:.0} |",
            f.replicas,
            batch / f.replicas,
            f.compile_ms,
            f.compile_ms / base.compile_ms,
            f.synced_ms,
            f.pipelined_ms,
            rate,
            rate / f.replicas as f64
        );
    }
    Ok(())
}
