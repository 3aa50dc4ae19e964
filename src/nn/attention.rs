//! The attention building blocks of decoder-only language models: rotary position embeddings
//! in Hugging Face's rotate-half convention and a functional scaled-dot-product attention with
//! grouped-query heads, both composites of tensor primitives.

use std::panic::Location;

use neuron_pc_compiler::{DType, HostTensor};

use crate::device::LazyDevice;
use crate::error::Result;
use crate::nn::{softmax, RopeScaling};
use crate::tensor::{shape_error, Tensor};

/// Rotary position embeddings as Hugging Face's `LlamaRotaryEmbedding` computes them:
/// `inv_freq[i] = 1 / rope_theta^(2i / head_dim)` for `i < head_dim / 2` (or the table of a
/// [`RopeScaling`]), the angle of position `p` is `p * inv_freq` repeated twice
/// (`cat(freqs, freqs)`), and [`apply_rotary_pos_emb`] rotates with `rotate_half`.
///
/// The position ids are a tensor input, not a constant of the graph: a window shifted along
/// the sequence (the next chunk of a long document, a decoding step) feeds new ids to the same
/// graph. `cos`/`sin` are computed in the graph, in float32 as Hugging Face does, then cast to
/// the dtype of the tensor they rotate.
pub struct RotaryEmbedding {
    /// `[head_dim / 2]` float32, uploaded once; like Hugging Face's non-persistent buffer, not a
    /// parameter and not in the state dict.
    pub inv_freq: Tensor,
    /// The dimension of one attention head (even).
    pub head_dim: usize,
    /// The base `theta` of the frequencies (`rope_theta` in `config.json`).
    pub rope_theta: f64,
    /// How the frequencies are scaled ([`RopeScaling::Default`]: not at all).
    pub scaling: RopeScaling,
}

impl RotaryEmbedding {
    /// `head_dim` must be even; Llama 2 uses `rope_theta` 10000, Llama 3 500000.
    pub fn new(device: &LazyDevice, head_dim: usize, rope_theta: f64) -> Result<RotaryEmbedding> {
        RotaryEmbedding::scaled(device, head_dim, rope_theta, RopeScaling::Default)
    }

    /// With the frequencies scaled as `scaling` says (`rope_parameters` of a long-context
    /// checkpoint).
    pub fn scaled(
        device: &LazyDevice,
        head_dim: usize,
        rope_theta: f64,
        scaling: RopeScaling,
    ) -> Result<RotaryEmbedding> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(crate::Error::Config(format!(
                "RotaryEmbedding: the head dimension must be even and positive, got {head_dim}"
            )));
        }
        let inv = scaling.inv_freq(head_dim, rope_theta);
        Ok(RotaryEmbedding {
            inv_freq: device.tensor(&HostTensor::from_slice(&inv, &[head_dim / 2])?)?,
            head_dim,
            rope_theta,
            scaling,
        })
    }

    /// The inverse frequencies for `position_ids`: the fixed table, or for dynamic NTK scaling
    /// the table of the rescaled base once the positions pass `max_position_embeddings`
    /// (float32, as `_compute_dynamic_ntk_parameters` computes it).
    fn frequencies(&self, position_ids: &Tensor) -> Result<Tensor> {
        let RopeScaling::Dynamic {
            factor,
            max_position_embeddings: max,
        } = self.scaling
        else {
            return Ok(self.inv_freq.clone());
        };
        let dims: Vec<isize> = (0..position_ids.rank() as isize).collect();
        let seq = position_ids
            .max(&dims, false)?
            .to_dtype(DType::F32)?
            .add_scalar(1.0)?;
        let seq = seq.maximum(&seq.constant_like(max as f64)?)?;
        let d = self.head_dim as f64;
        let base = seq
            .mul_scalar(factor)?
            .mul_scalar(1.0 / max as f64)?
            .add_scalar(-(factor - 1.0))?
            .powf(d / (d - 2.0))?
            .mul_scalar(self.rope_theta)?;
        let exponents: Vec<f32> = (0..self.head_dim / 2)
            .map(|i| (2 * i) as f32 / d as f32)
            .collect();
        let dev = position_ids.device()?;
        let exponents = dev.tensor(&HostTensor::from_slice(&exponents, &[self.head_dim / 2])?)?;
        let powers = base.broadcast_to(&[self.head_dim / 2])?.pow(&exponents)?;
        powers.constant_like(1.0)?.div(&powers)
    }

    /// `position_ids` (integer, `[s]` or `[b, s]`) → `(cos, sin)`, each float32 of shape
    /// `position_ids.dims() + [head_dim]`.
    #[track_caller]
    pub fn cos_sin(&self, position_ids: &Tensor) -> Result<(Tensor, Tensor)> {
        let location = Location::caller();
        if !position_ids.dtype().is_int() || !(1..=2).contains(&position_ids.rank()) {
            return Err(shape_error(
                "rotary_embedding",
                position_ids.ty().to_string(),
                "position ids must be integers of shape [seq] or [batch, seq]".into(),
                location,
            ));
        }
        // the outer product positions x inv_freq, then the halves repeated: [.., s, head_dim]
        let freqs = position_ids
            .to_dtype(DType::F32)?
            .unsqueeze(-1)?
            .mul(&self.frequencies(position_ids)?)?;
        let emb = Tensor::cat(&[&freqs, &freqs], -1)?;
        // Each table times the identity, which leaves it bit for bit as it is (one product
        // of 1, the others of 0) but makes XLA compute it once: sine and cosine are cheap
        // for XLA's fusion, which otherwise recomputes the table inside every fusion that
        // reads it, per element of the broadcast q or k (the small Llama: 16 sine and 16
        // cosine ops, each evaluated over a [4, 8 or 4, 128, 32] fusion, 3% of the step).
        let dev = position_ids.device()?;
        let idx = dev.arange(self.head_dim, DType::I32)?;
        let eye = idx.unsqueeze(-1)?.eq(&idx)?.to_dtype(DType::F32)?;
        let scale = self.scaling.attention_scaling();
        // float32 under autocast too, as transformers computes the tables with it disabled
        dev.autocast(None, || {
            let (cos, sin) = (emb.cos()?.matmul(&eye)?, emb.sin()?.matmul(&eye)?);
            if scale == 1.0 {
                return Ok((cos, sin));
            }
            Ok((cos.mul_scalar(scale)?, sin.mul_scalar(scale)?))
        })
    }

    /// Rotates `q [b, heads, s, head_dim]` and `k [b, kv_heads, s, head_dim]` for
    /// `position_ids` (`[s]` or `[b, s]`), as Hugging Face's `LlamaAttention` does before the
    /// attention product.
    #[track_caller]
    pub fn forward(
        &self,
        q: &Tensor,
        k: &Tensor,
        position_ids: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let (cos, sin) = self.cos_sin(position_ids)?;
        Ok((
            apply_rotary_pos_emb(q, &cos, &sin)?,
            apply_rotary_pos_emb(k, &cos, &sin)?,
        ))
    }
}

