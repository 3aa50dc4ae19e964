//! The Llama family of decoder-only language models: Llama 2, 3 and 3.1+ (with their rotary
//! scalings), Mistral (sliding-window attention), Qwen2/2.5 (q/k/v biases), Qwen3 (q/k
//! norms) and the mixtures of experts Qwen3-MoE and Mixtral ([`MoeConfig`],
//! [`SparseMoeBlock`]) are one decoder whose [`LlamaConfig`] switches what differs ([`Family`],
//! read from `config.json`'s `model_type`; see [`crate::models::mistral`],
//! [`crate::models::qwen2`], [`crate::models::qwen3`]). Parameter names are `transformers`',
//! so the directory `save_pretrained` writes loads here and the one
//! [`LlamaForCausalLM::save_pretrained`] writes loads there as the same family.
//!
//! ```no_run
//! use neuron_pc::models::llama::LlamaForCausalLM;
//! # fn main() -> neuron_pc::Result<()> {
//! let device = neuron_pc::LazyDevice::from_env()?;
//! let model = LlamaForCausalLM::from_pretrained(&device, "save_pretrained_dir".as_ref())?;
//! # Ok(()) }
//! ```
//!
//! A random model of given sizes, its next-token loss (the labels are the inputs: the shift
//! is inside) and a greedy continuation, then saved for `transformers`:
//!
//! ```no_run
//! use neuron_pc::models::llama::{Family, GenerateOptions, LlamaConfig, LlamaForCausalLM};
//! use neuron_pc::{DType, HostTensor, LazyDevice};
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! // vocabulary 256, hidden 64, MLP 128, 2 layers, 4 query heads, 2 key/value heads
//! let config = LlamaConfig::new(256, 64, 128, 2, 4, 2)?.with_family(Family::Qwen2);
//! let model = LlamaForCausalLM::random(&device, &config, 0)?;
//! let ids = device.tensor(&HostTensor::from_slice(&[1i32, 5, 9, 2, 7, 3], &[1, 6])?)?;
//! let loss = model.loss(&ids, None, &ids)?;
//! device.mark_step()?;
//! println!("loss {:.3}", loss.item()?);
//! let new_tokens = model.generate(&[vec![1, 5, 9]], &GenerateOptions::greedy(8))?;
//! println!("{:?}", new_tokens[0]);
//! model.save_pretrained("qwen2_dir".as_ref(), DType::BF16)?;
//! # Ok(()) }
//! ```

mod config;
mod eval;
mod experts;
mod family;
mod generate;
mod keys;
mod masks;
mod moe;
mod pretrained;
mod sample;
mod sharding;

use neuron_pc_compiler::DType;

pub use config::LlamaConfig;
pub use experts::MoeConfig;
pub use family::Family;
pub use generate::{GenerateOptions, Sampling};
pub use moe::SparseMoeBlock;
pub use sharding::LlamaSharding;

use crate::device::LazyDevice;
use crate::error::{Error, Result};
use crate::nn::{
    apply_rotary_pos_emb, chunked_cross_entropy, cross_entropy, remat,
    scaled_dot_product_attention, CrossEntropyOptions, Embedding, Init, Linear, Module, RMSNorm,
    Remat, RotaryEmbedding, ScannedLayers, VarBuilder,
};
use crate::tensor::{shape_error, Tensor};

/// A projection initialised as `transformers` does (weight normal with std
/// `initializer_range`, bias zero).
fn proj(
    vb: &VarBuilder,
    name: &str,
    (inputs, outputs): (usize, usize),
    std: f64,
    bias: bool,
) -> Result<Linear> {
    let vb = vb.pp(name);
    Ok(Linear {
        weight: vb.get(&[outputs, inputs], "weight", Init::Normal { std })?,
        bias: match bias {
            true => Some(vb.get(&[outputs], "bias", Init::Const(0.0))?),
            false => None,
        },
    })
}

