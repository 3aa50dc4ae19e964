//! Activation checkpointing (`nn::remat`, `LlamaForCausalLM::set_remat`): the gradients
//! of a checkpointed model are those of the plain one, for every policy, while the backward
//! pass recomputes the forward's ops (the optimized program's products are counted in
//! `remat_program.rs`).

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM};
use neuron_pc::nn::{remat, Module, Remat};
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

/// The loss and every parameter's gradient of a 3-layer Llama on a padded batch, with each
/// layer checkpointed as `policy` says.
fn loss_and_grads(dev: &LazyDevice, policy: Remat) -> (f64, Vec<(String, Vec<f64>)>) {
    let mut config = LlamaConfig::new(96, 32, 48, 3, 4, 2).unwrap();
    config.initializer_range = 0.1;
    let mut model = LlamaForCausalLM::random(dev, &config, 5).unwrap();
    model.set_remat(policy);
    let ids: Vec<i32> = (0..2 * 10).map(|i| (i * 7 + 3) % 96).collect();
    let ids = dev
        .tensor(&HostTensor::from_slice(&ids, &[2, 10]).unwrap())
        .unwrap();
    let mut mask = vec![1i32; 20];
    mask[17..].fill(0);
    let mask = dev
        .tensor(&HostTensor::from_slice(&mask, &[2, 10]).unwrap())
        .unwrap();
    let named = model.parameters();
    let params: Vec<&Tensor> = named.iter().map(|(_, t)| t).collect();
    let loss = model.loss(&ids, Some(&mask), &ids).unwrap();
    let grads = grad(&loss, &params).unwrap();
    dev.mark_step().unwrap();
    let out = named
        .iter()
        .zip(&grads)
        .map(|((n, _), g)| (n.clone(), values(g)))
        .collect();
    (loss.item().unwrap(), out)
}

#[test]
fn a_checkpointed_llama_has_the_plain_gradients_for_every_policy() {
    let dev = device();
    let (loss, plain) = loss_and_grads(&dev, Remat::None);
    for policy in [Remat::Full, Remat::Dots] {
        let (l, grads) = loss_and_grads(&dev, policy);
        assert!(
            (l - loss).abs() <= 1e-6 * loss.abs(),
            "{policy}: loss {l} vs {loss}"
        );
        let mut worst = 0f64;
        for ((name, got), (_, want)) in grads.iter().zip(&plain) {
            let scale = want.iter().fold(0f64, |m, w| m.max(w.abs()));
            assert!(scale > 0.0, "{name}: a zero gradient tests nothing");
            for (g, w) in got.iter().zip(want) {
                let rel = (g - w).abs() / scale;
                worst = worst.max(rel);
                assert!(
                    rel <= 1e-6,
                    "{policy}: {name}: {g} vs {w} ({rel:e} of its largest)"
                );
            }
        }
        println!("{policy}: largest difference {worst:e} of a gradient's largest entry");
    }
}

/// A block that reads a value from outside (a weight) and has two outputs, one feeding the
/// other's consumer: gradients reach the inputs and the outside value, as without the
/// checkpoint.
#[test]
fn a_block_with_two_outputs_and_an_outside_weight_differentiates_like_the_plain_one() {
    let dev = device();
    let x = dev
        .tensor(&HostTensor::from_slice(&[0.5f32, -1.0, 2.0, 0.25, 1.5, -0.75], &[2, 3]).unwrap())
        .unwrap();
    let w = dev
        .tensor(&HostTensor::from_slice(&[0.3f32, -0.2, 0.7, 0.1, -0.4, 0.9], &[3, 2]).unwrap())
        .unwrap();
    let run = |policy: Remat| -> Vec<Vec<f64>> {
        let out = remat(policy, &[&x], |xs| {
            let h = xs[0].matmul(&w)?.tanh()?;
            let e = h.exp()?.mul(&xs[0].sum(&[1], true)?)?;
            Ok(vec![h, e])
        })
        .unwrap();
        let loss = out[0]
            .mul(&out[1])
            .unwrap()
            .sum_all()
            .unwrap()
            .add(&out[0].sum_all().unwrap())
            .unwrap();
        let grads = grad(&loss, &[&x, &w]).unwrap();
        dev.mark_step().unwrap();
        grads.iter().map(values).collect()
    };
    let plain = run(Remat::None);
    for policy in [Remat::Full, Remat::Dots] {
        let got = run(policy);
        for (g, p) in got.iter().zip(&plain) {
            for (a, b) in g.iter().zip(p) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                    "{policy}: {a} vs {b}"
                );
            }
        }
    }
    // and the gradient is the right one: d/dx of sum(x) against a finite difference
    let eps = 1e-3;
    let f = |dx: f32| -> f64 {
        let xs: Vec<f32> = vec![0.5 + dx, -1.0, 2.0, 0.25, 1.5, -0.75];
        let x = HostTensor::from_slice(&xs, &[2, 3]).unwrap().to_f64_vec();
        let w = [0.3, -0.2, 0.7, 0.1, -0.4, 0.9];
        let mut total = 0.0;
        for r in 0..2 {
            let rs: f64 = x[r * 3..r * 3 + 3].iter().sum();
            for c in 0..2 {
                let h = (0..3)
                    .map(|k| x[r * 3 + k] * w[k * 2 + c])
                    .sum::<f64>()
                    .tanh();
                total += h * h.exp() * rs + h;
            }
        }
        total
    };
    let fd = (f(eps) - f(-eps)) / (2.0 * f64::from(eps));
    assert!((plain[0][0] - fd).abs() < 1e-3, "{} vs {fd}", plain[0][0]);
}

#[test]
fn a_policy_name_parses_and_a_wrong_one_is_one_clear_error() {
    assert_eq!("full".parse::<Remat>().unwrap(), Remat::Full);
    assert_eq!("dots".parse::<Remat>().unwrap(), Remat::Dots);
    assert_eq!("none".parse::<Remat>().unwrap(), Remat::None);
    let e = "everything".parse::<Remat>().unwrap_err().to_string();
    assert_eq!(
        e,
        "checkpoint policy \"everything\": use none, full or dots"
    );
}
