//! The rotary scalings of `transformers`' `rope_parameters` (`rope_scaling` before version 5):
//! each turns the default inverse frequencies `1 / theta^(2i / d)` into the ones a long-context
//! checkpoint was trained with. All but `dynamic` are fixed tables, computed here on the host
//! in float32 in the order `modeling_rope_utils.py` computes them, so the tables agree to the
//! bit; `dynamic` depends on the positions and is computed in the graph
//! ([`crate::nn::RotaryEmbedding::cos_sin`]).

use std::f32::consts::PI;

/// How the rotary frequencies are scaled (`rope_type` and its keys).
#[derive(Clone, Debug, PartialEq, Default)]
#[non_exhaustive]
pub enum RopeScaling {
    /// `default`: `inv_freq[i] = 1 / theta^(2i / d)`.
    #[default]
    Default,
    /// `linear` (position interpolation): the default frequencies divided by `factor`.
    Linear {
        /// The divisor of the frequencies (how many times longer the new context is).
        factor: f64,
    },
    /// `dynamic` (NTK-aware): for sequences past `max_position_embeddings` the base becomes
    /// `theta ((factor L / max) - (factor - 1))^(d / (d - 2))`, `L` the largest position + 1.
    /// `transformers` caches the frequencies of the longest sequence seen so far (until one
    /// shorter than `max_position_embeddings` resets them); here each graph uses its own
    /// positions' frequencies, which is the same whenever sequence lengths do not shrink
    /// while staying past `max_position_embeddings` (a fixed training length, for one).
    Dynamic {
        /// The scaling factor of the base's formula.
        factor: f64,
        /// The trained context length: sequences up to it keep the default frequencies.
        max_position_embeddings: usize,
    },
    /// `llama3` (Llama 3.1+): wavelengths longer than `original / low_freq_factor` are
    /// divided by `factor`, shorter than `original / high_freq_factor` kept, the band in
    /// between blended smoothly.
    Llama3 {
        /// The divisor of the long wavelengths' frequencies (8 for Llama 3.1).
        factor: f64,
        /// Wavelengths longer than `original / low_freq_factor` are scaled (1 for Llama 3.1).
        low_freq_factor: f64,
        /// Wavelengths shorter than `original / high_freq_factor` are kept (4 for Llama 3.1).
        high_freq_factor: f64,
        /// `original`: the context length of pretraining (8192 for Llama 3.1).
        original_max_position_embeddings: usize,
    },
    /// `yarn`: interpolated and extrapolated frequencies blended by a ramp between the
    /// dimensions of `beta_fast` and `beta_slow` rotations over the original length, and
    /// `cos`/`sin` multiplied by the attention factor (given, or `0.1 ln(factor) + 1` with
    /// `mscale`/`mscale_all_dim` as `transformers` reads them).
    Yarn {
        /// The divisor of the interpolated frequencies (a config without one gives
        /// `max_position_embeddings / original_max_position_embeddings`).
        factor: f64,
        /// The context length of pretraining.
        original_max_position_embeddings: usize,
        /// The factor `cos` and `sin` are multiplied by; `None` derives it from `factor`
        /// (see [`RopeScaling::attention_scaling`]).
        attention_factor: Option<f64>,
        /// With `mscale_all_dim` (both non-zero) and no `attention_factor`, the attention
        /// factor is `(0.1 mscale ln(factor) + 1) / (0.1 mscale_all_dim ln(factor) + 1)` for a
        /// `factor` above 1 (DeepSeek's configs).
        mscale: Option<f64>,
        /// See `mscale`.
        mscale_all_dim: Option<f64>,
        /// Dimensions that rotate at least this many times over the original length keep
        /// their frequencies (`transformers`' default 32).
        beta_fast: f64,
        /// Dimensions that rotate at most this many times over the original length are
        /// interpolated (`transformers`' default 1).
        beta_slow: f64,
        /// Rounds the ends of the blending ramp to whole dimensions (`transformers`' default
        /// true).
        truncate: bool,
    },
}

impl RopeScaling {
    /// The `rope_type` name in `config.json`.
    pub fn rope_type(&self) -> &'static str {
        match self {
            RopeScaling::Default => "default",
            RopeScaling::Linear { .. } => "linear",
            RopeScaling::Dynamic { .. } => "dynamic",
            RopeScaling::Llama3 { .. } => "llama3",
            RopeScaling::Yarn { .. } => "yarn",
        }
    }

    /// The factor `cos` and `sin` are multiplied by (`attention_scaling`): 1 but for YaRN.
    pub fn attention_scaling(&self) -> f64 {
        let RopeScaling::Yarn {
            factor,
            attention_factor,
            mscale,
            mscale_all_dim,
            ..
        } = *self
        else {
            return 1.0;
        };
        let get = |m: f64| {
            if factor <= 1.0 {
                1.0
            } else {
                0.1 * m * factor.ln() + 1.0
            }
        };
        match (attention_factor, mscale, mscale_all_dim) {
            (Some(a), _, _) => a,
            // transformers tests both for truthiness: a 0 counts as absent
            (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => get(m) / get(all),
            _ => get(1.0),
        }
    }

    /// The `[head_dim / 2]` inverse frequencies (for `dynamic`, those of sequences up to
    /// `max_position_embeddings`).
    pub fn inv_freq(&self, head_dim: usize, theta: f64) -> Vec<f32> {
        let d = head_dim as f32;
        // torch: `1.0 / (base ** (arange(0, d, 2).float() / d))`
        let exponents = (0..head_dim / 2).map(|i| (2 * i) as f32 / d);
        let default: Vec<f32> = exponents.map(|e| 1.0 / (theta as f32).powf(e)).collect();
        match *self {
            RopeScaling::Default | RopeScaling::Dynamic { .. } => default,
            RopeScaling::Linear { factor } => default.iter().map(|f| f / factor as f32).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let (factor, low, high) = (factor as f32, low_freq_factor, high_freq_factor);
                let old = original_max_position_embeddings as f64;
                let (low_wavelen, high_wavelen) = ((old / low) as f32, (old / high) as f32);
                default
                    .iter()
                    .map(|&f| {
                        let wavelen = 2.0 * PI / f;
                        let scaled = if wavelen > low_wavelen { f / factor } else { f };
                        // torch's `~(w < high) * ~(w > low)`; the wavelengths are finite
                        let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                        if !medium {
                            return scaled;
                        }
                        let smooth = (old as f32 / wavelen - low as f32) / (high - low) as f32;
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    })
                    .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                let dim = head_dim as f64;
                let correction = |rotations: f64| {
                    dim * (original_max_position_embeddings as f64
                        / (rotations * 2.0 * std::f64::consts::PI))
                        .ln()
                        / (2.0 * theta.ln())
                };
                let (mut low, mut high) = (correction(beta_fast), correction(beta_slow));
                if truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
                if low == high {
                    high += 0.001;
                }
                (0..head_dim / 2)
                    .map(|i| {
                        // torch: pos_freqs = base ** e; 1 / pos_freqs; 1 / (factor * pos_freqs)
                        let pos = (theta as f32).powf((2 * i) as f32 / d);
                        let extrapolation = 1.0 / pos;
                        let interpolation = 1.0 / (factor as f32 * pos);
                        let ramp = ((i as f32 - low as f32) / (high - low) as f32).clamp(0.0, 1.0);
                        let keep = 1.0 - ramp;
                        interpolation * (1.0 - keep) + extrapolation * keep
                    })
                    .collect()
            }
        }
    }
}
