//! Layers, activations and losses built from tensor primitives (no IR ops of their own), with
//! PyTorch's parameter names and default initialisation so state dicts move between the two.
//!
//! A model is a struct of layers with `#[derive(Module)]`, which names its parameters by field
//! path; layers take a [`HostRng`] for PyTorch's initialisation, or read a checkpoint by name
//! through a [`VarBuilder`] (`from_vb`).
//!
//! ```no_run
//! use neuron_pc::nn::{self, Conv1d, ConvConfig, HostRng, Linear, Module, RMSNorm};
//! use neuron_pc::{grad, LazyDevice, Tensor};
//!
//! #[derive(Module)]
//! struct Net {
//!     conv: Conv1d,
//!     norm: RMSNorm,
//!     head: Linear,
//! }
//!
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! let mut rng = HostRng::new(0);
//! let net = Net {
//!     conv: Conv1d::new(&device, &mut rng, ConvConfig::new(4, 8, [3]))?,
//!     norm: RMSNorm::new(&device, 8)?,
//!     head: Linear::new(&device, &mut rng, 8, 10, true)?,
//! };
//! let x = device.from_slice(&vec![0.5f32; 2 * 4 * 16], &[2, 4, 16])?; // [n, channels, length]
//! let labels = device.from_slice(&[3i32, 7], &[2])?;
//! let h = net.conv.forward(&x)?.mean(&[-1], false)?; // [2, 8]
//! let logits = net.head.forward(&nn::gelu(&net.norm.forward(&h)?)?)?; // [2, 10]
//! let loss = nn::cross_entropy(&logits, &labels)?;
//! // conv.weight, conv.bias, norm.weight, head.weight, head.bias
//! let params: Vec<Tensor> = net.parameters().into_iter().map(|(_, p)| p).collect();
//! let grads = grad(&loss, &params.iter().collect::<Vec<_>>())?;
//! device.mark_step()?;
//! println!("loss {}, {} gradients", loss.item()?, grads.len());
//! # Ok(()) }
//! ```

use neuron_pc_compiler::ir::Op;
use neuron_pc_compiler::rng::SplitMix64;
use neuron_pc_compiler::{DType, HostTensor};

use crate::device::LazyDevice;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

mod attention;
mod conv;
mod loss;
mod norm;
mod rope;
mod scanned;
mod var_builder;

#[allow(deprecated)]
pub use crate::autodiff::checkpoint;
pub use crate::autodiff::{remat, scan, Remat, ScanOptions};
pub use attention::{
    apply_rotary_pos_emb, rotate_half, scaled_dot_product_attention, RotaryEmbedding,
};
pub use conv::{Conv1d, Conv2d, ConvConfig, ConvLayer};
pub use loss::{chunked_cross_entropy, cross_entropy_with, CrossEntropyOptions, IGNORE_INDEX};
/// `#[derive(Module)]`: see the `neuron-pc-derive` crate for the field attributes.
pub use neuron_pc_derive::Module;
pub use norm::{BatchNorm, GroupNorm, RMSNorm};
pub use rope::RopeScaling;
pub use scanned::{LayerBuilder, ScannedLayers};
pub use var_builder::{Init, VarBuilder};

/// A shape error at the user's call site unless `t` has rank `rank`; `layout` names the
/// dimensions expected (`[n, classes]`), so layers never index `dims()` out of range.
#[track_caller]
fn check_rank(op: &'static str, what: &str, t: &Tensor, rank: usize, layout: &str) -> Result<()> {
    if t.rank() == rank {
        return Ok(());
    }
    Err(Error::Op {
        location: std::panic::Location::caller(),
        source: neuron_pc_compiler::Error::Shape {
            op,
            operands: t.ty().to_string(),
            message: format!(
                "{what} must have rank {rank} ({layout}), got rank {}",
                t.rank()
            ),
        },
    })
}