/// `LlamaRMSNorm`: the statistics in float32 whatever the input's dtype, the result cast
/// back before the weight is applied.
fn rms_norm(norm: &RMSNorm, x: &Tensor) -> Result<Tensor> {
    let dtype = x.dtype();
    let x32 = x.to_dtype(DType::F32)?;
    let var = x32.mul(&x32)?.mean(&[-1], true)?;
    let eps = norm.eps.unwrap_or(1e-6);
    let normed = x32.mul(&var.add_scalar(eps)?.rsqrt()?)?.to_dtype(dtype)?;
    normed.mul(&norm.weight)
}

/// `self_attn`: the q/k/v/o projections with grouped-query heads.
#[derive(Module)]
pub struct LlamaAttention {
    /// Queries: `[num_heads * head_dim, hidden]`.
    pub q_proj: Linear,
    /// Keys: `[num_kv_heads * head_dim, hidden]`.
    pub k_proj: Linear,
    /// Values: `[num_kv_heads * head_dim, hidden]`.
    pub v_proj: Linear,
    /// The heads' outputs back to the hidden size: `[hidden, num_heads * head_dim]`.
    pub o_proj: Linear,
    /// Qwen3's RMSNorm over each head of q (`[head_dim]`), before the rotation.
    pub q_norm: Option<RMSNorm>,
    /// Qwen3's RMSNorm over each head of k.
    pub k_norm: Option<RMSNorm>,
    /// This layer's attention window ([`LlamaConfig::window`]); `None`: full causal attention.
    #[module(skip)]
    pub sliding_window: Option<usize>,
    /// Query heads ([`LlamaConfig::num_attention_heads`]).
    #[module(skip)]
    pub num_heads: usize,
    /// Key/value heads ([`LlamaConfig::num_key_value_heads`]), each shared by
    /// `num_heads / num_kv_heads` query heads.
    #[module(skip)]
    pub num_kv_heads: usize,
    /// Width of each head ([`LlamaConfig::head_dim`]).
    #[module(skip)]
    pub head_dim: usize,
}

impl LlamaAttention {
    /// The projections (and Qwen3's q/k norms) of `c`'s sizes, read or initialised from `vb`
    /// (`q_proj.weight`, ...). The window is left `None`: the caller sets
    /// [`LlamaAttention::sliding_window`] for its layer.
    pub fn from_vb(vb: &VarBuilder, c: &LlamaConfig) -> Result<LlamaAttention> {
        let (h, d, std) = (c.hidden_size, c.head_dim, c.initializer_range);
        let (q, kv, qkv_bias) = (
            c.num_attention_heads * d,
            c.num_key_value_heads * d,
            c.qkv_bias(),
        );
        let norm = |name: &str| -> Result<Option<RMSNorm>> {
            match c.qk_norm() {
                true => Ok(Some(RMSNorm::from_vb(
                    &vb.pp(name),
                    d,
                    Some(c.rms_norm_eps),
                )?)),
                false => Ok(None),
            }
        };
        Ok(LlamaAttention {
            q_proj: proj(vb, "q_proj", (h, q), std, qkv_bias)?,
            k_proj: proj(vb, "k_proj", (h, kv), std, qkv_bias)?,
            v_proj: proj(vb, "v_proj", (h, kv), std, qkv_bias)?,
            o_proj: proj(vb, "o_proj", (q, h), std, c.attention_bias)?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            sliding_window: None,
            num_heads: c.num_attention_heads,
            num_kv_heads: c.num_key_value_heads,
            head_dim: d,
        })
    }

