//! Data-parallel overhead on this machine: the example model's training step on N = 1, 2 and 4
//! replicas (cpu devices of one process), the global batch fixed and sharded over the replicas,
//! gradients averaged inside the step graph before AdamW. Prints, per N: the compile time of
//! the step graph, the synced and pipelined step time (medians) and throughput. A second table
//! sets ZeRO-1 (`AdamW::zero1`: AdamW's moments sharded over the replicas) against plain
//! data-parallel AdamW at the `--zero1` replica counts: step times and the optimizer state one
//! replica holds, read from the device buffers (`Metrics::optimizer_state_bytes`).
//!
//! `cargo run --release --example bench_dp [-- --batch 64 --steps 60 --replicas 1,2,4 --zero1
//! 2,4]` (run by `scripts/bench`). On a 2-core machine the point is the overhead, not a
//! speed-up: all replicas share the same two cores.

use std::time::Instant;

use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::{average_gradients, AdamW};
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Tensor};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

#[derive(Clone, Copy)]
struct Figures {
    replicas: usize,
    compile_ms: f64,
    synced_ms: f64,
    pipelined_ms: f64,
    /// Optimizer state one replica holds, from its device buffers.
    state_bytes: u64,
}

fn run(replicas: usize, batch: usize, steps: usize, zero1: bool) -> anyhow::Result<Figures> {
    let device = LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        replicas,
        ..DeviceConfig::default()
    })?;
    let config = TextEncoderConfig::default();
    let model = TextEncoder::new(&device, config.clone(), 0)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = if zero1 {
        AdamW::zero1(&device, &params, 0.01)?
    } else {
        AdamW::new(&device, &params, 0.01)?
    };
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
        let grads = grad(&loss, &refs)?;
        // ZeRO-1 reduce-scatters each replica's own gradients inside its step
        let grads = if zero1 {
            grads
        } else {
            average_gradients(&grads)?
        };
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
    let m = device.metrics();
    assert_eq!(m.compiles, 1, "one step graph");
    Ok(Figures {
        replicas,
        compile_ms,
        synced_ms: median(synced),
        pipelined_ms: median(pipelined),
        state_bytes: m.optimizer_state_bytes,
    })
}

fn main() -> anyhow::Result<()> {
    let mut batch = 64;
    let mut steps = 60;
    let mut replicas = vec![1, 2, 4];
    let mut zero1 = vec![2, 4];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| anyhow::anyhow!("{a} needs a value"))
        };
        let list = |v: String| -> anyhow::Result<Vec<usize>> {
            let v: Vec<usize> = v.split(',').map(str::parse).collect::<Result<_, _>>()?;
            Ok(v)
        };
        match a.as_str() {
            "--batch" => batch = value()?.parse()?,
            "--steps" => steps = value()?.parse()?,
            "--replicas" => replicas = list(value()?)?,
            // "none": skip the ZeRO-1 table
            "--zero1" => match value()?.as_str() {
                "none" => zero1.clear(),
                v => zero1 = list(v.to_string())?,
            },
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    let figures: Vec<Figures> = replicas
        .iter()
        .map(|&n| run(n, batch, steps, false))
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
    if zero1.is_empty() {
        return Ok(());
    }
    // the plain runs are the data-parallel table's where it has that N
    let mut pairs = Vec::new();
    for &n in &zero1 {
        let plain = match figures.iter().find(|f| f.replicas == n) {
            Some(f) => *f,
            None => run(n, batch, steps, false)?,
        };
        pairs.push((plain, run(n, batch, steps, true)?));
    }
    println!();
    println!(
        "| replicas | optimizer | synced step ms | pipelined step ms | optimizer state per \
         replica (vs plain) |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (plain, z) in &pairs {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        println!(
            "| {} | data-parallel AdamW | {:.2} | {:.2} | {:.3} MiB |",
            plain.replicas,
            plain.synced_ms,
            plain.pipelined_ms,
            mib(plain.state_bytes)
        );
        println!(
            "| {} | ZeRO-1 AdamW | {:.2} ({:.2}x) | {:.2} ({:.2}x) | {:.3} MiB ({:.3}x) |",
            z.replicas,
            z.synced_ms,
            z.synced_ms / plain.synced_ms,
            z.pipelined_ms,
            z.pipelined_ms / plain.pipelined_ms,
            mib(z.state_bytes),
            z.state_bytes as f64 / plain.state_bytes.max(1) as f64
        );
    }
    Ok(())
}
