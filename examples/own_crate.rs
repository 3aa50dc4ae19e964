//! A job as a user writes it in their own crate (the guide's "Use it in your own crate"
//! quotes this file): a small 1-D convolutional classifier as a `Module`, trained with AdamW on
//! a synthetic task, one step graph per step.
//!
//! Run with `cargo run --release --example own_crate`.

use neuron_pc::nn::{self, Conv1d, ConvConfig, HostRng, Linear, Module, RMSNorm};
use neuron_pc::optim::AdamW;
use neuron_pc::{grad, DType, HostTensor, LazyDevice, Result, Tensor};

/// conv (4 -> 8 channels, kernel 3, padding 1) -> GELU -> mean over time -> RMSNorm -> linear.
/// The derive names its parameters by field, as PyTorch's `named_parameters()` and a state
/// dict do: `conv.weight`, `conv.bias`, `norm.weight`, `head.weight`, `head.bias`.
#[derive(Module)]
struct Classifier {
    conv: Conv1d,
    norm: RMSNorm,
    head: Linear,
}

impl Classifier {
    fn new(device: &LazyDevice, seed: u64) -> Result<Classifier> {
        let mut rng = HostRng::new(seed);
        let mut conv = ConvConfig::new(4, 8, [3]);
        conv.padding = [1];
        Ok(Classifier {
            conv: Conv1d::new(device, &mut rng, conv)?,
            norm: RMSNorm::new(device, 8)?,
            head: Linear::new(device, &mut rng, 8, 3, true)?,
        })
    }

    /// `x [batch, 4, time]` -> logits `[batch, 3]`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = nn::gelu(&self.conv.forward(x)?)?;
        let pooled = h.mean(&[-1], false)?;
        self.head.forward(&self.norm.forward(&pooled)?)
    }
}

/// A batch whose label is the channel (0, 1 or 2) carrying a ramp; the rest is noise.
fn batch(rng: &mut HostRng, n: usize, time: usize) -> Result<(HostTensor, HostTensor)> {
    let mut x = vec![0f32; n * 4 * time];
    let mut labels = vec![0i32; n];
    for (row, label) in labels.iter_mut().enumerate() {
        *label = (rng.next_u64() % 3) as i32;
        for c in 0..4 {
            for t in 0..time {
                let signal = if c == *label as usize {
                    t as f64 / time as f64
                } else {
                    0.0
                };
                x[(row * 4 + c) * time + t] = (signal + 0.3 * rng.normal()) as f32;
            }
        }
    }
    Ok((
        HostTensor::from_slice(&x, &[n, 4, time])?,
        HostTensor::from_slice(&labels, &[n])?,
    ))
}

fn main() -> Result<()> {
    let device = LazyDevice::from_env()?;
    let model = Classifier::new(&device, 0)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let refs: Vec<&Tensor> = params.iter().collect();
    let mut opt = AdamW::new(&device, &params, 0.01)?;
    let lr = device.scalar(0.02, DType::F32)?;
    let mut rng = HostRng::new(1);
    let mut losses = Vec::new();
    for step in 0..60 {
        let (x, labels) = batch(&mut rng, 32, 16)?;
        let (x, labels) = (device.tensor(&x)?, device.tensor(&labels)?);
        let loss = nn::cross_entropy(&model.forward(&x)?, &labels)?;
        let grads = grad(&loss, &refs)?;
        opt.step(&params, &grads, &lr)?;
        device.mark_step()?; // forward, backward and AdamW: one graph, compiled once
        if step % 20 == 0 || step == 59 {
            let value = loss.item()?;
            println!("step {step:3}  loss {value:.4}");
            losses.push(value);
        }
    }
    println!("{}", device.metrics().report());
    if losses.last() >= losses.first() {
        return Err(neuron_pc::Error::Config("the loss did not fall".into()));
    }
    Ok(())
}
