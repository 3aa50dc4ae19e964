//! Synthetic graphs for `scripts/bench-aot`: `--count` training-step graphs the size of the
//! example job's (text encoder forward, backward and AdamW update), each with a different first
//! MLP width so every graph is distinct.
//!
//! ```sh
//! NEURON_PC_EXTRACT_DIR=/tmp/g NEURON_PC_CACHE=0 \
//!     target/release/examples/bench_aot_graphs --count 16
//! neuron-pc compile-graphs /tmp/g --jobs 2
//! ```
//! Run as a trial run (as above, or under `neuron-pc compile`) nothing executes: each step's
//! program is written out for the compiler.

use clap::Parser;
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::AdamW;
use neuron_pc::{grad, DType, LazyDevice, Tensor};

#[derive(Parser, Debug)]
struct Args {
    /// Distinct graphs to make.
    #[arg(long, default_value_t = 16)]
    count: usize,
    #[arg(long, default_value_t = 64)]
    batch_size: usize,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let device = LazyDevice::from_env()?;
    for i in 0..args.count {
        // The example job's model, its first hidden layer 8 units narrower per variant.
        let mut config = TextEncoderConfig::default();
        let first = config.mlp.first().copied().unwrap_or(512);
        if let Some(w) = config.mlp.first_mut() {
            *w = first.saturating_sub(8 * i).max(8);
        }
        let model = TextEncoder::new(&device, config.clone(), i as u64)?;
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        let mut opt = AdamW::new(&device, &params, 0.01)?;
        let host = SyntheticTask::new(config, 0).batch(0, 0, args.batch_size);
        let [ids, mask, labels] = &host[..] else {
            anyhow::bail!("a batch has three tensors")
        };
        let (ids, mask, labels) = (
            device.tensor(ids)?,
            device.tensor(mask)?,
            device.tensor(labels)?,
        );
        let lr = device.scalar(1e-3, DType::F32)?;
        let loss = model.loss(&ids, &mask, &labels)?;
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = grad(&loss, &refs)?;
        opt.step(&params, &grads, &lr)?;
        device.mark_step()?;
    }
    println!("{} graphs", args.count);
    Ok(())
}