    /// `x [b, s, hidden]`, the rotary tables and a key mask → `[b, s, hidden]`. With a
    /// `cache` (generation), this step's keys and values are written into it at its index
    /// and the queries attend over the whole cache, as `key_mask` (then `[b, 1, s, cache]`,
    /// causal order included) says.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        key_mask: Option<&Tensor>,
        cache: Option<&mut generate::LayerCache>,
    ) -> Result<Tensor> {
        let (b, s) = (x.dims()[0], x.dims()[1]);
        let heads = |p: &Linear, n: usize, norm: Option<&RMSNorm>| -> Result<Tensor> {
            let t = p.forward(x)?.reshape(&[b, s, n, self.head_dim])?;
            let t = match norm {
                Some(norm) => rms_norm(norm, &t)?,
                None => t,
            };
            t.permute(&[0, 2, 1, 3]) // [b, n, s, head_dim]
        };
        // Under autocast the projections come out in the lower precision; the rotation runs in
        // the hidden states' dtype and the attention in the autocast dtype, as in transformers
        // (its bf16 q times its float32 cos promotes; its matmuls cast back). Without
        // autocast both are the hidden states' dtype and nothing is cast.
        let compute = x.device()?.autocast_dtype().unwrap_or(x.dtype());
        let rotated = |t: Tensor| -> Result<Tensor> {
            apply_rotary_pos_emb(&t.to_dtype(x.dtype())?, cos, sin)?.to_dtype(compute)
        };
        let q = rotated(heads(&self.q_proj, self.num_heads, self.q_norm.as_ref())?)?;
        let k = rotated(heads(
            &self.k_proj,
            self.num_kv_heads,
            self.k_norm.as_ref(),
        )?)?;
        let v = heads(&self.v_proj, self.num_kv_heads, None)?.to_dtype(compute)?;
        let (k, v, causal) = match cache {
            None => (k, v, true),
            Some(cache) => {
                cache.write(&k, &v)?;
                (cache.k.clone(), cache.v.clone(), false)
            }
        };
        let ctx = scaled_dot_product_attention(&q, &k, &v, key_mask, causal, None)?
            .permute(&[0, 2, 1, 3])?
            .reshape(&[b, s, self.num_heads * self.head_dim])?;
        self.o_proj.forward(&ctx)
    }
}

/// `mlp`: SwiGLU, `down(silu(gate(x)) * up(x))`.
#[derive(Module)]
pub struct LlamaMlp {
    /// `[intermediate, hidden]`, its output through SiLU.
    pub gate_proj: Linear,
    /// `[intermediate, hidden]`, multiplied by the gate.
    pub up_proj: Linear,
    /// `[hidden, intermediate]`, back to the hidden size.
    pub down_proj: Linear,
}

impl LlamaMlp {
    /// The three projections of `c`'s sizes (biases with [`LlamaConfig::mlp_bias`]), read or
    /// initialised from `vb`.
    pub fn from_vb(vb: &VarBuilder, c: &LlamaConfig) -> Result<LlamaMlp> {
        let (h, i, std, bias) = (
            c.hidden_size,
            c.intermediate_size,
            c.initializer_range,
            c.mlp_bias,
        );
        Ok(LlamaMlp {
            gate_proj: proj(vb, "gate_proj", (h, i), std, bias)?,
            up_proj: proj(vb, "up_proj", (h, i), std, bias)?,
            down_proj: proj(vb, "down_proj", (i, h), std, bias)?,
        })
    }

    /// `x [.., hidden]` → `[.., hidden]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gated = self.gate_proj.forward(x)?.silu()?;
        self.down_proj
            .forward(&gated.mul(&self.up_proj.forward(x)?)?)
    }
}

/// A layer's feed-forward block: a dense MLP, or experts and their router.
pub enum FeedForward {
    /// `mlp`: one SwiGLU MLP.
    Dense(LlamaMlp),
    /// `mlp` (Qwen3-MoE) or `block_sparse_moe` (Mixtral): experts and their router.
    Sparse(SparseMoeBlock),
}

/// `model.layers.N`: pre-norm attention and feed-forward blocks, each with a residual
/// connection.
pub struct LlamaDecoderLayer {
    /// The attention block.
    pub self_attn: LlamaAttention,
    /// The feed-forward block (parameters under `mlp.`, or Mixtral's `block_sparse_moe.`).
    pub mlp: FeedForward,
    /// The RMSNorm before the attention.
    pub input_layernorm: RMSNorm,
    /// The RMSNorm before the MLP.
    pub post_attention_layernorm: RMSNorm,
    /// What the layer keeps for the backward pass: everything ([`Remat::None`], the
    /// default), its input alone ([`Remat::Full`]) or its projections ([`Remat::Dots`]); see
    /// [`crate::nn::checkpoint`] and [`LlamaForCausalLM::set_remat`].
    pub remat: Remat,
}

