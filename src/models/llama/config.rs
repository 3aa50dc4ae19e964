//! `LlamaConfig`: the sizes of a Llama model, read from (and written as) a Hugging Face
//! `config.json`.

use std::path::Path;

use neuron_pc_compiler::DType;
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// The settings of a Llama-family model (Llama 2/3, Mistral-style grouped-query attention)
/// that change what the model computes, as `transformers`' `LlamaConfig` names them.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); equal to the query heads for plain MHA.
    pub num_key_value_heads: usize,
    /// `hidden_size / num_attention_heads` unless the config gives `head_dim`.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// `lm_head` shares `model.embed_tokens.weight` (then no `lm_head.weight` is stored).
    pub tie_word_embeddings: bool,
    /// The standard deviation of the random initialisation (weights only; norms are 1).
    pub initializer_range: f64,
    pub max_position_embeddings: usize,
    /// The dtype the checkpoint is stored in (`dtype`, or `torch_dtype` in older configs).
    pub dtype: DType,
    /// neuron-pc's own switch, not in `config.json`: the decoder layers are stacked and run as
    /// one loop (`nn::ScannedLayers`), so the step graph, and the time to compile it, do not
    /// grow with depth. The state-dict names and checkpoints are the same either way. Off by
    /// default: see `docs/design.md` ("Scanned layers") for what it costs and when it pays.
    pub scan_layers: bool,
}

