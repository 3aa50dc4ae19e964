//! The checks `tests/llm/llama.rs` and `tests/llm/families.rs` share: a decoder from a
//! `save_pretrained` directory against the values `transformers` computed for it (one step's
//! logits, loss, gradients and AdamW update; 30 training steps).
#![allow(dead_code)] // each test binary uses a different part

use std::path::{Path, PathBuf};

use neuron_pc::models::llama::LlamaForCausalLM;
use neuron_pc::nn::Module;
use neuron_pc::optim::AdamW;
use neuron_pc::{grad, DType, HostTensor, LazyDevice, Tensor};

use crate::torch_fixture::Fixture;

pub fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

/// The largest `|got - want| - rtol |want|`, asserted to be at most `atol`.
pub fn close(name: &str, got: &[f64], want: &[f64], atol: f64, rtol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{name}: length");
    let mut worst = f64::NEG_INFINITY;
    let mut max_abs = 0f64;
    for (g, w) in got.iter().zip(want) {
        assert!(g.is_finite(), "{name}: got {g}");
        worst = worst.max((g - w).abs() - rtol * w.abs());
        max_abs = max_abs.max((g - w).abs());
    }
    assert!(
        worst <= atol,
        "{name}: off by {worst:e} beyond the tolerance {atol:e} (rtol {rtol:e})"
    );
    max_abs
}

/// A directory under the system's temporary directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("npc-llm-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

pub fn adamw(dev: &LazyDevice, params: &[Tensor]) -> AdamW {
    let mut opt = AdamW::new(dev, params, 0.1).unwrap();
    opt.beta2 = 0.95;
    opt
}

/// `(name, values)` of each parameter, a stacked one as its rows (`layers.0.…`, ...).
pub fn rows(name: &str, values: Vec<f64>, dims: &[usize]) -> Vec<(String, Vec<f64>)> {
    if !neuron_pc::state_dict::is_stacked(name) {
        return vec![(name.to_string(), values)];
    }
    let n = values.len() / dims[0];
    values
        .chunks(n)
        .enumerate()
        .map(|(i, v)| (neuron_pc::state_dict::stacked_row_name(name, i), v.to_vec()))
        .collect()
}

pub fn check_one_step(fx: &Fixture, model: &LlamaForCausalLM) {
    let (ids, mask, labels) = (
        fx.tensor("batch.input_ids"),
        fx.tensor("batch.attention_mask"),
        fx.tensor("batch.labels"),
    );
    let (loss, logits) = model
        .forward_loss(&ids, None, Some(&mask), &labels)
        .unwrap();
    let named = model.parameters();
    let per_layer: usize = named
        .iter()
        .map(|(n, t)| rows(n, vec![0.0; t.dims()[0]], t.dims()).len())
        .sum();
    let torch_params = fx
        .sd
        .tensors
        .keys()
        .filter(|k| k.starts_with("grad."))
        .count();
    assert_eq!(
        per_layer, torch_params,
        "a parameter for each of transformers'"
    );
    let params: Vec<Tensor> = named.iter().map(|(_, t)| t.clone()).collect();
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = grad(&loss, &refs).unwrap();
    let mut opt = adamw(&fx.dev, &params);
    let lr = 1e-2;
    opt.step(&params, &grads, &fx.dev.scalar(lr, DType::F32).unwrap())
        .unwrap();
    fx.dev.mark_step().unwrap();

    let d = close(
        "logits",
        &values(&logits),
        &fx.host("logits").to_f64_vec(),
        1e-5,
        1e-4,
    );
    eprintln!("logits: max |diff| {d:e}");
    let (got, want) = (loss.item().unwrap(), fx.host("loss").to_f64_vec()[0]);
    eprintln!("loss: {got} vs {want}");
    assert!(((got - want) / want).abs() < 1e-6, "loss {got} vs {want}");
    let (mut worst_grad, mut worst_param) = (0f64, 0f64);
    let mut per_layer = Vec::new();
    for ((name, p), g) in named.iter().zip(&grads) {
        let params = rows(name, values(p), p.dims());
        let grads = rows(name, values(g), g.dims());
        for ((name, p), (_, g)) in params.into_iter().zip(grads) {
            per_layer.push((name, p, g));
        }
    }
    for (name, got, got_grad) in per_layer {
        let want_grad = fx.host(&format!("grad.{name}")).to_f64_vec();
        let largest = want_grad.iter().fold(0f64, |m, v| m.max(v.abs()));
        assert!(largest > 0.0, "{name}: torch's gradient is zero");
        let d = close(
            &format!("grad.{name}"),
            &got_grad,
            &want_grad,
            1e-4 * largest,
            1e-4,
        );
        worst_grad = worst_grad.max(d / largest);
        // AdamW's first step moves a weight by about lr g / (|g| + eps), which where |g| is
        // near eps depends steeply on g (d/dg = lr eps / (|g| + eps)^2): the gradient
        // difference accepted above carries into such a weight, and its tolerance adds that.
        let want = fx.host(&format!("adamw.{name}")).to_f64_vec();
        assert_eq!(got.len(), want.len(), "adamw.{name}: length");
        let eps = opt.eps;
        for (k, (p, w)) in got.iter().zip(&want).enumerate() {
            let (g, dg) = (want_grad[k].abs(), (got_grad[k] - want_grad[k]).abs());
            let carried = lr * eps * dg / ((g + eps) * (g + eps));
            assert!(
                (p - w).abs() <= 2e-6 + carried,
                "adamw.{name}[{k}]: {p} vs {w} (gradient {} vs {})",
                got_grad[k],
                want_grad[k]
            );
            worst_param = worst_param.max((p - w).abs());
        }
    }
    eprintln!(
        "gradients: max |diff| / largest {worst_grad:e}; after AdamW: max |diff| {worst_param:e}"
    );
}