impl Module for LlamaDecoderLayer {
    fn named_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        let name = |n: &str| crate::nn::join_name(prefix, n);
        self.self_attn.named_params(&name("self_attn"), out);
        match &self.mlp {
            FeedForward::Dense(mlp) => mlp.named_params(&name("mlp"), out),
            FeedForward::Sparse(block) => block.named_params(&name(block.name()), out),
        }
        self.input_layernorm
            .named_params(&name("input_layernorm"), out);
        self.post_attention_layernorm
            .named_params(&name("post_attention_layernorm"), out);
    }
}

impl LlamaDecoderLayer {
    /// One dense layer of `c`'s sizes, read or initialised from `vb` (`self_attn.…`, `mlp.…`,
    /// the norms), keeping everything for the backward pass; its window is left `None` as
    /// [`LlamaAttention::from_vb`] leaves it.
    pub fn from_vb(vb: &VarBuilder, c: &LlamaConfig) -> Result<LlamaDecoderLayer> {
        LlamaDecoderLayer::from_vb_at(vb, c, None)
    }

    /// Layer `index` of `c` ([`LlamaDecoderLayer::from_vb`]): with experts where
    /// [`LlamaConfig::is_sparse`] says (`index` `None`: dense).
    pub fn from_vb_at(
        vb: &VarBuilder,
        c: &LlamaConfig,
        index: Option<usize>,
    ) -> Result<LlamaDecoderLayer> {
        let eps = Some(c.rms_norm_eps);
        // read (or drawn) in the order of the fields: a random model's values depend on it
        let self_attn = LlamaAttention::from_vb(&vb.pp("self_attn"), c)?;
        let mlp = match (&c.moe, index) {
            (Some(moe), Some(l)) if moe.is_sparse(l) => {
                let block = vb.pp(moe::Names::of(c.family).block);
                FeedForward::Sparse(SparseMoeBlock::from_vb(&block, c, moe)?)
            }
            _ => FeedForward::Dense(LlamaMlp::from_vb(&vb.pp("mlp"), c)?),
        };
        Ok(LlamaDecoderLayer {
            self_attn,
            mlp,
            input_layernorm: RMSNorm::from_vb(&vb.pp("input_layernorm"), c.hidden_size, eps)?,
            post_attention_layernorm: RMSNorm::from_vb(
                &vb.pp("post_attention_layernorm"),
                c.hidden_size,
                eps,
            )?,
            remat: Remat::None,
        })
    }

    /// The layer's output and, in a sparse layer, what its router chose.
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        key_mask: Option<&Tensor>,
    ) -> Result<(Tensor, Option<moe::Routing>)> {
        let out = remat(self.remat, &[x], |xs| {
            let (h, routing) = self.forward_block(&xs[0], cos, sin, key_mask, None)?;
            let mut out = vec![h];
            out.extend(routing.map(|r| [r.probs, r.chosen]).into_iter().flatten());
            Ok(out)
        })?;
        let mut out = out.into_iter();
        let h = out.next().expect("one output");
        let routing = match (out.next(), out.next()) {
            (Some(probs), Some(chosen)) => Some(moe::Routing { probs, chosen }),
            _ => None,
        };
        Ok((h, routing))
    }

    fn forward_block(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        key_mask: Option<&Tensor>,
        cache: Option<&mut generate::LayerCache>,
    ) -> Result<(Tensor, Option<moe::Routing>)> {
        let normed = rms_norm(&self.input_layernorm, x)?;
        let attn = self.self_attn.forward(&normed, cos, sin, key_mask, cache)?;
        let h = x.add(&attn)?;
        let normed = rms_norm(&self.post_attention_layernorm, &h)?;
        let (out, routing) = match &self.mlp {
            FeedForward::Dense(mlp) => (mlp.forward(&normed)?, None),
            FeedForward::Sparse(block) => {
                let (out, routing) = block.forward(&normed)?;
                (out, Some(routing))
            }
        };
        Ok((h.add(&out)?, routing))
    }
}

