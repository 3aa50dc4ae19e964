//! Reading the keys of a `config.json`: each value checked for its type, each error naming the
//! key (`config.json: config key `rope_parameters.factor`: ...`).

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::nn::RopeScaling;

pub(super) struct Keys<'a> {
    pub(super) map: &'a Map<String, Value>,
    pub(super) origin: &'a str,
}

impl Keys<'_> {
    pub(super) fn err(&self, key: &str, message: String) -> Error {
        Error::Config(format!("{}: config key `{key}`: {message}", self.origin))
    }

    /// A key that is present and not `null`.
    pub(super) fn get(&self, key: &str) -> Option<&Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(super) fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.usize_in(self.map, key, key)
    }

    fn usize_in(&self, m: &Map<String, Value>, key: &str, name: &str) -> Result<Option<usize>> {
        match m.get(key).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .filter(|n| *n > 0)
                .map(|n| Some(n as usize))
                .ok_or_else(|| self.err(name, format!("expected a positive integer, got {v}"))),
        }
    }

    pub(super) fn required(&self, key: &str) -> Result<usize> {
        self.usize(key)?
            .ok_or_else(|| self.err(key, "missing (a decoder config needs it)".into()))
    }

    pub(super) fn f64(&self, m: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
        self.f64_named(m, key, key)
    }

    fn f64_named(&self, m: &Map<String, Value>, key: &str, name: &str) -> Result<Option<f64>> {
        match m.get(key).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| self.err(name, format!("expected a number, got {v}"))),
        }
    }

    pub(super) fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.bool_in(self.map, key, key)
    }

    fn bool_in(&self, m: &Map<String, Value>, key: &str, name: &str) -> Result<Option<bool>> {
        match m.get(key).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.err(name, format!("expected true or false, got {v}"))),
        }
    }

    /// Qwen2/Qwen3's window and sliding layers: `sliding_window` counts only with
    /// `use_sliding_window` (default 4096 when absent, none when `null`); `layer_types` names
    /// each layer's attention, or layers from `max_window_layers` (default 28) on slide.
    pub(super) fn qwen_layers(&self, layers: usize) -> Result<(Option<usize>, Vec<bool>)> {
        if !self.bool("use_sliding_window")?.unwrap_or(false) {
            return Ok((None, Vec::new()));
        }
        let window = match self.map.get("sliding_window") {
            None => Some(4096),
            Some(_) => self.usize("sliding_window")?,
        };
        if window.is_none() {
            return Ok((None, Vec::new()));
        }
        let Some(types) = self.get("layer_types") else {
            let first = self.usize("max_window_layers")?.unwrap_or(28);
            return Ok((window, (0..layers).map(|i| i >= first).collect()));
        };
        let bad = || {
            self.err(
                "layer_types",
                format!(
                    "expected {layers} of \"full_attention\" or \"sliding_attention\", got {types}"
                ),
            )
        };
        let list = types
            .as_array()
            .filter(|l| l.len() == layers)
            .ok_or_else(bad)?;
        let sliding = list
            .iter()
            .map(|t| match t.as_str() {
                Some("full_attention") => Ok(false),
                Some("sliding_attention") => Ok(true),
                _ => Err(bad()),
            })
            .collect::<Result<Vec<bool>>>()?;
        Ok((window, sliding))
    }

    /// `rope_theta` and the rotary scaling, from `rope_scaling` and `rope_parameters` (the
    /// latter's keys win) and the top-level `rope_theta`, `partial_rotary_factor` and
    /// `original_max_position_embeddings` (which wins, as transformers' standardisation does).
    pub(super) fn rope(&self, max_position_embeddings: usize) -> Result<(f64, RopeScaling)> {
        let mut params = Map::new();
        let mut source = "rope_parameters";
        for key in ["rope_scaling", "rope_parameters"] {
            let Some(v) = self.get(key) else { continue };
            let Value::Object(m) = v else {
                return Err(self.err(key, format!("expected an object, got {v}")));
            };
            if let Some((layer_type, _)) = m.iter().find(|(_, v)| v.is_object()) {
                return Err(self.err(
                    key,
                    format!("rotary parameters per layer type ({layer_type:?}) are not supported"),
                ));
            }
            params.extend(m.iter().map(|(k, v)| (k.clone(), v.clone())));
            source = key;
        }
        let name = |k: &str| format!("{source}.{k}");
        let theta = match self.f64_named(&params, "rope_theta", &name("rope_theta"))? {
            Some(t) => t,
            None => self.f64(self.map, "rope_theta")?.unwrap_or(10_000.0),
        };
        if theta.is_nan() || theta <= 0.0 {
            return Err(self.err("rope_theta", format!("must be positive, got {theta}")));
        }
        for (m, key) in [
            (&params, name("partial_rotary_factor")),
            (self.map, String::new()),
        ] {
            let k = if key.is_empty() {
                "partial_rotary_factor"
            } else {
                &key
            };
            if let Some(p) = self.f64_named(m, "partial_rotary_factor", k)? {
                if p != 1.0 {
                    return Err(self.err(
                        k,
                        format!("{p}: rotating part of each head is not supported (only 1.0)"),
                    ));
                }
            }
        }
        let ty_key = if params.contains_key("rope_type") {
            "rope_type"
        } else {
            "type"
        };
        let ty = match params.get(ty_key).filter(|v| !v.is_null()) {
            None => "default".to_string(),
            Some(v) => v
                .as_str()
                .ok_or_else(|| self.err(&name(ty_key), format!("expected a string, got {v}")))?
                .to_string(),
        };
        let number = |k: &str| self.f64_named(&params, k, &name(k));
        let required = |k: &str| -> Result<f64> {
            let v = number(k)?.ok_or_else(|| {
                self.err(&name(k), format!("missing (rope type {ty:?} needs it)"))
            })?;
            if v.is_nan() || v <= 0.0 {
                return Err(self.err(&name(k), format!("must be positive, got {v}")));
            }
            Ok(v)
        };
        let original = || -> Result<usize> {
            Ok(match self.usize("original_max_position_embeddings")? {
                Some(n) => n,
                None => self
                    .usize_in(
                        &params,
                        "original_max_position_embeddings",
                        &name("original_max_position_embeddings"),
                    )?
                    .unwrap_or(max_position_embeddings),
            })
        };
        let scaling = match ty.as_str() {
            "default" => RopeScaling::Default,
            "linear" => RopeScaling::Linear {
                factor: required("factor")?,
            },
            "dynamic" => RopeScaling::Dynamic {
                factor: required("factor")?,
                max_position_embeddings,
            },
            "llama3" => {
                let (low, high) = (required("low_freq_factor")?, required("high_freq_factor")?);
                if low == high {
                    return Err(self.err(
                        &name("high_freq_factor"),
                        format!("must differ from low_freq_factor ({low})"),
                    ));
                }
                RopeScaling::Llama3 {
                    factor: required("factor")?,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max_position_embeddings: original()?,
                }
            }
            "yarn" => {
                let original = original()?;
                let factor = match number("factor")? {
                    Some(_) => required("factor")?,
                    None => max_position_embeddings as f64 / original as f64,
                };
                // transformers reads these with `or`: 0 counts as absent
                let nonzero =
                    |k: &str| -> Result<Option<f64>> { Ok(number(k)?.filter(|v| *v != 0.0)) };
                RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings: original,
                    attention_factor: number("attention_factor")?,
                    mscale: number("mscale")?,
                    mscale_all_dim: number("mscale_all_dim")?,
                    beta_fast: nonzero("beta_fast")?.unwrap_or(32.0),
                    beta_slow: nonzero("beta_slow")?.unwrap_or(1.0),
                    truncate: self
                        .bool_in(&params, "truncate", &name("truncate"))?
                        .unwrap_or(true),
                }
            }
            other => {
                return Err(self.err(
                    &name(ty_key),
                    format!(
                        "rope type {other:?} is not supported (default, linear, dynamic, llama3 \
                         or yarn)"
                    ),
                ))
            }
        };
        Ok((theta, scaling))
    }
}
