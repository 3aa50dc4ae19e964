//! The model of a run built from flags: its sizes, its family and, for a mixture of experts,
//! its experts (`--family qwen3_moe --experts 8 --experts-per-token 2`).

use std::path::Path;

use anyhow::bail;
use neuron_pc::models::llama::{Family, LlamaConfig, MoeConfig};

/// The flags that give the whole model, which the size flags would contradict.
const MODEL_GIVEN: [&str; 2] = ["init_from", "config"];

/// The size flags (used when neither `--init-from` nor `--config` is given).
#[derive(clap::Args, Debug)]
pub struct ModelArgs {
    #[arg(long, default_value_t = 64, conflicts_with_all = MODEL_GIVEN)]
    hidden: usize,
    #[arg(long, default_value_t = 2, conflicts_with_all = MODEL_GIVEN)]
    layers: usize,
    #[arg(long, default_value_t = 4, conflicts_with_all = MODEL_GIVEN)]
    heads: usize,
    #[arg(long, default_value_t = 2, conflicts_with_all = MODEL_GIVEN)]
    kv_heads: usize,
    /// The MLP's width (a mixture's dense layers'; Mixtral's experts').
    #[arg(long, default_value_t = 128, conflicts_with_all = MODEL_GIVEN)]
    intermediate: usize,
    /// Vocabulary (at least 256 with `--text`).
    #[arg(long, default_value_t = 256, conflicts_with_all = MODEL_GIVEN)]
    vocab: usize,
    #[arg(long, default_value_t = 10_000.0, conflicts_with_all = MODEL_GIVEN)]
    rope_theta: f64,
    /// The architecture of a model built from the size flags: llama, mistral, qwen2, qwen3,
    /// qwen3_moe or mixtral (`config.json`'s `model_type`).
    #[arg(long, default_value = "llama", conflicts_with_all = MODEL_GIVEN)]
    family: String,
    /// Tie `lm_head` to the token embeddings.
    #[arg(long, conflicts_with_all = MODEL_GIVEN)]
    tie_embeddings: bool,
    /// Experts in each layer of a mixture (qwen3_moe, mixtral).
    #[arg(long, default_value_t = 8, conflicts_with_all = MODEL_GIVEN)]
    experts: usize,
    /// Experts each token is routed to.
    #[arg(long, default_value_t = 2, conflicts_with_all = MODEL_GIVEN)]
    experts_per_token: usize,
    /// Each expert's width (qwen3_moe's `moe_intermediate_size`; default --intermediate).
    #[arg(long, conflicts_with_all = MODEL_GIVEN)]
    expert_intermediate: Option<usize>,
    /// The load-balancing loss's weight in the loss (`router_aux_loss_coef`; 0: left out).
    #[arg(long, default_value_t = 0.001, conflicts_with_all = MODEL_GIVEN)]
    router_aux_loss_coef: f64,
}

/// The config of `--config`'s file, or of the size flags for sequences of `seq_len` tokens.
pub fn model_config(
    args: &ModelArgs,
    config: Option<&Path>,
    seq_len: usize,
) -> anyhow::Result<LlamaConfig> {
    if let Some(path) = config {
        return Ok(LlamaConfig::from_file(path)?);
    }
    let Some(family) = Family::from_model_type(&args.family) else {
        let known: Vec<&str> = Family::ALL.iter().map(|f| f.model_type()).collect();
        bail!(
            "--family {}: not a supported family (one of {})",
            args.family,
            known.join(", ")
        );
    };
    let mut c = LlamaConfig::new(
        args.vocab,
        args.hidden,
        args.intermediate,
        args.layers,
        args.heads,
        args.kv_heads,
    )?
    .with_family(family);
    c.rope_theta = args.rope_theta;
    c.rms_norm_eps = 1e-5;
    c.tie_word_embeddings = args.tie_embeddings;
    c.max_position_embeddings = seq_len.max(c.max_position_embeddings);
    if matches!(family, Family::Qwen3Moe | Family::Mixtral) {
        let width = match (family, args.expert_intermediate) {
            (Family::Mixtral, Some(w)) if w != args.intermediate => bail!(
                "--expert-intermediate {w}: Mixtral's experts are --intermediate wide ({})",
                args.intermediate
            ),
            (_, w) => w.unwrap_or(args.intermediate),
        };
        let mut moe = MoeConfig::new(args.experts, args.experts_per_token, width);
        // training from scratch balances the experts, as transformers does when asked
        moe.output_router_logits = args.router_aux_loss_coef > 0.0;
        moe.router_aux_loss_coef = args.router_aux_loss_coef;
        c = c.with_moe(moe)?;
    }
    Ok(c)
}