/// `cat(-x2, x1)` of the two halves of the last dimension (Hugging Face's `rotate_half`).
#[track_caller]
pub fn rotate_half(x: &Tensor) -> Result<Tensor> {
    let location = Location::caller();
    let d = x.dims().last().copied().unwrap_or(0);
    if d == 0 || !d.is_multiple_of(2) {
        return Err(shape_error(
            "rotate_half",
            x.ty().to_string(),
            "the last dimension must be even and positive".into(),
            location,
        ));
    }
    let x1 = x.narrow(-1, 0, d / 2)?;
    let x2 = x.narrow(-1, d / 2, d / 2)?;
    Tensor::cat(&[&x2.neg()?, &x1], -1)
}

/// `x * cos + rotate_half(x) * sin` for `x [b, heads, s, head_dim]` with the tables of
/// [`RotaryEmbedding::cos_sin`] (`[s, head_dim]` or `[b, s, head_dim]`, shared by the heads).
#[track_caller]
pub fn apply_rotary_pos_emb(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let location = Location::caller();
    let err = |message: String| {
        shape_error(
            "apply_rotary_pos_emb",
            format!("{}, {}, {}", x.ty(), cos.ty(), sin.ty()),
            message,
            location,
        )
    };
    if x.rank() != 4 {
        return Err(err(format!(
            "x must have rank 4 ([batch, heads, seq, head_dim]), got rank {}",
            x.rank()
        )));
    }
    let (b, s, d) = (x.dims()[0], x.dims()[2], x.dims()[3]);
    let ok = |t: &Tensor| match t.dims() {
        [ts, td] => *ts == s && *td == d,
        [tb, ts, td] => (*tb == b || *tb == 1) && *ts == s && *td == d,
        _ => false,
    };
    if cos.dims() != sin.dims() || !ok(cos) {
        return Err(err(format!(
            "cos and sin must both be [{s}, {d}] or [{b}, {s}, {d}]"
        )));
    }
    let table = |t: &Tensor| -> Result<Tensor> {
        let t = t.to_dtype(x.dtype())?;
        if t.rank() == 3 {
            t.unsqueeze(1) // [b, 1, s, d]: the same angles for every head
        } else {
            Ok(t)
        }
    };
    x.mul(&table(cos)?)?
        .add(&rotate_half(x)?.mul(&table(sin)?)?)
}

