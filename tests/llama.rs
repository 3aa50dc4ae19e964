//! `models::llama` against Hugging Face `transformers`' `LlamaForCausalLM`: the reference values
//! in `tests/data/torch/llama*.safetensors` and the `save_pretrained` directory
//! `tests/data/llama-tiny/` were written by `scripts/fixtures/llama.py` (a tiny random config
//! built in code: vocabulary 128, hidden 32, 2 layers, 4 heads over 2 kv heads, intermediate
//! 48, rope_theta 5000, eps 1e-5, untied head, float32).
//!
//! Tolerances (float32, every element): logits `1e-5 + 1e-4 |torch|`; the loss `1e-6`
//! relative; gradients `1e-4 |torch|` plus `1e-4` of the largest entry of that parameter's
//! gradient (small entries are differences of larger terms); parameters after one AdamW step
//! `2e-6` absolute (the step moves each by about `lr` = 1e-2; an entry whose gradient is near
//! AdamW's eps carries the gradient's relative error into `m / sqrt(v)`); 30 losses `1e-4`
//! relative. Each comparison prints its largest difference.

mod torch_fixture;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use neuron_pc::checkpoint::StateDict;
use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM, LoadOptions};
use neuron_pc::nn::Module;
use neuron_pc::optim::AdamW;
use neuron_pc::{grad, DType, HostTensor, LazyDevice, Tensor};
use torch_fixture::Fixture;

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

