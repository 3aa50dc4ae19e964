//! The host's cost per step, where the device has almost nothing to do (issue 55): a 2-layer
//! MLP (8 -> 8 -> 8, tanh), batch 1, squared error, AdamW, its parameters and moments updated
//! in place. On this cpu the step's program runs in microseconds, so steps/s is what the host
//! can launch: the stand-in for a fast accelerator, where the host must never hold the device
//! back. `scripts/reference/jax_host_step.py` is the same step in JAX (`jax.jit`, donated
//! state); `scripts/bench host` runs both, processes alternating.
//!
//! `cargo run --release --example bench_host [-- --steps N --rounds R]`: R rounds of N steps
//! each, traced (`mark_step` after each) and replayed (`device.step_fn`), one wait at the end
//! of a round, and each again with its loss read after every step (a loop that logs it);
//! prints the median steps/s of each and the device's host-time split.

use std::time::Instant;

use neuron_pc::nn::{HostRng, Linear};
use neuron_pc::optim::AdamW;
use neuron_pc::{grad, DType, LazyDevice, Metrics, Tensor};

fn flag(args: &[String], name: &str, default: usize) -> anyhow::Result<usize> {
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args
            .get(i + 1)
            .ok_or_else(|| anyhow::anyhow!("{name} takes a number"))?
            .parse()?),
        None => Ok(default),
    }
}

struct Mlp {
    l1: Linear,
    l2: Linear,
    params: Vec<Tensor>,
}

impl Mlp {
    fn new(device: &LazyDevice) -> neuron_pc::Result<Mlp> {
        let mut rng = HostRng::new(0);
        let l1 = Linear::new(device, &mut rng, 8, 8, true)?;
        let l2 = Linear::new(device, &mut rng, 8, 8, true)?;
        let params = [&l1, &l2]
            .iter()
            .flat_map(|l| [l.weight.clone(), l.bias.clone().expect("a bias")])
            .collect();
        Ok(Mlp { l1, l2, params })
    }

    /// One training step: the loss, the parameters and moments updated in place.
    fn step(
        &self,
        opt: &mut AdamW,
        x: &Tensor,
        y: &Tensor,
        lr: &Tensor,
    ) -> neuron_pc::Result<Tensor> {
        let out = self.l2.forward(&self.l1.forward(x)?.tanh()?)?;
        let d = out.sub(y)?;
        let loss = d.mul(&d)?.mean(&[0, 1], false)?;
        let refs: Vec<&Tensor> = self.params.iter().collect();
        let grads = grad(&loss, &refs)?;
        opt.step(&self.params, &grads, lr)?;
        Ok(loss)
    }
}

/// The device's host-time split over a round, per step in µs: (trace, key, lookup, marshal,
/// launch, finish, read), the launch thread's time (off the loop's thread), the in-flight wait and
/// the reads' wait for their steps.
struct Split {
    parts: [f64; 7],
    thread: f64,
    wait: f64,
    read_wait: f64,
}

impl Split {
    fn between(a: &Metrics, b: &Metrics, steps: usize) -> Split {
        let per = |x: f64, y: f64| 1e3 * (y - x) / steps as f64;
        Split {
            parts: [
                per(a.host_trace_ms, b.host_trace_ms),
                per(a.host_key_ms, b.host_key_ms),
                per(a.host_lookup_ms, b.host_lookup_ms),
                per(a.host_marshal_ms, b.host_marshal_ms),
                per(a.host_launch_ms, b.host_launch_ms),
                per(a.host_finish_ms, b.host_finish_ms),
                per(a.host_read_ms, b.host_read_ms),
            ],
            thread: per(a.launch_thread_ms, b.launch_thread_ms),
            wait: per(a.in_flight_wait_ms, b.in_flight_wait_ms),
            read_wait: per(a.read_wait_ms, b.read_wait_ms),
        }
    }

    fn host(&self) -> f64 {
        self.parts.iter().sum()
    }

    fn row(&self) -> String {
        let p: Vec<String> = self.parts.iter().map(|v| format!("{v:.1}")).collect();
        format!(
            "{} | {:.1} | {:.1} | {:.1} | {:.1}",
            p.join(" | "),
            self.thread,
            self.wait,
            self.read_wait,
            self.host()
        )
    }
}

/// One round's figures: steps/s, the host's split, and the host's time per step measured
/// around the loop (µs, the in-flight and read waits taken out).
struct Round {
    rate: f64,
    split: Split,
    measured: f64,
}

