//! [`LlamaForCausalLM::generate`]: autoregressive decoding with a key/value cache, as
//! `transformers`' `generate` does for a batch of prompts (left padding, position ids counted
//! over the real tokens), in two kinds of step graph:
//!
//! - **prefill**: the prompts, left-padded to the smallest bucket that holds the longest, run
//!   once and fill the cache's first `bucket` slots; one graph per bucket;
//! - **decode**: one new token per row, written at the next slot; the slot is an input (a
//!   device scalar), so every decode step of every bucket is the same graph.
//!
//! The cache holds `largest bucket + max_new_tokens` slots per layer (`[b, kv_heads, slots,
//! head_dim]`), and each query sees the slots up to its own, minus the prompt's padding, minus
//! what a sliding window excludes. Tokens are picked on the device, in the step that computes
//! the last logits (`sample.rs`): greedy, or sampled with temperature, top-k and top-p, each
//! row's uniform number drawn on the host from a seeded generator.

use std::collections::BTreeMap;

use neuron_pc_compiler::DType;

use super::masks::lowest;
use super::{rms_norm, LlamaDecoderLayer, LlamaForCausalLM};
use crate::error::{Error, Result};
use crate::nn::HostRng;
use crate::tensor::Tensor;

/// How [`LlamaForCausalLM::generate`] picks each token from the logits.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Sampling {
    /// The most likely token (the first of equals, as `argmax`): `do_sample=False`.
    Greedy,
    /// Drawn from `softmax(logits / temperature)` over the `top_k` most likely tokens, then
    /// over the fewest of those whose probability reaches `top_p` (transformers' warpers, in
    /// that order), with a generator seeded by `seed`: the same seed, the same tokens.
    Sample {
        /// Divides the logits before the softmax; positive (below 1 sharpens, above 1
        /// flattens).
        temperature: f64,
        /// Keep only the `top_k` most likely tokens; `None`: all of them.
        top_k: Option<usize>,
        /// Keep only the fewest most likely tokens whose probabilities sum to at least
        /// `top_p`, in `(0, 1]` (nucleus sampling); `None`: all of them.
        top_p: Option<f64>,
        /// Seeds the host generator the tokens are drawn with.
        seed: u64,
    },
}

/// What [`LlamaForCausalLM::generate`] does; [`GenerateOptions::greedy`] and the fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct GenerateOptions {
    /// New tokens per prompt (fewer for a row that emits an end token).
    pub max_new_tokens: usize,
    /// How each token is picked from the logits (greedy, or sampled).
    pub sampling: Sampling,
    /// Prompt lengths the prefill graph is compiled for: the prompts are left-padded to the
    /// smallest that holds the longest. The cache holds the largest plus `max_new_tokens`.
    pub buckets: Vec<usize>,
    /// A row ends after emitting one of these (kept in its output).
    pub eos_token_ids: Vec<i32>,
    /// The token padding a prompt on the left (masked: its value does not matter).
    pub pad_token_id: i32,
}

impl GenerateOptions {
    /// Greedy decoding of `max_new_tokens`, buckets 64, 256 and 1024, no end token.
    pub fn greedy(max_new_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens,
            sampling: Sampling::Greedy,
            buckets: vec![64, 256, 1024],
            eos_token_ids: Vec::new(),
            pad_token_id: 0,
        }
    }

    /// The bucket of `prompts`, after checking everything else; every error is one line.
    fn check(&self, prompts: &[Vec<i32>], vocab: usize) -> Result<usize> {
        let err = |m: String| Err(Error::Config(format!("generate: {m}")));
        if self.max_new_tokens == 0 {
            return err("max_new_tokens must be at least 1".into());
        }
        if let Sampling::Sample {
            temperature,
            top_k,
            top_p,
            ..
        } = self.sampling
        {
            if temperature.is_nan() || temperature <= 0.0 {
                return err(format!("temperature {temperature}: must be positive"));
            }
            if top_k == Some(0) {
                return err("top_k 0: keep at least one token".into());
            }
            if let Some(p) = top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
                return err(format!("top_p {p}: must be in (0, 1]"));
            }
        }
        if prompts.is_empty() {
            return err("no prompts".into());
        }
        for (i, p) in prompts.iter().enumerate() {
            if p.is_empty() {
                return err(format!("prompt {i} is empty"));
            }
            if let Some(t) = p.iter().find(|t| **t < 0 || **t as usize >= vocab) {
                return err(format!(
                    "prompt {i} has token {t}, outside the vocabulary of {vocab}"
                ));
            }
        }
        let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let mut buckets = self.buckets.clone();
        buckets.sort_unstable();
        match buckets.iter().find(|b| **b >= longest) {
            Some(&b) => Ok(b),
            None => err(format!(
                "a prompt of {longest} tokens is longer than the largest bucket ({:?})",
                buckets.last()
            )),
        }
    }
}

