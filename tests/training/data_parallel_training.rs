//! Data-parallel training on 1, 2 and 4 cpu devices: the same global batch, sharded, follows
//! the single-device run; replicas never diverge; checkpoints move between replica counts; the
//! loader shards the global batch.

use neuron_pc::data::{DeviceLoader, LastBatch};
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::{average_gradients, clip_grad_norm, AdamW};
use neuron_pc::state_dict::StateDict;
use neuron_pc::tensor::Reduction;
use neuron_pc::{grad, state, DType, Error, HostTensor, Tensor};

const BATCH: usize = 16;

use crate::common::replicated as device;

fn config() -> TextEncoderConfig {
    TextEncoderConfig {
        vocab: 97,
        embed: 16,
        seq_len: 8,
        mlp: vec![32, 24],
        classes: 8,
    }
}

/// A small training run: `steps` steps from batch `first` on, optionally from a checkpoint;
/// returns each step's global mean loss, the final state dict and the device.
struct Run {
    losses: Vec<f64>,
    state: StateDict,
}

/// The learning rate of [`train`].
const LR: f64 = 2e-2;

fn train(replicas: usize, first: u64, steps: u64, from: Option<&StateDict>, check: bool) -> Run {
    let dev = device(replicas);
    let model = TextEncoder::new(&dev, config(), 3).unwrap();
    let named = model.parameters();
    let params: Vec<Tensor> = named.iter().map(|(_, t)| t.clone()).collect();
    let mut opt = AdamW::new(&dev, &params, 0.01).unwrap();
    if let Some(sd) = from {
        state::load_training(&model, &opt, sd, std::path::Path::new("memory")).unwrap();
    }
    let task = SyntheticTask::new(config(), 5);
    let mut losses = Vec::new();
    for i in first..first + steps {
        let b: Vec<Tensor> = task
            .batch(0, i, BATCH)
            .iter()
            .map(|h| dev.shard(h).unwrap())
            .collect();
        let lr = dev.scalar(LR, DType::F32).unwrap();
        let loss = model.loss(&b[0], &b[1], &b[2]).unwrap();
        let refs: Vec<&Tensor> = params.iter().collect();
        let mut grads = average_gradients(&grad(&loss, &refs).unwrap()).unwrap();
        clip_grad_norm(&mut grads, 1.0).unwrap();
        opt.step(&params, &grads, &lr).unwrap();
        let global = loss.all_reduce(Reduction::Mean).unwrap();
        dev.mark_step().unwrap();
        losses.push(global.item().unwrap());
        if check {
            // every replica holds bit-identical parameters after every step
            for (name, p) in &named {
                let copies = p.to_host_replicas().unwrap();
                assert_eq!(copies.len(), replicas);
                for c in &copies[1..] {
                    assert_eq!(c.bytes(), copies[0].bytes(), "{name} at step {i}");
                }
            }
        }
    }
    Run {
        losses,
        state: state::training_state(&model, &opt, first + steps).unwrap(),
    }
}

fn assert_close(a: f64, b: f64, rel: f64, what: &str) {
    assert!(
        (a - b).abs() <= rel * b.abs().max(1e-6),
        "{what}: {a} vs {b} (relative {:.2e})",
        (a - b).abs() / b.abs().max(1e-6)
    );
}

#[test]
fn two_and_four_replicas_follow_the_single_device_run() {
    let one = train(1, 0, 50, None, false);
    // the mean of the last five batches' losses against the first five's (one batch's loss
    // moves with the random initialisation's stream)
    let mean5 = |l: &[f64]| l.iter().sum::<f64>() / 5.0;
    assert!(
        mean5(&one.losses[45..]) < 0.7 * mean5(&one.losses[..5]),
        "the model learns: {:?}",
        one.losses
    );
    for n in [2, 4] {
        let dp = train(n, 0, 50, None, true);
        for (s, (a, b)) in dp.losses.iter().zip(&one.losses).enumerate() {
            assert_close(*a, *b, 1e-5, &format!("N={n} loss at step {s}"));
        }
        let mut worst: f64 = 0.0;
        for (name, want) in &one.state.tensors {
            let got = &dp.state.tensors[name];
            let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
            for (x, y) in g.iter().zip(&w) {
                // Summation order differs between N replicas and one. AdamW normalises each
                // update, so a parameter whose gradient is round-off still moves by up to the
                // learning rate per step, whichever way the round-off points: near zero the
                // difference is measured against one step (LR), elsewhere against the value.
                // After 50 steps, at worst: 2.9e-4 for this seed (a parameter of 0.0029 that
                // differs by 6.7e-6, a third of a thousandth of one step); 4.3e-5 when the
                // softmax still followed its maximum's round-off gradient.
                let err = (x - y).abs() / (LR + y.abs());
                worst = worst.max(err);
                assert!(err < 1e-3, "N={n} {name}: {x} vs {y}");
            }
        }
        eprintln!("N={n}: worst relative parameter difference after 50 steps {worst:.2e}");
    }
}