/// `rounds` rounds of `steps` calls of `step`, one wait at the end of each: the median round
/// (by steps/s).
fn median_round(
    device: &LazyDevice,
    rounds: usize,
    steps: usize,
    mut step: impl FnMut() -> neuron_pc::Result<()>,
) -> anyhow::Result<Round> {
    let mut done = Vec::new();
    for _ in 0..rounds {
        let before = device.metrics();
        let t = Instant::now();
        for _ in 0..steps {
            step()?;
        }
        let looped = t.elapsed().as_secs_f64();
        device.synchronize()?;
        let split = Split::between(&before, &device.metrics(), steps);
        done.push(Round {
            rate: steps as f64 / t.elapsed().as_secs_f64(),
            measured: 1e6 * looped / steps as f64 - split.wait - split.read_wait,
            split,
        });
    }
    done.sort_by(|a, b| a.rate.partial_cmp(&b.rate).unwrap());
    Ok(done.swap_remove(rounds / 2))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let steps = flag(&args, "--steps", 2000)?;
    let rounds = flag(&args, "--rounds", 5)?;
    let device = LazyDevice::from_env()?;
    let mlp = Mlp::new(&device)?;
    let mut opt = AdamW::new(&device, &mlp.params, 0.01)?;
    let x = device.from_slice(&[0.5f32, -1.0, 0.25, 2.0, -0.5, 1.0, 0.0, -2.0], &[1, 8])?;
    let y = device.from_slice(&[1.0f32, 0.0, -1.0, 0.5, 0.25, -0.5, 2.0, 0.0], &[1, 8])?;
    let lr = device.scalar(1e-3, DType::F32)?;

    // Traced: the step recorded and cut every time (the warm-up compiles its graph).
    for _ in 0..10 {
        mlp.step(&mut opt, &x, &y, &lr)?;
        device.mark_step()?;
    }
    device.synchronize()?;
    let first_loss = mlp.step(&mut opt, &x, &y, &lr)?;
    device.mark_step()?;
    let first_loss = first_loss.item()?;
    let traced = median_round(&device, rounds, steps, || {
        mlp.step(&mut opt, &x, &y, &lr)?;
        device.mark_step()
    })?;
    // Synced: the loss read after every step, as a loop that logs it every step does (its
    // wait for the step is the read wait, the read's own time its part of the split).
    let traced_read = median_round(&device, rounds, steps, || {
        let loss = mlp.step(&mut opt, &x, &y, &lr)?;
        device.mark_step()?;
        loss.item().map(drop)
    })?;

    // Replayed: traced twice, then launched without tracing.
    let mut step_fn =
        device.step_fn(|a: &[Tensor]| Ok(vec![mlp.step(&mut opt, &a[0], &a[1], &a[2])?]));
    for _ in 0..10 {
        step_fn.call(&[x.clone(), y.clone(), lr.clone()])?;
    }
    device.synchronize()?;
    anyhow::ensure!(
        step_fn.is_replaying(),
        "the step function did not replay: {}",
        step_fn.why_traced().unwrap_or("no reason given")
    );
    let mut last = Vec::new();
    let replayed = median_round(&device, rounds, steps, || {
        last = step_fn.call(&[x.clone(), y.clone(), lr.clone()])?;
        Ok(())
    })?;
    let replayed_read = median_round(&device, rounds, steps, || {
        last = step_fn.call(&[x.clone(), y.clone(), lr.clone()])?;
        last[0].item().map(drop)
    })?;
    let last_loss = last[0].item()?;
    anyhow::ensure!(
        last_loss < first_loss,
        "the MLP did not train: loss {first_loss} then {last_loss}"
    );
    let m = device.metrics();

    println!(
        "| step (median of {rounds} rounds of {steps}, one wait a round) | steps/s | trace | \
         key | lookup | marshal | launch | finish | read | launch thread (off the loop) \
         | in-flight wait | read wait | host split sum | host measured | split / measured |"
    );
    println!("|{}", " --- |".repeat(15));
    for (name, r) in [
        ("traced", &traced),
        ("traced, loss read every step", &traced_read),
        ("replayed (step_fn)", &replayed),
        ("replayed, loss read every step", &replayed_read),
    ] {
        println!(
            "| {name} | {:.0} | {} | {:.1} | {:.3} |",
            r.rate,
            r.split.row(),
            r.measured,
            r.split.host() / r.measured
        );
    }
    println!(
        "(µs per step; loss {first_loss:.5}, then {last_loss:.5} after every step; in flight \
         (peak) {} steps)",
        m.peak_steps_in_flight
    );
    Ok(())
}
