//! Host-side costs of the lazy device, printed as one table (medians of repeated runs):
//! tracing cost per op, host overhead of a mark_step that hits the in-memory executable cache
//! for a 600-node graph (its step cut and its launch apart, from a device's timeline: the
//! plugin runs a program that small inside the launch call), and the example model's step time.
//!
//! `cargo run --release --example bench_device [-- --floor STEP.mlir]` (run by `scripts/bench`).
//!
//! `--floor STEP.mlir`: the example step's own program (written by a trial run, its `.json`
//! record beside it) is also run alone through a client of the same plugin in this process, on
//! the job's values (the runtime's floor, `StepLoop` as `hlo_steptime` runs it), alternating
//! round by round with the traced and then the replayed step; a second table compares them, and
//! pairing the rounds keeps the machine's load out of the ratios.

use std::time::Instant;

use neuron_pc::compile::extract::GraphRecord;
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::AdamW;
use neuron_pc::tensor::Reduction;
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Tensor};
use neuron_pc_compiler::pjrt::{find_plugin, Client, ClientOptions, Plugin, StepLoop, Target};
use neuron_pc_compiler::HostTensor;

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

/// The 600-node chain's `mark_step` on a device that records its timeline, 50 times after 10
/// warm-up steps: the medians of its step cut (the graph walk, the key, the in-memory lookup)
/// and of its launch, in ms. A program this small runs inside the plugin's launch call.
fn chain_phases() -> anyhow::Result<(f64, f64)> {
    let path = std::env::temp_dir().join(format!("bench-device-{}.json", std::process::id()));
    {
        let device = LazyDevice::new(DeviceConfig {
            cache: neuron_pc::compile::CacheConfig::disabled(),
            trace: Some(path.clone()),
            ..DeviceConfig::from_env()?
        })?;
        let x = device.from_slice(&[0.5f32; 4], &[4])?;
        for _ in 0..60 {
            let y = chain(&x)?;
            device.synchronize()?;
            device.mark_step()?;
            device.synchronize()?;
            drop(y);
        }
    }
    let events = neuron_pc::timeline::read(&path)?;
    std::fs::remove_file(&path)?;
    let phase = |name: &str| {
        let durations: Vec<f64> = events
            .iter()
            .filter(|e| e.name == name)
            .filter_map(|e| e.dur)
            .skip(10)
            .map(|us| us / 1e3)
            .collect();
        anyhow::ensure!(
            durations.len() >= 40,
            "the timeline has too few {name:?} phases"
        );
        Ok(median(durations))
    };
    Ok((phase("step cut")?, phase("launch")?))
}

/// The example job's training step (`examples/train_text_encoder.rs`): the loss of one batch,
/// its gradients, an AdamW update; returns the loss averaged over the replicas (one here).
fn example_step(
    model: &TextEncoder,
    params: &[Tensor],
    opt: &mut AdamW,
    batch: &[Tensor],
    lr: &Tensor,
) -> neuron_pc::Result<Tensor> {
    let loss = model.loss(&batch[0], &batch[1], &batch[2])?;
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = grad(&loss, &refs)?;
    opt.step(params, &grads, lr)?;
    loss.all_reduce(Reduction::Mean)
}

