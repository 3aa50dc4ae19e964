//! The directory layout `save_pretrained` writes: `config.json` beside `model.safetensors`, or
//! beside shards `model-0000i-of-0000n.safetensors` named by `model.safetensors.index.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::checkpoint::{write_atomic, CheckpointError, StateDict};
use crate::error::Result;

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