/// How [`LlamaForCausalLM::from_pretrained_with`] builds the model.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Convert the parameters to this dtype as they are read.
    pub dtype: Option<DType>,
    /// On a mesh device: each parameter read straight into its blocks (see [`LlamaSharding`]).
    pub plan: Option<std::sync::Arc<dyn crate::sharding::ShardingPlan>>,
    /// Stack the decoder layers and run them as one loop ([`LlamaConfig::scan_layers`]).
    pub scan_layers: bool,
}

/// `model`: embeddings, decoder layers, the final norm and the rotary tables.
#[derive(Module)]
pub struct LlamaModel {
    /// Token embeddings `[vocab, hidden]` (also the head when the embeddings are tied).
    pub embed_tokens: Embedding,
    /// The decoder layers, one module each; empty when they are scanned.
    pub layers: Vec<LlamaDecoderLayer>,
    /// The decoder layers stacked and run as one loop ([`LlamaConfig::scan_layers`]), their
    /// parameters named `layers.*.…` (`layers.0.…`, ... in a state dict).
    #[module(rename = "layers")]
    pub scanned_layers: Option<ScannedLayers<LlamaDecoderLayer>>,
    /// The RMSNorm after the last layer.
    pub norm: RMSNorm,
    /// The rotary frequencies of [`LlamaConfig::rope_theta`] and
    /// [`LlamaConfig::rope_scaling`]; not a parameter and not in the state dict.
    #[module(skip)]
    pub rotary_emb: RotaryEmbedding,
}

/// `LlamaForCausalLM`: the decoder and a language-model head (`lm_head`, or the token
/// embeddings when `tie_word_embeddings`).
#[derive(Module)]
pub struct LlamaForCausalLM {
    /// The configuration the model was built from (written back by `save_pretrained`).
    #[module(skip)]
    pub config: LlamaConfig,
    /// The decoder: parameters under `model.`.
    pub model: LlamaModel,
    /// `None` when the head is tied to `model.embed_tokens.weight`.
    pub lm_head: Option<Linear>,
    /// [`LlamaForCausalLM::loss`] computes the head and the loss this many tokens at a time
    /// ([`crate::nn::chunked_cross_entropy`]): no more than one chunk's logits exist at once.
    /// `None` (the default): the whole logits at once.
    #[module(skip)]
    pub loss_chunk: Option<usize>,
}