/// Steps per pipelined round, the same for the lazy step and its floor.
const ROUND: usize = 10;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let floor_file = match args.iter().position(|a| a == "--floor") {
        Some(i) => Some(
            args.get(i + 1)
                .ok_or_else(|| anyhow::anyhow!("--floor takes a file"))?,
        ),
        None => None,
    };
    if let Some(f) = floor_file {
        // a wrong path fails now, not after the first minute of measuring
        std::fs::metadata(f).map_err(|e| anyhow::anyhow!("{f}: {e}"))?;
    }
    // The first device in a process loads the plugin and creates its client: the floor of any
    // process's time to first step.
    let t = Instant::now();
    // The environment's settings (the bound on steps in flight among them), without a cache.
    let device = LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        ..DeviceConfig::from_env()?
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
    let (cut, launch) = chain_phases()?;

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
            example_step(&model, &params, &mut opt, &b, &lr)?;
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
            let lr = device.scalar(1e-3, DType::F32)?;
            example_step(&model, &params, &mut opt, &batches[i % batches.len()], &lr)?;
            device.mark_step()?;
        }
        device.synchronize()?;
        pipelined.push(t.elapsed().as_secs_f64() * 1e3 / 100.0);
    }
    let pipelined = median(pipelined);

    let lr = device.scalar(1e-3, DType::F32)?;
    // The floor runs on the job's values, not on zeros: an all-zero batch reads and updates one
    // embedding row and averages over an empty mask, a cheaper step than training's. Named
    // inputs (parameters, optimizer state) are matched by the names the trial run recorded, the
    // unnamed ones (the batch, the learning rate) by type.
    let mut floor = match floor_file {
        Some(f) => {
            let mut named: Vec<(String, HostTensor)> = Vec::new();
            for (name, t) in model.parameters() {
                named.push((name, t.to_host()?));
            }
            let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
            for (name, t) in opt.named_state(&names)? {
                named.push((format!("optimizer.{name}"), t.to_host()?));
            }
            // the batch and the learning rate, the one unnamed scalar
            let batch = task.batch(0, 0, 64);
            let mut unnamed = batch.to_vec();
            unnamed.push(lr.to_host()?);
            // the job's loss for that batch from these values, and after one step on it: the
            // floor's first two steps must return the same
            let b: Vec<Tensor> = batch
                .iter()
                .map(|h| device.tensor(h))
                .collect::<Result<_, _>>()?;
            let first = model.loss(&b[0], &b[1], &b[2])?.item()?;
            example_step(&model, &params, &mut opt, &b, &lr)?;
            device.mark_step()?;
            let second = model.loss(&b[0], &b[1], &b[2])?.item()?;
            Some(floor_loop(f, &named, &unnamed, [first, second])?)
        }
        None => None,
    };
    // Paired with the floor, the lazy step runs on the floor's batch (the first): how long a
    // step takes depends on its values, not only on their shapes.
    let paired_traced = match &mut floor {
        Some(floor) => {
            let mut call = || {
                let lr = device.scalar(1e-3, DType::F32)?;
                let loss = example_step(&model, &params, &mut opt, &batches[0], &lr)?;
                device.mark_step()?;
                Ok(vec![loss])
            };
            Some(paired_with_floor(&device, &mut call, floor)?)
        }
        None => None,
    };

    // The same step through a step function: traced on its first calls, then replayed (no
    // tracing, no step cut); the learning rate is an argument, as replaying needs.
    let mut step_fn = device.step_fn(|a: &[Tensor]| {
        Ok(vec![example_step(
            &model,
            &params,
            &mut opt,
            &a[..3],
            &a[3],
        )?])
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
    let paired_replayed = match &mut floor {
        Some(floor) => {
            let mut call = || step_fn.call(&args(&batches[0]));
            Some(paired_with_floor(&device, &mut call, floor)?)
        }
        None => None,
    };
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
        "| mark_step call to return, 600-node graph, memory hit (launch included) | {:.3} ms |",
        ovh
    );
    println!("| of which the step cut (walk, key, in-memory lookup), timeline | {cut:.3} ms |");
    println!(
        "| of which the launch (this small program runs inside it), timeline | {launch:.3} ms |"
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
    if let (Some(traced), Some(replayed)) = (paired_traced, paired_replayed) {
        println!();
        println!(
            "The example step against its floor, alternating round by round in this process \
             ({PAIRED_ROUNDS} rounds of {ROUND} steps each; ratio: the median of the rounds' \
             ratios):"
        );
        println!("| step | mode | lazy ms | floor ms | ratio |");
        println!("| --- | --- | --- | --- | --- |");
        for (step, p) in [("traced", traced), ("replayed (StepFn)", replayed)] {
            for (mode, (lazy, floor, ratio)) in [
                ("synced (loss read every step), median per step", p.synced),
                ("pipelined, median per step of the rounds", p.pipelined),
            ] {
                println!("| {step} | {mode} | {lazy:.2} | {floor:.2} | {ratio:.3}x |");
            }
        }
    }
    Ok(())
}

/// Rounds of the paired comparison.
const PAIRED_ROUNDS: usize = 30;

/// Medians of the lazy step and the floor, and the median of the per-round ratios.
struct Paired {
    synced: (f64, f64, f64),
    pipelined: (f64, f64, f64),
}

/// The step program alone, on a client of the plugin the device uses (one device). Each input
/// is set from `named` by the name in the extract record next to `file` (`<key>.json`), or
/// else to the first of `unnamed` of its type not taken by an earlier input.
fn floor_loop(
    file: &str,
    named: &[(String, HostTensor)],
    unnamed: &[HostTensor],
    losses: [f64; 2],
) -> anyhow::Result<StepLoop> {
    let text = std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
    let record = GraphRecord::read(&std::path::Path::new(file).with_extension("json"))
        .map_err(|e| anyhow::anyhow!("{file}: its extract record: {e}"))?;
    let plugin = Plugin::load(&find_plugin(Target::Cpu)?)?;
    let client = Client::new(&plugin, &ClientOptions::cpu_devices(1))?;
    let mut floor = StepLoop::new(&client, &text, &Default::default(), true)?;
    anyhow::ensure!(
        floor.donated().0 > 0,
        "{file} donates nothing: not a training step's program"
    );
    let types = floor.input_types().to_vec();
    anyhow::ensure!(
        record.param_names.len() == types.len(),
        "{file}: the record names {} inputs, the program has {}",
        record.param_names.len(),
        types.len()
    );
    let mut taken = vec![false; unnamed.len()];
    for (i, (ty, name)) in types.iter().zip(&record.param_names).enumerate() {
        let value = if name.is_empty() {
            let k = (0..unnamed.len())
                .find(|&k| {
                    !taken[k] && unnamed[k].dtype() == ty.dtype && unnamed[k].dims() == ty.dims
                })
                .ok_or_else(|| anyhow::anyhow!("{file}: no value for input {i} ({ty})"))?;
            taken[k] = true;
            &unnamed[k]
        } else {
            named
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v)
                .ok_or_else(|| anyhow::anyhow!("{file}: input {i} is {name}, not in this job"))?
        };
        floor.set_input(i, value)?;
    }
    // The first two steps' losses are the job's for the same batch and values: every input got
    // its value (a learning rate taken as the step count would change the second).
    for (step, loss) in losses.into_iter().enumerate() {
        let (outputs, done) = floor.launch()?;
        if let Some(done) = done {
            done.wait()?;
        }
        let returned: Vec<f64> = outputs
            .iter()
            .flatten()
            .map(|b| b.to_host().map(|h| h.to_f64_vec()))
            .collect::<Result<Vec<_>, _>>()?
            .concat();
        anyhow::ensure!(
            returned
                .iter()
                .any(|v| (v - loss).abs() <= 1e-4 * loss.abs()),
            "{file}: the floor's step {step} returns none of the job's loss {loss} ({returned:?})"
        );
    }
    Ok(floor)
}

