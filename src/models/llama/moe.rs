//! Mixture-of-experts feed-forward blocks: Qwen3-MoE's `Qwen3MoeSparseMoeBlock` and Mixtral's
//! `MixtralSparseMoeBlock`. A router (a linear layer, a softmax, the top `k` experts,
//! renormalised where the family does) weighs `k` of `num_experts` SwiGLU experts per token;
//! no token is dropped, as in `transformers`.
//!
//! Dispatch and combine are dense (GShard's one-hot einsums without a capacity): every expert
//! runs over every token and the router's weights, zero outside each token's top `k`, combine
//! them. Each step is then one graph of static shapes, the experts' weights are three stacked
//! tensors `[experts, ..]` that a sharding plan splits over an `expert` mesh axis, and the
//! partitioner's reduction over that axis is the only collective. It costs `experts / k` times
//! the expert FLOPs a sorted (Megablocks) dispatch would spend; `docs/design.md` ("Mixture of
//! experts") has the measurement and why this is the first of the two.

use neuron_pc_compiler::DType;
use serde_json::{json, Map, Value};

use super::keys::Keys;
use super::{proj, Family, LlamaConfig};
use crate::checkpoint::{stack_rows, STACKED};
use crate::error::{Error, Result};
use crate::nn::{join_name, one_hot, softmax, Init, Linear, Module, VarBuilder};
use crate::tensor::Tensor;