/// A shape error at the user's call site unless the last dimension of `x` is the length of the
/// per-feature `weight` (which would otherwise broadcast silently over a dimension of 1).
#[track_caller]
fn check_last_dim(op: &'static str, x: &Tensor, weight: &Tensor) -> Result<()> {
    let n = weight.dims().first().copied().unwrap_or(0);
    if x.dims().last() == Some(&n) {
        return Ok(());
    }
    Err(crate::tensor::shape_error(
        op,
        format!("{}, weight {}", x.ty(), weight.ty()),
        format!("the last dimension of the input must be the normalised size {n}"),
        std::panic::Location::caller(),
    ))
}

/// The host-side generator for parameter initialisation (the workspace's one SplitMix64).
#[derive(Clone, Debug)]
pub struct HostRng(SplitMix64);

impl HostRng {
    /// A generator seeded with `seed`: the same seed draws the same parameters.
    pub fn new(seed: u64) -> HostRng {
        HostRng(SplitMix64::new(seed))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0.unit()
    }

    /// Standard normal (the ziggurat method; see `SplitMix64::normal`).
    pub fn normal(&mut self) -> f64 {
        self.0.normal()
    }

    /// `n` values uniform in [-bound, bound).
    pub fn uniform_vec(&mut self, n: usize, bound: f64) -> Vec<f32> {
        (0..n)
            .map(|_| ((self.uniform() * 2.0 - 1.0) * bound) as f32)
            .collect()
    }
}

/// Anything with named parameters (PyTorch `named_parameters()` order and names).
///
/// Derive it: `#[derive(Module)]` on a struct walks its fields in order and names each
/// parameter by its field path (`layers.0.self_attn.weight` for `layers: Vec<Block>`), with
/// `#[module(rename = "...")]`, `#[module(skip)]` (sizes, `eps`), `#[module(buffer)]` (state
/// no optimizer updates) and `#[module(index_step = 2)]` (an `nn.Sequential` with activations
/// between its layers). Write `named_params` by hand only for names no field path gives,
/// joining with [`join_name`].
///
/// ```
/// use neuron_pc::nn::{LayerNorm, Linear, Module};
///
/// #[derive(Module)]
/// struct Block {
///     #[module(rename = "self_attn")]
///     attention: Linear,
///     norm: Option<LayerNorm>,
///     #[module(skip)]
///     width: usize,
/// }
///
/// #[derive(Module)]
/// struct Model {
///     layers: Vec<Block>, // layers.0.self_attn.weight, layers.0.norm.weight, ...
/// }
/// ```
pub trait Module {
    /// Appends `(prefix + name, tensor)` for every parameter.
    fn named_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>);

    /// All parameters with their names; each unnamed parameter tensor is also given its name
    /// (see [`Tensor::set_name`]), so diagnostics can name it.
    fn parameters(&self) -> Vec<(String, Tensor)> {
        let mut v = Vec::new();
        self.named_params("", &mut v);
        for (name, t) in &v {
            if t.name().is_none() {
                t.set_name(name);
            }
        }
        v
    }

    /// Appends `(prefix + name, tensor)` for every buffer: state a checkpoint holds but no
    /// optimiser updates (PyTorch's `named_buffers()`, such as `BatchNorm`'s running
    /// statistics). None by default; a module holding a `BatchNorm` forwards to it.
    fn named_buffers(&self, _prefix: &str, _out: &mut Vec<(String, Tensor)>) {}

    /// Parameters, then buffers: what PyTorch's `state_dict()` holds.
    fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut v = self.parameters();
        self.named_buffers("", &mut v);
        v
    }
}

