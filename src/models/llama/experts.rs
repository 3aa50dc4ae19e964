//! [`MoeConfig`]: the experts of a mixture-of-experts config (Qwen3-MoE, Mixtral), read from
//! and written to `config.json` as `transformers` names them; what other mixtures need is
//! refused by its key.

use serde_json::{json, Map, Value};

use super::family::Family;
use super::keys::Keys;
use crate::error::{Error, Result};

/// The settings of a mixture-of-experts decoder ([`super::LlamaConfig::moe`]), as `transformers`'
/// Qwen3-MoE and Mixtral configs name them.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct MoeConfig {
    /// Experts in each sparse layer (`num_experts`; Mixtral's `num_local_experts`).
    pub num_experts: usize,
    /// Experts each token is routed to (`num_experts_per_tok`).
    pub experts_per_token: usize,
    /// Width of each expert's gate and up projections (Qwen3-MoE's `moe_intermediate_size`;
    /// Mixtral's experts are `intermediate_size` wide).
    pub expert_intermediate_size: usize,
    /// Divide the top `k` routing weights by their sum (`norm_topk_prob`; Mixtral always does).
    pub norm_topk_prob: bool,
    /// Add the load-balancing loss to [`super::LlamaForCausalLM::loss`], as `transformers` does
    /// when `output_router_logits` is set.
    pub output_router_logits: bool,
    /// The load-balancing loss's weight in the loss (`router_aux_loss_coef`).
    pub router_aux_loss_coef: f64,
    /// Every this many layers is sparse (Qwen3-MoE's `decoder_sparse_step`, default 1).
    pub decoder_sparse_step: usize,
    /// Layers that keep a dense MLP of `intermediate_size` (Qwen3-MoE's `mlp_only_layers`).
    pub mlp_only_layers: Vec<usize>,
}

impl MoeConfig {
    /// `num_experts` experts of width `expert_intermediate_size`, `experts_per_token` of them
    /// per token, their weights renormalised, every layer sparse, and the load-balancing loss
    /// left out of the loss (`transformers`' default; see [`MoeConfig::output_router_logits`]).
    pub fn new(
        num_experts: usize,
        experts_per_token: usize,
        expert_intermediate_size: usize,
    ) -> MoeConfig {
        MoeConfig {
            num_experts,
            experts_per_token,
            expert_intermediate_size,
            norm_topk_prob: true,
            output_router_logits: false,
            router_aux_loss_coef: 0.001,
            decoder_sparse_step: 1,
            mlp_only_layers: Vec::new(),
        }
    }

    /// Whether layer `layer` has experts (else a dense MLP), as `Qwen3MoeDecoderLayer` decides.
    pub fn is_sparse(&self, layer: usize) -> bool {
        !self.mlp_only_layers.contains(&layer)
            && (layer + 1).is_multiple_of(self.decoder_sparse_step)
    }

    /// Parameters of one sparse block of hidden size `h` (the experts and the router), and the
    /// part a token uses (its `k` experts and the router).
    pub(super) fn block_parameters(&self, h: usize) -> (usize, usize) {
        let expert = 3 * h * self.expert_intermediate_size;
        let router = self.num_experts * h;
        (
            self.num_experts * expert + router,
            self.experts_per_token * expert + router,
        )
    }
}

/// Keys of other mixtures of experts that this decoder does not compute, refused by name
/// whatever the `model_type` says: DeepSeek's grouped routing and shared experts, Qwen2-MoE's
/// shared expert, gpt-oss's clamped SwiGLU and its name for `num_experts_per_tok`.
const UNSUPPORTED: [(&str, &str); 12] = [
    ("n_group", "grouped routing (DeepSeek)"),
    ("topk_group", "grouped routing (DeepSeek)"),
    ("topk_method", "DeepSeek's routing methods"),
    ("scoring_func", "a router scored other than by softmax"),
    ("routed_scaling_factor", "scaled routing weights (DeepSeek)"),
    ("n_shared_experts", "shared experts (DeepSeek)"),
    ("n_routed_experts", "DeepSeek's routed experts"),
    ("first_k_dense_replace", "DeepSeek's dense first layers"),
    (
        "shared_expert_intermediate_size",
        "a shared expert (Qwen2-MoE)",
    ),
    ("moe_layer_freq", "DeepSeek's sparse layer frequency"),
    ("swiglu_limit", "gpt-oss's clamped SwiGLU experts"),
    (
        "experts_per_token",
        "gpt-oss's experts (attention sinks, biased experts)",
    ),
];

