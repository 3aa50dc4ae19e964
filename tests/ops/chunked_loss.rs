//! `nn::chunked_cross_entropy` and `LlamaForCausalLM::loss_chunk`: the value and gradients of
//! the whole loss, with no more than about one chunk's logits alive at once (the step
//! executable's temporary bytes, from XLA's buffer assignment).

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM};
use neuron_pc::nn::HostRng;
use neuron_pc::nn::{chunked_cross_entropy, cross_entropy_with, CrossEntropyOptions, Module};
use neuron_pc::{grad, DeviceConfig, HostTensor, LazyDevice, Tensor};

fn device() -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        warmup_steps: u64::MAX,
        ..DeviceConfig::default()
    })
    .unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

fn random(dev: &LazyDevice, rng: &mut HostRng, dims: &[usize], scale: f64) -> Tensor {
    let n = dims.iter().product();
    dev.tensor(&HostTensor::from_slice(&rng.uniform_vec(n, scale), dims).unwrap())
        .unwrap()
}

fn labels(dev: &LazyDevice, n: usize, classes: usize, ignored_every: usize) -> Tensor {
    let l: Vec<i32> = (0..n)
        .map(|i| {
            if i % ignored_every == 3 {
                -100
            } else {
                ((i * 37 + 11) % classes) as i32
            }
        })
        .collect();
    dev.tensor(&HostTensor::from_slice(&l, &[n]).unwrap())
        .unwrap()
}

/// Asserts every entry within `1e-6` of the largest entry.
fn same(name: &str, got: &[f64], want: &[f64]) {
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs()));
    assert!(scale > 0.0, "{name}: zeros test nothing");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-6 * scale, "{name}: {g} vs {w}");
    }
}

#[test]
fn the_chunked_loss_has_the_whole_losss_value_and_gradients() {
    let dev = device();
    let mut rng = HostRng::new(3);
    let (n, h, classes) = (50, 16, 40);
    let hidden = random(&dev, &mut rng, &[2, 25, h], 1.0);
    let weight = random(&dev, &mut rng, &[classes, h], 0.5);
    let l = labels(&dev, n, classes, 7).reshape(&[2, 25]).unwrap();
    for smoothing in [0.0, 0.1] {
        let options = CrossEntropyOptions {
            label_smoothing: smoothing,
            ..CrossEntropyOptions::default()
        };
        let logits = hidden.linear(&weight, None).unwrap();
        let whole = cross_entropy_with(&logits, &l, options).unwrap();
        let want = grad(&whole, &[&hidden, &weight]).unwrap();
        // 50 rows in chunks of 16: the last chunk has 2
        let chunked = chunked_cross_entropy(&hidden, &weight, &l, 16, options).unwrap();
        let got = grad(&chunked, &[&hidden, &weight]).unwrap();
        dev.mark_step().unwrap();
        let (a, b) = (chunked.item().unwrap(), whole.item().unwrap());
        assert!(
            (a - b).abs() <= 1e-6 * b.abs(),
            "smoothing {smoothing}: {a} vs {b}"
        );
        same("d hidden", &values(&got[0]), &values(&want[0]));
        same("d weight", &values(&got[1]), &values(&want[1]));
    }
}

#[test]
fn a_llama_with_a_loss_chunk_has_the_plain_loss_and_gradients() {
    let dev = device();
    let config = LlamaConfig::new(96, 32, 48, 2, 4, 2).unwrap();
    let ids: Vec<i32> = (0..2 * 10).map(|i| (i * 7 + 3) % 96).collect();
    let ids = dev
        .tensor(&HostTensor::from_slice(&ids, &[2, 10]).unwrap())
        .unwrap();
    let mut results = Vec::new();
    for chunk in [None, Some(4)] {
        let mut model = LlamaForCausalLM::random(&dev, &config, 5).unwrap();
        model.loss_chunk = chunk;
        let named = model.parameters();
        let params: Vec<&Tensor> = named.iter().map(|(_, t)| t).collect();
        let loss = model.loss(&ids, None, &ids).unwrap();
        let grads = grad(&loss, &params).unwrap();
        dev.mark_step().unwrap();
        results.push((
            loss.item().unwrap(),
            grads.iter().map(values).collect::<Vec<_>>(),
        ));
    }
    let (whole, chunked) = (&results[0], &results[1]);
    assert!(
        (whole.0 - chunked.0).abs() <= 1e-6 * whole.0,
        "{} vs {}",
        chunked.0,
        whole.0
    );
    for (g, w) in chunked.1.iter().zip(&whole.1) {
        same("a parameter's gradient", g, w);
    }
}