/// `prefix.name`, or `name` under an empty prefix: how a parameter's state-dict name is built
/// from its module's. What `#[derive(Module)]` calls; a hand-written
/// [`Module::named_params`] uses it too.
pub fn join_name(prefix: &str, name: &str) -> String {
    join(prefix, name)
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

/// `y = x W^T + b`, weight `[out, in]`, initialised like `torch.nn.Linear`
/// (uniform in ±1/sqrt(in) for both weight and bias).
#[derive(Module)]
pub struct Linear {
    /// `[outputs, inputs]`.
    pub weight: Tensor,
    /// `[outputs]`, or `None` for a layer without a bias.
    pub bias: Option<Tensor>,
}

impl Linear {
    /// `torch.nn.Linear(inputs, outputs, bias)`: weight `[outputs, inputs]` and bias
    /// `[outputs]` uniform in ±1/sqrt(inputs), drawn from `rng` in float32.
    pub fn new(
        device: &LazyDevice,
        rng: &mut HostRng,
        inputs: usize,
        outputs: usize,
        bias: bool,
    ) -> Result<Linear> {
        let bound = 1.0 / (inputs as f64).sqrt();
        let w = HostTensor::from_slice(
            &rng.uniform_vec(inputs * outputs, bound),
            &[outputs, inputs],
        )?;
        let bias = if bias {
            Some(device.tensor(&HostTensor::from_slice(
                &rng.uniform_vec(outputs, bound),
                &[outputs],
            )?)?)
        } else {
            None
        };
        Ok(Linear {
            weight: device.tensor(&w)?,
            bias,
        })
    }

    /// `weight [outputs, inputs]` (and `bias [outputs]`) under `vb`'s prefix, read from its
    /// checkpoint; with no checkpoint, `torch.nn.Linear`'s initialisation.
    pub fn from_vb(vb: &VarBuilder, inputs: usize, outputs: usize, bias: bool) -> Result<Linear> {
        let init = Init::Uniform {
            bound: 1.0 / (inputs as f64).sqrt(),
        };
        Ok(Linear {
            weight: vb.get(&[outputs, inputs], "weight", init)?,
            bias: match bias {
                true => Some(vb.get(&[outputs], "bias", init)?),
                false => None,
            },
        })
    }

    /// `x [.., inputs]` → `[.., outputs]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.linear(&self.weight, self.bias.as_ref())
    }
}

/// A lookup table `[num, dim]`, initialised like `torch.nn.Embedding` (standard normal).
#[derive(Module)]
pub struct Embedding {
    /// `[num, dim]`: row `i` is the vector of id `i`.
    pub weight: Tensor,
}

impl Embedding {
    /// `torch.nn.Embedding(num, dim)`: `num` rows of `dim` values, standard normal, drawn
    /// from `rng` in float32.
    pub fn new(
        device: &LazyDevice,
        rng: &mut HostRng,
        num: usize,
        dim: usize,
    ) -> Result<Embedding> {
        let w: Vec<f32> = (0..num * dim).map(|_| rng.normal() as f32).collect();
        Ok(Embedding {
            weight: device.tensor(&HostTensor::from_slice(&w, &[num, dim])?)?,
        })
    }

    /// `weight [num, dim]` under `vb`'s prefix (standard normal with no checkpoint).
    pub fn from_vb(vb: &VarBuilder, num: usize, dim: usize) -> Result<Embedding> {
        Ok(Embedding {
            weight: vb.get(&[num, dim], "weight", Init::Normal { std: 1.0 })?,
        })
    }

    /// `ids` of any shape (integer) → `ids.dims() + [dim]`. An id past the table reads its
    /// last row (XLA clamps) where PyTorch raises; index checks
    /// ([`crate::DeviceConfig::check_indices`]) make it an error naming this call.
    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.weight
            .index_select_rows_as("embedding", ids, std::panic::Location::caller())
    }
}

/// Layer normalisation over the last dimension, like `torch.nn.LayerNorm` (weight 1, bias 0).
#[derive(Module)]
pub struct LayerNorm {
    /// `[dim]`, the per-feature scale.
    pub weight: Tensor,
    /// `[dim]`, the per-feature shift.
    pub bias: Tensor,
    /// Added to the variance before the square root (PyTorch's default 1e-5).
    #[module(skip)]
    pub eps: f64,
}

impl LayerNorm {
    /// PyTorch's default `eps`, 1e-5.
    pub fn new(device: &LazyDevice, dim: usize) -> Result<LayerNorm> {
        LayerNorm::with_eps(device, dim, 1e-5)
    }

