//! State dicts move between neuron-pc and PyTorch, and the example model computes what PyTorch
//! computes. The reference values in `tests/data/torch/` are written by PyTorch itself
//! (`scripts/fixtures/text_encoder.py`): the initial weights as
//! `safetensors.torch.save_file(model.state_dict())`, one input batch, and PyTorch's logits,
//! loss, gradients and parameters and optimizer state after one `torch.optim.AdamW` step.
//!
//! Set `TORCH_PYTHON=/tmp/tvenv/bin/python` to also have PyTorch load the files neuron-pc writes
//! (`load_state_dict(strict=True)`) and check them.
//!
//! Tolerances (float32, `atol + rtol * |torch|`): XLA fuses and reorders the reductions
//! (masked mean over 8 positions, matmuls over at most 32 terms, softmax over 5 classes) and
//! uses its own erf polynomial, so results may differ from PyTorch's by some ulps (float32 ulp
//! at 1 is 1.2e-7). Forward values and parameters: atol 1e-6, rtol 1e-5. Gradients: rtol 1e-4
//! plus atol 1e-5 of the tensor's largest entry, because a small gradient entry is a
//! difference of larger terms and carries their rounding error (measured: 5e-7 of the largest
//! entry, relative 2e-4 on an entry 100x below it). Measured maxima (printed with
//! `--nocapture`): logits 1.5e-8, loss 0, gradients 5.3e-7 of the largest entry, parameters
//! after AdamW 2.4e-7 (about one ulp). The bounds are 10-40x above those and still far below
//! any real error (a wrong gradient rule, a transposed weight or a missing bias correction
//! changes values at the 1e-2 level).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use neuron_pc::models::{TextEncoder, TextEncoderConfig};
use neuron_pc::nn::{cross_entropy, Module};
use neuron_pc::optim::{AdamW, Sgd};
use neuron_pc::state_dict::StateDict;
use neuron_pc::{grad, state, DType, DeviceConfig, HostTensor, LazyDevice, Tensor};

fn device() -> LazyDevice {
    let config = DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        ..DeviceConfig::default()
    };
    LazyDevice::new(config).expect("cpu device: run scripts/setup")
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/torch")
        .join(name)
}

fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_dir("npc-torch", tag)
}

/// The fixture: PyTorch's initial weights, the batch, PyTorch's results, and the configuration
/// and AdamW hyper-parameters the script used (from the results file's metadata).
struct Fixture {
    init_path: PathBuf,
    init: StateDict,
    batch: StateDict,
    expected: StateDict,
    config: TextEncoderConfig,
    lr: f64,
    weight_decay: f64,
}

fn fixture() -> Fixture {
    let init_path = data("text_encoder.init.safetensors");
    let init = StateDict::load(&init_path).unwrap();
    let batch = StateDict::load(&data("text_encoder.batch.safetensors")).unwrap();
    let expected = StateDict::load(&data("text_encoder.expected.safetensors")).unwrap();
    let meta = |k: &str| expected.metadata[k].clone();
    let c: serde_json::Value = serde_json::from_str(&meta("config")).unwrap();
    let n = |k: &str| c[k].as_u64().unwrap() as usize;
    let config = TextEncoderConfig {
        vocab: n("vocab"),
        embed: n("embed"),
        seq_len: n("seq_len"),
        mlp: c["mlp"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_u64().unwrap() as usize)
            .collect(),
        classes: n("classes"),
    };
    // The Rust AdamW has PyTorch's default betas and eps; the script must have used them too.
    assert_eq!(meta("betas"), "0.9,0.999");
    assert_eq!(meta("eps"), "1e-08");
    let lr = meta("lr").parse().unwrap();
    let weight_decay = meta("weight_decay").parse().unwrap();
    Fixture {
        init_path,
        init,
        batch,
        expected,
        config,
        lr,
        weight_decay,
    }
}

/// Compares element-wise within `atol + rtol * |want|`; returns the largest absolute difference.
fn assert_close(what: &str, got: &HostTensor, want: &HostTensor, atol: f64, rtol: f64) -> f64 {
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtype");
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    let mut worst = 0.0f64;
    for (i, (g, w)) in got
        .to_f64_vec()
        .into_iter()
        .zip(want.to_f64_vec())
        .enumerate()
    {
        let d = (g - w).abs();
        assert!(
            d <= atol + rtol * w.abs(),
            "{what}[{i}]: neuron-pc {g:e}, PyTorch {w:e} (difference {d:e})"
        );
        worst = worst.max(d);
    }
    worst
}

