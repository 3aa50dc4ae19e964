//! `from_pretrained` and `save_pretrained`, and the directory layout they read and write:
//! `config.json` beside `model.safetensors`, or beside shards
//! `model-0000i-of-0000n.safetensors` named by `model.safetensors.index.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use neuron_pc_compiler::{DType, HostTensor};

#[cfg(doc)]
use super::LlamaSharding;
use super::{LlamaConfig, LlamaForCausalLM, LoadOptions};
use crate::device::LazyDevice;
use crate::error::{Error, Result};
use crate::nn::VarBuilder;
use crate::state_dict::{write_atomic, CheckpointError, StateDict};

pub(super) const SINGLE: &str = "model.safetensors";
pub(super) const INDEX: &str = "model.safetensors.index.json";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The shard files an existing index names (none when there is no readable index).
fn indexed_shards(dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(dir.join(INDEX)) else {
        return Vec::new();
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = json["weight_map"]
        .as_object()
        .map(|m| {
            m.values()
                .filter_map(|v| v.as_str())
                .map(|s| dir.join(s))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.dedup();
    files
}

/// Writes `config` and the tensors of `sd` into `dir`: one file, or shards of at most
/// `max_shard_bytes` each (a tensor larger than that gets a shard of its own) with an index.
/// Files of the other layout left by an earlier save are removed, so a later load cannot
/// pick up stale weights. The caller skips this in a trial run.
pub(super) fn write_dir(
    dir: &Path,
    config: &serde_json::Value,
    sd: &StateDict,
    max_shard_bytes: Option<usize>,
) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let config_path = dir.join("config.json");
    let text = serde_json::to_string_pretty(config).expect("a JSON value serialises");
    write_atomic(&config_path, text.as_bytes()).map_err(io(&config_path))?;
    let stale = indexed_shards(dir);
    let mut shards: Vec<StateDict> = Vec::new();
    let mut bytes = 0usize;
    for (name, t) in &sd.tensors {
        let size = t.bytes().len();
        let full = max_shard_bytes.is_some_and(|max| bytes > 0 && bytes + size > max);
        if shards.is_empty() || full {
            shards.push(StateDict {
                tensors: BTreeMap::new(),
                metadata: sd.metadata.clone(),
            });
            bytes = 0;
        }
        bytes += size;
        let shard = shards.last_mut().expect("pushed above");
        shard.tensors.insert(name.clone(), t.clone());
    }
    let remove = |path: &Path| -> Result<()> {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(path)(e).into()),
            _ => Ok(()),
        }
    };
    if max_shard_bytes.is_none() || shards.len() <= 1 {
        let single = shards.pop().unwrap_or_default();
        single.save(&dir.join(SINGLE))?;
        for path in stale
            .iter()
            .map(PathBuf::as_path)
            .chain([dir.join(INDEX).as_path()])
        {
            remove(path)?;
        }
        return Ok(());
    }
    let n = shards.len();
    let mut weight_map = BTreeMap::new();
    let mut written = Vec::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
        for name in shard.tensors.keys() {
            weight_map.insert(name.clone(), file.clone());
        }
        shard.save(&dir.join(&file))?;
        written.push(dir.join(&file));
    }
    let total: usize = sd.tensors.values().map(|t| t.bytes().len()).sum();
    let index = serde_json::json!({
        "metadata": {"total_size": total},
        "weight_map": weight_map,
    });
    let index_path = dir.join(INDEX);
    let text = serde_json::to_string_pretty(&index).expect("a JSON value serialises");
    write_atomic(&index_path, text.as_bytes()).map_err(io(&index_path))?;
    remove(&dir.join(SINGLE))?;
    for path in stale.iter().filter(|p| !written.contains(p)) {
        remove(path)?;
    }
    Ok(())
}

impl LlamaForCausalLM {
    /// Loads a `save_pretrained` directory: `config.json` and `model.safetensors`, or the
    /// shards named by `model.safetensors.index.json`. Parameters keep the checkpoint's dtype;
    /// see [`LlamaForCausalLM::from_pretrained_as`] to convert them. Every tensor of the
    /// checkpoint must be used (a strict load), apart from a tied model's `lm_head.weight`.
    pub fn from_pretrained(device: &LazyDevice, dir: &Path) -> Result<LlamaForCausalLM> {
        LlamaForCausalLM::from_pretrained_with(device, dir, &LoadOptions::default())
    }