    /// `torch.nn.LayerNorm(dim, eps=eps)` (a model config's `layer_norm_eps`).
    pub fn with_eps(device: &LazyDevice, dim: usize, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: device.tensor(&HostTensor::from_slice(&vec![1f32; dim], &[dim])?)?,
            bias: device.tensor(&HostTensor::zeros(DType::F32, &[dim]))?,
            eps,
        })
    }

    /// `weight` and `bias` `[dim]` under `vb`'s prefix (1 and 0 with no checkpoint).
    pub fn from_vb(vb: &VarBuilder, dim: usize, eps: f64) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: vb.get(&[dim], "weight", Init::Const(1.0))?,
            bias: vb.get(&[dim], "bias", Init::Const(0.0))?,
            eps,
        })
    }

    /// `x [.., dim]` normalised over its last dimension (biased variance), then scaled by
    /// `weight` and shifted by `bias`; the same shape.
    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        check_last_dim("layer_norm", x, &self.weight)?;
        let mean = x.mean(&[-1], true)?;
        let centered = x.sub(&mean)?;
        let var = centered.mul(&centered)?.mean(&[-1], true)?;
        let normed = centered.mul(&var.add_scalar(self.eps)?.rsqrt()?)?;
        normed.mul(&self.weight)?.add(&self.bias)
    }
}

/// GELU, exact form (PyTorch's default): `0.5 x (1 + erf(x / sqrt 2))`, computed as
/// `0.5 x erfc(-x / sqrt 2)`, as JAX does. The two are equal; the erfc form has no cancellation
/// for negative x, and XLA's cpu backend runs the step it makes about 10% faster on 2 cores
/// (docs/design.md, "The IR, and trade-offs taken").
#[track_caller]
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    // a bf16 or f16 input in float32, rounded once (see `Tensor::silu`)
    if matches!(x.dtype(), DType::BF16 | DType::F16) {
        return gelu(&x.to_dtype(DType::F32)?)?.to_dtype(x.dtype());
    }
    let inner = x.mul_scalar(-std::f64::consts::FRAC_1_SQRT_2)?.erfc()?;
    x.mul(&inner)?.mul_scalar(0.5)
}

/// SiLU (swish), `x * sigmoid(x)` (`torch.nn.functional.silu`); see [`Tensor::silu`].
#[track_caller]
pub fn silu(x: &Tensor) -> Result<Tensor> {
    x.silu()
}

/// Softmax along `dim` (max-subtracted for stability). The maximum is cut off from
/// differentiation ([`Tensor::detach`]): the softmax does not depend on the shift, so its
/// gradient there is zero, and following it cost a comparison, a product and a sum over the
/// whole input in the backward pass (per layer, the attention scores: the step's largest
/// tensor) to add round-off. The small Llama's step compiles 6-7% faster without it.
#[track_caller]
pub fn softmax(x: &Tensor, dim: isize) -> Result<Tensor> {
    let shifted = x.sub(&x.max(&[dim], true)?.detach()?)?;
    let e = shifted.exp()?;
    e.div(&e.sum(&[dim], true)?)
}

/// Log-softmax along `dim` (the maximum subtracted and cut off from differentiation, as in
/// [`softmax`]).
#[track_caller]
pub fn log_softmax(x: &Tensor, dim: isize) -> Result<Tensor> {
    let shifted = x.sub(&x.max(&[dim], true)?.detach()?)?;
    shifted.sub(&shifted.exp()?.sum(&[dim], true)?.log()?)
}

/// One-hot rows: integer `labels [n]` → `[n, classes]` of `dtype`.
#[track_caller]
pub fn one_hot(labels: &Tensor, classes: usize, dtype: DType) -> Result<Tensor> {
    check_rank("one_hot", "labels", labels, 1, "[n]")?;
    if !labels.dtype().is_int() {
        return Err(crate::tensor::shape_error(
            "one_hot",
            labels.ty().to_string(),
            format!(
                "labels must have an integer dtype, got {} \
                 (convert class indices with to_dtype(DType::I32))",
                labels.dtype()
            ),
            std::panic::Location::caller(),
        ));
    }
    let n = labels.dims()[0];
    let dev = labels.device_inner()?;
    let iota = Tensor::apply_nullary(
        &dev,
        Op::Iota {
            dims: vec![n, classes],
            dim: 1,
            dtype: labels.dtype(),
        },
    )?;
    let expanded = labels.unsqueeze(1)?;
    expanded.eq(&iota)?.to_dtype(dtype)
}

