//! A Llama with scanned layers (`LlamaConfig::scan_layers`, `nn::ScannedLayers`) against the
//! same model unrolled: logits, loss and every gradient entry by entry (within 4e-6 of the
//! largest), the parameters after AdamW steps as tensors (within 4e-6 relative; plain and
//! ZeRO-1 over 2 replicas), the `save_pretrained` directory byte for byte and the training
//! checkpoint; and the step graph, which does not grow with depth. (Against transformers:
//! `llama.rs`.)

use std::path::{Path, PathBuf};

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM, LoadOptions};
use neuron_pc::nn::{Linear, Module, Remat, ScannedLayers, VarBuilder};
use neuron_pc::optim::{average_gradients, AdamW};
use neuron_pc::{grad, state, DType, DeviceConfig, HostTensor, LazyDevice, Tensor};

fn device(replicas: usize) -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        warmup_steps: u64::MAX,
        replicas,
        ..DeviceConfig::default()
    })
    .unwrap()
}

fn config(layers: usize, scan: bool) -> LlamaConfig {
    let mut c = LlamaConfig::new(96, 32, 48, layers, 4, 2).unwrap();
    c.initializer_range = 0.1;
    c.scan_layers = scan;
    c
}

/// `(name, values)` per layer: a stacked tensor as its rows under their per-layer names.
fn per_layer(named: &[(String, Vec<f64>, Vec<usize>)]) -> Vec<(String, Vec<f64>)> {
    let mut out = Vec::new();
    for (name, v, dims) in named {
        if neuron_pc::state_dict::is_stacked(name) {
            for (i, row) in v.chunks(v.len() / dims[0]).enumerate() {
                out.push((
                    neuron_pc::state_dict::stacked_row_name(name, i),
                    row.to_vec(),
                ));
            }
        } else {
            out.push((name.clone(), v.clone()));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

struct Run {
    losses: Vec<f64>,
    logits: Vec<f64>,
    grads: Vec<(String, Vec<f64>)>,
    params: Vec<(String, Vec<f64>)>,
}

/// Three AdamW steps on a padded batch; the logits and gradients of the first.
fn train(dev: &LazyDevice, scan: bool, remat: Remat, zero1: bool) -> (Run, LlamaForCausalLM) {
    let mut model = LlamaForCausalLM::random(dev, &config(3, scan), 5).unwrap();
    model.set_remat(remat);
    let named = model.parameters();
    let params: Vec<Tensor> = named.iter().map(|(_, t)| t.clone()).collect();
    let refs: Vec<&Tensor> = params.iter().collect();
    let mut opt = match zero1 {
        false => AdamW::new(dev, &params, 0.1).unwrap(),
        true => AdamW::zero1(dev, &params, 0.1).unwrap(),
    };
    let lr = dev.scalar(1e-2, DType::F32).unwrap();
    let mut run = Run {
        losses: Vec::new(),
        logits: Vec::new(),
        grads: Vec::new(),
        params: Vec::new(),
    };
    let replicas = dev.replicas();
    for step in 0..3 {
        let ids: Vec<i32> = (0..2 * replicas * 10)
            .map(|i| ((i + step) * 7 + 3) as i32 % 96)
            .collect();
        let ids = HostTensor::from_slice(&ids, &[2 * replicas, 10]).unwrap();
        let mut mask = vec![1i32; 2 * replicas * 10];
        mask[17..20].fill(0);
        let mask = HostTensor::from_slice(&mask, &[2 * replicas, 10]).unwrap();
        let (ids, mask) = (dev.shard(&ids).unwrap(), dev.shard(&mask).unwrap());
        let (loss, logits) = model.forward_loss(&ids, None, Some(&mask), &ids).unwrap();
        let g = grad(&loss, &refs).unwrap();
        let g = if zero1 || replicas == 1 {
            g
        } else {
            average_gradients(&g).unwrap()
        };
        opt.step(&params, &g, &lr).unwrap();
        dev.mark_step().unwrap();
        run.losses
            .push(loss.to_host_replicas().unwrap()[0].to_f64_vec()[0]);
        if step == 0 {
            run.logits = logits.to_host_replicas().unwrap()[0].to_f64_vec();
            let host: Vec<_> = named
                .iter()
                .zip(&g)
                .map(|((n, t), g)| {
                    let v = g.to_host_replicas().unwrap()[0].to_f64_vec();
                    (n.clone(), v, t.dims().to_vec())
                })
                .collect();
            run.grads = per_layer(&host);
        }
    }
    let host: Vec<_> = named
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.to_host().unwrap().to_f64_vec(),
                t.dims().to_vec(),
            )
        })
        .collect();
    run.params = per_layer(&host);
    (run, model)
}

/// Entry by entry within 4e-6 of the largest entry: the two programs sum a gradient's terms (a
/// norm weight's over every position) in different orders, and float32 sums of tens of terms
/// differ by a few 1e-7 of their magnitude (1.4e-6 of the largest for one such gradient at XLA's
/// backend level 0).
fn close(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    let scale = want.iter().fold(0f64, |m, w| m.max(w.abs()));
    assert!(scale > 0.0, "{what}: all zero tests nothing");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= 4e-6 * scale,
            "{what}: {g} vs {w} (scale {scale})"
        );
    }
}