    /// As [`LlamaForCausalLM::from_pretrained`] (converted to `dtype` when given), each
    /// parameter read straight into the blocks `plan` gives it on the device's mesh (see
    /// [`LlamaSharding`]): no device holds a whole split parameter, ever.
    pub fn from_pretrained_sharded(
        device: &LazyDevice,
        dir: &Path,
        dtype: Option<DType>,
        plan: std::sync::Arc<dyn crate::sharding::ShardingPlan>,
    ) -> Result<LlamaForCausalLM> {
        let options = LoadOptions {
            dtype,
            plan: Some(plan),
            ..LoadOptions::default()
        };
        LlamaForCausalLM::from_pretrained_with(device, dir, &options)
    }

    /// As [`LlamaForCausalLM::from_pretrained`], the parameters converted to `dtype` as they
    /// are read (a bfloat16 checkpoint trained in float32).
    pub fn from_pretrained_as(
        device: &LazyDevice,
        dir: &Path,
        dtype: DType,
    ) -> Result<LlamaForCausalLM> {
        let options = LoadOptions {
            dtype: Some(dtype),
            ..LoadOptions::default()
        };
        LlamaForCausalLM::from_pretrained_with(device, dir, &options)
    }

    /// [`LlamaForCausalLM::from_pretrained`] as `options` say: converted, laid out over a
    /// mesh, the layers scanned.
    pub fn from_pretrained_with(
        device: &LazyDevice,
        dir: &Path,
        options: &LoadOptions,
    ) -> Result<LlamaForCausalLM> {
        let mut config = LlamaConfig::from_file(&dir.join("config.json"))?;
        config.scan_layers = options.scan_layers;
        let (dtype, plan) = (options.dtype, options.plan.clone());
        let single = dir.join(SINGLE);
        let index = dir.join(INDEX);
        let vb = if single.exists() {
            VarBuilder::from_safetensors(device, &[&single])?
        } else if index.exists() {
            VarBuilder::from_safetensors_index(device, &index)?
        } else {
            return Err(CheckpointError::Io {
                path: single,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no model.safetensors or model.safetensors.index.json in the directory \
                     (a save_pretrained directory in the safetensors format is expected)",
                ),
            }
            .into());
        };
        let vb = match dtype {
            Some(d) => vb.with_dtype(d),
            None => vb,
        };
        let vb = match plan {
            Some(p) => vb.with_sharding(p),
            None => vb,
        };
        let model = LlamaForCausalLM::from_vb(&vb, &config)?;
        let unused: Vec<String> = vb
            .unused()
            .into_iter()
            .filter(|n| !(config.tie_word_embeddings && n == "lm_head.weight"))
            .collect();
        if !unused.is_empty() {
            return Err(CheckpointError::Mismatch {
                path: dir.to_path_buf(),
                problems: unused
                    .iter()
                    .map(|n| format!("  unexpected: {n} (not a parameter of this model)"))
                    .collect(),
            }
            .into());
        }
        Ok(model)
    }

    /// Writes `config.json` and `model.safetensors` into `dir` (created if needed), the
    /// parameters in `dtype` (float32 or bfloat16), for `LlamaForCausalLM.from_pretrained`.
    /// A tied model stores no `lm_head.weight`, as `save_pretrained` does. In a trial run
    /// (`neuron-pc compile`) nothing is written.
    pub fn save_pretrained(&self, dir: &Path, dtype: DType) -> Result<()> {
        self.save(dir, dtype, None)
    }

    /// As [`LlamaForCausalLM::save_pretrained`], in shards of at most `max_shard_bytes`
    /// (`save_pretrained(max_shard_size=..)`): `model-00001-of-0000n.safetensors`, ... and
    /// `model.safetensors.index.json`. A model that fits one shard is written as one file.
    pub fn save_pretrained_sharded(
        &self,
        dir: &Path,
        dtype: DType,
        max_shard_bytes: usize,
    ) -> Result<()> {
        self.save(dir, dtype, Some(max_shard_bytes))
    }

    fn save(&self, dir: &Path, dtype: DType, max_shard_bytes: Option<usize>) -> Result<()> {
        if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(Error::Config(format!(
                "save_pretrained: dtype {dtype} is not a checkpoint dtype (f32, bf16 or f16)"
            )));
        }
        let mut sd = crate::state::module_state(self)?;
        for t in sd.tensors.values_mut() {
            if t.dtype() != dtype {
                *t = HostTensor::from_f64s(dtype, &t.to_f64_vec(), t.dims())?;
            }
        }
        // transformers refuses a safetensors file without this
        sd.metadata.insert("format".into(), "pt".into());
        if crate::trial::skip_write("save_pretrained directory", dir) {
            return Ok(());
        }
        write_dir(dir, &self.config.to_json(dtype), &sd, max_shard_bytes)
    }
}