/// `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask, is_causal, scale,
/// enable_gqa=True)`: `softmax(q k^T * scale + mask) v` over `q [b, heads, sq, d]`,
/// `k [b, kv_heads, sk, d]` and `v [b, kv_heads, sk, dv]` → `[b, heads, sq, dv]`.
///
/// - Grouped-query heads: `kv_heads` must divide `heads`; query head `h` reads kv head
///   `h / (heads / kv_heads)` (PyTorch's and Hugging Face's `repeat_interleave` order). The kv
///   heads are never repeated in memory: the queries are regrouped as
///   `[b, kv_heads, group * sq, d]` (a reshape) and each product is one batched `dot_general`.
/// - `mask` broadcasts to `[b, heads, sq, sk]`: a boolean one (`DType::Pred`) keeps the
///   positions that are true (the others get `-inf`), a float one is added to the scores.
/// - `causal` keeps key `j <= i` for query `i` (PyTorch's top-left aligned lower triangle). It
///   may be combined with a mask (PyTorch refuses both at once; here both apply).
/// - `scale` defaults to `1 / sqrt(d)`.
///
/// A query row with every key masked gives NaN, as in PyTorch.
#[track_caller]
pub fn scaled_dot_product_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: Option<f64>,
) -> Result<Tensor> {
    let location = Location::caller();
    let operands = || {
        let mut s = format!("{}, {}, {}", q.ty(), k.ty(), v.ty());
        if let Some(m) = mask {
            s.push_str(&format!(", mask {}", m.ty()));
        }
        s
    };
    let err = |message: String| {
        shape_error(
            "scaled_dot_product_attention",
            operands(),
            message,
            location,
        )
    };
    for (name, t) in [("q", q), ("k", k), ("v", v)] {
        if t.rank() != 4 {
            return Err(err(format!(
                "{name} must have rank 4 ([batch, heads, seq, head_dim]), got rank {}",
                t.rank()
            )));
        }
    }
    let (b, hq, sq, d) = (q.dims()[0], q.dims()[1], q.dims()[2], q.dims()[3]);
    let (hkv, sk) = (k.dims()[1], k.dims()[2]);
    let dv = v.dims()[3];
    if k.dims()[0] != b || v.dims()[0] != b {
        return Err(err("q, k and v must have the same batch size".into()));
    }
    if k.dims()[3] != d {
        return Err(err(format!(
            "q and k must have the same head dimension ({d} vs {})",
            k.dims()[3]
        )));
    }
    if v.dims()[1] != hkv || v.dims()[2] != sk {
        return Err(err(
            "k and v must have the same number of heads and the same sequence length".into(),
        ));
    }
    if hkv == 0 || !hq.is_multiple_of(hkv) {
        return Err(err(format!(
            "the {hkv} key/value heads must divide the {hq} query heads"
        )));
    }
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        return Err(err("q, k and v must have the same dtype".into()));
    }
    let group = hq / hkv;
    let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
    // [b, hkv, group * sq, d] . [b, hkv, sk, d] -> [b, hkv, group * sq, sk] -> [b, hq, sq, sk]
    let qg = q.reshape(&[b, hkv, group * sq, d])?;
    let scores = qg
        .dot_general(k, &[0, 1], &[0, 1], &[3], &[3])?
        .reshape(&[b, hq, sq, sk])?
        .mul_scalar(scale)?;
    let scores = match mask {
        None => scores,
        Some(m) => {
            let full = [b, hq, sq, sk];
            let fits = m.rank() <= 4
                && m.dims()
                    .iter()
                    .rev()
                    .zip(full.iter().rev())
                    .all(|(&md, &fd)| md == fd || md == 1);
            if !fits {
                return Err(err(format!("the mask must broadcast to {full:?}")));
            }
            if m.dtype() == DType::Pred {
                let neg_inf = scores.constant_like(f64::NEG_INFINITY)?;
                Tensor::where_cond(m, &scores, &neg_inf)?
            } else if m.dtype().is_float() {
                scores.add(&m.to_dtype(scores.dtype())?)?
            } else {
                return Err(err(format!(
                    "the mask must be boolean or float, got {}",
                    m.dtype()
                )));
            }
        }
    };
    let scores = if causal {
        let rows = scores.device()?.arange(sq, DType::I32)?.unsqueeze(1)?; // [sq, 1]
        let cols = scores.device()?.arange(sk, DType::I32)?; // [sk]
        let keep = cols.le(&rows)?; // [sq, sk]
        Tensor::where_cond(&keep, &scores, &scores.constant_like(f64::NEG_INFINITY)?)?
    } else {
        scores
    };
    // in float32 for a lower-precision input, then back (transformers' eager attention:
    // `softmax(scores, dtype=float32).to(q.dtype)`)
    let probs = match scores.dtype() {
        DType::BF16 | DType::F16 => {
            softmax(&scores.to_dtype(DType::F32)?, -1)?.to_dtype(q.dtype())?
        }
        _ => softmax(&scores, -1)?,
    }
    .reshape(&[b, hkv, group * sq, sk])?;
    // [b, hkv, group * sq, sk] . [b, hkv, sk, dv] -> [b, hkv, group * sq, dv]
    probs
        .dot_general(v, &[0, 1], &[0, 1], &[3], &[2])?
        .reshape(&[b, hq, sq, dv])
}