/// The largest `|got - want| - rtol |want|`, asserted to be at most `atol`.
fn close(name: &str, got: &[f64], want: &[f64], atol: f64, rtol: f64) -> f64 {
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
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("npc-llama-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

fn tiny(fx: &Fixture) -> LlamaForCausalLM {
    LlamaForCausalLM::from_pretrained(&fx.dev, &data("llama-tiny")).unwrap()
}

fn adamw(dev: &LazyDevice, params: &[Tensor]) -> AdamW {
    let mut opt = AdamW::new(dev, params, 0.1).unwrap();
    opt.beta2 = 0.95;
    opt
}

#[test]
fn logits_loss_gradients_and_one_adamw_step_match_transformers() {
    let fx = Fixture::load("llama");
    check_one_step(&fx, &tiny(&fx));
}

/// The same with the layers stacked and run as one loop: each layer's row of a stacked
/// gradient and parameter against transformers' per-layer ones.
#[test]
fn scanned_layers_match_transformers_as_well() {
    let fx = Fixture::load("llama");
    let options = LoadOptions {
        scan_layers: true,
        ..LoadOptions::default()
    };
    let model =
        LlamaForCausalLM::from_pretrained_with(&fx.dev, &data("llama-tiny"), &options).unwrap();
    assert!(model.model.layers.is_empty() && model.model.scanned_layers.is_some());
    check_one_step(&fx, &model);
}

/// `(name, values)` of each parameter, a stacked one as its rows (`layers.0.…`, ...).
fn rows(name: &str, values: Vec<f64>, dims: &[usize]) -> Vec<(String, Vec<f64>)> {
    if !neuron_pc::checkpoint::is_stacked(name) {
        return vec![(name.to_string(), values)];
    }
    let n = values.len() / dims[0];
    values
        .chunks(n)
        .enumerate()
        .map(|(i, v)| (neuron_pc::checkpoint::stacked_row_name(name, i), v.to_vec()))
        .collect()
}

fn check_one_step(fx: &Fixture, model: &LlamaForCausalLM) {
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
    assert_eq!(
        per_layer,
        2 + 2 * 9 + 1,
        "every parameter, lm_head included"
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

#[test]
fn thirty_training_steps_follow_transformers() {
    let fx = Fixture::load("llama");
    let model = tiny(&fx);
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

    // the trained model, saved as transformers reads it (fp32 and bf16), loads back here
    let dir = TempDir::new("1");
    let ids = fx.tensor("batch.input_ids");
    let mask = fx.tensor("batch.attention_mask");
    let before = model.forward(&ids, None, Some(&mask)).unwrap();
    model.save_pretrained(dir.path(), DType::F32).unwrap();
    let loaded = LlamaForCausalLM::from_pretrained(&fx.dev, dir.path()).unwrap();
    let after = loaded.forward(&ids, None, Some(&mask)).unwrap();
    fx.dev.mark_step().unwrap();
    assert_eq!(
        values(&before),
        values(&after),
        "a float32 round trip is exact"
    );
    if std::env::var_os("NEURON_PC_REGEN_FIXTURES").is_some() {
        // inputs of `scripts/fixtures/llama.py --check`
        model
            .save_pretrained(&data("llama-saved-by-rust"), DType::F32)
            .unwrap();
        model
            .save_pretrained(&data("llama-saved-by-rust-bf16"), DType::BF16)
            .unwrap();
    }
}

/// The directories this crate wrote (`save_pretrained` after the 30 steps above, float32 and
/// bfloat16), loaded by `transformers`' `from_pretrained` (`scripts/fixtures/llama.py
/// --check`): its logits on the fixture batch agree with ours from the same directory.
#[test]
fn directories_saved_here_load_in_transformers_with_the_same_logits() {
    let fx = Fixture::load("llama");
    let ids = fx.tensor("batch.input_ids");
    let mask = fx.tensor("batch.attention_mask");
    for (dir, bf16) in [
        ("llama-saved-by-rust", false),
        ("llama-saved-by-rust-bf16", true),
        // written by examples/train_llama.rs (see tests/train_llama.rs)
        ("llama-saved-by-example", false),
    ] {
        let path = data(dir);
        let check = StateDict::load(&data(&format!(
            "torch/llama_check_{}.safetensors",
            dir.replace('-', "_")
        )))
        .unwrap();
        assert_eq!(
            check.tensors["stored_bf16"].to_f64_vec()[0],
            f64::from(u8::from(bf16))
        );
        let model = LlamaForCausalLM::from_pretrained_as(&fx.dev, &path, DType::F32).unwrap();
        let logits = model.forward(&ids, None, Some(&mask)).unwrap();
        fx.dev.mark_step().unwrap();
        let want = check.tensors["logits"].to_f64_vec();
        let d = close(dir, &values(&logits), &want, 1e-5, 1e-4);
        eprintln!("{dir}: max |diff| {d:e}");
        // and they are not the untrained model's logits
        let untrained = fx.host("logits").to_f64_vec();
        assert!(want
            .iter()
            .zip(&untrained)
            .any(|(a, b)| (a - b).abs() > 0.1));
    }
}

fn config_json(extra: &str) -> String {
    format!(
        r#"{{"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
            "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 8,
            "num_key_value_heads": 2, "rms_norm_eps": 1e-5{extra}}}"#
    )
}

#[test]
fn config_reads_both_rope_theta_forms_and_names_unsupported_keys() {
    let parse = |extra: &str| LlamaConfig::from_json_str(&config_json(extra), "config.json");
    let old = parse(r#", "rope_theta": 500000.0, "rope_scaling": null, "torch_dtype": "bfloat16""#)
        .unwrap();
    assert_eq!(old.rope_theta, 500_000.0);
    assert_eq!(old.dtype, DType::BF16);
    assert_eq!((old.head_dim, old.num_key_value_heads), (8, 2));
    assert!(!old.tie_word_embeddings);
    let new = parse(
        r#", "rope_parameters": {"rope_type": "default", "rope_theta": 250000.0},
            "dtype": "float32", "tie_word_embeddings": true, "head_dim": 16"#,
    )
    .unwrap();
    assert_eq!(new.rope_theta, 250_000.0);
    assert_eq!((new.dtype, new.head_dim), (DType::F32, 16));
    assert!(new.tie_word_embeddings);
    assert_eq!(
        parse("").unwrap().rope_theta,
        10_000.0,
        "transformers' default"
    );
    // the committed fixture's config (transformers 5 layout)
    let tiny = LlamaConfig::from_file(&data("llama-tiny/config.json")).unwrap();
    assert_eq!(tiny.rope_theta, 5000.0);
    assert_eq!(tiny.rms_norm_eps, 1e-5);
    // what we write reads back as the same config
    let text = tiny.to_json(DType::F32).to_string();
    assert_eq!(LlamaConfig::from_json_str(&text, "ours").unwrap(), tiny);

    for (extra, key) in [
        (
            r#", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}"#,
            "`rope_scaling`",
        ),
        (
            r#", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}"#,
            "`rope_parameters`",
        ),
        (r#", "attention_bias": true"#, "`attention_bias`"),
        (r#", "mlp_bias": true"#, "`mlp_bias`"),
        (r#", "hidden_act": "gelu""#, "`hidden_act`"),
        (r#", "sliding_window": 4096"#, "`sliding_window`"),
        (r#", "attention_dropout": 0.1"#, "`attention_dropout`"),
        (r#", "dtype": "int8""#, "`dtype`"),
        (r#", "num_key_value_heads": 3"#, "`num_key_value_heads`"),
        (r#", "head_dim": 7"#, "`head_dim`"),
        (r#", "hidden_size": "64""#, "`hidden_size`"),
    ] {
        let json = if extra.contains("num_key_value_heads") || extra.contains("hidden_size\"") {
            config_json("").replace(
                if extra.contains("num_key") {
                    r#""num_key_value_heads": 2"#
                } else {
                    r#""hidden_size": 64"#
                },
                &extra[2..],
            )
        } else {
            config_json(extra)
        };
        let e = LlamaConfig::from_json_str(&json, "config.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{extra}: {e}");
    }
    let e = LlamaConfig::from_json_str(r#"{"model_type": "gpt2"}"#, "c").unwrap_err();
    assert!(e.to_string().contains("`model_type`"), "{e}");
    let e = LlamaConfig::from_json_str(r#"{"model_type": "llama"}"#, "c").unwrap_err();
    assert!(e.to_string().contains("`hidden_size`: missing"), "{e}");
    let e = LlamaConfig::from_file(Path::new("/nonexistent/config.json")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/config.json"), "{e}");
}

#[test]
fn sharded_checkpoint_loads_like_the_single_file() {
    let fx = Fixture::load("llama");
    let single = tiny(&fx);
    // split the committed model.safetensors into two shards with an index, as
    // save_pretrained(max_shard_size=..) does
    let sd = StateDict::load(&data("llama-tiny/model.safetensors")).unwrap();
    let dir = TempDir::new("2");
    std::fs::copy(
        data("llama-tiny/config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let mut shards = [StateDict::default(), StateDict::default()];
    let mut weight_map = BTreeMap::new();
    for (i, (name, t)) in sd.tensors.iter().enumerate() {
        let shard = i % 2;
        shards[shard].tensors.insert(name.clone(), t.clone());
        weight_map.insert(
            name.clone(),
            format!("model-0000{}-of-00002.safetensors", shard + 1),
        );
    }
    for (i, s) in shards.iter().enumerate() {
        s.save(
            &dir.path()
                .join(format!("model-0000{}-of-00002.safetensors", i + 1)),
        )
        .unwrap();
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        dir.path().join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let sharded = LlamaForCausalLM::from_pretrained(&fx.dev, dir.path()).unwrap();
    let ids = fx.tensor("batch.input_ids");
    let a = single.forward(&ids, None, None).unwrap();
    let b = sharded.forward(&ids, None, None).unwrap();
    fx.dev.mark_step().unwrap();
    assert_eq!(values(&a), values(&b));

    // save_pretrained_sharded writes the same layout, and a later single-file save into the
    // same directory removes the shards (a load must not find stale weights)
    let out = TempDir::new("sharded-save");
    single
        .save_pretrained_sharded(out.path(), DType::F32, 20_000)
        .unwrap();
    let index = std::fs::read_to_string(out.path().join("model.safetensors.index.json")).unwrap();
    let index: serde_json::Value = serde_json::from_str(&index).unwrap();
    let files: std::collections::BTreeSet<&str> = index["weight_map"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_str().unwrap())
        .collect();
    let n = files.len();
    assert!(n >= 4, "{files:?}");
    for i in 1..=n {
        let file = format!("model-{i:05}-of-{n:05}.safetensors");
        assert!(files.contains(file.as_str()), "{files:?}");
    }
    assert_eq!(index["weight_map"].as_object().unwrap().len(), 21);
    assert!(!out.path().join("model.safetensors").exists());
    let resharded = LlamaForCausalLM::from_pretrained(&fx.dev, out.path()).unwrap();
    let c = resharded.forward(&ids, None, None).unwrap();
    fx.dev.mark_step().unwrap();
    assert_eq!(values(&a), values(&c));
    single.save_pretrained(out.path(), DType::F32).unwrap();
    let mut left: Vec<String> = std::fs::read_dir(out.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["config.json", "model.safetensors"]);

    // a missing shard is one error naming the file
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let e = LlamaForCausalLM::from_pretrained(&fx.dev, dir.path())
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("model-00002-of-00002.safetensors"),
        "{e}"
    );
    // no weights at all
    std::fs::remove_file(dir.path().join("model.safetensors.index.json")).unwrap();
    let e = LlamaForCausalLM::from_pretrained(&fx.dev, dir.path())
        .err()
        .unwrap();
    assert!(e.to_string().contains("no model.safetensors"), "{e}");
}

#[test]
fn random_init_saves_and_loads_back_fp32_and_bf16_with_tied_embeddings() {
    let fx = Fixture::load("llama");
    let mut config = LlamaConfig::new(64, 32, 48, 2, 4, 2).unwrap();
    config.tie_word_embeddings = true;
    config.initializer_range = 0.05;
    let model = LlamaForCausalLM::random(&fx.dev, &config, 3).unwrap();
    let names: Vec<String> = model.parameters().into_iter().map(|(n, _)| n).collect();
    assert!(
        !names.iter().any(|n| n.starts_with("lm_head")),
        "tied: no lm_head parameter"
    );
    let sd = neuron_pc::state::module_state(&model).unwrap();
    // transformers' initialisation: normal(0, initializer_range) weights, norms 1
    let emb = sd.tensors["model.embed_tokens.weight"].to_f64_vec();
    let std = (emb.iter().map(|v| v * v).sum::<f64>() / emb.len() as f64).sqrt();
    assert!((std - 0.05).abs() < 0.005, "embedding std {std}");
    let norm = sd.tensors["model.layers.1.post_attention_layernorm.weight"].to_f64_vec();
    assert!(norm.iter().all(|v| *v == 1.0));

    let ids = fx
        .dev
        .tensor(&HostTensor::from_slice(&[1i32, 5, 9, 63, 0, 2], &[1, 6]).unwrap());
    let ids = ids.unwrap();
    let want = model.forward(&ids, None, None).unwrap();
    fx.dev.mark_step().unwrap();
    let want = values(&want);
    for (dtype, tol) in [(DType::F32, 0.0), (DType::BF16, 2e-2)] {
        let dir = TempDir::new("3");
        model.save_pretrained(dir.path(), dtype).unwrap();
        let file = StateDict::load(&dir.path().join("model.safetensors")).unwrap();
        assert!(
            !file.tensors.contains_key("lm_head.weight"),
            "tied: lm_head not written"
        );
        assert_eq!(file.tensors.len(), sd.tensors.len());
        assert!(file.tensors.values().all(|t| t.dtype() == dtype));
        assert_eq!(file.metadata.get("format").map(String::as_str), Some("pt"));
        let config_back = LlamaConfig::from_file(&dir.path().join("config.json")).unwrap();
        assert_eq!(config_back.dtype, dtype);

        // loaded in the file's dtype: the parameters are the saved values exactly
        let loaded = LlamaForCausalLM::from_pretrained(&fx.dev, dir.path()).unwrap();
        for (name, t) in loaded.parameters() {
            assert_eq!(t.dtype(), dtype, "{name}");
            assert_eq!(t.to_host().unwrap(), file.tensors[&name], "{name}");
        }
        // in float32, the logits are the original model's (bf16: within its rounding)
        let loaded = LlamaForCausalLM::from_pretrained_as(&fx.dev, dir.path(), DType::F32);
        let logits = loaded.unwrap().forward(&ids, None, None).unwrap();
        fx.dev.mark_step().unwrap();
        let d = close(
            &format!("{dtype} round trip"),
            &values(&logits),
            &want,
            tol,
            0.0,
        );
        eprintln!("{dtype} round trip: max |diff| {d:e}");
    }

    // a bf16 model runs (logits in bf16)
    let dir = TempDir::new("4");
    model.save_pretrained(dir.path(), DType::BF16).unwrap();
    let bf = LlamaForCausalLM::from_pretrained(&fx.dev, dir.path()).unwrap();
    let logits = bf.forward(&ids, None, None).unwrap();
    assert_eq!(logits.dtype(), DType::BF16);
    fx.dev.mark_step().unwrap();
    close("bf16 compute", &values(&logits), &want, 5e-2, 0.05);
}

#[test]
fn left_padding_leaves_the_real_tokens_logits_as_without_padding() {
    let fx = Fixture::load("llama");
    let model = tiny(&fx);
    let tokens = [5i32, 17, 99, 3, 64, 8];
    let alone = fx
        .dev
        .tensor(&HostTensor::from_slice(&tokens, &[1, 6]).unwrap())
        .unwrap();
    // two padding tokens first; positions count from the first real token, as generation does
    let padded: Vec<i32> = [0, 0].iter().chain(&tokens).copied().collect();
    let padded = fx
        .dev
        .tensor(&HostTensor::from_slice(&padded, &[1, 8]).unwrap());
    let mask = HostTensor::from_slice(&[0i32, 0, 1, 1, 1, 1, 1, 1], &[1, 8]).unwrap();
    let positions = HostTensor::from_slice(&[0i32, 0, 0, 1, 2, 3, 4, 5], &[1, 8]).unwrap();
    let (mask, positions) = (
        fx.dev.tensor(&mask).unwrap(),
        fx.dev.tensor(&positions).unwrap(),
    );
    let a = model.forward(&alone, None, None).unwrap();
    let b = model
        .forward(&padded.unwrap(), Some(&positions), Some(&mask))
        .unwrap();
    fx.dev.mark_step().unwrap();
    let b = values(&b);
    assert!(b.iter().all(|v| v.is_finite()), "padded rows give no NaN");
    let d = close("left padding", &b[2 * 128..], &values(&a), 1e-5, 1e-4);
    eprintln!("left padding: max |diff| {d:e}");
}

#[test]
fn bad_inputs_are_errors() {
    let fx = Fixture::load("llama");
    let model = tiny(&fx);
    let ids = fx.tensor("batch.input_ids");
    let float_ids = ids.to_dtype(DType::F32).unwrap();
    let e = model.forward(&float_ids, None, None).err().unwrap();
    assert!(e.to_string().contains("input_ids must be integers"), "{e}");
    let short = fx.tensor("batch.attention_mask").narrow(1, 0, 4).unwrap();
    let e = model.forward(&ids, None, Some(&short)).err().unwrap();
    assert!(
        e.to_string().contains("attention_mask must be [2, 12]"),
        "{e}"
    );
    // a checkpoint whose shapes do not fit the config names the tensor
    let dir = TempDir::new("5");
    let text = std::fs::read_to_string(data("llama-tiny/config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        text.replace("\"intermediate_size\": 48", "\"intermediate_size\": 40"),
    )
    .unwrap();
    std::fs::copy(
        data("llama-tiny/model.safetensors"),
        dir.path().join("model.safetensors"),
    )
    .unwrap();
    let e = LlamaForCausalLM::from_pretrained(&fx.dev, dir.path())
        .err()
        .unwrap();
    assert!(
        e.to_string()
            .contains("model.layers.0.mlp.gate_proj.weight"),
        "{e}"
    );
}
