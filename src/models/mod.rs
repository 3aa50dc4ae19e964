//! Ready-made models. [`TextEncoder`] is the example job's model: a text encoder like the one
//! in the Amazon Search case study (token embedding, masked mean pooling, an MLP with GELU, a
//! projection to classes), with PyTorch's parameter names so its state dict loads into the
//! matching `torch.nn.Module` (see `scripts/fixtures/text_encoder.py`).
//!
//! [`llama`] holds the decoder-only language models (Llama, and as configurations of the same
//! decoder [`mistral`], [`qwen2`] and [`qwen3`]), loaded from and saved to `transformers`'
//! `save_pretrained` directories.
//!
//! ```no_run
//! use neuron_pc::models::{accuracy, SyntheticTask, TextEncoder, TextEncoderConfig};
//! use neuron_pc::LazyDevice;
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! let config = TextEncoderConfig::default();
//! let model = TextEncoder::new(&device, config.clone(), 0)?;
//! let task = SyntheticTask::new(config, 0);
//! // batch 0 of split 1 (validation), 32 examples: ids, mask, labels
//! let batch = task.batch(1, 0, 32);
//! let [ids, mask, labels] = [&batch[0], &batch[1], &batch[2]].map(|t| device.tensor(t));
//! let (ids, mask, labels) = (ids?, mask?, labels?);
//! let logits = model.forward(&ids, &mask)?; // [32, classes]
//! let loss = model.loss(&ids, &mask, &labels)?;
//! let acc = accuracy(&logits, &labels)?;
//! device.mark_step()?;
//! println!("loss {:.3}, accuracy {:.3}", loss.item()?, acc.item()?);
//! # Ok(()) }
//! ```

pub mod llama;
pub mod mistral;
pub mod qwen2;
pub mod qwen3;

use neuron_pc_compiler::{DType, HostTensor};

use crate::device::LazyDevice;
use crate::error::Result;
use crate::nn::{cross_entropy, gelu, masked_mean, Embedding, HostRng, Linear, Module};
use crate::tensor::Tensor;

/// Sizes of a [`TextEncoder`]; the default is the configuration peers are measured on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextEncoderConfig {
    /// Token vocabulary size: ids are in `0..vocab` (default 8192).
    pub vocab: usize,
    /// Width of the token embeddings (default 128).
    pub embed: usize,
    /// Tokens per example, padding included (default 32).
    pub seq_len: usize,
    /// Widths of the MLP's layers after the embedding (each followed by GELU).
    pub mlp: Vec<usize>,
    /// Number of classes: the width of the logits (default 64).
    pub classes: usize,
}

impl Default for TextEncoderConfig {
    fn default() -> Self {
        TextEncoderConfig {
            vocab: 8192,
            embed: 128,
            seq_len: 32,
            mlp: vec![512, 512, 256],
            classes: 64,
        }
    }
}

/// `embedding → masked mean → (Linear → GELU)* → proj`.
#[derive(Module)]
pub struct TextEncoder {
    /// The sizes the model was built with (not a parameter).
    #[module(skip)]
    pub config: TextEncoderConfig,
    /// Token embeddings, `embedding.weight [vocab, embed]`.
    pub embedding: Embedding,
    /// `mlp.0`, `mlp.2`, ... in PyTorch's `nn.Sequential` numbering (GELUs in between).
    #[module(index_step = 2)]
    pub mlp: Vec<Linear>,
    /// The last layer: the MLP's output (or the pooled embedding) to `classes` logits.
    pub proj: Linear,
}

impl TextEncoder {
    /// A model initialised like PyTorch's defaults from `seed`.
    pub fn new(device: &LazyDevice, config: TextEncoderConfig, seed: u64) -> Result<TextEncoder> {
        let mut rng = HostRng::new(seed);
        let embedding = Embedding::new(device, &mut rng, config.vocab, config.embed)?;
        let mut mlp = Vec::new();
        let mut width = config.embed;
        for &w in &config.mlp {
            mlp.push(Linear::new(device, &mut rng, width, w, true)?);
            width = w;
        }
        let proj = Linear::new(device, &mut rng, width, config.classes, true)?;
        Ok(TextEncoder {
            config,
            embedding,
            mlp,
            proj,
        })
    }

