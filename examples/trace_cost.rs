//! The tracing hot path alone, for profilers: records a 600-op chain (300 `mul_scalar`, 300
//! `tanh`) `REPS` times and drops it, with no step cut and no execution, then prints the
//! median cost per op. `valgrind --tool=callgrind` on this binary attributes the cost of
//! recording an op to its parts (see `docs/design.md`).
//!
//! `--cut` also cuts each chain with `mark_step` on an in-memory hit (after one compile) and
//! waits for it, printing the median host time of the `mark_step` call (step cut, lookup,
//! launch); under callgrind the inclusive cost of `mark_step` is the cut's.
//!
//! `cargo run --release --example trace_cost [REPS] [--cut]`

use std::time::Instant;

use neuron_pc::compile::CacheConfig;
use neuron_pc::{DeviceConfig, LazyDevice, Tensor};

#[inline(never)]
fn chain(x: &Tensor) -> neuron_pc::Result<Tensor> {
    let mut y = x.clone();
    for i in 0..300 {
        y = y.mul_scalar(1.0 + i as f64 * 1e-6)?.tanh()?;
    }
    Ok(y)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let mut reps = 50;
    let mut cut = false;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--cut" => cut = true,
            n => reps = n.parse()?,
        }
    }
    anyhow::ensure!(reps > 0, "REPS must be at least 1");
    let device = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        ..DeviceConfig::default()
    })?;
    let x = device.from_slice(&[0.5f32; 4], &[4])?;
    if cut {
        // the one compile, outside the figures
        let y = chain(&x)?;
        device.mark_step()?;
        device.synchronize()?;
        drop(y);
    }
    let mut per_op = Vec::with_capacity(reps);
    let mut cut_ms = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let y = chain(&x)?;
        per_op.push(t.elapsed().as_secs_f64() * 1e9 / 600.0);
        if cut {
            let t = Instant::now();
            device.mark_step()?;
            cut_ms.push(t.elapsed().as_secs_f64() * 1e3);
            device.synchronize()?;
        }
        drop(y);
    }
    println!(
        "tracing cost per op: {:.0} ns (median of {reps})",
        median(per_op)
    );
    if cut {
        anyhow::ensure!(
            device.metrics().compiles == 1,
            "the chain must compile once"
        );
        println!(
            "mark_step host time, 600-op chain, memory hit: {:.3} ms (median of {reps})",
            median(cut_ms)
        );
    }
    Ok(())
}