impl LlamaForCausalLM {
    /// Builds the model from `vb` (a checkpoint, or [`VarBuilder::random`] for `transformers`'
    /// initialisation: normal with std `initializer_range` for the projections and embeddings,
    /// ones for the norms). Parameters are read under `model.` and `lm_head.`.
    pub fn from_vb(vb: &VarBuilder, config: &LlamaConfig) -> Result<LlamaForCausalLM> {
        let c = config;
        let m = vb.pp("model");
        let embed_tokens = Embedding {
            weight: m.pp("embed_tokens").get(
                &[c.vocab_size, c.hidden_size],
                "weight",
                Init::Normal {
                    std: c.initializer_range,
                },
            )?,
        };
        let (layers, scanned_layers) = if c.scan_layers {
            if c.moe.is_some() {
                return Err(Error::Config(format!(
                    "scan_layers: model_type {:?}: scanned layers of experts are not supported \
                     (leave the layers unrolled)",
                    c.family.model_type()
                )));
            }
            // one loop body for every layer: they must attend alike
            let window = c.window(0);
            if let Some(l) = (1..c.num_hidden_layers).find(|&l| c.window(l) != window) {
                return Err(Error::Config(format!(
                    "scan_layers: layer {l} attends through a window of {:?}, layer 0 {window:?}; \
                     scanned layers must all be alike (leave the layers unrolled)",
                    c.window(l)
                )));
            }
            let layer_config = c.clone();
            let build = std::sync::Arc::new(move |vb: &VarBuilder| {
                let mut layer = LlamaDecoderLayer::from_vb(vb, &layer_config)?;
                layer.self_attn.sliding_window = window;
                Ok(layer)
            });
            let scanned = ScannedLayers::from_vb(&m.pp("layers"), c.num_hidden_layers, build)?;
            (Vec::new(), Some(scanned))
        } else {
            let layers = (0..c.num_hidden_layers)
                .map(|i| {
                    let vb = m.pp(&format!("layers.{i}"));
                    let mut layer = LlamaDecoderLayer::from_vb_at(&vb, c, Some(i))?;
                    layer.self_attn.sliding_window = c.window(i);
                    Ok(layer)
                })
                .collect::<Result<Vec<_>>>()?;
            (layers, None)
        };
        let norm = RMSNorm::from_vb(&m.pp("norm"), c.hidden_size, Some(c.rms_norm_eps))?;
        let lm_head = match c.tie_word_embeddings {
            true => None,
            false => Some(proj(
                vb,
                "lm_head",
                (c.hidden_size, c.vocab_size),
                c.initializer_range,
                false,
            )?),
        };
        Ok(LlamaForCausalLM {
            config: c.clone(),
            model: LlamaModel {
                embed_tokens,
                layers,
                scanned_layers,
                norm,
                rotary_emb: RotaryEmbedding::scaled(
                    vb.device(),
                    c.head_dim,
                    c.rope_theta,
                    c.rope_scaling.clone(),
                )?,
            },
            lm_head,
            loss_chunk: None,
        })
    }

    /// Sets every decoder layer's checkpoint policy (`layer.remat` sets one layer's).
    pub fn set_remat(&mut self, policy: Remat) {
        for layer in &mut self.model.layers {
            layer.remat = policy;
        }
        if let Some(scanned) = &mut self.model.scanned_layers {
            scanned.remat = policy;
        }
    }

    /// A randomly initialised model (as `LlamaForCausalLM(config)` with a seed), float32.
    pub fn random(device: &LazyDevice, config: &LlamaConfig, seed: u64) -> Result<Self> {
        LlamaForCausalLM::from_vb(&VarBuilder::random(device, seed), config)
    }

    /// `input_ids [b, s]` (integer) → logits `[b, s, vocab]`. `position_ids` (`[s]` or
    /// `[b, s]`) default to `0..s`; `attention_mask [b, s]` (1 = token, 0 = padding, any dtype)
    /// masks padded keys, on top of the causal mask. Padding may be on either side; the logits
    /// of padded positions are finite and meaningless. `position_ids` without an
    /// `attention_mask` may pack several documents in a row: where the ids do not step by 1 a
    /// new document starts, and no query attends across (transformers' training forward with
    /// `use_cache=False` does the same).
    #[track_caller]
    pub fn forward(
        &self,
        input_ids: &Tensor,
        position_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.hidden_states(input_ids, position_ids, attention_mask)?
            .linear(self.head_weight(), None)
    }

    /// [`LlamaForCausalLM::forward`] before the head: the final norm's output
    /// `[b, s, hidden]`.
    #[track_caller]
    pub fn hidden_states(
        &self,
        input_ids: &Tensor,
        position_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let location = std::panic::Location::caller();
        Ok(self
            .decode(input_ids, position_ids, attention_mask, location)?
            .0)
    }