fn compare(what: &str, got: &Run, want: &Run) {
    close(&format!("{what}: losses"), &got.losses, &want.losses);
    close(&format!("{what}: logits"), &got.logits, &want.logits);
    assert_eq!(got.grads.len(), want.grads.len());
    for ((n, g), (m, w)) in got.grads.iter().zip(&want.grads) {
        assert_eq!(n, m);
        close(&format!("{what}: grad {n}"), g, w);
    }
    // parameters as whole tensors: AdamW's `m / sqrt(v)` turns a last-bit difference of a
    // gradient near zero into a visible one of that entry (the loop's XLA program rounds in
    // other places than the unrolled one's), so entry by entry is not a fair measure; 4e-6 as
    // for the gradients (lm_head's moved 1.0e-6 at XLA's backend level 0)
    for ((n, g), (m, w)) in got.params.iter().zip(&want.params) {
        assert_eq!(n, m);
        let diff: f64 = g.iter().zip(w).map(|(a, b)| (a - b).powi(2)).sum();
        let norm: f64 = w.iter().map(|b| b.powi(2)).sum();
        let rel = (diff / norm).sqrt();
        assert!(
            rel <= 4e-6,
            "{what}: {n} after AdamW differs by {rel:e} (relative, whole)"
        );
    }
}

/// A directory under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("npc-scan-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().to_string();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn scanned_layers_train_as_the_unrolled_model_and_save_the_same_directory() {
    let dev = device(1);
    let (want, unrolled) = train(&dev, false, Remat::None, false);
    for remat in [Remat::None, Remat::Full] {
        let (got, scanned) = train(&dev, true, remat, false);
        compare(&format!("scanned, remat {remat}"), &got, &want);
        // the trained model saves and loads back scanned or not
        if remat == Remat::None {
            let dir = TempDir::new("trained");
            scanned.save_pretrained(&dir.0, DType::F32).unwrap();
            let back = LlamaForCausalLM::from_pretrained(&dev, &dir.0).unwrap();
            let options = LoadOptions {
                scan_layers: true,
                ..LoadOptions::default()
            };
            let again = LlamaForCausalLM::from_pretrained_with(&dev, &dir.0, &options).unwrap();
            let sd = state::module_state(&back).unwrap();
            assert_eq!(sd.tensors, state::module_state(&again).unwrap().tensors);
            assert_eq!(sd.tensors, state::module_state(&scanned).unwrap().tensors);
            assert!(sd.tensors.contains_key("model.layers.2.mlp.up_proj.weight"));
        }
    }
    drop(unrolled);
    // the same model in either layout saves the same directory, byte for byte
    let (a, b) = (TempDir::new("unrolled"), TempDir::new("scanned"));
    LlamaForCausalLM::random(&dev, &config(3, false), 5)
        .unwrap()
        .save_pretrained(&a.0, DType::F32)
        .unwrap();
    LlamaForCausalLM::random(&dev, &config(3, true), 5)
        .unwrap()
        .save_pretrained(&b.0, DType::F32)
        .unwrap();
    assert_eq!(files(&a.0), files(&b.0));
}

#[test]
fn zero1_over_two_replicas_trains_stacked_parameters_as_unstacked_ones() {
    let dev = device(2);
    let (want, _) = train(&dev, false, Remat::None, true);
    let (got, _) = train(&dev, true, Remat::None, true);
    compare("zero1", &got, &want);
}

#[test]
fn a_training_checkpoint_moves_between_scanned_and_unrolled_models() {
    let dev = device(1);
    let (_, unrolled) = train(&dev, false, Remat::None, false);
    let named = unrolled.parameters();
    let params: Vec<Tensor> = named.iter().map(|(_, t)| t.clone()).collect();
    let opt = AdamW::new(&dev, &params, 0.1).unwrap();
    let sd = state::training_state(&unrolled, &opt, 7).unwrap();
    assert!(sd
        .tensors
        .contains_key("optimizer.model.layers.1.self_attn.q_proj.weight.exp_avg"));
    let scanned = LlamaForCausalLM::random(&dev, &config(3, true), 9).unwrap();
    let sp: Vec<Tensor> = scanned.parameters().into_iter().map(|(_, t)| t).collect();
    let sopt = AdamW::new(&dev, &sp, 0.1).unwrap();
    let restored = state::load_training(&scanned, &sopt, &sd, Path::new("memory")).unwrap();
    assert_eq!(restored.step, Some(7));
    let again = state::training_state(&scanned, &sopt, 7).unwrap();
    assert_eq!(again.tensors, sd.tensors);
}

#[test]
fn layers_of_different_shapes_are_one_error_naming_them() {
    let dev = device(1);
    let vb = VarBuilder::random(&dev, 1);
    let layers = vec![
        Linear::from_vb(&vb.pp("a"), 4, 8, true).unwrap(),
        Linear::from_vb(&vb.pp("b"), 4, 6, true).unwrap(),
    ];
    let build = std::sync::Arc::new(|vb: &VarBuilder| Linear::from_vb(vb, 4, 8, true));
    let err = match ScannedLayers::from_layers(layers, build) {
        Ok(_) => panic!("layers of different shapes stacked"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("0.weight is f32[8, 4] but 1.weight is f32[6, 4]"),
        "{err}"
    );
}

#[test]
fn the_step_graph_does_not_grow_with_depth() {
    let dev = device(1);
    let mut ops = Vec::new();
    for layers in [2, 6] {
        let model = LlamaForCausalLM::random(&dev, &config(layers, true), 5).unwrap();
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        let refs: Vec<&Tensor> = params.iter().collect();
        let ids = dev
            .tensor(&HostTensor::from_slice(&[1i32, 5, 9, 2, 7, 3], &[1, 6]).unwrap())
            .unwrap();
        let loss = model.loss(&ids, None, &ids).unwrap();
        let g = grad(&loss, &refs).unwrap();
        dev.mark_step().unwrap();
        drop(g);
        ops.push(dev.metrics().last_step_ops);
    }
    assert!(ops[0] > 100, "a whole training step traced: {ops:?}");
    assert_eq!(ops[0], ops[1], "ops of the step graph at 2 and 6 layers");
}