/// Reads the experts of `family`'s config (`None` for a dense family, which must not have
/// any); any key of [`UNSUPPORTED`] is an error naming it.
pub(super) fn parse(
    keys: &Keys<'_>,
    family: Family,
    intermediate_size: usize,
) -> Result<Option<MoeConfig>> {
    for (key, what) in UNSUPPORTED {
        if keys.get(key).is_some() {
            return Err(keys.err(
                key,
                format!("{what} is not supported (the experts of qwen3_moe and mixtral are)"),
            ));
        }
    }
    let count = || -> Result<Option<usize>> {
        Ok(match keys.usize("num_experts")? {
            Some(n) => Some(n),
            None => keys.usize("num_local_experts")?,
        })
    };
    let mut moe = match family {
        Family::Llama | Family::Mistral | Family::Qwen2 | Family::Qwen3 => {
            let keys_of_experts = ["num_experts", "num_local_experts", "num_experts_per_tok"];
            return match keys_of_experts.into_iter().find(|k| keys.get(k).is_some()) {
                Some(key) => Err(keys.err(
                    key,
                    format!(
                        "model_type {:?} has no experts (model_type \"qwen3_moe\" or \
                         \"mixtral\" has)",
                        family.model_type()
                    ),
                )),
                None => Ok(None),
            };
        }
        Family::Qwen3Moe => {
            let mut moe = MoeConfig::new(
                count()?.unwrap_or(128),
                keys.usize("num_experts_per_tok")?.unwrap_or(8),
                keys.usize("moe_intermediate_size")?.unwrap_or(768),
            );
            moe.norm_topk_prob = keys.bool("norm_topk_prob")?.unwrap_or(false);
            moe.decoder_sparse_step = keys.usize("decoder_sparse_step")?.unwrap_or(1);
            if let Some(v) = keys.get("mlp_only_layers") {
                let bad = || {
                    keys.err(
                        "mlp_only_layers",
                        format!("expected layer indices, got {v}"),
                    )
                };
                let list = v.as_array().ok_or_else(bad)?;
                moe.mlp_only_layers = list
                    .iter()
                    .map(|i| i.as_u64().map(|i| i as usize).ok_or_else(bad))
                    .collect::<Result<_>>()?;
            }
            moe
        }
        Family::Mixtral => {
            if let Some(noise) = keys.f64(keys.map, "router_jitter_noise")? {
                if noise != 0.0 {
                    return Err(keys.err(
                        "router_jitter_noise",
                        format!("{noise}: router noise is not supported (use 0.0)"),
                    ));
                }
            }
            MoeConfig::new(
                count()?.unwrap_or(8),
                keys.usize("num_experts_per_tok")?.unwrap_or(2),
                intermediate_size,
            )
        }
    };
    moe.output_router_logits = keys.bool("output_router_logits")?.unwrap_or(false);
    if let Some(c) = keys.f64(keys.map, "router_aux_loss_coef")? {
        moe.router_aux_loss_coef = c;
    }
    Ok(Some(moe))
}

/// Sizes and settings that cannot make the experts are an error naming the key.
pub(super) fn validate(
    moe: Option<&MoeConfig>,
    family: Family,
    (intermediate_size, layers): (usize, usize),
    err: &dyn Fn(&str, String) -> Error,
) -> Result<()> {
    let sparse_family = matches!(family, Family::Qwen3Moe | Family::Mixtral);
    let Some(moe) = moe else {
        if sparse_family {
            return Err(err(
                "num_experts",
                format!("model_type {:?} needs experts", family.model_type()),
            ));
        }
        return Ok(());
    };
    if !sparse_family {
        return Err(err(
            "num_experts",
            format!("model_type {:?} has no experts", family.model_type()),
        ));
    }
    let (experts, k) = (moe.num_experts, moe.experts_per_token);
    if experts == 0 || moe.expert_intermediate_size == 0 || moe.decoder_sparse_step == 0 {
        let key = match (experts, moe.expert_intermediate_size) {
            (0, _) => "num_experts",
            (_, 0) => "moe_intermediate_size",
            _ => "decoder_sparse_step",
        };
        return Err(err(key, "must be positive".into()));
    }
    if k == 0 || k > experts {
        return Err(err(
            "num_experts_per_tok",
            format!("{k}: must be between 1 and the {experts} experts"),
        ));
    }
    if family == Family::Mixtral && !moe.norm_topk_prob {
        return Err(err(
            "norm_topk_prob",
            "Mixtral always renormalises its routing weights".into(),
        ));
    }
    if family == Family::Mixtral && moe.expert_intermediate_size != intermediate_size {
        return Err(err(
            "intermediate_size",
            "Mixtral's experts are intermediate_size wide".into(),
        ));
    }
    if let Some(&l) = moe.mlp_only_layers.iter().find(|&&l| l >= layers) {
        return Err(err(
            "mlp_only_layers",
            format!("layer {l} of {} layers", layers),
        ));
    }
    Ok(())
}

/// Adds the experts' keys to `family`'s `config.json`, as `transformers` reads them.
pub(super) fn write(moe: &MoeConfig, family: Family, map: &mut Map<String, Value>) {
    let mut put = |key: &str, value: Value| {
        map.insert(key.into(), value);
    };
    put("num_experts_per_tok", json!(moe.experts_per_token));
    put("output_router_logits", json!(moe.output_router_logits));
    put("router_aux_loss_coef", json!(moe.router_aux_loss_coef));
    match family {
        Family::Mixtral => {
            put("num_local_experts", json!(moe.num_experts));
            put("router_jitter_noise", json!(0.0));
        }
        _ => {
            put("num_experts", json!(moe.num_experts));
            put("moe_intermediate_size", json!(moe.expert_intermediate_size));
            put("norm_topk_prob", json!(moe.norm_topk_prob));
            put("decoder_sparse_step", json!(moe.decoder_sparse_step));
            put("mlp_only_layers", json!(moe.mlp_only_layers));
        }
    }
}