/// Alternates rounds of `call` (one lazy step, returning its loss first) and of the floor,
/// which goes first swapping every round: synced steps (each loss read back), then pipelined
/// rounds.
fn paired_with_floor(
    device: &LazyDevice,
    call: &mut dyn FnMut() -> neuron_pc::Result<Vec<Tensor>>,
    floor: &mut StepLoop,
) -> anyhow::Result<Paired> {
    let mut synced = (Vec::new(), Vec::new(), Vec::new());
    let mut pipelined = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        floor.synced()?;
    }
    for round in 0..PAIRED_ROUNDS {
        let (mut lazy_s, mut floor_s) = (Vec::new(), Vec::new());
        let (mut lazy_p, mut floor_p) = (0.0, 0.0);
        for turn in 0..2 {
            if (round + turn) % 2 == 0 {
                for _ in 0..ROUND {
                    let t = Instant::now();
                    let loss = call()?.remove(0);
                    loss.item()?;
                    lazy_s.push(t.elapsed().as_secs_f64() * 1e3);
                }
                let t = Instant::now();
                for _ in 0..ROUND {
                    call()?;
                }
                device.synchronize()?;
                lazy_p = t.elapsed().as_secs_f64() * 1e3 / ROUND as f64;
            } else {
                for _ in 0..ROUND {
                    let t = Instant::now();
                    floor.synced()?;
                    floor_s.push(t.elapsed().as_secs_f64() * 1e3);
                }
                let t = Instant::now();
                floor.pipelined(ROUND)?;
                floor_p = t.elapsed().as_secs_f64() * 1e3 / ROUND as f64;
            }
        }
        let (ls, fs) = (median(lazy_s), median(floor_s));
        synced.0.push(ls);
        synced.1.push(fs);
        synced.2.push(ls / fs);
        pipelined.0.push(lazy_p);
        pipelined.1.push(floor_p);
        pipelined.2.push(lazy_p / floor_p);
    }
    let m = |v: (Vec<f64>, Vec<f64>, Vec<f64>)| (median(v.0), median(v.1), median(v.2));
    Ok(Paired {
        synced: m(synced),
        pipelined: m(pipelined),
    })
}
