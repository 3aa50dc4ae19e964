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

use super::config::LlamaConfig;
use super::experts::MoeConfig;
use super::family::Family;
use super::proj;
use crate::error::Result;
use crate::nn::{join_name, one_hot, softmax, Init, Linear, Module, VarBuilder};
use crate::state_dict::{stack_rows, STACKED};
use crate::tensor::Tensor;

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
    // every sparse layer's rows, one after another, as transformers concatenates them
    let all = |part: fn(&Routing) -> &Tensor| {
        Tensor::cat(&routing.iter().map(part).collect::<Vec<_>>(), 0)
    };
    let (probs, chosen) = (all(|r| &r.probs)?, all(|r| &r.chosen)?);
    let (rows, experts) = (probs.dims()[0], probs.dims()[1]);
    let fraction_times_prob = |probs: &Tensor, chosen: &Tensor| -> Result<Tensor> {
        chosen
            .sum(&[0], false)?
            .mul(&probs.sum(&[0], false)?)?
            .sum_all()
    };
    match attention_mask {
        None => fraction_times_prob(&probs, &chosen)?
            .mul_scalar(experts as f64 / (rows as f64 * rows as f64)),
        Some(m) => {
            let keep = m.ne(&m.zeros_like()?)?.to_dtype(DType::F32)?;
            let keep = keep.reshape(&[keep.elem_count(), 1])?;
            let keep = Tensor::cat(&vec![&keep; routing.len()], 0)?;
            let real = keep.sum_all()?;
            fraction_times_prob(&probs.mul(&keep)?, &chosen.mul(&keep)?)?
                .div(&real.mul(&real)?)?
                .mul_scalar(experts as f64)
        }
    }
}