/// The settings of a mixture-of-experts decoder ([`LlamaConfig::moe`]), as `transformers`'
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
    let count = |keys: &Keys<'_>| -> Result<Option<usize>> {
        Ok(match keys.usize("num_experts")? {
            Some(n) => Some(n),
            None => keys.usize("num_local_experts")?,
        })
    };
    let dense = |keys: &Keys<'_>| -> Result<Option<MoeConfig>> {
        for key in ["num_experts", "num_local_experts", "num_experts_per_tok"] {
            if keys.get(key).is_some() {
                return Err(keys.err(
                    key,
                    format!(
                        "model_type {:?} has no experts (model_type \"qwen3_moe\" or \
                         \"mixtral\" has)",
                        family.model_type()
                    ),
                ));
            }
        }
        Ok(None)
    };
    let mut moe = match family {
        Family::Llama | Family::Mistral | Family::Qwen2 | Family::Qwen3 => return dense(keys),
        Family::Qwen3Moe => {
            let mut moe = MoeConfig::new(
                count(keys)?.unwrap_or(128),
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
                count(keys)?.unwrap_or(8),
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
pub(super) fn validate(c: &LlamaConfig, err: &dyn Fn(&str, String) -> Error) -> Result<()> {
    let sparse_family = matches!(c.family, Family::Qwen3Moe | Family::Mixtral);
    let Some(moe) = &c.moe else {
        if sparse_family {
            return Err(err(
                "num_experts",
                format!("model_type {:?} needs experts", c.family.model_type()),
            ));
        }
        return Ok(());
    };
    if !sparse_family {
        return Err(err(
            "num_experts",
            format!("model_type {:?} has no experts", c.family.model_type()),
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
    if c.family == Family::Mixtral && !moe.norm_topk_prob {
        return Err(err(
            "norm_topk_prob",
            "Mixtral always renormalises its routing weights".into(),
        ));
    }
    if c.family == Family::Mixtral && moe.expert_intermediate_size != c.intermediate_size {
        return Err(err(
            "intermediate_size",
            "Mixtral's experts are intermediate_size wide".into(),
        ));
    }
    if let Some(&l) = moe
        .mlp_only_layers
        .iter()
        .find(|&&l| l >= c.num_hidden_layers)
    {
        return Err(err(
            "mlp_only_layers",
            format!("layer {l} of {} layers", c.num_hidden_layers),
        ));
    }
    if c.scan_layers {
        return Err(err(
            "scan_layers",
            "scanned layers of experts are not supported (leave the layers unrolled)".into(),
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

/// The checkpoint's names of a family's block: under the layer, then each expert's gate, up
/// and down projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Names {
    pub(super) block: &'static str,
    projections: [&'static str; 3],
}

impl Names {
    pub(super) fn of(family: Family) -> Names {
        match family {
            Family::Mixtral => Names {
                block: "block_sparse_moe",
                projections: ["w1", "w3", "w2"],
            },
            _ => Names {
                block: "mlp",
                projections: ["gate_proj", "up_proj", "down_proj"],
            },
        }
    }
}

/// The experts of a sparse layer and their router. Parameters (under the layer's
/// `mlp.`, Mixtral's `block_sparse_moe.`): `gate.weight` `[experts, hidden]` (the router), and
/// the experts' projections stacked, named with `*` for the expert
/// (`experts.*.gate_proj.weight` `[experts, intermediate, hidden]`, Mixtral's `w1`;
/// `experts.*.up_proj.weight`, `w3`; `experts.*.down_proj.weight`
/// `[experts, hidden, intermediate]`, `w2`): in a state dict, a checkpoint or a
/// `save_pretrained` directory each expert's are its own (`experts.0.gate_proj.weight`, ...).
pub struct SparseMoeBlock {
    /// The router: `[experts, hidden]`, no bias.
    pub gate: Linear,
    /// The experts' gate projections, `[experts, intermediate, hidden]`, through SiLU.
    pub gate_proj: Tensor,
    /// The experts' up projections, `[experts, intermediate, hidden]`.
    pub up_proj: Tensor,
    /// The experts' down projections, `[experts, hidden, intermediate]`.
    pub down_proj: Tensor,
    /// Experts per token.
    pub top_k: usize,
    /// Renormalise the top `k` routing weights.
    pub norm_topk_prob: bool,
    names: Names,
}

/// What the router chose for each token: its float32 probabilities `[tokens, experts]` and a
/// 0/1 mask of each token's top `k` (no gradient), for the load-balancing loss.
pub(super) struct Routing {
    pub(super) probs: Tensor,
    pub(super) chosen: Tensor,
}

impl SparseMoeBlock {
    /// The block of `c`'s sizes under `vb` (the layer's `mlp`, or Mixtral's
    /// `block_sparse_moe`), each expert's projections read (or drawn, in expert order) and
    /// uploaded stacked, laid out by the builder's sharding plan.
    pub(super) fn from_vb(vb: &VarBuilder, c: &LlamaConfig, moe: &MoeConfig) -> Result<Self> {
        let names = Names::of(c.family);
        let (h, i, std) = (
            c.hidden_size,
            moe.expert_intermediate_size,
            c.initializer_range,
        );
        let gate = proj(vb, "gate", (h, moe.num_experts), std, false)?;
        let collected = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let shapes = [[i, h], [i, h], [h, i]];
        let mut rows: [Vec<neuron_pc_compiler::HostTensor>; 3] = Default::default();
        for e in 0..moe.num_experts {
            let expert = vb.pp(&format!("experts.{e}")).collecting(&collected);
            for (k, name) in names.projections.iter().enumerate() {
                expert
                    .pp(name)
                    .get(&shapes[k], "weight", Init::Normal { std })?;
                let (_, host) = crate::device::lock(&collected)
                    .pop()
                    .expect("a collecting builder keeps what it reads");
                rows[k].push(host);
            }
        }
        let mut stacked = Vec::with_capacity(3);
        for (k, name) in names.projections.iter().enumerate() {
            let refs: Vec<_> = rows[k].iter().collect();
            let full = join_name(
                &join_name(&join_name(vb.prefix(), "experts"), STACKED),
                &format!("{name}.weight"),
            );
            stacked.push(vb.upload_stacked(&full, &stack_rows(&refs)?)?);
        }
        let down_proj = stacked.pop().expect("three");
        let up_proj = stacked.pop().expect("three");
        let gate_proj = stacked.pop().expect("three");
        Ok(SparseMoeBlock {
            gate,
            gate_proj,
            up_proj,
            down_proj,
            top_k: moe.experts_per_token,
            norm_topk_prob: moe.norm_topk_prob,
            names,
        })
    }

    /// The checkpoint's name of this block under its layer (`mlp` or `block_sparse_moe`).
    pub(super) fn name(&self) -> &'static str {
        self.names.block
    }

    /// `x [b, s, hidden]` → `[b, s, hidden]` and what the router chose.
    pub(super) fn forward(&self, x: &Tensor) -> Result<(Tensor, Routing)> {
        let (b, s, h) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let tokens = x.reshape(&[b * s, h])?;
        // the router's logits in x's dtype, its softmax and weights in float32, the weights
        // cast back (`Qwen3MoeTopKRouter`, `MixtralTopKRouter`)
        let logits = self.gate.forward(&tokens)?;
        let probs = softmax(&logits.to_dtype(DType::F32)?, -1)?;
        let chosen = top_k_mask(&probs, self.top_k)?;
        let mut weights = probs.mul(&chosen)?;
        if self.norm_topk_prob {
            weights = weights.div(&weights.sum(&[-1], true)?)?;
        }
        let weights = weights.to_dtype(x.dtype())?;
        // every expert over every token: [tokens, experts, intermediate]
        let up = |w: &Tensor| tokens.dot_general(w, &[], &[], &[1], &[2]);
        let act = up(&self.gate_proj)?.silu()?.mul(&up(&self.up_proj)?)?;
        // each expert's output weighed by its routing weight (zero outside the top k) and
        // summed over the experts: one contraction over experts and intermediate features
        let weighted = act.mul(&weights.unsqueeze(2)?)?;
        let out = weighted.dot_general(&self.down_proj, &[], &[], &[1, 2], &[0, 2])?;
        Ok((out.reshape(&[b, s, h])?, Routing { probs, chosen }))
    }
}

impl Module for SparseMoeBlock {
    fn named_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.gate.named_params(&join_name(prefix, "gate"), out);
        let experts = join_name(&join_name(prefix, "experts"), STACKED);
        let tensors = [&self.gate_proj, &self.up_proj, &self.down_proj];
        for (name, t) in self.names.projections.iter().zip(tensors) {
            let full = join_name(&experts, &format!("{name}.weight"));
            out.push((full, t.clone()));
        }
    }
}

/// A 0/1 float32 mask `[tokens, experts]` of each row's `k` largest `probs` (`torch.topk`'s
/// choice; of equal values, the first), cut off from differentiation.
fn top_k_mask(probs: &Tensor, k: usize) -> Result<Tensor> {
    let experts = probs.dims()[1];
    let mut left = probs.detach()?;
    let mut mask: Option<Tensor> = None;
    for _ in 0..k {
        let hot = one_hot(&left.argmax(-1)?, experts, DType::F32)?;
        // probabilities are at least 0: a chosen one falls to -2 or less, below all the rest
        left = left.sub(&hot.mul_scalar(2.0)?)?;
        mask = Some(match mask {
            Some(m) => m.add(&hot)?,
            None => hot,
        });
    }
    Ok(mask.expect("k is at least 1"))
}

/// `transformers`' `load_balancing_loss_func` over the sparse layers' routing: the fraction
/// of top-`k` choices each expert got times its mean router probability, summed over the
/// experts and scaled by their number; with an `attention_mask [b, s]` only real tokens count.
pub(super) fn load_balancing_loss(
    routing: &[Routing],
    attention_mask: Option<&Tensor>,
) -> Result<Tensor> {
    let first = routing.first().expect("a sparse layer");
    let (tokens, experts) = (first.probs.dims()[0], first.probs.dims()[1]);
    let keep = match attention_mask {
        Some(m) => Some(
            m.ne(&m.zeros_like()?)?
                .to_dtype(DType::F32)?
                .reshape(&[tokens, 1])?,
        ),
        None => None,
    };
    let (mut chosen_sum, mut prob_sum) = (None::<Tensor>, None::<Tensor>);
    let add = |acc: Option<Tensor>, t: Tensor| -> Result<Option<Tensor>> {
        Ok(Some(match acc {
            Some(a) => a.add(&t)?,
            None => t,
        }))
    };
    for r in routing {
        let (chosen, probs) = match &keep {
            Some(k) => (r.chosen.mul(k)?, r.probs.mul(k)?),
            None => (r.chosen.clone(), r.probs.clone()),
        };
        chosen_sum = add(chosen_sum, chosen.sum(&[0], false)?)?;
        prob_sum = add(prob_sum, probs.sum(&[0], false)?)?;
    }
    let (chosen_sum, prob_sum) = (chosen_sum.expect("a layer"), prob_sum.expect("a layer"));
    let product = chosen_sum.mul(&prob_sum)?.sum_all()?;
    let rows = match &keep {
        Some(k) => k.sum_all()?.mul_scalar(routing.len() as f64)?,
        None => probs_count(&first.probs, tokens * routing.len())?,
    };
    product.div(&rows.mul(&rows)?)?.mul_scalar(experts as f64)
}

/// `n` as a float32 scalar on `like`'s device.
fn probs_count(like: &Tensor, n: usize) -> Result<Tensor> {
    like.device()?.scalar(n as f64, DType::F32)
}