/// The temporaries of a step computing the loss over 2048 rows and a vocabulary of
/// 4000 and both gradients, with the whole logits (`chunk` none) or in chunks.
fn temp_bytes(chunk: Option<usize>) -> u64 {
    let dev = device();
    let mut rng = HostRng::new(5);
    let (n, h, classes) = (2048, 16, 4000);
    let hidden = random(&dev, &mut rng, &[n, h], 1.0);
    let weight = random(&dev, &mut rng, &[classes, h], 0.5);
    let l = labels(&dev, n, classes, 9);
    let options = CrossEntropyOptions::default();
    let loss = match chunk {
        None => cross_entropy_with(&hidden.linear(&weight, None).unwrap(), &l, options),
        Some(c) => chunked_cross_entropy(&hidden, &weight, &l, c, options),
    }
    .unwrap();
    let grads = grad(&loss, &[&hidden, &weight]).unwrap();
    dev.mark_step().unwrap();
    assert!(loss.item().unwrap().is_finite());
    drop(grads);
    dev.metrics().step_temp_bytes
}

#[test]
fn the_chunked_loss_keeps_under_two_chunks_of_logits_alive() {
    let logits = |rows: u64| rows * 4000 * 4;
    let whole = temp_bytes(None);
    let chunked = temp_bytes(Some(256));
    println!(
        "temporaries: whole {:.1} MB (logits {:.1} MB), chunks of 256 rows {:.2} MB (one chunk's \
         logits {:.2} MB)",
        whole as f64 / 1e6,
        logits(2048) as f64 / 1e6,
        chunked as f64 / 1e6,
        logits(256) as f64 / 1e6
    );
    assert!(
        whole >= logits(2048),
        "the whole loss holds the logits: {whole}"
    );
    // besides the logits, the step holds the head's gradient [4000, 16] and the hidden
    // states' [2048, 16] (or partial sums of them) whatever the chunking
    let other = (4000 * 16 + 2048 * 16) * 4;
    assert!(
        chunked < 2 * logits(256) + other,
        "chunks of 256 rows: {chunked} bytes of temporaries"
    );
    // and it scales with the chunk, not the sequence
    let bigger = temp_bytes(Some(512));
    println!("chunks of 512 rows: {:.2} MB", bigger as f64 / 1e6);
    assert!(
        bigger < 2 * logits(512) + other,
        "chunks of 512 rows: {bigger} bytes"
    );
    assert!(bigger > chunked + logits(256), "{bigger} vs {chunked}");
}

#[test]
fn a_bad_chunk_or_shape_is_one_clear_error() {
    let dev = device();
    let mut rng = HostRng::new(3);
    let hidden = random(&dev, &mut rng, &[6, 8], 1.0);
    let weight = random(&dev, &mut rng, &[10, 8], 1.0);
    let l = labels(&dev, 6, 10, 5);
    let o = CrossEntropyOptions::default();
    let e = chunked_cross_entropy(&hidden, &weight, &l, 0, o)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the chunk must hold at least one row"), "{e}");
    let wrong = random(&dev, &mut rng, &[10, 7], 1.0);
    let e = chunked_cross_entropy(&hidden, &wrong, &l, 2, o)
        .unwrap_err()
        .to_string();
    assert!(e.contains("weight [classes, h]"), "{e}");
    assert!(
        e.contains("tests/ops/chunked_loss.rs"),
        "names the caller: {e}"
    );
}
