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

use crate::llm_check;
use crate::torch_fixture;

use std::collections::BTreeMap;
use std::path::Path;

use llm_check::{check_one_step, close, data, save_round_trip, thirty_steps, values, TempDir};
use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM, LoadOptions};
use neuron_pc::nn::Module;
use neuron_pc::state_dict::StateDict;
use neuron_pc::{DType, HostTensor};
use torch_fixture::Fixture;

fn tiny(fx: &Fixture) -> LlamaForCausalLM {
    LlamaForCausalLM::from_pretrained(&fx.dev, &data("llama-tiny")).unwrap()
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

#[test]
fn thirty_training_steps_follow_transformers() {
    let fx = Fixture::load("llama");
    let model = tiny(&fx);
    thirty_steps(&fx, &model);

    save_round_trip(&fx, &model, "llama");
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
        // written by examples/train_llama/main.rs (see tests/jobs/train_llama.rs)
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
            "`rope_scaling.low_freq_factor`: missing",
        ),
        (
            r#", "rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}"#,
            "`rope_parameters.rope_type`",
        ),
        (
            r#", "rope_scaling": {"type": "linear", "factor": -2}"#,
            "`rope_scaling.factor`: must be positive",
        ),
        (
            r#", "rope_parameters": {"full_attention": {"rope_type": "default"}}"#,
            "`rope_parameters`: rotary parameters per layer type",
        ),
        (
            r#", "partial_rotary_factor": 0.5"#,
            "`partial_rotary_factor`",
        ),
        (r#", "attention_bias": 1"#, "`attention_bias`"),
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
    assert!(
        e.to_string().contains("`num_hidden_layers`: missing"),
        "{e}"
    );
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
