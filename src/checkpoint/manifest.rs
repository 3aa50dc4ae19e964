//! A checkpoint's layout: `step-00000100/` holds safetensors files of at most the shard size
//! each (Hugging Face's names, `model-00001-of-00003.safetensors`, and its
//! `model.safetensors.index.json` for the tensors stored whole), and `manifest.json`, written
//! last: the commit point. A directory without its manifest is a save that did not finish and
//! is never read.
//!
//! The manifest lists every file with its size and SHA-256, and every tensor with its dtype,
//! shape and chunks: where its elements are (file, key, first element, count). A tensor saved
//! whole is one chunk; a ZeRO-1 tensor is one chunk per replica's block, written by the process
//! that holds it. Loading assembles each tensor from its chunks, so it does not matter how many
//! replicas (or processes) wrote them or will read them.

use std::collections::BTreeMap;

use neuron_pc_compiler::{DType, HostTensor};
use sha2::{Digest, Sha256};

use super::{CheckpointError, Result};

/// The manifest's `format`.
pub(crate) const FORMAT: &str = "neuron-pc checkpoint";
/// The manifest's `version`.
pub(crate) const VERSION: u32 = 1;
/// The commit point's name in a checkpoint's directory.
pub(crate) const MANIFEST: &str = "manifest.json";
/// Hugging Face's index of sharded safetensors.
pub(crate) const HF_INDEX: &str = "model.safetensors.index.json";

/// A checkpoint's directory name: `step-00000100`.
pub(crate) fn dir_name(step: u64) -> String {
    format!("step-{step:08}")
}

/// The step of a checkpoint directory's name.
pub(crate) fn step_of(dir: &str) -> Option<u64> {
    let digits = dir.strip_prefix("step-")?;
    (digits.len() >= 8 && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct FileEntry {
    pub bytes: u64,
    pub sha256: String,
}

/// Where some of a tensor's elements are: `len` elements from element `start` of the tensor
/// (flattened, row-major) are tensor `key` of `file`.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Chunk {
    pub file: String,
    pub key: String,
    pub start: usize,
    pub len: usize,
}

/// One tensor of a checkpoint.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct TensorEntry {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub chunks: Vec<Chunk>,
}

/// `manifest.json` (and, in a run of several processes, each rank's part of it).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Manifest {
    pub format: String,
    pub version: u32,
    pub step: u64,
    /// The processes that wrote it.
    pub processes: usize,
    pub metadata: BTreeMap<String, String>,
    pub files: BTreeMap<String, FileEntry>,
    pub tensors: BTreeMap<String, TensorEntry>,
}

impl Manifest {
    pub(crate) fn new(step: u64, processes: usize, metadata: BTreeMap<String, String>) -> Self {
        Manifest {
            format: FORMAT.to_string(),
            version: VERSION,
            step,
            processes,
            metadata,
            files: BTreeMap::new(),
            tensors: BTreeMap::new(),
        }
    }

    /// Parses and checks a manifest read from `name`.
    pub(crate) fn parse(name: &str, bytes: &[u8]) -> Result<Manifest> {
        let m: Manifest = serde_json::from_slice(bytes).map_err(|e| corrupt(name, e))?;
        if m.format != FORMAT || m.version != VERSION {
            return Err(corrupt(
                name,
                format!(
                    "format {:?} version {}; this build reads {FORMAT:?} version {VERSION}",
                    m.format, m.version
                ),
            ));
        }
        for (t, e) in &m.tensors {
            let numel: usize = e.shape.iter().product();
            let covered: usize = e.chunks.iter().map(|c| c.len).sum();
            let unknown = e.chunks.iter().find(|c| !m.files.contains_key(&c.file));
            if covered != numel || unknown.is_some() || parse_dtype(&e.dtype).is_none() {
                return Err(corrupt(
                    name,
                    format!("tensor {t}: chunks do not make it up"),
                ));
            }
        }
        Ok(m)
    }