    /// `ids i32 [b, s]`, `mask f32 [b, s]` → logits `[b, classes]`.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let emb = self.embedding.forward(ids)?;
        let mut h = masked_mean(&emb, mask)?;
        for layer in &self.mlp {
            h = gelu(&layer.forward(&h)?)?;
        }
        self.proj.forward(&h)
    }

    /// Mean cross-entropy of a batch.
    #[track_caller]
    pub fn loss(&self, ids: &Tensor, mask: &Tensor, labels: &Tensor) -> Result<Tensor> {
        cross_entropy(&self.forward(ids, mask)?, labels)
    }
}

/// A synthetic classification task the encoder can learn: each class owns a few "signature"
/// tokens; an example of class `c` mixes `c`'s signature tokens with random ones, then padding.
/// Batches are a pure function of `(seed, index)`, so a resumed run sees the same data.
#[derive(Clone, Debug)]
pub struct SyntheticTask {
    /// The sizes of the batches (`vocab`, `seq_len`, `classes`; the model's config).
    pub config: TextEncoderConfig,
    /// Seeds the class signatures and every batch.
    pub seed: u64,
    signatures: Vec<Vec<i32>>,
}

/// One host batch: `ids i32 [b, s]`, `mask f32 [b, s]`, `labels i32 [b]`.
pub type HostBatch = Vec<HostTensor>;

impl SyntheticTask {
    /// The task for `config`'s sizes, its signature tokens drawn from `seed`.
    pub fn new(config: TextEncoderConfig, seed: u64) -> SyntheticTask {
        let mut rng = HostRng::new(seed ^ 0x005E_ED0F_7A5C);
        let signatures = (0..config.classes)
            .map(|_| {
                (0..8)
                    .map(|_| (rng.next_u64() % config.vocab as u64) as i32)
                    .collect()
            })
            .collect();
        SyntheticTask {
            config,
            seed,
            signatures,
        }
    }

    /// Batch number `index` of a stream (`split` separates training from validation data).
    pub fn batch(&self, split: u64, index: u64, batch: usize) -> HostBatch {
        let c = &self.config;
        let mut rng = HostRng::new(
            self.seed
                .wrapping_mul(0x9E37_79B9)
                .wrapping_add(split << 40)
                .wrapping_add(index),
        );
        let mut ids = Vec::with_capacity(batch * c.seq_len);
        let mut mask = Vec::with_capacity(batch * c.seq_len);
        let mut labels = Vec::with_capacity(batch);
        for _ in 0..batch {
            let label = (rng.next_u64() % c.classes as u64) as usize;
            let len = c.seq_len / 2 + (rng.next_u64() % (c.seq_len as u64 / 2 + 1)) as usize;
            for pos in 0..c.seq_len {
                if pos < len {
                    let token = if rng.uniform() < 0.5 {
                        let sig = &self.signatures[label];
                        sig[(rng.next_u64() % sig.len() as u64) as usize]
                    } else {
                        (rng.next_u64() % c.vocab as u64) as i32
                    };
                    ids.push(token);
                    mask.push(1.0f32);
                } else {
                    ids.push(0);
                    mask.push(0.0);
                }
            }
            labels.push(label as i32);
        }
        vec![
            HostTensor::from_slice(&ids, &[batch, c.seq_len]).expect("sizes agree"),
            HostTensor::from_slice(&mask, &[batch, c.seq_len]).expect("sizes agree"),
            HostTensor::from_slice(&labels, &[batch]).expect("sizes agree"),
        ]
    }
}

/// Fraction of rows whose argmax equals the label (a device scalar).
#[track_caller]
pub fn accuracy(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    logits
        .argmax(-1)?
        .eq(labels)?
        .to_dtype(DType::F32)?
        .mean_all()
}
