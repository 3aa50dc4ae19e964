//! The model families and rotary variants `models::llama` loads besides Llama 2, each against
//! `transformers`: `tests/data/families/<case>/` (a `save_pretrained` directory) and
//! `tests/data/torch/family_<case>.safetensors` were written by `scripts/fixtures/families.py`
//! from a tiny random config built in code (see the script for each case: Llama 3.1 rope,
//! linear, dynamic NTK and YaRN scaling, Mistral's sliding window, Qwen2's q/k/v biases with a
//! window in one layer of two, Qwen3's q/k norms).
//!
//! For each case: one step's logits, loss, every gradient and the parameters after one AdamW
//! step (the tolerances of `tests/llm/llama.rs`), 30 training steps' losses within 1e-4 relative,
//! and the directory written here after them (`<case>-saved-by-rust`) loaded by
//! `transformers`' `AutoModelForCausalLM` (`families.py --check`) with the same logits.

use crate::llm_check;
use crate::torch_fixture;

use llm_check::{check_one_step, close, data, save_round_trip, thirty_steps, values};
use neuron_pc::models::llama::{Family, LlamaConfig, LlamaForCausalLM, LoadOptions};
use neuron_pc::nn::RopeScaling;
use neuron_pc::state_dict::StateDict;
use neuron_pc::DType;
use torch_fixture::Fixture;

fn fixture(case: &str) -> Fixture {
    Fixture::load(&format!("family_{case}"))
}

fn load(fx: &Fixture, case: &str, scan_layers: bool) -> LlamaForCausalLM {
    let options = LoadOptions {
        scan_layers,
        ..LoadOptions::default()
    };
    LlamaForCausalLM::from_pretrained_with(&fx.dev, &data(&format!("families/{case}")), &options)
        .unwrap()
}

fn one_step(case: &str) {
    let fx = fixture(case);
    check_one_step(&fx, &load(&fx, case, false));
}

fn one_step_scanned(case: &str) {
    let fx = fixture(case);
    let model = load(&fx, case, true);
    assert!(model.model.scanned_layers.is_some());
    check_one_step(&fx, &model);
}

/// 30 steps, then the model saved and loaded back here exactly; with
/// NEURON_PC_REGEN_FIXTURES set, saved as `families/<case>-saved-by-rust` for
/// `families.py --check`.
fn thirty(case: &str) {
    let fx = fixture(case);
    let model = load(&fx, case, false);
    thirty_steps(&fx, &model);
    save_round_trip(&fx, &model, case);
    if std::env::var_os("NEURON_PC_REGEN_FIXTURES").is_some() {
        let saved = data(&format!("families/{case}-saved-by-rust"));
        model.save_pretrained(&saved, DType::F32).unwrap();
    }
}

/// `transformers` loads the directory saved here (as its family's class: the script asserts
/// it) and computes our logits.
fn saved_here_loads_in_transformers(case: &str) {
    let fx = fixture(case);
    let dir = data(&format!("families/{case}-saved-by-rust"));
    let model = LlamaForCausalLM::from_pretrained(&fx.dev, &dir).unwrap();
    assert_eq!(model.config, load(&fx, case, false).config);
    let check = StateDict::load(&data(&format!("torch/family_{case}_check.safetensors"))).unwrap();
    let ids = fx.tensor("batch.input_ids");
    let mask = fx.tensor("batch.attention_mask");
    let logits = model.forward(&ids, None, Some(&mask)).unwrap();
    fx.dev.mark_step().unwrap();
    let want = check.tensors["logits"].to_f64_vec();
    let d = close(case, &values(&logits), &want, 1e-5, 1e-4);
    eprintln!("{case} saved here, in transformers: max |diff| {d:e}");
    let untrained = fx.host("logits").to_f64_vec();
    assert!(
        want.iter()
            .zip(&untrained)
            .any(|(a, b)| (a - b).abs() > 0.1),
        "the trained model's logits"
    );
}

macro_rules! cases {
    ($($case:ident),*) => {$(
        mod $case {
            #[test]
            fn one_step_matches_transformers() {
                super::one_step(stringify!($case));
            }

            #[test]
            fn thirty_steps_follow_transformers() {
                super::thirty(stringify!($case));
            }

            #[test]
            fn the_directory_saved_here_loads_in_transformers() {
                super::saved_here_loads_in_transformers(stringify!($case));
            }
        }
    )*};
}

cases!(llama3, linear, dynamic, yarn, mistral, qwen2, qwen3, qwen3_moe, mixtral);

/// Scanned layers take the families' switches too (Qwen2's fixture mixes full and windowed
/// layers, which one loop body cannot: see below).
#[test]
fn scanned_layers_match_transformers_for_each_switch() {
    for case in ["llama3", "mistral", "qwen3"] {
        eprintln!("{case}:");
        one_step_scanned(case);
    }
}

