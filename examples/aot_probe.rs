//! A tiny job for `neuron-pc compile` tests and benchmarks: a few small graphs of different
//! shapes per step (one "training" update and `--variants` probe graphs with other batch sizes).
//!
//! ```text
//! neuron-pc compile -- target/debug/examples/aot_probe --steps 2
//! target/debug/examples/aot_probe --steps 6 --json
//! ```
//! Prints one `{"step": N, "loss": X}` line per step (exact f32 bits in `bits`), then, with
//! `--json`, a `METRICS {...}` line with the device's metrics.
//!
//! Data-parallel with `NEURON_PC_DEVICES=N` (N divides 4): each replica takes its shard of the
//! 4-row batch, and the gradient is summed over the replicas before the update, so every N
//! follows the same trajectory up to float reassociation.

use neuron_pc::tensor::Reduction;
use neuron_pc::{HostTensor, LazyDevice};

struct Args {
    steps: u64,
    variants: usize,
    width: usize,
    fail_at: Option<u64>,
    sleep_ms: u64,
    json: bool,
}

fn parse() -> anyhow::Result<Args> {
    let mut a = Args {
        steps: 4,
        variants: 2,
        width: 8,
        fail_at: None,
        sleep_ms: 0,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut num = |name: &str| -> anyhow::Result<u64> {
            it.next()
                .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))?
                .parse()
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))
        };
        match arg.as_str() {
            "--steps" => a.steps = num("--steps")?,
            "--variants" => a.variants = num("--variants")? as usize,
            "--width" => a.width = num("--width")? as usize,
            "--fail-at" => a.fail_at = Some(num("--fail-at")?),
            "--sleep-ms" => a.sleep_ms = num("--sleep-ms")?,
            "--json" => a.json = true,
            other => anyhow::bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

/// Deterministic pseudo-random inputs.
fn data(seed: u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((seed * 7919 + i as u64 * 104_729) % 1000) as f32 / 500.0) - 1.0)
        .collect()
}

fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let dev = LazyDevice::from_env()?;
    let w_dims = [a.width, a.width];
    let w = dev.tensor(&HostTensor::from_slice(
        &data(1, a.width * a.width),
        &w_dims,
    )?)?;
    for step in 0..a.steps {
        if a.fail_at == Some(step) {
            eprintln!("aot_probe: failing on purpose at step {step}");
            std::process::exit(3);
        }
        let x = dev.shard(&HostTensor::from_slice(
            &data(step + 2, 4 * a.width),
            &[4, a.width],
        )?)?;
        let y = x.matmul(&w)?.tanh()?;
        let loss = y.mul(&y)?.mean_all()?.all_reduce(Reduction::Mean)?;
        let grad = x.transpose(0, 1)?.matmul(&y)?.all_reduce(Reduction::Sum)?;
        w.assign(&w.sub(&grad.mul_scalar(0.01)?)?)?;
        dev.mark_step()?;
        for k in 0..a.variants {
            let xp = dev.tensor(&HostTensor::from_slice(
                &data(step + 100, (5 + k) * a.width),
                &[5 + k, a.width],
            )?)?;
            let p = xp.matmul(&w)?.tanh()?.mean_all()?;
            dev.mark_step()?;
            drop(p);
        }
        let v = loss.item()? as f32;
        println!(
            "{{\"step\": {}, \"loss\": {v:.9e}, \"bits\": {}}}",
            step + 1,
            v.to_bits()
        );
        if a.sleep_ms > 0 {
            std::thread::sleep(std::time::Duration::from_millis(a.sleep_ms));
        }
    }
    if a.json {
        println!("METRICS {}", serde_json::to_string(&dev.metrics())?);
    }
    Ok(())
}
