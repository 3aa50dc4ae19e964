//! Host-side costs of the lazy device, printed as one table (medians of repeated runs):
//! tracing cost per op, host overhead of a mark_step that hits the in-memory executable cache
//! for a 600-node graph (everything but execution), and the example model's step time.
//!
//! `cargo run --release --example bench_device` (run by `scripts/bench`).

use std::time::Instant;

use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::AdamW;
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Tensor};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// A 600-op elementwise chain on a small vector.
fn chain(x: &Tensor) -> neuron_pc::Result<Tensor> {
    let mut y = x.clone();
    for i in 0..300 {
        y = y.mul_scalar(1.0 + i as f64 * 1e-6)?.tanh()?;
    }
    Ok(y)
}

fn main() -> anyhow::Result<()> {
    // The first device in a process loads the plugin and creates its client: the floor of any
    // process's time to first step.
    let t = Instant::now();
    let device = LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        ..DeviceConfig::default()
    })?;
    let device_ms = t.elapsed().as_secs_f64() * 1e3;
    let x = device.from_slice(&[0.5f32; 4], &[4])?;

    // Tracing: 600 ops (plus the 300 scalar constants they use) per repetition.
    let mut per_op = Vec::new();
    for _ in 0..50 {
        let t = Instant::now();
        let y = chain(&x)?;
        per_op.push(t.elapsed().as_secs_f64() * 1e9 / 600.0);
        drop(y);
    }
    device.mark_step()?; // forget the dropped traces

    // mark_step on an in-memory hit: it returns once the step is launched, so its wall time
    // is the host overhead (step cut, lookup, launch); `total` also waits for the execution.
    let mut overhead = Vec::new();
    let mut total = Vec::new();
    for rep in 0..60 {
        let y = chain(&x)?;
        device.synchronize()?;
        let t = Instant::now();
        device.mark_step()?;
        let launched = t.elapsed().as_secs_f64() * 1e3;
        device.synchronize()?;
        let wall = t.elapsed().as_secs_f64() * 1e3;
        drop(y);
        if rep >= 10 {
            total.push(wall);
            overhead.push(launched);
        }
    }
    let m = device.metrics();
    assert_eq!(m.compiles, 1, "the chain must compile once");

    // The example model's full training step (trace + mark_step + execution).
    let config = TextEncoderConfig::default();
    let model = TextEncoder::new(&device, config.clone(), 0)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&device, &params, 0.01)?;
    let task = SyntheticTask::new(config, 0);
    let mut steps = Vec::new();
    let mut traces = Vec::new();
    for i in 0..80u64 {
        let b: Vec<Tensor> = task
            .batch(0, i, 64)
            .iter()
            .map(|h| device.tensor(h))
            .collect::<neuron_pc::Result<_>>()?;
        let t = Instant::now();
        {
            let lr = device.scalar(1e-3, DType::F32)?;
            let loss = model.loss(&b[0], &b[1], &b[2])?;
            let refs: Vec<&Tensor> = params.iter().collect();
            let grads = grad(&loss, &refs)?;
            opt.step(&params, &grads, &lr)?;
        }
        let traced = t.elapsed().as_secs_f64() * 1e3;
        device.mark_step()?;
        // Synced: wait for this step before the next (what JAX's block_until_ready measures).
        device.synchronize()?;
        if i >= 10 {
            steps.push(t.elapsed().as_secs_f64() * 1e3);
            traces.push(traced);
        }
    }
    let step = median(steps);
    // Pipelined: 100 steps with one wait at the end, the way a loop that reads the loss only
    // when logging runs (tracing a step overlaps the previous one's execution); 5 runs.
    let batches: Vec<Vec<Tensor>> = (0..4u64)
        .map(|i| {
            task.batch(0, i, 64)
                .iter()
                .map(|h| device.tensor(h))
                .collect::<neuron_pc::Result<_>>()
        })
        .collect::<neuron_pc::Result<_>>()?;
    let mut pipelined = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for i in 0..100 {
            let b = &batches[i % batches.len()];
            let lr = device.scalar(1e-3, DType::F32)?;
            let loss = model.loss(&b[0], &b[1], &b[2])?;
            let refs: Vec<&Tensor> = params.iter().collect();
            let grads = grad(&loss, &refs)?;
            opt.step(&params, &grads, &lr)?;
            device.mark_step()?;
        }
        device.synchronize()?;
        pipelined.push(t.elapsed().as_secs_f64() * 1e3 / 100.0);
    }
    let pipelined = median(pipelined);

    // The same step through a step function: traced on its first calls, then replayed (no
    // tracing, no step cut); the learning rate is an argument, as replaying needs.
    let lr = device.scalar(1e-3, DType::F32)?;
    let mut step_fn = device.step_fn(|a: &[Tensor]| {
        let loss = model.loss(&a[0], &a[1], &a[2])?;
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = grad(&loss, &refs)?;
        opt.step(&params, &grads, &a[3])?;
        Ok(vec![loss])
    });
    let args = |b: &[Tensor]| vec![b[0].clone(), b[1].clone(), b[2].clone(), lr.clone()];
    let mut replayed = Vec::new();
    let mut replay_host = Vec::new();
    for i in 0..80 {
        let a = args(&batches[i % batches.len()]);
        let t = Instant::now();
        step_fn.call(&a)?;
        let launched = t.elapsed().as_secs_f64() * 1e3;
        device.synchronize()?;
        if i >= 10 {
            replayed.push(t.elapsed().as_secs_f64() * 1e3);
            replay_host.push(launched);
        }
    }
    let mut replayed_pipelined = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        for i in 0..100 {
            step_fn.call(&args(&batches[i % batches.len()]))?;
        }
        device.synchronize()?;
        replayed_pipelined.push(t.elapsed().as_secs_f64() * 1e3 / 100.0);
    }
    anyhow::ensure!(
        step_fn.is_replaying(),
        "the step function did not replay: {}",
        step_fn.why_traced().unwrap_or("no reason given")
    );
    let hwm = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM")).map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<f64>()
                    .unwrap_or(0.0)
            })
        })
        .unwrap_or(0.0);
    let ovh = median(overhead);
    println!("| measure | median |");
    println!("| --- | --- |");
    println!(
        "| first device in the process (plugin load + client), one sample | {device_ms:.0} ms |"
    );
    println!("| tracing cost per op | {:.0} ns |", median(per_op));
    println!(
        "| mark_step host overhead, 600-node graph, memory hit (excl. execution) | {:.3} ms |",
        ovh
    );
    println!(
        "| mark_step total for that graph | {:.3} ms |",
        median(total)
    );
    println!(
        "| example step (trace + mark_step + execute), default config, synced every step \
         | {:.2} ms |",
        step
    );
    println!(
        "| example step, pipelined (100 steps, one sync at the end) | {:.2} ms |",
        pipelined
    );
    println!(
        "| example step, replayed (StepFn), synced every step | {:.2} ms |",
        median(replayed)
    );
    println!(
        "| example step, replayed, pipelined | {:.2} ms |",
        median(replayed_pipelined)
    );
    println!(
        "| of which the replay's host time (call to launched) | {:.3} ms |",
        median(replay_host)
    );
    println!(
        "| of which tracing forward+backward+AdamW | {:.3} ms |",
        median(traces)
    );
    println!(
        "| 600-node overhead as a share of the example step | {:.1} % |",
        100.0 * ovh / step
    );
    println!("| peak RSS of this process | {:.0} MiB |", hwm / 1024.0);
    Ok(())
}