/// 30 AdamW steps (lr 1e-2) on the fixture's `train.input_ids` (`[30, 4, 16]`, labels = ids):
/// the losses, asserted to follow `train.losses` within 1e-4 relative and to fall.
pub fn thirty_steps(fx: &Fixture, model: &LlamaForCausalLM) -> Vec<f64> {
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let refs: Vec<&Tensor> = params.iter().collect();
    let mut opt = adamw(&fx.dev, &params);
    let batches = fx.host("train.input_ids");
    let want = fx.host("train.losses").to_f64_vec();
    let all: Vec<i32> = batches.to_vec().unwrap();
    let per = 4 * 16;
    let mut got = Vec::new();
    for step in 0..30 {
        let host = HostTensor::from_slice(&all[step * per..(step + 1) * per], &[4, 16]).unwrap();
        let ids = fx.dev.tensor(&host).unwrap();
        let loss = model.loss(&ids, None, &ids).unwrap();
        let grads = grad(&loss, &refs).unwrap();
        let lr = fx.dev.scalar(1e-2, DType::F32).unwrap();
        opt.step(&params, &grads, &lr).unwrap();
        fx.dev.mark_step().unwrap();
        got.push(loss.item().unwrap());
    }
    let worst = got
        .iter()
        .zip(&want)
        .map(|(g, w)| ((g - w) / w).abs())
        .fold(0f64, f64::max);
    eprintln!(
        "30 steps: losses {:.4} -> {:.4}, max relative diff {worst:e}",
        got[0], got[29]
    );
    assert!(worst < 1e-4, "losses\n got {got:?}\nwant {want:?}");
    assert!(got[29] < got[0] - 1.0, "the model learns the sequences");
    got
}

/// The model saved as `transformers` reads it (float32) loads back here with the same config
/// and exactly the same logits on the fixture batch.
pub fn save_round_trip(fx: &Fixture, model: &LlamaForCausalLM, tag: &str) {
    let dir = TempDir::new(tag);
    let ids = fx.tensor("batch.input_ids");
    let mask = fx.tensor("batch.attention_mask");
    let before = model.forward(&ids, None, Some(&mask)).unwrap();
    model.save_pretrained(dir.path(), DType::F32).unwrap();
    let loaded = LlamaForCausalLM::from_pretrained(&fx.dev, dir.path()).unwrap();
    assert_eq!(
        loaded.config, model.config,
        "the config reads back as written"
    );
    let after = loaded.forward(&ids, None, Some(&mask)).unwrap();
    fx.dev.mark_step().unwrap();
    assert_eq!(
        values(&before),
        values(&after),
        "a float32 round trip is exact"
    );
}