    /// The final norm's output and what each sparse layer's router chose.
    fn decode(
        &self,
        input_ids: &Tensor,
        position_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        location: &'static std::panic::Location<'static>,
    ) -> Result<(Tensor, Vec<moe::Routing>)> {
        let err = |message: String| {
            shape_error(
                "LlamaForCausalLM::forward",
                input_ids.ty().to_string(),
                message,
                location,
            )
        };
        if input_ids.rank() != 2 || !input_ids.dtype().is_int() {
            return Err(err(
                "input_ids must be integers of shape [batch, seq]".into()
            ));
        }
        let (b, s) = (input_ids.dims()[0], input_ids.dims()[1]);
        let dtype = self.model.embed_tokens.weight.dtype();
        let lowest = masks::lowest(dtype);
        let key_mask = match attention_mask {
            None => None,
            Some(m) => {
                if m.dims() != [b, s] {
                    return Err(err(format!(
                        "attention_mask must be [{b}, {s}] like input_ids, got {}",
                        m.ty()
                    )));
                }
                // an additive mask of the dtype's lowest finite value, as transformers builds
                // it: a query whose keys are all padding (left padding) then gets finite
                // scores; a -inf mask would give it NaN, which reaches the real tokens in the
                // next layer (its values are weighted by 0, and 0 * NaN is NaN)
                let keep = m.ne(&m.zeros_like()?)?.to_dtype(dtype)?;
                Some(
                    keep.add_scalar(-1.0)?
                        .mul_scalar(lowest)?
                        .reshape(&[b, 1, 1, s])?,
                )
            }
        };
        let default_positions;
        let positions = match position_ids {
            Some(p) => p,
            None => {
                default_positions = input_ids.device()?.arange(s, DType::I32)?;
                &default_positions
            }
        };
        // packed documents, as transformers reads them: position ids without an attention
        // mask, each restart (a step other than +1) beginning a document no query sees past
        let key_mask = match (key_mask, position_ids) {
            (None, Some(p)) => Some(masks::document_mask(p, dtype)?),
            (mask, _) => mask,
        };
        let m = &self.model;
        // each window's band `query - window < key` (on top of the causal mask), added to the
        // key mask; a window as long as the sequence changes nothing and adds nothing
        let mut windows: Vec<usize> = m
            .layers
            .iter()
            .filter_map(|l| l.self_attn.sliding_window)
            .collect();
        // a scanned body's window is the config's (`from_vb` checks they are all alike)
        windows.extend(self.config.sliding_window);
        windows.retain(|&w| w < s);
        let mut banded = std::collections::BTreeMap::new();
        for w in windows {
            if banded.contains_key(&w) {
                continue;
            }
            let band = masks::band(&input_ids.device()?, s, w, dtype)?;
            let mask = match &key_mask {
                Some(k) => k.add(&band)?,
                None => band,
            };
            banded.insert(w, mask);
        }
        let mask_of = |window: Option<usize>| match window.and_then(|w| banded.get(&w)) {
            Some(mask) => Some(mask),
            None => key_mask.as_ref(),
        };
        let (cos, sin) = m.rotary_emb.cos_sin(positions)?;
        let mut h = m.embed_tokens.forward(input_ids)?;
        let mut routing = Vec::new();
        for layer in &m.layers {
            let (out, chosen) =
                layer.forward(&h, &cos, &sin, mask_of(layer.self_attn.sliding_window))?;
            h = out;
            routing.extend(chosen);
        }
        if let Some(scanned) = &m.scanned_layers {
            // what a layer keeps is the loop's to say (`ScannedLayers::remat`)
            let out = scanned.forward(&[&h], |layer, h| {
                let mask = mask_of(layer.self_attn.sliding_window);
                Ok(vec![layer.forward_block(&h[0], &cos, &sin, mask, None)?.0])
            })?;
            h = out.into_iter().next().expect("one carry");
        }
        Ok((rms_norm(&m.norm, &h)?, routing))
    }

    /// The load-balancing loss `router_aux_loss_coef` times, as `transformers` adds it to the
    /// loss with `output_router_logits`; `None` when the config leaves it out.
    fn router_aux_loss(
        &self,
        routing: &[moe::Routing],
        attention_mask: Option<&Tensor>,
    ) -> Result<Option<Tensor>> {
        match &self.config.moe {
            Some(moe) if moe.output_router_logits && !routing.is_empty() => {
                let aux = moe::load_balancing_loss(routing, attention_mask)?;
                Ok(Some(aux.mul_scalar(moe.router_aux_loss_coef)?))
            }
            _ => Ok(None),
        }
    }

