//! The tracing hot path alone, for profilers: records a 600-op chain (300 `mul_scalar`, 300
//! `tanh`) `REPS` times and drops it, with no step cut and no execution, then prints the
//! median cost per op. `valgrind --tool=callgrind` on this binary attributes the cost of
//! recording an op to its parts (see `docs/design.md`).
//!
//! `cargo run --release --example trace_cost [REPS]`

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

fn main() -> anyhow::Result<()> {
    let reps: usize = std::env::args().nth(1).map_or(Ok(50), |s| s.parse())?;
    let device = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        ..DeviceConfig::default()
    })?;
    let x = device.from_slice(&[0.5f32; 4], &[4])?;
    let mut per_op = Vec::with_capacity(reps);
    for _ in 0..reps {
        let t = Instant::now();
        let y = chain(&x)?;
        per_op.push(t.elapsed().as_secs_f64() * 1e9 / 600.0);
        drop(y);
    }
    per_op.sort_by(f64::total_cmp);
    println!(
        "tracing cost per op: {:.0} ns (median of {reps})",
        per_op[reps / 2]
    );
    Ok(())
}