#[test]
fn configs_read_each_family_and_rope_variant() {
    let config = |case: &str| {
        LlamaConfig::from_file(&data(&format!("families/{case}/config.json"))).unwrap()
    };
    let llama3 = config("llama3");
    assert_eq!((llama3.family, llama3.head_dim), (Family::Llama, 16));
    assert_eq!(
        llama3.rope_scaling,
        RopeScaling::Llama3 {
            factor: 4.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 64
        }
    );
    assert!(llama3.tie_word_embeddings);
    assert_eq!(
        config("linear").rope_scaling,
        RopeScaling::Linear { factor: 2.0 }
    );
    assert_eq!(
        config("dynamic").rope_scaling,
        RopeScaling::Dynamic {
            factor: 2.0,
            max_position_embeddings: 8
        }
    );
    let RopeScaling::Yarn {
        factor,
        original_max_position_embeddings,
        beta_fast,
        beta_slow,
        truncate,
        ..
    } = config("yarn").rope_scaling
    else {
        panic!("yarn")
    };
    assert_eq!(
        (
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            truncate
        ),
        (4.0, 64, 32.0, 1.0, true)
    );
    let yarn = config("yarn").rope_scaling.attention_scaling();
    assert!((yarn - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);

    let mistral = config("mistral");
    assert_eq!(mistral.family, Family::Mistral);
    assert_eq!((mistral.window(0), mistral.window(1)), (Some(5), Some(5)));
    let qwen2 = config("qwen2");
    assert_eq!(qwen2.family, Family::Qwen2);
    assert!(qwen2.qkv_bias() && !qwen2.attention_bias && qwen2.tie_word_embeddings);
    assert_eq!((qwen2.window(0), qwen2.window(1)), (None, Some(5)));
    let qwen3 = config("qwen3");
    assert!(qwen3.qk_norm() && !qwen3.qkv_bias() && qwen3.head_dim == 16);
    assert_eq!(qwen3.window(0), None);

    // what we write reads back as the same config, for every case
    for case in [
        "llama3", "linear", "dynamic", "yarn", "mistral", "qwen2", "qwen3",
    ] {
        let c = config(case);
        let text = c.to_json(DType::F32).to_string();
        assert_eq!(
            LlamaConfig::from_json_str(&text, case).unwrap(),
            c,
            "{case}"
        );
    }
    // transformers 4's `rope_scaling` (with `type`) and top-level `rope_theta` read as 5's
    let mut old: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(data("families/llama3/config.json")).unwrap(),
    )
    .unwrap();
    let map = old.as_object_mut().unwrap();
    map.remove("rope_parameters");
    map.insert("rope_theta".into(), 5000.0.into());
    map.insert(
        "rope_scaling".into(),
        serde_json::json!({"type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    );
    assert_eq!(
        LlamaConfig::from_json_str(&old.to_string(), "old").unwrap(),
        llama3
    );
    // Qwen's `max_window_layers` when `layer_types` is absent (layers from it on slide)
    let mut text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data("families/qwen2/config.json")).unwrap())
            .unwrap();
    text.as_object_mut().unwrap().remove("layer_types");
    let inferred = LlamaConfig::from_json_str(&text.to_string(), "qwen2").unwrap();
    assert_eq!(inferred, qwen2);
    text["use_sliding_window"] = false.into();
    let full = LlamaConfig::from_json_str(&text.to_string(), "qwen2").unwrap();
    assert_eq!((full.window(0), full.window(1)), (None, None));
}

#[test]
fn what_no_family_computes_is_one_error_naming_the_key() {
    let qwen2 = std::fs::read_to_string(data("families/qwen2/config.json")).unwrap();
    let base: serde_json::Value = serde_json::from_str(&qwen2).unwrap();
    for (edit, key) in [
        (serde_json::json!({"model_type": "gemma2"}), "`model_type`"),
        (
            serde_json::json!({"layer_types": ["full_attention"]}),
            "`layer_types`",
        ),
        (
            serde_json::json!({"layer_types": ["full_attention", "chunked"]}),
            "`layer_types`",
        ),
        (serde_json::json!({"sliding_window": 0}), "`sliding_window`"),
        (
            serde_json::json!({"rope_parameters": {"rope_type": "yarn", "factor": 0}}),
            "`rope_parameters.factor`",
        ),
        (
            serde_json::json!({"rope_parameters": {"rope_type": "llama3", "factor": 8,
                "low_freq_factor": 1, "high_freq_factor": 1}}),
            "`rope_parameters.high_freq_factor`",
        ),
    ] {
        let mut json = base.clone();
        for (k, v) in edit.as_object().unwrap() {
            json[k] = v.clone();
        }
        let e = LlamaConfig::from_json_str(&json.to_string(), "config.json")
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{edit}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    // a Llama config has no window; a Mistral one has no biases to switch on
    let llama = std::fs::read_to_string(data("families/linear/config.json")).unwrap();
    let e = LlamaConfig::from_json_str(
        &llama.replace("\"vocab_size\"", "\"sliding_window\": 8, \"vocab_size\""),
        "c",
    )
    .unwrap_err();
    assert!(e.to_string().contains("`sliding_window`"), "{e}");

    // one loop body cannot be both a full and a windowed layer
    let fx = fixture("qwen2");
    let options = LoadOptions {
        scan_layers: true,
        ..LoadOptions::default()
    };
    let e = LlamaForCausalLM::from_pretrained_with(&fx.dev, &data("families/qwen2"), &options)
        .err()
        .expect("mixed layers cannot be scanned")
        .to_string();
    assert!(e.contains("scan_layers") && e.contains("layer 1"), "{e}");
}

/// A window at least as long as the sequence is full causal attention (and adds no mask), a
/// shorter one is not: the band is what makes Mistral differ.
#[test]
fn a_window_longer_than_the_sequence_changes_nothing() {
    let fx = fixture("mistral");
    let dir = data("families/mistral");
    let windowed = LlamaForCausalLM::from_pretrained(&fx.dev, &dir).unwrap();
    let mut wide = LlamaForCausalLM::from_pretrained(&fx.dev, &dir).unwrap();
    let mut full = LlamaForCausalLM::from_pretrained(&fx.dev, &dir).unwrap();
    for layer in &mut wide.model.layers {
        layer.self_attn.sliding_window = Some(12);
    }
    wide.config.sliding_window = Some(12);
    for layer in &mut full.model.layers {
        layer.self_attn.sliding_window = None;
    }
    full.config.sliding_window = None;
    let ids = fx.tensor("batch.input_ids");
    let [a, b, c] = [&windowed, &wide, &full].map(|m| m.forward(&ids, None, None).unwrap());
    fx.dev.mark_step().unwrap();
    assert_eq!(values(&b), values(&c));
    let d = values(&a)
        .iter()
        .zip(values(&c))
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    assert!(
        d > 1e-3,
        "a window of 5 over 12 tokens changes the logits ({d})"
    );
}

/// The `config.json` files of checkpoints users bring, as published (transformers 4 layout:
/// `rope_scaling`, top-level `rope_theta`, `torch_dtype`), read with the published parameter
/// counts (Llama 3.2 1B: 1.24B; Qwen2.5 0.5B: 494M; Qwen3 0.6B: 596M, 440M without the
/// embeddings; Mistral 7B: 7.24B).
#[test]
fn published_configs_read_with_their_parameter_counts() {
    let llama_3_2_1b = r#"{"architectures": ["LlamaForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": 128001,
        "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
        "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256}"#;
    let qwen2_5_0_5b = r#"{"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": 151643, "eos_token_id": 151643, "hidden_act": "silu",
        "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
        "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2",
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
        "tie_word_embeddings": true, "torch_dtype": "bfloat16",
        "transformers_version": "4.40.1", "use_cache": true, "use_sliding_window": false,
        "vocab_size": 151936}"#;
    let qwen3_0_6b = r#"{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
        "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
        "head_dim": 128, "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
        "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
        "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null,
        "rope_theta": 1000000, "sliding_window": null, "tie_word_embeddings": true,
        "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
        "use_sliding_window": false, "vocab_size": 151936}"#;
    let mistral_7b = r#"{"architectures": ["MistralForCausalLM"], "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
        "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
        "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": true,
        "vocab_size": 32000}"#;
    let read = |text: &str| LlamaConfig::from_json_str(text, "config.json").unwrap();

    let llama = read(llama_3_2_1b);
    assert_eq!(llama.num_parameters(), 1_235_814_400);
    assert_eq!((llama.rope_theta, llama.dtype), (500_000.0, DType::BF16));
    assert!(matches!(
        llama.rope_scaling,
        RopeScaling::Llama3 { factor, original_max_position_embeddings: 8192, .. } if factor == 32.0
    ));
    let qwen2 = read(qwen2_5_0_5b);
    assert_eq!(qwen2.num_parameters(), 494_032_768);
    assert_eq!(qwen2.window(23), None, "use_sliding_window is false");
    let qwen3 = read(qwen3_0_6b);
    assert_eq!(qwen3.num_parameters(), 596_049_920);
    let embeddings = qwen3.vocab_size * qwen3.hidden_size;
    assert_eq!(qwen3.num_parameters() - embeddings, 440_467_456);
    let mistral = read(mistral_7b);
    assert_eq!(mistral.num_parameters(), 7_241_732_096);
    assert_eq!(
        (mistral.window(0), mistral.window(31)),
        (Some(4096), Some(4096))
    );
    // Qwen2.5's long-context recipe: YaRN in the old layout
    let yarn = qwen2_5_0_5b.replace(
        r#""rope_theta": 1000000.0,"#,
        r#""rope_theta": 1000000.0, "rope_scaling": {"factor": 4.0,
            "original_max_position_embeddings": 32768, "type": "yarn"},"#,
    );
    let yarn = read(&yarn).rope_scaling;
    assert!(matches!(yarn, RopeScaling::Yarn { factor, .. } if factor == 4.0));
    assert!((yarn.attention_scaling() - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
}