/// Mean cross-entropy of `logits [.., classes]` against integer `labels [..]` with PyTorch's
/// defaults: labels equal to -100 ([`loss::IGNORE_INDEX`]) are ignored and the mean runs over
/// the others. [`cross_entropy_with`] takes other options (no ignored label, label smoothing).
#[track_caller]
pub fn cross_entropy(logits: &Tensor, labels: &Tensor) -> Result<Tensor> {
    cross_entropy_with(logits, labels, CrossEntropyOptions::default())
}

/// Mean of `x [b, s, d]` over the positions where `mask [b, s]` (float 0/1) is 1.
#[track_caller]
pub fn masked_mean(x: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let m = mask.unsqueeze(2)?;
    let total = x.mul(&m)?.sum(&[1], false)?;
    let count = mask.sum(&[1], true)?.maximum(&mask.constant_like(1e-9)?)?;
    total.div(&count)
}

/// Inverted dropout: zeroes elements with probability `p` and scales the rest by `1/(1-p)`.
/// `key` is a `u32[2]` device tensor (a new one per step keeps the same graph); the same key
/// gives the same mask, so runs are reproducible.
#[track_caller]
pub fn dropout(x: &Tensor, p: f64, key: &Tensor) -> Result<Tensor> {
    if p <= 0.0 {
        return Ok(x.clone());
    }
    let device = x.device()?;
    let u = device.rand(key, x.dims())?;
    let keep = u.ge(&u.constant_like(p)?)?.to_dtype(x.dtype())?;
    x.mul(&keep)?.mul_scalar(1.0 / (1.0 - p))
}

/// Multi-head self-attention with `torch.nn.MultiheadAttention`'s parameter layout
/// (`in_proj_weight [3E, E]`, `in_proj_bias [3E]`, `out_proj.weight`, `out_proj.bias`).
#[derive(Module)]
pub struct MultiHeadAttention {
    /// `[3E, E]`: the query, key and value projections stacked in that order.
    pub in_proj_weight: Tensor,
    /// `[3E]`: the three projections' biases.
    pub in_proj_bias: Tensor,
    /// The output projection, `[E, E]` with a bias.
    pub out_proj: Linear,
    /// Number of heads; each head has `E / heads` dimensions.
    #[module(skip)]
    pub heads: usize,
}

/// PyTorch's check in `nn.MultiheadAttention`: each head takes `dim / heads` features.
fn check_heads(dim: usize, heads: usize) -> Result<()> {
    if heads == 0 || !dim.is_multiple_of(heads) {
        return Err(Error::Config(format!(
            "MultiHeadAttention: embed_dim {dim} must be divisible by num_heads {heads}"
        )));
    }
    Ok(())
}

impl MultiHeadAttention {
    /// Initialised as PyTorch does: Xavier-uniform in-projection, zero biases, and the output
    /// projection like a Linear layer with a zero bias. `dim` must divide by `heads`, as
    /// PyTorch requires.
    pub fn new(
        device: &LazyDevice,
        rng: &mut HostRng,
        dim: usize,
        heads: usize,
    ) -> Result<MultiHeadAttention> {
        check_heads(dim, heads)?;
        let bound = (6.0 / (dim + 3 * dim) as f64).sqrt();
        let w = HostTensor::from_slice(&rng.uniform_vec(3 * dim * dim, bound), &[3 * dim, dim])?;
        let mut out_proj = Linear::new(device, rng, dim, dim, false)?;
        out_proj.bias = Some(device.tensor(&HostTensor::zeros(DType::F32, &[dim]))?);
        Ok(MultiHeadAttention {
            in_proj_weight: device.tensor(&w)?,
            in_proj_bias: device.tensor(&HostTensor::zeros(DType::F32, &[3 * dim]))?,
            out_proj,
            heads,
        })
    }