impl LlamaConfig {
    /// A config from explicit sizes, with the defaults of `transformers`' `LlamaConfig` for
    /// the rest (eps 1e-6, `rope_theta` 10000, untied, initializer range 0.02, float32).
    pub fn new(
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
    ) -> Result<LlamaConfig> {
        let c = LlamaConfig {
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim: hidden_size / num_attention_heads.max(1),
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            tie_word_embeddings: false,
            initializer_range: 0.02,
            max_position_embeddings: 2048,
            dtype: DType::F32,
            scan_layers: false,
        };
        c.validate("LlamaConfig::new")?;
        Ok(c)
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_file(path: &Path) -> Result<LlamaConfig> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("{}: cannot read: {e}", path.display())))?;
        LlamaConfig::from_json_str(&text, &path.display().to_string())
    }

    /// Parses the text of a `config.json`; `origin` names it in errors. `rope_theta` may be
    /// top-level (older configs) or under `rope_parameters` (what transformers 5 writes). A
    /// setting this implementation does not compute (rope scaling, attention or MLP biases,
    /// another activation, dropout) is an error naming the key, never silently ignored.
    pub fn from_json_str(text: &str, origin: &str) -> Result<LlamaConfig> {
        let err = |key: &str, message: String| {
            Error::Config(format!("{origin}: config key `{key}`: {message}"))
        };
        let value: Value = serde_json::from_str(text)
            .map_err(|e| Error::Config(format!("{origin}: not valid JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(Error::Config(format!("{origin}: not a JSON object")));
        };
        let get = |key: &str| map.get(key).filter(|v| !v.is_null());
        let usize_key = |key: &str| -> Result<Option<usize>> {
            match get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .filter(|n| *n > 0)
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| err(key, format!("expected a positive integer, got {v}"))),
            }
        };
        let required = |key: &str| -> Result<usize> {
            usize_key(key)?.ok_or_else(|| err(key, "missing (a Llama config needs it)".into()))
        };
        let f64_key = |m: &Map<String, Value>, key: &str| -> Result<Option<f64>> {
            match m.get(key).filter(|v| !v.is_null()) {
                None => Ok(None),
                Some(v) => v
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| err(key, format!("expected a number, got {v}"))),
            }
        };
        let bool_key = |key: &str| -> Result<Option<bool>> {
            match get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_bool()
                    .map(Some)
                    .ok_or_else(|| err(key, format!("expected true or false, got {v}"))),
            }
        };

        if let Some(t) = get("model_type") {
            if !matches!(t.as_str(), Some("llama") | Some("mistral")) {
                return Err(err(
                    "model_type",
                    format!("{t} is not a Llama-family model (expected \"llama\")"),
                ));
            }
        }
        if let Some(w) = get("sliding_window") {
            return Err(err(
                "sliding_window",
                format!("sliding-window attention ({w}) is not supported"),
            ));
        }
        if let Some(act) = get("hidden_act") {
            if act.as_str() != Some("silu") {
                return Err(err(
                    "hidden_act",
                    format!("{act} is not supported (Llama's MLP uses \"silu\")"),
                ));
            }
        }
        for key in ["attention_bias", "mlp_bias"] {
            if bool_key(key)? == Some(true) {
                return Err(err(
                    key,
                    "biases in the projections are not supported".into(),
                ));
            }
        }
        for key in ["attention_dropout", "hidden_dropout"] {
            if let Some(p) = f64_key(&map, key)? {
                if p != 0.0 {
                    return Err(err(key, format!("dropout {p} is not supported (use 0.0)")));
                }
            }
        }

        // rope: `rope_scaling` (transformers 4) or `rope_parameters` (transformers 5)
        let rope_type_ok = |key: &str, m: &Map<String, Value>| -> Result<()> {
            let ty = m.get("rope_type").or_else(|| m.get("type"));
            match ty.and_then(|t| t.as_str()) {
                None | Some("default") => Ok(()),
                Some(other) => Err(err(
                    key,
                    format!(
                        "rope type {other:?} is not supported (only \"default\" rotary \
                         embeddings)"
                    ),
                )),
            }
        };
        if let Some(s) = get("rope_scaling") {
            match s {
                Value::Object(m) => rope_type_ok("rope_scaling", m)?,
                other => return Err(err("rope_scaling", format!("expected an object: {other}"))),
            }
        }
        let mut rope_theta = f64_key(&map, "rope_theta")?;
        if let Some(p) = get("rope_parameters") {
            let Value::Object(m) = p else {
                return Err(err("rope_parameters", format!("expected an object: {p}")));
            };
            rope_type_ok("rope_parameters", m)?;
            if let Some(t) = f64_key(m, "rope_theta")? {
                rope_theta = Some(t);
            }
        }
        let rope_theta = rope_theta.unwrap_or(10_000.0);
        if rope_theta <= 0.0 {
            return Err(err(
                "rope_theta",
                format!("must be positive, got {rope_theta}"),
            ));
        }

        let dtype = match get("dtype").or_else(|| get("torch_dtype")) {
            None => DType::F32,
            Some(v) => match v.as_str() {
                Some("float32") => DType::F32,
                Some("bfloat16") => DType::BF16,
                Some("float16") => DType::F16,
                _ => {
                    let key = if get("dtype").is_some() {
                        "dtype"
                    } else {
                        "torch_dtype"
                    };
                    return Err(err(
                        key,
                        format!("{v} is not supported (float32, bfloat16 or float16)"),
                    ));
                }
            },
        };

        let hidden_size = required("hidden_size")?;
        let num_attention_heads = required("num_attention_heads")?;
        let config = LlamaConfig {
            vocab_size: required("vocab_size")?,
            hidden_size,
            intermediate_size: required("intermediate_size")?,
            num_hidden_layers: required("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: usize_key("num_key_value_heads")?.unwrap_or(num_attention_heads),
            head_dim: usize_key("head_dim")?.unwrap_or(hidden_size / num_attention_heads),
            rms_norm_eps: f64_key(&map, "rms_norm_eps")?.unwrap_or(1e-6),
            rope_theta,
            tie_word_embeddings: bool_key("tie_word_embeddings")?.unwrap_or(false),
            initializer_range: f64_key(&map, "initializer_range")?.unwrap_or(0.02),
            max_position_embeddings: usize_key("max_position_embeddings")?.unwrap_or(2048),
            dtype,
            scan_layers: false,
        };
        config.validate(origin)?;
        Ok(config)
    }

    /// Sizes that cannot make a model are an error naming the key.
    fn validate(&self, origin: &str) -> Result<()> {
        let err = |key: &str, message: String| {
            Err(Error::Config(format!(
                "{origin}: config key `{key}`: {message}"
            )))
        };
        for (key, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
        ] {
            if v == 0 {
                return err(key, "must be positive".into());
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return err(
                "num_key_value_heads",
                format!(
                    "{} key/value heads do not divide the {} attention heads",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            );
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return err(
                "head_dim",
                format!(
                    "{} (rotary embeddings need an even, positive head dimension)",
                    self.head_dim
                ),
            );
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps <= 0.0 {
            return err(
                "rms_norm_eps",
                format!("must be positive, got {}", self.rms_norm_eps),
            );
        }
        Ok(())
    }

    /// The `config.json` `save_pretrained` would write for this model (transformers 5
    /// layout: `rope_parameters`, `dtype`), loadable by `LlamaForCausalLM.from_pretrained`.
    pub fn to_json(&self, dtype: DType) -> Value {
        let dtype = match dtype {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        };
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": false,
            "attention_dropout": 0.0,
            "bos_token_id": null,
            "eos_token_id": null,
            "pad_token_id": null,
            "dtype": dtype,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "hidden_size": self.hidden_size,
            "initializer_range": self.initializer_range,
            "intermediate_size": self.intermediate_size,
            "max_position_embeddings": self.max_position_embeddings,
            "mlp_bias": false,
            "num_attention_heads": self.num_attention_heads,
            "num_hidden_layers": self.num_hidden_layers,
            "num_key_value_heads": self.num_key_value_heads,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": {"rope_theta": self.rope_theta, "rope_type": "default"},
            "tie_word_embeddings": self.tie_word_embeddings,
            "use_cache": true,
            "vocab_size": self.vocab_size,
        })
    }

    /// Parameters of the model (embeddings counted once when tied).
    pub fn num_parameters(&self) -> usize {
        let (h, i) = (self.hidden_size, self.intermediate_size);
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h;
        let head = if self.tie_word_embeddings {
            0
        } else {
            self.vocab_size * h
        };
        self.vocab_size * h + self.num_hidden_layers * layer + h + head
    }

    /// Matmul FLOPs of one training step (forward and backward, `6 N` per token for the
    /// weights plus the attention products) for `batch` sequences of `seq` tokens.
    pub fn training_flops(&self, batch: usize, seq: usize) -> f64 {
        let tokens = (batch * seq) as f64;
        let embed = (self.vocab_size * self.hidden_size) as f64;
        // the embedding lookup is a gather, not a matmul; the lm head is one
        let matmul_params =
            self.num_parameters() as f64 - if self.tie_word_embeddings { 0.0 } else { embed };
        // q k^T and p v: 2 * 2 * seq * head_dim * heads per token and layer, forward
        let attn =
            4.0 * (seq * self.head_dim * self.num_attention_heads * self.num_hidden_layers) as f64;
        3.0 * tokens * (2.0 * matmul_params + attn)
    }
}
