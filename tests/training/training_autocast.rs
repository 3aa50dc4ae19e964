//! The example model trains under every auto-cast setting: for `--auto-cast none|matmult|all`
//! and `--auto-cast-type bf16|fp16`, the loss stays finite at every step and falls.
//!
//! Before auto-cast chose ops by class, `--auto-cast all --auto-cast-type fp16` rounded AdamW's
//! `eps` (1e-8) to zero and `g * g` of small gradients to zero in f16, so the update divided zero
//! by zero and every parameter became NaN from the second step.

use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::{AdamW, WarmupCosine};
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Tensor};
use neuron_pc_compiler::flags::CompilerFlags;

const STEPS: u64 = 30;

/// Losses of `STEPS` training steps of a small text encoder under `flags`.
fn train(flags: &str) -> Vec<f64> {
    let config = DeviceConfig {
        flags: CompilerFlags::parse(flags).unwrap(),
        cache: neuron_pc::compile::CacheConfig::disabled(),
        ..DeviceConfig::default()
    };
    let device = LazyDevice::new(config).expect("cpu device: run scripts/setup");
    let cfg = TextEncoderConfig {
        vocab: 256,
        embed: 32,
        seq_len: 16,
        mlp: vec![64, 64],
        classes: 8,
    };
    let model = TextEncoder::new(&device, cfg.clone(), 1).unwrap();
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let refs: Vec<&Tensor> = params.iter().collect();
    let mut opt = AdamW::new(&device, &params, 0.01).unwrap();
    let schedule = WarmupCosine {
        base_lr: 5e-3,
        min_lr: 2.5e-4,
        warmup_steps: 5,
        total_steps: STEPS,
    };
    let task = SyntheticTask::new(cfg, 1);
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let batch: Vec<Tensor> = task
            .batch(0, step, 32)
            .iter()
            .map(|h| device.tensor(h).unwrap())
            .collect();
        let lr = device.scalar(schedule.lr(step), DType::F32).unwrap();
        let loss = model.loss(&batch[0], &batch[1], &batch[2]).unwrap();
        let grads = grad(&loss, &refs).unwrap();
        opt.step(&params, &grads, &lr).unwrap();
        device.mark_step().unwrap();
        losses.push(loss.item().unwrap());
    }
    losses
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

#[test]
fn every_auto_cast_setting_trains_with_finite_falling_loss() {
    let mut failures = Vec::new();
    for mode in ["none", "matmult", "all"] {
        for ty in ["bf16", "fp16"] {
            let flags = format!("--auto-cast {mode} --auto-cast-type {ty}");
            let losses = train(&flags);
            let first = mean(&losses[..5]);
            let last = mean(&losses[losses.len() - 5..]);
            if let Some(at) = losses.iter().position(|l| !l.is_finite()) {
                failures.push(format!("{flags}: loss {} at step {}", losses[at], at + 1));
            } else if last >= 0.8 * first {
                failures.push(format!(
                    "{flags}: loss did not fall (first 5 steps {first:.4}, last 5 {last:.4})"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