    /// `in_proj_weight`, `in_proj_bias` and `out_proj.{weight,bias}` under `vb`'s prefix;
    /// with no checkpoint, PyTorch's initialisation as in [`MultiHeadAttention::new`]. `dim`
    /// must divide by `heads`.
    pub fn from_vb(vb: &VarBuilder, dim: usize, heads: usize) -> Result<MultiHeadAttention> {
        check_heads(dim, heads)?;
        let xavier = Init::Uniform {
            bound: (6.0 / (dim + 3 * dim) as f64).sqrt(),
        };
        let zero = Init::Const(0.0);
        let out = vb.pp("out_proj");
        Ok(MultiHeadAttention {
            in_proj_weight: vb.get(&[3 * dim, dim], "in_proj_weight", xavier)?,
            in_proj_bias: vb.get(&[3 * dim], "in_proj_bias", zero)?,
            out_proj: Linear {
                weight: out.get(
                    &[dim, dim],
                    "weight",
                    Init::Uniform {
                        bound: 1.0 / (dim as f64).sqrt(),
                    },
                )?,
                bias: Some(out.get(&[dim], "bias", zero)?),
            },
            heads,
        })
    }

    /// `x [b, s, e]`, optional `mask [b, s]` (1 = attend, 0 = padding) → `[b, s, e]`.
    #[track_caller]
    pub fn forward(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        self.forward_with(x, mask, false)
    }

    /// As [`MultiHeadAttention::forward`]; with `causal`, position `i` attends only to
    /// positions `<= i` (PyTorch's `is_causal=True` / a square subsequent mask).
    #[track_caller]
    pub fn forward_with(&self, x: &Tensor, mask: Option<&Tensor>, causal: bool) -> Result<Tensor> {
        let op = "MultiHeadAttention::forward";
        check_rank(op, "x", x, 3, "[batch, seq, embed]")?;
        if let Some(m) = mask {
            check_rank(op, "mask", m, 2, "[batch, seq]")?;
        }
        let (b, s, e) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let h = self.heads;
        let d = e / h;
        let qkv = x.linear(&self.in_proj_weight, Some(&self.in_proj_bias))?; // [b, s, 3e]
        let split = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, i * e, e)?
                .reshape(&[b, s, h, d])?
                .permute(&[0, 2, 1, 3]) // [b, h, s, d]
        };
        let (q, k, v) = (split(0)?, split(1)?, split(2)?);
        let scores = q
            .matmul(&k.transpose(2, 3)?)?
            .mul_scalar(1.0 / (d as f64).sqrt())?; // [b, h, s, s]
        let scores = match mask {
            Some(m) => {
                // padding keys get a large negative score
                let bias = m
                    .add_scalar(-1.0)?
                    .mul_scalar(1e9)?
                    .reshape(&[b, 1, 1, s])?;
                scores.add(&bias)?
            }
            None => scores,
        };
        let scores = if causal {
            // key position j > query position i gets a large negative score
            let dev = x.device_inner()?;
            let pos = |dim: usize| {
                Tensor::apply_nullary(
                    &dev,
                    Op::Iota {
                        dims: vec![s, s],
                        dim,
                        dtype: DType::I32,
                    },
                )
            };
            let future = pos(1)?.gt(&pos(0)?)?;
            let bias = Tensor::where_cond(
                &future,
                &scores.constant_like(-1e9)?,
                &scores.constant_like(0.0)?,
            )?;
            scores.add(&bias)?
        } else {
            scores
        };
        let attn = softmax(&scores, -1)?;
        let ctx = attn
            .matmul(&v)?
            .permute(&[0, 2, 1, 3])?
            .reshape(&[b, s, e])?;
        self.out_proj.forward(&ctx)
    }
}
