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

use crate::state_dict::{CheckpointError, Result};

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
#[serde(deny_unknown_fields)]
pub(crate) struct FileEntry {
    pub bytes: u64,
    pub sha256: String,
}

/// Where some of a tensor's elements are, in tensor `key` of `file`: `len` elements from
/// element `start` of the tensor (flattened, row-major: a ZeRO-1 block), or, with `block`, the
/// box of the tensor at `block.offset` of shape `block.shape` (a mesh device's block of a
/// sharded parameter; `len` is its element count, `start` 0).
///
/// `at` and `sha256` (written since checkpoints are read chunk by chunk; absent in older ones)
/// say where the chunk's bytes are in the file (from its first byte) and their SHA-256, so a
/// reader fetches and checks only the chunks it needs.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Chunk {
    pub file: String,
    pub key: String,
    pub start: usize,
    pub len: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<Block>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl Chunk {
    /// Whether a reader can fetch this chunk alone: its place in the file and digest are known.
    pub(crate) fn addressable(&self) -> bool {
        self.at.is_some() && self.sha256.is_some()
    }
}

/// A box of a tensor: its first element's index along each dimension, and its shape.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Block {
    pub offset: Vec<usize>,
    pub shape: Vec<usize>,
}

impl Block {
    /// Whether the box lies inside a tensor of shape `dims`.
    fn fits(&self, dims: &[usize]) -> bool {
        self.offset.len() == dims.len()
            && self.shape.len() == dims.len()
            && (self.offset.iter().zip(&self.shape).zip(dims)).all(|((o, s), d)| o + s <= *d)
    }

    /// Copies `src` (the box's elements, row-major, `size` bytes each) into `dst`, a whole
    /// tensor of shape `dims`: one contiguous run per row of the box's last dimension.
    pub(crate) fn scatter(&self, dims: &[usize], size: usize, src: &[u8], dst: &mut [u8]) {
        let rank = dims.len();
        if rank == 0 {
            dst[..size].copy_from_slice(&src[..size]);
            return;
        }
        let run = self.shape[rank - 1] * size;
        let rows: usize = self.shape[..rank - 1].iter().product();
        let mut index = vec![0usize; rank - 1];
        for r in 0..rows {
            let mut at = 0;
            for d in 0..rank {
                let i = if d + 1 < rank { index[d] } else { 0 };
                at = at * dims[d] + self.offset[d] + i;
            }
            dst[at * size..at * size + run].copy_from_slice(&src[r * run..(r + 1) * run]);
            for d in (0..rank - 1).rev() {
                index[d] += 1;
                if index[d] < self.shape[d] {
                    break;
                }
                index[d] = 0;
            }
        }
    }
}

/// One tensor of a checkpoint.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TensorEntry {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub chunks: Vec<Chunk>,
}

/// `manifest.json` (and, in a run of several processes, each rank's part of it).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Manifest {
    pub format: String,
    pub version: u32,
    pub step: u64,
    /// The processes that wrote it.
    pub processes: usize,
    /// A run of several processes: the save's nonce, agreed by the ranks before they write
    /// their parts, so rank 0 never merges a part an earlier (killed) save left behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
    /// The run that wrote it ([`crate::state::CheckpointOptions::run_id`]); none in
    /// manifests written before run ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    pub metadata: BTreeMap<String, String>,
    pub files: BTreeMap<String, FileEntry>,
    pub tensors: BTreeMap<String, TensorEntry>,
    /// The SHA-256 of the Hugging Face index written beside it (a committed manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_sha256: Option<String>,
    /// The SHA-256 of this manifest's own JSON written without this field ([`Manifest::seal`]):
    /// a committed manifest whose bytes changed is not used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
}

impl Manifest {
    pub(crate) fn new(step: u64, processes: usize, metadata: BTreeMap<String, String>) -> Self {
        Manifest {
            format: FORMAT.to_string(),
            version: VERSION,
            step,
            processes,
            nonce: None,
            run: None,
            metadata,
            files: BTreeMap::new(),
            tensors: BTreeMap::new(),
            index_sha256: None,
            sha256: None,
        }
    }

    /// The JSON to commit: this manifest with the digest of its index (`index`, the bytes
    /// written beside it) and, last, the digest of its own JSON without that field.
    pub(crate) fn seal(&self, index: &[u8]) -> Vec<u8> {
        let mut m = self.clone();
        m.index_sha256 = Some(sha256(index));
        m.sha256 = None;
        m.sha256 = Some(sha256(&m.json()));
        m.json()
    }

    /// The JSON written for this manifest.
    fn json(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(self).expect("a manifest is JSON")
    }