/// One layer's cached keys and values `[b, kv_heads, slots, head_dim]`, and the slot this
/// step writes from.
pub(super) struct LayerCache {
    pub(super) k: Tensor,
    pub(super) v: Tensor,
    index: Tensor,
}

impl LayerCache {
    /// Writes this step's `k` and `v` (`[b, kv_heads, t, head_dim]`) at the cache's index.
    pub(super) fn write(&mut self, k: &Tensor, v: &Tensor) -> Result<()> {
        let zero = self.index.zeros_like()?;
        let starts = [&zero, &zero, &self.index, &zero];
        self.k = self
            .k
            .dynamic_update_slice(&k.to_dtype(self.k.dtype())?, &starts)?;
        self.v = self
            .v
            .dynamic_update_slice(&v.to_dtype(self.v.dtype())?, &starts)?;
        Ok(())
    }
}

impl LlamaForCausalLM {
    /// Continues each prompt (token ids) by up to `options.max_new_tokens` tokens and returns
    /// the new tokens of each, in order. The prompts run as one batch; see the module
    /// documentation for the graphs it compiles. Under `neuron-pc compile` (a trial run) the
    /// tokens are meaningless but the graphs are the real run's.
    pub fn generate(
        &self,
        prompts: &[Vec<i32>],
        options: &GenerateOptions,
    ) -> Result<Vec<Vec<i32>>> {
        let c = &self.config;
        let bucket = options.check(prompts, c.vocab_size)?;
        let unstacked;
        let layers: &[LlamaDecoderLayer] = match &self.model.scanned_layers {
            Some(scanned) => {
                unstacked = scanned.unstacked()?;
                &unstacked
            }
            None => &self.model.layers,
        };
        let dev = self.model.embed_tokens.weight.device()?;
        let dtype = self.model.embed_tokens.weight.dtype();
        let b = prompts.len();
        let largest = options.buckets.iter().copied().max().unwrap_or(bucket);
        let slots = largest + options.max_new_tokens;
        // left padding: the real tokens end at the bucket's last slot; positions count them
        let mut ids = vec![options.pad_token_id; b * bucket];
        let mut positions = vec![1i32; b * bucket];
        let mut valid = vec![1f32; b * slots];
        for (r, prompt) in prompts.iter().enumerate() {
            let start = bucket - prompt.len();
            for (j, &t) in prompt.iter().enumerate() {
                ids[r * bucket + start + j] = t;
                positions[r * bucket + start + j] = j as i32;
            }
            valid[r * slots..r * slots + start].fill(0.0);
        }
        let shape = [b, c.num_key_value_heads, slots, c.head_dim];
        let index = dev.scalar(0.0, DType::I32)?;
        let mut caches = Vec::with_capacity(layers.len());
        for _ in layers {
            caches.push(LayerCache {
                k: dev.zeros(&shape, dtype)?,
                v: dev.zeros(&shape, dtype)?,
                index: index.clone(),
            });
        }
        let valid = dev.from_slice(&valid, &[b, slots])?;
        let mut logits = self.cached_step(
            layers,
            &dev.from_slice(&ids, &[b, bucket])?,
            &dev.from_slice(&positions, &[b, bucket])?,
            0,
            &valid,
            &mut caches,
        )?;
        let mut rng = match options.sampling {
            Sampling::Sample { seed, .. } => Some(HostRng::new(seed)),
            Sampling::Greedy => None,
        };
        let mut next_position: Vec<i32> = prompts.iter().map(|p| p.len() as i32).collect();
        let mut out: Vec<Vec<i32>> = vec![Vec::new(); b];
        let mut done = vec![false; b];
        for step in 0..options.max_new_tokens {
            // one number per live row, drawn in row order (the host sampler's order)
            let u = match rng.as_mut() {
                Some(rng) => {
                    let u: Vec<f32> = done
                        .iter()
                        .map(|d| if *d { 0.0 } else { rng.uniform() as f32 })
                        .collect();
                    Some(dev.from_slice(&u, &[b])?)
                }
                None => None,
            };
            let picked = options.sampling.pick_on_device(&logits, u.as_ref())?;
            dev.mark_step()?;
            let picked: Vec<i32> = picked.to_vec()?;
            let mut tokens = vec![options.pad_token_id; b];
            for r in 0..b {
                if done[r] {
                    continue;
                }
                tokens[r] = picked[r];
                out[r].push(tokens[r]);
                done[r] = options.eos_token_ids.contains(&tokens[r]);
            }
            if step + 1 == options.max_new_tokens || done.iter().all(|d| *d) {
                break;
            }
            logits = self.cached_step(
                layers,
                &dev.from_slice(&tokens, &[b, 1])?,
                &dev.from_slice(&next_position, &[b, 1])?,
                bucket + step,
                &valid,
                &mut caches,
            )?;
            for p in &mut next_position {
                *p += 1;
            }
        }
        Ok(out)
    }