    /// Adds a rank's part: its files and its chunks of each tensor.
    pub(crate) fn merge(&mut self, part: Manifest) -> Result<()> {
        self.files.extend(part.files);
        for (name, entry) in part.tensors {
            match self.tensors.get_mut(&name) {
                None => {
                    self.tensors.insert(name, entry);
                }
                Some(e) if e.dtype == entry.dtype && e.shape == entry.shape => {
                    e.chunks.extend(entry.chunks)
                }
                Some(e) => {
                    return Err(corrupt(
                        &name,
                        format!(
                            "ranks disagree: {}{:?} and {}{:?}",
                            e.dtype, e.shape, entry.dtype, entry.shape
                        ),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Hugging Face's `model.safetensors.index.json`: each tensor stored whole, by file.
    pub(crate) fn hf_index(&self) -> String {
        let mut map = serde_json::Map::new();
        for (name, e) in &self.tensors {
            if let [c] = e.chunks.as_slice() {
                if c.key == *name {
                    map.insert(name.clone(), c.file.clone().into());
                }
            }
        }
        let total: u64 = self.files.values().map(|f| f.bytes).sum();
        let index = serde_json::json!({
            "metadata": { "total_size": total },
            "weight_map": map,
        });
        serde_json::to_string_pretty(&index).expect("JSON of strings and numbers")
    }
}

/// Tensors being assembled from the chunks of a checkpoint's files.
pub(crate) struct Assembly {
    buffers: BTreeMap<String, (DType, Vec<usize>, Vec<u8>)>,
}

impl Assembly {
    pub(crate) fn new(m: &Manifest) -> Assembly {
        let buffers = m
            .tensors
            .iter()
            .map(|(name, e)| {
                let dtype = parse_dtype(&e.dtype).expect("checked by Manifest::parse");
                let bytes = e.shape.iter().product::<usize>() * dtype.size_in_bytes();
                (name.clone(), (dtype, e.shape.clone(), vec![0u8; bytes]))
            })
            .collect();
        Assembly { buffers }
    }

    /// Copies every chunk that lives in `file` (its bytes, already checked against the
    /// manifest) into place.
    pub(crate) fn fill(&mut self, m: &Manifest, file: &str, bytes: &[u8]) -> Result<()> {
        let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| corrupt(file, e))?;
        for (name, e) in &m.tensors {
            let (dtype, _, buf) = self.buffers.get_mut(name).expect("one buffer per tensor");
            let size = dtype.size_in_bytes();
            for c in e.chunks.iter().filter(|c| c.file == file) {
                let view = st
                    .tensor(&c.key)
                    .map_err(|err| corrupt(file, format!("{}: {err}", c.key)))?;
                let data = view.data();
                if super::from_st(view.dtype()) != Some(*dtype) || data.len() != c.len * size {
                    return Err(corrupt(
                        file,
                        format!("{}: not the manifest's chunk", c.key),
                    ));
                }
                buf[c.start * size..(c.start + c.len) * size].copy_from_slice(data);
            }
        }
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<BTreeMap<String, HostTensor>> {
        self.buffers
            .into_iter()
            .map(|(name, (dtype, dims, bytes))| {
                let t =
                    HostTensor::from_bytes(dtype, &dims, bytes).map_err(|e| corrupt(&name, e))?;
                Ok((name, t))
            })
            .collect()
    }
}

/// Checks `bytes` (file `name`) against its manifest entry.
pub(crate) fn verify(name: &str, entry: &FileEntry, bytes: &[u8]) -> Result<()> {
    if bytes.len() as u64 != entry.bytes {
        return Err(corrupt(
            name,
            format!("{} bytes, the manifest says {}", bytes.len(), entry.bytes),
        ));
    }
    if sha256(bytes) != entry.sha256 {
        return Err(corrupt(name, "its SHA-256 is not the manifest's"));
    }
    Ok(())
}

pub(crate) fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

pub(crate) fn dtype_name(d: DType) -> String {
    d.to_string()
}

fn parse_dtype(s: &str) -> Option<DType> {
    DType::ALL.into_iter().find(|d| d.to_string() == s)
}

pub(crate) fn corrupt(name: &str, e: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Corrupt {
        name: name.to_string(),
        message: e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_names_sort_by_step_and_parse_back() {
        assert_eq!(dir_name(100), "step-00000100");
        assert_eq!(step_of("step-00000100"), Some(100));
        assert_eq!(step_of(&dir_name(123_456_789_012)), Some(123_456_789_012));
        for bad in ["step-1", "step-0000010x", "last.safetensors", "step-"] {
            assert_eq!(step_of(bad), None, "{bad}");
        }
        assert!(dir_name(99) < dir_name(100));
    }

    #[test]
    fn chunks_that_do_not_cover_a_tensor_are_corrupt() {
        let mut m = Manifest::new(3, 1, BTreeMap::new());
        let file = FileEntry {
            bytes: 1,
            sha256: String::new(),
        };
        m.files.insert("a.safetensors".into(), file);
        let chunk = |start, len| Chunk {
            file: "a.safetensors".into(),
            key: "w".into(),
            start,
            len,
        };
        m.tensors.insert(
            "w".into(),
            TensorEntry {
                dtype: "f32".into(),
                shape: vec![2, 3],
                chunks: vec![chunk(0, 3)],
            },
        );
        let bytes = serde_json::to_vec(&m).unwrap();
        let err = Manifest::parse("m", &bytes).unwrap_err().to_string();
        assert!(err.contains("chunks do not make it up"), "{err}");
        m.tensors.get_mut("w").unwrap().chunks.push(chunk(3, 3));
        let bytes = serde_json::to_vec(&m).unwrap();
        assert_eq!(Manifest::parse("m", &bytes).unwrap(), m);
    }
}