#[test]
fn a_checkpoint_from_four_replicas_continues_on_one_and_two() {
    let saved = train(4, 0, 6, None, false);
    let path = std::env::temp_dir().join(format!("npc-dp-ckpt-{}.safetensors", std::process::id()));
    saved.state.save(&path).unwrap();
    let sd = StateDict::load(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    // the file is the plain PyTorch-named state dict, whatever the replica count
    assert!(
        sd.tensors.contains_key("embedding.weight"),
        "{:?}",
        sd.tensors.keys()
    );
    assert!(sd
        .tensors
        .contains_key("optimizer.embedding.weight.exp_avg"));
    let four = train(4, 6, 4, Some(&sd), false);
    for n in [1, 2] {
        let other = train(n, 6, 4, Some(&sd), false);
        for (s, (a, b)) in other.losses.iter().zip(&four.losses).enumerate() {
            assert_close(*a, *b, 1e-5, &format!("N={n} after resume, step {s}"));
        }
    }
    // and the continued run is not the fresh run: the checkpoint mattered
    let fresh = train(2, 6, 1, None, false);
    assert!((fresh.losses[0] - four.losses[0]).abs() > 1e-3);
}

#[test]
fn unaveraged_gradients_are_a_clear_error_naming_the_parameter() {
    let dev = device(2);
    let model = TextEncoder::new(&dev, config(), 3).unwrap();
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&dev, &params, 0.01).unwrap();
    let task = SyntheticTask::new(config(), 5);
    let b: Vec<Tensor> = task
        .batch(0, 0, BATCH)
        .iter()
        .map(|h| dev.shard(h).unwrap())
        .collect();
    let loss = model.loss(&b[0], &b[1], &b[2]).unwrap();
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = grad(&loss, &refs).unwrap();
    assert!(grads.iter().all(Tensor::is_per_replica));
    let lr = dev.scalar(1e-3, DType::F32).unwrap();
    let e = opt.step(&params, &grads, &lr).unwrap_err();
    assert!(matches!(e, Error::Placement { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("embedding.weight") && msg.contains("average"),
        "{msg}"
    );
    // the averaged gradients are replicated and step fine
    let avg = average_gradients(&grads).unwrap();
    assert!(avg.iter().all(|g| !g.is_per_replica()));
    opt.step(&params, &avg, &lr).unwrap();
    dev.mark_step().unwrap();
}

#[test]
fn averaged_gradients_equal_the_global_batch_gradient() {
    // Buckets: several gradients of one dtype flattened into one all-reduce must come back
    // in the right places and shapes.
    let dev = device(4);
    let w = dev
        .tensor(&HostTensor::from_slice(&[0.5f32, -1.0, 2.0, 0.25, 1.5, -0.5], &[3, 2]).unwrap())
        .unwrap();
    let bias = dev
        .tensor(&HostTensor::from_slice(&[0.1f32, -0.2], &[2]).unwrap())
        .unwrap();
    let x: Vec<f32> = (0..24).map(|i| ((i * 7) % 11) as f32 * 0.1 - 0.5).collect();
    let xs = dev
        .shard(&HostTensor::from_slice(&x, &[8, 3]).unwrap())
        .unwrap();
    let y = xs.matmul(&w).unwrap().add(&bias).unwrap();
    let loss = y.mul(&y).unwrap().mean_all().unwrap();
    let g = average_gradients(&grad(&loss, &[&w, &bias]).unwrap()).unwrap();
    assert_eq!(g[0].dims(), &[3, 2]);
    assert_eq!(g[1].dims(), &[2]);
    // host: d/dW mean over all 8 rows and 2 columns of y^2 = 2 x^T y / 16
    let wv = [0.5f32, -1.0, 2.0, 0.25, 1.5, -0.5];
    let bv = [0.1f32, -0.2];
    let xr = &x;
    let yv: Vec<f32> = (0..8)
        .flat_map(|r| {
            (0..2).map(move |c| (0..3).map(|k| xr[r * 3 + k] * wv[k * 2 + c]).sum::<f32>() + bv[c])
        })
        .collect();
    let gw: Vec<f32> = (0..6)
        .map(|i| {
            (0..8)
                .map(|r| 2.0 * x[r * 3 + i / 2] * yv[r * 2 + i % 2])
                .sum::<f32>()
                / 16.0
        })
        .collect();
    let gb: Vec<f32> = (0..2)
        .map(|c| (0..8).map(|r| 2.0 * yv[r * 2 + c]).sum::<f32>() / 16.0)
        .collect();
    for (got, want) in [(&g[0], gw), (&g[1], gb)] {
        for copy in got.to_host_replicas().unwrap() {
            for (a, b) in copy.to_vec::<f32>().unwrap().iter().zip(&want) {
                assert!((a - b).abs() < 1e-5, "{a} vs {b}");
            }
        }
    }
}

#[test]
fn the_loader_shards_the_global_batch_and_pads_or_drops_it_whole() {
    let rows = |n: usize, offset: usize| {
        let x: Vec<f32> = (0..n).map(|i| (i + offset) as f32).collect();
        vec![HostTensor::from_slice(&x, &[n, 1]).unwrap()]
    };
    let dev = device(4);
    let batches = vec![rows(8, 0), rows(5, 100)];
    let got: Vec<_> = DeviceLoader::new(&dev, batches.clone(), 8, LastBatch::Pad, 2)
        .map(Result::unwrap)
        .collect();
    assert_eq!(got.len(), 2);
    let shards = |t: &Tensor| -> Vec<Vec<f32>> {
        t.to_host_replicas()
            .unwrap()
            .iter()
            .map(|h| h.to_vec::<f32>().unwrap())
            .collect()
    };
    assert_eq!(got[0].tensors[0].dims(), &[2, 1]);
    assert!(got[0].tensors[0].is_per_replica());
    assert_eq!(
        shards(&got[0].tensors[0]),
        [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
    );
    assert_eq!(
        (got[0].valid, got[0].valid_per_replica.clone()),
        (8, vec![2, 2, 2, 2])
    );
    // 5 real rows padded to 8: replica 2 has one real row, replica 3 none
    assert_eq!(
        shards(&got[1].tensors[0]),
        [[100.0, 101.0], [102.0, 103.0], [104.0, 0.0], [0.0, 0.0]]
    );
    assert_eq!(
        (got[1].valid, got[1].valid_per_replica.clone()),
        (5, vec![2, 2, 1, 0])
    );
    let dropped: Vec<_> = DeviceLoader::new(&dev, batches, 8, LastBatch::Drop, 2).collect();
    assert_eq!(dropped.len(), 1);
    // a global batch that does not split over the replicas
    let mut bad = DeviceLoader::new(&dev, vec![rows(6, 0)], 6, LastBatch::Drop, 2);
    let e = bad.next().unwrap().err().unwrap();
    assert!(
        e.to_string().contains("does not split over 4 replicas"),
        "{e}"
    );
}

#[test]
fn clipping_averaged_gradients_uses_the_global_norm() {
    // the single-device gradient of the global batch is the reference
    let grads_of = |n: usize| -> (Vec<Vec<f32>>, f64) {
        let dev = device(n);
        let model = TextEncoder::new(&dev, config(), 3).unwrap();
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        let task = SyntheticTask::new(config(), 5);
        let b: Vec<Tensor> = task
            .batch(0, 0, BATCH)
            .iter()
            .map(|h| dev.shard(h).unwrap())
            .collect();
        let loss = model.loss(&b[0], &b[1], &b[2]).unwrap();
        let refs: Vec<&Tensor> = params.iter().collect();
        let mut g = average_gradients(&grad(&loss, &refs).unwrap()).unwrap();
        let norm = clip_grad_norm(&mut g, 0.01).unwrap();
        dev.mark_step().unwrap();
        let clipped = g.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
        (clipped, norm.item().unwrap())
    };
    let (one, norm1) = grads_of(1);
    let (four, norm4) = grads_of(4);
    assert!(norm1 > 0.01, "the test must clip: norm {norm1}");
    assert_close(norm4, norm1, 1e-5, "global norm on 4 replicas");
    // clipped to 0.01 in both cases, the same vectors
    let total: f64 = four
        .iter()
        .flatten()
        .map(|&v| (v as f64) * (v as f64))
        .sum();
    assert_close(total.sqrt(), 0.01, 1e-4, "clipped norm");
    for (a, b) in four.iter().flatten().zip(one.iter().flatten()) {
        assert!((a - b).abs() <= 1e-6 + 1e-4 * b.abs(), "{a} vs {b}");
    }
}