    /// One prefill or decode step: `ids [b, t]` at `positions`, written into the caches from
    /// slot `index`; records the last position's logits `[b, vocab]` (the caller picks the
    /// tokens from them and ends the step).
    fn cached_step(
        &self,
        layers: &[LlamaDecoderLayer],
        ids: &Tensor,
        positions: &Tensor,
        index: usize,
        valid: &Tensor,
        caches: &mut [LayerCache],
    ) -> Result<Tensor> {
        let dev = ids.device()?;
        let (b, t, slots) = (ids.dims()[0], ids.dims()[1], valid.dims()[1]);
        let dtype = self.model.embed_tokens.weight.dtype();
        let low = lowest(dtype);
        // an input, not a constant: every decode step is one graph
        let index = dev.scalar(index as f64, DType::I32)?;
        for cache in caches.iter_mut() {
            cache.index = index.clone();
        }
        // the query at slot index + i sees the slots up to its own, the prompt's real tokens
        // and, in a windowed layer, the last `window` slots
        let rows = dev.arange(t, DType::I32)?.add(&index)?.unsqueeze(1)?; // [t, 1]
        let cols = dev.arange(slots, DType::I32)?; // [slots]
        let causal = cols.le(&rows)?;
        let open = dev.zeros(&[t, slots], dtype)?;
        let shut = open.constant_like(-low)?;
        let padding = valid
            .to_dtype(dtype)?
            .add_scalar(-1.0)?
            .mul_scalar(low)?
            .reshape(&[b, 1, 1, slots])?;
        let mut masks: BTreeMap<Option<usize>, Tensor> = BTreeMap::new();
        for layer in layers {
            let window = layer.self_attn.sliding_window;
            if masks.contains_key(&window) {
                continue;
            }
            let keep = match window {
                None => causal.clone(),
                Some(w) => causal.logical_and(&cols.add_scalar(w as f64)?.gt(&rows)?)?,
            };
            let mask = Tensor::where_cond(&keep, &open, &shut)?
                .reshape(&[1, 1, t, slots])?
                .add(&padding)?;
            masks.insert(window, mask);
        }
        let (cos, sin) = self.model.rotary_emb.cos_sin(positions)?;
        let mut h = self.model.embed_tokens.forward(ids)?;
        for (layer, cache) in layers.iter().zip(caches.iter_mut()) {
            let mask = &masks[&layer.self_attn.sliding_window];
            h = layer
                .forward_block(&h, &cos, &sin, Some(mask), Some(cache))?
                .0;
        }
        let last = rms_norm(&self.model.norm, &h)?.narrow(1, t - 1, 1)?;
        let logits = last
            .linear(self.head_weight(), None)?
            .reshape(&[b, self.config.vocab_size])?
            .to_dtype(DType::F32)?;
        Ok(logits)
    }
}