/// `frac` times the largest magnitude in `t`: an absolute tolerance for values that are sums of
/// terms about that large (a small entry of a gradient is often a difference of big ones, so
/// its rounding error scales with the tensor's magnitude, not its own).
fn scaled(t: &HostTensor, frac: f64) -> f64 {
    frac * t.to_f64_vec().iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

fn run_torch_check(file: &Path, after_step: bool) {
    let Some(python) = std::env::var_os("TORCH_PYTHON") else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/fixtures/text_encoder.py");
    let mut cmd = Command::new(python);
    cmd.arg(script).arg("--check-rust").arg(file);
    if after_step {
        cmd.arg("--after-step");
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "PyTorch rejects {}: {}{}",
        file.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout).trim());
}

/// A model of the fixture's configuration holding PyTorch's initial weights. The seed differs
/// from anything PyTorch used, so every value must come from the file.
fn model_with_torch_weights(dev: &LazyDevice, f: &Fixture) -> TextEncoder {
    let model = TextEncoder::new(dev, f.config.clone(), 987).unwrap();
    state::load_module(&model, &f.init, &f.init_path).unwrap();
    model
}

#[test]
fn pytorch_weights_give_pytorchs_logits_loss_gradients_and_adamw_step() {
    let f = fixture();
    let dev = device();
    let model = model_with_torch_weights(&dev, &f);
    let loaded = state::module_state(&model).unwrap();
    assert_eq!(
        loaded.tensors, f.init.tensors,
        "loaded weights differ from the file"
    );

    let input = |k: &str| dev.tensor(&f.batch.tensors[k]).unwrap();
    let (ids, mask, labels) = (input("ids"), input("mask"), input("labels"));
    let named = model.parameters();
    let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
    let params: Vec<Tensor> = named.iter().map(|(_, t)| t.clone()).collect();
    let mut opt = AdamW::new(&dev, &params, f.weight_decay).unwrap();
    let lr = dev.scalar(f.lr, DType::F32).unwrap();

    // One training step, as the example job writes it: a single step graph.
    let logits = model.forward(&ids, &mask).unwrap();
    let loss = cross_entropy(&logits, &labels).unwrap();
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = grad(&loss, &refs).unwrap();
    opt.step(&params, &grads, &lr).unwrap();
    dev.mark_step().unwrap();

    let e = &f.expected.tensors;
    let d_logits = assert_close(
        "logits",
        &logits.to_host().unwrap(),
        &e["logits"],
        1e-6,
        1e-5,
    );
    let d_loss = assert_close("loss", &loss.to_host().unwrap(), &e["loss"], 1e-6, 1e-5);
    let mut d_grad = 0.0f64;
    for (name, g) in names.iter().zip(&grads) {
        let want = &e[&format!("grad.{name}")];
        let atol = scaled(want, 1e-5);
        let d = assert_close(
            &format!("grad {name}"),
            &g.to_host().unwrap(),
            want,
            atol,
            1e-4,
        );
        d_grad = d_grad.max(d / scaled(want, 1.0));
    }

    // After one step AdamW moves each weight by about lr * g / (|g| + eps); that comparison is
    // well conditioned only where |g| is far above eps = 1e-8 (or exactly 0, as for the rows of
    // tokens not in the batch). The fixture keeps to that; check it still does.
    let smallest = names
        .iter()
        .flat_map(|n| e[&format!("grad.{n}")].to_f64_vec())
        .map(f64::abs)
        .filter(|g| *g > 0.0)
        .fold(f64::INFINITY, f64::min);
    assert!(
        smallest > 1e-6,
        "fixture gradient {smallest:e} too close to eps"
    );

    let after = state::training_state(&model, &opt, 1).unwrap();
    let mut d_param = 0.0f64;
    let mut d_state = 0.0f64;
    for name in &names {
        d_param = d_param.max(assert_close(
            &format!("{name} after one step"),
            &after.tensors[name],
            &e[&format!("after_step.{name}")],
            1e-6,
            1e-5,
        ));
        // exp_avg = 0.1 g and exp_avg_sq = 0.001 g^2 after one step: the gradients' tolerance,
        // scaled (twice the relative error for the square).
        for (slot, frac, rtol) in [("exp_avg", 1e-5, 1e-4), ("exp_avg_sq", 2e-5, 2e-4)] {
            let key = format!("optimizer.{name}.{slot}");
            let want = &e[&key];
            let d = assert_close(&key, &after.tensors[&key], want, scaled(want, frac), rtol);
            d_state = d_state.max(d / scaled(want, 1.0));
        }
    }
    assert_close(
        "optimizer.step",
        &after.tensors["optimizer.step"],
        &e["optimizer.step"],
        0.0,
        0.0,
    );
    // The parameters really moved: a step that changed nothing would fail above, but make the
    // size of the move explicit (about lr for every weight with a non-zero gradient).
    let moved = after.tensors["proj.weight"]
        .to_f64_vec()
        .iter()
        .zip(f.init.tensors["proj.weight"].to_f64_vec())
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f64, f64::max);
    assert!(moved > 0.5 * f.lr, "proj.weight moved only {moved:e}");
    eprintln!(
        "max |neuron-pc - PyTorch|: logits {d_logits:.2e}, loss {d_loss:.2e}, gradients \
         {d_grad:.2e} (of each tensor's largest entry), parameters after AdamW {d_param:.2e}, \
         AdamW moments {d_state:.2e} (of each tensor's largest entry)"
    );

    let dir = tmp("after-step");
    let file = dir.join("after_step.safetensors");
    after.save(&file).unwrap();
    run_torch_check(&file, true);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn saving_gives_pytorchs_names_dtypes_shapes_and_bytes() {
    let f = fixture();
    let dev = device();
    let model = model_with_torch_weights(&dev, &f);
    let dir = tmp("save");
    let file = dir.join("model.safetensors");
    state::module_state(&model).unwrap().save(&file).unwrap();

    // Read both files with the safetensors crate directly, not through StateDict.
    let ours_bytes = std::fs::read(&file).unwrap();
    let torch_bytes = std::fs::read(&f.init_path).unwrap();
    let ours = safetensors::SafeTensors::deserialize(&ours_bytes).unwrap();
    let torch = safetensors::SafeTensors::deserialize(&torch_bytes).unwrap();
    let mut our_names = ours.names();
    let mut torch_names = torch.names();
    our_names.sort();
    torch_names.sort();
    assert_eq!(our_names, torch_names);
    assert_eq!(
        torch_names,
        [
            "embedding.weight",
            "mlp.0.bias",
            "mlp.0.weight",
            "mlp.2.bias",
            "mlp.2.weight",
            "proj.bias",
            "proj.weight"
        ]
    );
    for name in torch_names {
        let (a, b) = (ours.tensor(name).unwrap(), torch.tensor(name).unwrap());
        assert_eq!(a.dtype(), b.dtype(), "{name}");
        assert_eq!(a.shape(), b.shape(), "{name}");
        assert!(a.data() == b.data(), "{name}: bytes differ");
    }
    run_torch_check(&file, false);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_mismatched_file_names_every_problem_and_loads_nothing() {
    let f = fixture();
    let dev = device();
    let model = model_with_torch_weights(&dev, &f);
    let before = state::module_state(&model).unwrap();

    let mut bad = f.init.clone();
    // mlp.0.weight stored transposed ([in, out]), proj.bias missing, a tensor the model lacks,
    // and the embedding in float64.
    bad.tensors.insert(
        "mlp.0.weight".into(),
        HostTensor::from_slice(&vec![0.25f32; 16 * 32], &[16, 32]).unwrap(),
    );
    bad.tensors.remove("proj.bias");
    bad.tensors.insert(
        "mlp.4.weight".into(),
        HostTensor::from_slice(&[1.0f32; 4], &[2, 2]).unwrap(),
    );
    bad.tensors.insert(
        "embedding.weight".into(),
        HostTensor::from_slice(&vec![0.5f64; 50 * 16], &[50, 16]).unwrap(),
    );
    let dir = tmp("bad");
    let path = dir.join("bad.safetensors");
    bad.save(&path).unwrap();
    let sd = StateDict::load(&path).unwrap();

    let err = state::load_module(&model, &sd, &path)
        .unwrap_err()
        .to_string();
    for needle in [
        "does not match the model",
        "bad.safetensors",
        "mlp.0.weight: file has f32[16, 32], model expects f32[32, 16]",
        "missing: proj.bias (f32[5])",
        "unexpected: mlp.4.weight",
        "embedding.weight: file has f64[50, 16], model expects f32[50, 16]",
    ] {
        assert!(err.contains(needle), "{needle:?} not in: {err}");
    }
    // Exactly those four problems: the tensors that do match are not reported.
    assert_eq!(err.lines().count(), 5, "{err}");
    assert_eq!(
        state::module_state(&model).unwrap(),
        before,
        "a tensor was loaded"
    );

    // The same file as a training checkpoint: same report, optimizer untouched too.
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let opt = AdamW::new(&dev, &params, 0.0).unwrap();
    let err = state::load_training(&model, &opt, &sd, &path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing: proj.bias"), "{err}");
    assert_eq!(state::module_state(&model).unwrap(), before);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn training_state_round_trips_and_a_pytorch_file_loads_as_parameters_alone() {
    let f = fixture();
    let dev = device();
    let model = model_with_torch_weights(&dev, &f);
    let named = model.parameters();
    let params: Vec<Tensor> = named.iter().map(|(_, t)| t.clone()).collect();
    let mut opt = AdamW::new(&dev, &params, f.weight_decay).unwrap();
    let input = |k: &str| dev.tensor(&f.batch.tensors[k]).unwrap();
    let loss = model
        .loss(&input("ids"), &input("mask"), &input("labels"))
        .unwrap();
    let refs: Vec<&Tensor> = params.iter().collect();
    let grads = grad(&loss, &refs).unwrap();
    opt.step(&params, &grads, &dev.scalar(f.lr, DType::F32).unwrap())
        .unwrap();
    // Left pending on purpose: saving computes it.
    let saved = state::training_state(&model, &opt, 7).unwrap();
    assert_eq!(saved.metadata["step"], "7");
    let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
    let opt_only = state::optimizer_state(&opt, &names).unwrap();
    assert_eq!(opt_only.tensors.len(), 2 * names.len() + 1);
    for (k, v) in &opt_only.tensors {
        assert!(k.starts_with("optimizer."), "{k}");
        assert_eq!(&saved.tensors[k], v, "{k}");
    }
    let dir = tmp("round-trip");
    let path = dir.join("last.safetensors");
    saved.save(&path).unwrap();

    // A fresh model and optimizer (other seed, zero moments) restored from the file.
    let other = TextEncoder::new(&dev, f.config.clone(), 5).unwrap();
    let other_params: Vec<Tensor> = other.parameters().into_iter().map(|(_, t)| t).collect();
    let other_opt = AdamW::new(&dev, &other_params, f.weight_decay).unwrap();
    let restored =
        state::load_training(&other, &other_opt, &StateDict::load(&path).unwrap(), &path).unwrap();
    assert_eq!(
        restored,
        state::Restored {
            step: Some(7),
            optimizer: true
        }
    );
    assert_eq!(state::training_state(&other, &other_opt, 7).unwrap(), saved);

    // PyTorch's model-only file: parameters load, the optimizer keeps its state, no step.
    let restored = state::load_training(&other, &other_opt, &f.init, &f.init_path).unwrap();
    assert_eq!(
        restored,
        state::Restored {
            step: None,
            optimizer: false
        }
    );
    assert_eq!(state::module_state(&other).unwrap().tensors, f.init.tensors);
    assert_eq!(
        state::optimizer_state(&other_opt, &names).unwrap(),
        opt_only
    );

    // Half of an optimizer state is an error naming what is missing; an unreadable step too.
    let mut partial = saved.clone();
    partial.tensors.remove("optimizer.proj.bias.exp_avg_sq");
    let err = state::load_training(&other, &other_opt, &partial, &path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("missing: optimizer.proj.bias.exp_avg_sq"),
        "{err}"
    );
    let mut bad_step = saved.clone();
    bad_step.metadata.insert("step".into(), "seven".into());
    let err = state::load_training(&other, &other_opt, &bad_step, &path)
        .unwrap_err()
        .to_string();
    assert!(err.contains("step") && err.contains("seven"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Mean, variance and the largest magnitude of a tensor's values.
/// SGD's momentum buffers are saved and restored: a restored run's next step equals the
/// original's, bit for bit, which it would not with fresh (zero) buffers.
#[test]
fn sgd_momentum_state_round_trips() {
    let f = fixture();
    let dev = device();
    let input = |k: &str| dev.tensor(&f.batch.tensors[k]).unwrap();
    let lr = dev.scalar(0.05, DType::F32).unwrap();
    let train_step = |model: &TextEncoder, opt: &mut Sgd| {
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        let loss = model
            .loss(&input("ids"), &input("mask"), &input("labels"))
            .unwrap();
        let grads = grad(&loss, &params.iter().collect::<Vec<_>>()).unwrap();
        opt.step(&params, &grads, &lr).unwrap();
        dev.mark_step().unwrap();
    };
    let new_sgd = |model: &TextEncoder| {
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        Sgd::new(&dev, &params, 0.9, 1e-4).unwrap()
    };
    let model = model_with_torch_weights(&dev, &f);
    let mut opt = new_sgd(&model);
    train_step(&model, &mut opt);
    train_step(&model, &mut opt);
    let saved = state::training_state(&model, &opt, 2).unwrap();
    let names: Vec<String> = model.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        state::optimizer_state(&opt, &names)
            .unwrap()
            .tensors
            .keys()
            .filter(|k| k.ends_with(".momentum_buffer"))
            .count(),
        names.len()
    );

    let restored_model = TextEncoder::new(&dev, f.config.clone(), 9).unwrap();
    let mut restored_opt = new_sgd(&restored_model);
    let fresh_model = TextEncoder::new(&dev, f.config.clone(), 9).unwrap();
    let mut fresh_opt = new_sgd(&fresh_model);
    let path = tmp("sgd").join("sgd.safetensors");
    let r = state::load_training(&restored_model, &restored_opt, &saved, &path).unwrap();
    assert_eq!((r.step, r.optimizer), (Some(2), true));
    state::load_module(&fresh_model, &saved, &path).unwrap(); // weights only

    train_step(&model, &mut opt);
    train_step(&restored_model, &mut restored_opt);
    train_step(&fresh_model, &mut fresh_opt);
    let weights = |m: &TextEncoder| state::module_state(m).unwrap().tensors;
    assert_eq!(weights(&restored_model), weights(&model));
    assert_ne!(weights(&fresh_model), weights(&model));
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

fn moments(t: &HostTensor) -> (f64, f64, f64, usize) {
    let v = t.to_f64_vec();
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let max = v.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    (mean, var, max, v.len())
}

#[test]
fn initialisation_matches_pytorchs_defaults() {
    // The default (benchmark) size, so the samples are large: 1M embedding values, 33K-262K
    // per Linear weight. Every bound below is 6 standard errors of the statistic for the
    // intended distribution (a false failure has probability ~1e-9 per check), while the
    // plausible mistakes (bound from fan_out, N(0,1) weights, U(0,1) values, a constant init)
    // miss by far more.
    let dev = device();
    let model = TextEncoder::new(&dev, TextEncoderConfig::default(), 0).unwrap();
    let sd = state::module_state(&model).unwrap();
    let fan_in: BTreeMap<&str, usize> = [("mlp.0", 128), ("mlp.2", 512), ("mlp.4", 512)]
        .into_iter()
        .chain([("proj", 256)])
        .collect();
    assert_eq!(sd.tensors.len(), 1 + 2 * fan_in.len());

    // nn.Embedding: N(0, 1). Sample mean has sd 1/sqrt(n), sample variance sd sqrt(2/n), and
    // the share within one sd (0.6827) has sd sqrt(p(1-p)/n).
    let emb = &sd.tensors["embedding.weight"];
    assert_eq!(emb.dims(), [8192, 128]);
    let (mean, var, max, n) = moments(emb);
    let se = 1.0 / (n as f64).sqrt();
    assert!(mean.abs() < 6.0 * se, "embedding mean {mean}");
    assert!(
        (var - 1.0).abs() < 6.0 * 2f64.sqrt() * se,
        "embedding var {var}"
    );
    let within = emb.to_f64_vec().iter().filter(|x| x.abs() < 1.0).count() as f64 / n as f64;
    let p = 0.682_689_5;
    assert!(
        (within - p).abs() < 6.0 * (p * (1.0 - p)).sqrt() * se,
        "embedding share within 1 sd {within}"
    );
    // Normal tails: among 1M samples the largest |x| is about 4.9.
    assert!(max > 4.0 && max < 6.5, "embedding max |x| {max}");

    // nn.Linear: weight and bias U(-b, b) with b = 1/sqrt(fan_in). Uniform: mean sd
    // b/sqrt(3n); sample variance b^2/3 with sd b^2 sqrt(4/45)/sqrt(n); P(max |x| < 0.8 b) =
    // 0.8^n <= 6e-7 for n >= 64. The two bound checks tell fan_in from fan_out in every layer
    // (1/sqrt(fan_out) is below 0.8 b or above b) in each non-square layer.
    for (layer, fan_in) in &fan_in {
        let b = 1.0 / (*fan_in as f64).sqrt();
        for kind in ["weight", "bias"] {
            let name = format!("{layer}.{kind}");
            let (mean, var, max, n) = moments(&sd.tensors[&name]);
            let rn = (n as f64).sqrt();
            assert!(max <= b * (1.0 + 1e-6), "{name}: |x| {max} above {b}");
            assert!(max > 0.8 * b, "{name}: max |x| {max}, bound {b}");
            assert!(
                mean.abs() < 6.0 * b / (3.0 * n as f64).sqrt(),
                "{name}: mean {mean}"
            );
            let want = b * b / 3.0;
            let tol = 6.0 * b * b * (4.0f64 / 45.0).sqrt() / rn;
            assert!(
                (var - want).abs() < tol,
                "{name}: var {var}, want {want} ± {tol}"
            );
        }
    }
}
