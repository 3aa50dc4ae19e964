//! Memory you can read: the metrics report, per device, the bytes of the parameters and of the
//! optimizer state measured from the device buffers, and what a step needs at most (its
//! arguments, new outputs, temporaries and code, from the compiler's buffer assignment).

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::{average_gradients, AdamW};
use neuron_pc::tensor::Reduction;
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Metrics, Tensor};

fn config() -> TextEncoderConfig {
    TextEncoderConfig {
        vocab: 97,
        embed: 16,
        seq_len: 8,
        mlp: vec![32, 24],
        classes: 8,
    }
}

/// Trains 3 AdamW steps over `replicas`; the metrics and the parameters' f32 element count.
fn train(replicas: usize, zero1: bool) -> (Metrics, u64) {
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        replicas,
        ..DeviceConfig::default()
    })
    .expect("cpu device: run scripts/setup");
    let model = TextEncoder::new(&dev, config(), 3).unwrap();
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let elements: usize = params
        .iter()
        .map(|p| p.dims().iter().product::<usize>())
        .sum();
    let mut opt = if zero1 {
        AdamW::zero1(&dev, &params, 0.01).unwrap()
    } else {
        AdamW::new(&dev, &params, 0.01).unwrap()
    };
    let lr = dev.scalar(1e-2, DType::F32).unwrap();
    let task = SyntheticTask::new(config(), 5);
    for i in 0..3 {
        let b: Vec<Tensor> = task
            .batch(0, i, 16)
            .iter()
            .map(|h| dev.shard(h).unwrap())
            .collect();
        let loss = model.loss(&b[0], &b[1], &b[2]).unwrap();
        let g = grad(&loss, &params.iter().collect::<Vec<_>>()).unwrap();
        let g = if zero1 {
            g
        } else {
            average_gradients(&g).unwrap()
        };
        opt.step(&params, &g, &lr).unwrap();
        drop(g);
        let loss = loss.all_reduce(Reduction::Mean).unwrap();
        dev.mark_step().unwrap();
        loss.item().unwrap();
    }
    (dev.metrics(), 4 * elements as u64)
}

#[test]
fn parameters_optimizer_state_and_the_largest_step_per_device() {
    let (m, param_bytes) = train(1, false);
    eprintln!("{}", m.report());
    assert_eq!(m.parameter_bytes, param_bytes);
    assert_eq!(m.optimizer_state_bytes, 2 * param_bytes);
    // the step takes the parameters, both moments and the batch, and writes the updates over
    // them: at least all of the state, and temporaries for the backward pass besides
    assert!(m.step_temp_bytes > 0, "{m:?}");
    assert!(
        m.step_peak_bytes >= m.parameter_bytes + m.optimizer_state_bytes + m.step_temp_bytes,
        "{m:?}"
    );
    // far from twice the state: the updates are written over the donated inputs
    assert!(
        m.step_peak_bytes < 2 * (3 * param_bytes) + m.step_temp_bytes,
        "{m:?}"
    );
    let report = m.report();
    assert!(report.contains("parameters "), "{report}");
    assert!(report.contains("step memory (largest)"), "{report}");
}

#[test]
fn zero1_shards_the_state_not_the_parameters() {
    let (m, param_bytes) = train(2, true);
    assert_eq!(m.parameter_bytes, param_bytes);
    // each replica keeps half of each moment (rounded up to the shard size)
    assert!(m.optimizer_state_bytes < 2 * param_bytes * 6 / 10, "{m:?}");
    assert!(m.optimizer_state_bytes >= param_bytes, "{m:?}");
}