    /// Parses and checks a manifest read from `name`.
    pub(crate) fn parse(name: &str, bytes: &[u8]) -> Result<Manifest> {
        let mut m: Manifest = serde_json::from_slice(bytes).map_err(|e| corrupt(name, e))?;
        if let Some(want) = m.sha256.take() {
            // the digest covers what the bytes say, so a changed value, key or field fails
            if sha256(&m.json()) != want {
                return Err(corrupt(name, "its SHA-256 does not match its contents"));
            }
            m.sha256 = Some(want);
        }
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
            let outside = e.chunks.iter().any(|c| match &c.block {
                Some(b) => !b.fits(&e.shape) || b.shape.iter().product::<usize>() != c.len,
                None => c.start + c.len > numel,
            });
            if covered != numel || unknown.is_some() || outside || parse_dtype(&e.dtype).is_none() {
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
            let (dtype, dims, buf) = self.buffers.get_mut(name).expect("one buffer per tensor");
            let size = dtype.size_in_bytes();
            for c in e.chunks.iter().filter(|c| c.file == file) {
                let view = st
                    .tensor(&c.key)
                    .map_err(|err| corrupt(file, format!("{}: {err}", c.key)))?;
                let data = view.data();
                if crate::state_dict::from_st(view.dtype()) != Some(*dtype)
                    || data.len() != c.len * size
                {
                    return Err(corrupt(
                        file,
                        format!("{}: not the manifest's chunk", c.key),
                    ));
                }
                match &c.block {
                    Some(b) => b.scatter(dims, size, data, buf),
                    None => buf[c.start * size..(c.start + c.len) * size].copy_from_slice(data),
                }
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

pub(crate) fn parse_dtype(s: &str) -> Option<DType> {
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
            block: None,
            at: None,
            sha256: None,
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
        // a box past the tensor's edge
        m.tensors.get_mut("w").unwrap().chunks = vec![Chunk {
            block: Some(Block {
                offset: vec![1, 0],
                shape: vec![2, 3],
            }),
            ..chunk(0, 6)
        }];
        let bytes = serde_json::to_vec(&m).unwrap();
        assert!(Manifest::parse("m", &bytes).is_err());
    }

    #[test]
    fn a_sealed_manifest_with_any_one_bit_flipped_does_not_parse() {
        let mut meta = BTreeMap::new();
        meta.insert("step".to_string(), "7".to_string());
        let mut m = Manifest::new(7, 2, meta);
        m.nonce = Some("9f3a.2".into());
        let file = FileEntry {
            bytes: 1234,
            sha256: sha256(b"file"),
        };
        m.files.insert("rank-00000-model.safetensors".into(), file);
        m.tensors.insert(
            "model.w".into(),
            TensorEntry {
                dtype: "f32".into(),
                shape: vec![2, 3],
                chunks: vec![Chunk {
                    file: "rank-00000-model.safetensors".into(),
                    key: "model.w@0,0".into(),
                    start: 0,
                    len: 6,
                    block: Some(Block {
                        offset: vec![0, 0],
                        shape: vec![2, 3],
                    }),
                    at: Some(80),
                    sha256: Some(sha256(b"chunk")),
                }],
            },
        );
        let sealed = m.seal(b"{\"weight_map\": {}}");
        let parsed = Manifest::parse("m", &sealed).unwrap();
        assert_eq!(parsed.index_sha256, Some(sha256(b"{\"weight_map\": {}}")));
        // every bit of it: a value, a key, a digest, a bracket or the white space between
        for at in 0..sealed.len() * 8 {
            let mut flipped = sealed.clone();
            flipped[at / 8] ^= 1 << (at % 8);
            assert!(
                Manifest::parse("m", &flipped).is_err(),
                "bit {at} of {:?}",
                String::from_utf8_lossy(&flipped)
            );
        }
        // a manifest written before the digest (none) still parses
        let old = serde_json::to_vec_pretty(&m).unwrap();
        assert_eq!(Manifest::parse("m", &old).unwrap(), m);
    }

    #[test]
    fn boxes_scatter_into_their_place() {
        // a 4x6 tensor of 1-byte elements cut into 2x3 boxes: each lands where it belongs
        let dims = [4, 6];
        let want: Vec<u8> = (0..24).collect();
        let mut got = vec![0u8; 24];
        for (r, c) in [(0, 0), (0, 3), (2, 0), (2, 3)] {
            let b = Block {
                offset: vec![r, c],
                shape: vec![2, 3],
            };
            let src: Vec<u8> = (0..2)
                .flat_map(|i| (0..3).map(move |j| ((r + i) * 6 + c + j) as u8))
                .collect();
            b.scatter(&dims, 1, &src, &mut got);
        }
        assert_eq!(got, want);
        // three dimensions, a box in the middle
        let dims = [2, 3, 4];
        let b = Block {
            offset: vec![1, 1, 2],
            shape: vec![1, 2, 2],
        };
        let mut got = vec![0u8; 24];
        b.scatter(&dims, 1, &[1, 2, 3, 4], &mut got);
        let at = |i: usize, j: usize, k: usize| got[(i * 3 + j) * 4 + k];
        assert_eq!(
            [at(1, 1, 2), at(1, 1, 3), at(1, 2, 2), at(1, 2, 3)],
            [1, 2, 3, 4]
        );
        assert_eq!(got.iter().filter(|b| **b != 0).count(), 4);
    }
}