    /// The head's weight `[vocab, hidden]`: `lm_head`'s, or the token embeddings' when tied.
    pub fn head_weight(&self) -> &Tensor {
        match &self.lm_head {
            Some(head) => &head.weight,
            None => &self.model.embed_tokens.weight,
        }
    }

    /// The next-token loss as `LlamaForCausalLM` computes it with `labels`: the logits of
    /// positions `0..s-1` against the labels of `1..s`, labels -100 ignored, the mean over the
    /// rest (in float32); with experts and [`MoeConfig::output_router_logits`], plus
    /// `router_aux_loss_coef` times the load-balancing loss. Returns `(loss, logits)`.
    #[track_caller]
    pub fn forward_loss(
        &self,
        input_ids: &Tensor,
        position_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let location = std::panic::Location::caller();
        let (h, routing) = self.decode(input_ids, position_ids, attention_mask, location)?;
        let logits = h.linear(self.head_weight(), None)?;
        let s = input_ids.dims()[1];
        shifted_labels_check(input_ids, labels, location)?;
        let shifted = logits.narrow(1, 0, s - 1)?.to_dtype(DType::F32)?;
        let targets = labels.narrow(1, 1, s - 1)?;
        let loss = cross_entropy(&shifted, &targets)?;
        let loss = match self.router_aux_loss(&routing, attention_mask)? {
            Some(aux) => loss.add(&aux)?,
            None => loss,
        };
        Ok((loss, logits))
    }

    /// [`LlamaForCausalLM::forward_loss`]'s loss alone; with [`LlamaForCausalLM::loss_chunk`]
    /// set, computed over chunks of tokens with no more than one chunk's logits at once.
    #[track_caller]
    pub fn loss(
        &self,
        input_ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
    ) -> Result<Tensor> {
        self.loss_at(input_ids, None, attention_mask, labels)
    }

    /// [`LlamaForCausalLM::loss`] of packed rows (`data::pack`): documents told apart by
    /// `position_ids` that restart (see [`LlamaForCausalLM::forward`]).
    #[track_caller]
    pub fn loss_packed(
        &self,
        input_ids: &Tensor,
        position_ids: &Tensor,
        labels: &Tensor,
    ) -> Result<Tensor> {
        self.loss_at(input_ids, Some(position_ids), None, labels)
    }

    #[track_caller]
    fn loss_at(
        &self,
        input_ids: &Tensor,
        position_ids: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        labels: &Tensor,
    ) -> Result<Tensor> {
        let Some(chunk) = self.loss_chunk else {
            return Ok(self
                .forward_loss(input_ids, position_ids, attention_mask, labels)?
                .0);
        };
        let location = std::panic::Location::caller();
        let (h, routing) = self.decode(input_ids, position_ids, attention_mask, location)?;
        shifted_labels_check(input_ids, labels, location)?;
        let s = input_ids.dims()[1];
        let shifted = h.narrow(1, 0, s - 1)?;
        let targets = labels.narrow(1, 1, s - 1)?;
        let loss = chunked_cross_entropy(
            &shifted,
            self.head_weight(),
            &targets,
            chunk,
            CrossEntropyOptions::default(),
        )?;
        match self.router_aux_loss(&routing, attention_mask)? {
            Some(aux) => loss.add(&aux),
            None => Ok(loss),
        }
    }
}

/// Labels shaped as `input_ids`, at least 2 tokens a row (one to predict).
fn shifted_labels_check(
    input_ids: &Tensor,
    labels: &Tensor,
    location: &'static std::panic::Location<'static>,
) -> Result<()> {
    if labels.dims() != input_ids.dims() {
        return Err(shape_error(
            "LlamaForCausalLM::loss",
            format!("{}, labels {}", input_ids.ty(), labels.ty()),
            "labels must have the shape of input_ids".into(),
            location,
        ));
    }
    if input_ids.dims()[1] < 2 {
        return Err(Error::Config(
            "LlamaForCausalLM::loss: a sequence needs at least 2 tokens to predict one".into(),
        ));
    }
    Ok(())
}
