//! Resuming from a committed checkpoint without holding it: each tensor is read from only the
//! chunks this process needs (a ranged read per chunk, checked against the chunk's SHA-256 in
//! the manifest), put on the device in the layout its target has (whole, a mesh's blocks, or
//! this process's ZeRO-1 blocks) and assigned before the next one is read. The host holds one
//! tensor at a time, never the state: a 70B state is 840 GB, and 32 processes of a node each
//! reading it whole cannot.
//!
//! Names, dtypes and shapes are checked against the manifest before anything is read. A chunk
//! that fails its digest stops the restore with the tensors before it loaded; the caller
//! ([`super::Checkpoints::resume`]) then falls back to the checkpoint before, which loads every
//! tensor again.

use std::collections::BTreeMap;
use std::path::Path;

use neuron_pc_compiler::{DType, HostTensor};

use super::{step_in, Restored, OPTIMIZER_PREFIX};
use crate::error::Result;
use crate::nn::Module;
use crate::optim::{HeldState, OptimizerState};
use crate::state::manifest::{self, Assembly, Chunk, Manifest, TensorEntry, HF_INDEX, MANIFEST};
use crate::state::Location;
use crate::state_dict::{
    check_types, is_stacked, stack_rows, stacked_row_name, CheckpointError, StateDict,
};
use crate::tensor::Tensor;

/// A committed checkpoint opened for reading chunk by chunk.
pub(crate) struct Reader<'a> {
    loc: &'a Location,
    dir: &'a str,
    manifest: Manifest,
    /// Bytes of tensor data fetched so far.
    pub(crate) read: u64,
}

impl<'a> Reader<'a> {
    /// The checkpoint whose manifest is `m`, in `dir` of `loc`; `None` when one of its chunks
    /// has no place or digest (a checkpoint written before chunks had them, read whole).
    pub(crate) fn new(loc: &'a Location, dir: &'a str, m: Manifest) -> Option<Reader<'a>> {
        let addressable = m
            .tensors
            .values()
            .all(|e| e.chunks.iter().all(Chunk::addressable));
        addressable.then_some(Reader {
            loc,
            dir,
            manifest: m,
            read: 0,
        })
    }

    /// The bytes of every tensor of the checkpoint.
    pub(crate) fn state_bytes(&self) -> u64 {
        (self.manifest.tensors.values())
            .map(|e| {
                let size = manifest::parse_dtype(&e.dtype).map_or(0, DType::size_in_bytes);
                (e.shape.iter().product::<usize>() * size) as u64
            })
            .sum()
    }

    /// Each tensor's dtype and shape, as the manifest says.
    fn types(&self) -> BTreeMap<String, (DType, Vec<usize>)> {
        (self.manifest.tensors.iter())
            .map(|(n, e)| {
                let dtype = manifest::parse_dtype(&e.dtype).expect("checked by Manifest::parse");
                (n.clone(), (dtype, e.shape.clone()))
            })
            .collect()
    }

    fn entry(&self, name: &str) -> Result<&TensorEntry> {
        Ok(self.manifest.tensors.get(name).ok_or_else(|| {
            manifest::corrupt(&format!("{}/{}", self.dir, manifest::MANIFEST), name)
        })?)
    }

    /// The bytes of `c` (`size` bytes an element), fetched alone and checked.
    fn chunk(&mut self, c: &Chunk, size: usize) -> Result<Vec<u8>> {
        let name = format!("{}/{}", self.dir, c.file);
        let at = c.at.expect("Reader::new checked");
        let bytes = self.loc.get_range(&name, at, c.len * size)?;
        if Some(manifest::sha256(&bytes)) != c.sha256 {
            let what = format!("chunk {} is not what was saved", c.key);
            return Err(manifest::corrupt(&name, what).into());
        }
        self.read += bytes.len() as u64;
        Ok(bytes)
    }

    /// Elements `lo..hi` of tensor `name`, flattened row-major, as bytes: from the chunks that
    /// hold any of them. A tensor saved as a mesh's boxes is put together whole first.
    fn range(&mut self, name: &str, lo: usize, hi: usize) -> Result<Vec<u8>> {
        let e = self.entry(name)?.clone();
        let dtype = manifest::parse_dtype(&e.dtype).expect("checked by Manifest::parse");
        let size = dtype.size_in_bytes();
        let numel: usize = e.shape.iter().product();
        let mut out = vec![0u8; (hi - lo) * size];
        if e.chunks.iter().any(|c| c.block.is_some()) {
            let mut whole = vec![0u8; numel * size];
            for c in &e.chunks {
                let bytes = self.chunk(c, size)?;
                match &c.block {
                    Some(b) => b.scatter(&e.shape, size, &bytes, &mut whole),
                    None => whole[c.start * size..(c.start + c.len) * size].copy_from_slice(&bytes),
                }
            }
            out.copy_from_slice(&whole[lo * size..hi * size]);
            return Ok(out);
        }
        for c in &e.chunks {
            let (from, to) = (c.start.max(lo), (c.start + c.len).min(hi));
            if from >= to {
                continue;
            }
            let bytes = self.chunk(c, size)?;
            out[(from - lo) * size..(to - lo) * size]
                .copy_from_slice(&bytes[(from - c.start) * size..(to - c.start) * size]);
        }
        Ok(out)
    }

    /// Tensor `name` whole.
    fn whole(&mut self, name: &str) -> Result<HostTensor> {
        let e = self.entry(name)?;
        let dtype = manifest::parse_dtype(&e.dtype).expect("checked by Manifest::parse");
        let dims = e.shape.clone();
        let bytes = self.range(name, 0, dims.iter().product())?;
        Ok(HostTensor::from_bytes(dtype, &dims, bytes)?)
    }

    /// The value of target `name` (a stacked one from its rows), whole.
    fn target(&mut self, name: &str, layers: usize) -> Result<HostTensor> {
        if !is_stacked(name) || self.manifest.tensors.contains_key(name) {
            return self.whole(name);
        }
        let rows = (0..layers)
            .map(|i| self.whole(&stacked_row_name(name, i)))
            .collect::<Result<Vec<_>>>()?;
        Ok(stack_rows(&rows.iter().collect::<Vec<_>>())?)
    }
}

/// What a tensor of `named` stands for in a checkpoint: itself, or one tensor per layer.
fn expected_types(
    name: &str,
    dtype: DType,
    dims: &[usize],
    in_file: impl Fn(&str) -> bool,
    want: &mut BTreeMap<String, (DType, Vec<usize>)>,
) {
    if is_stacked(name) && !in_file(name) {
        for i in 0..dims[0] {
            want.insert(stacked_row_name(name, i), (dtype, dims[1..].to_vec()));
        }
    } else {
        want.insert(name.to_string(), (dtype, dims.to_vec()));
    }
}

/// Loads the checkpoint `reader` reads into `module` and `opt` (made for
/// `module.parameters()` in that order), a tensor at a time; `source` names it in errors. The
/// optimizer's state is loaded when the checkpoint has some (all of it), as
/// [`super::load_training`] does.
pub(crate) fn restore<M, O>(
    module: &M,
    opt: &O,
    reader: &mut Reader<'_>,
    source: &Path,
) -> Result<Restored>
where
    M: Module + ?Sized,
    O: OptimizerState + ?Sized,
{
    let names: Vec<String> = module.parameters().into_iter().map(|(n, _)| n).collect();
    let named = module.state_tensors();
    let held = opt.held_state(&names)?;
    let have = reader.types();
    let in_file = |n: &str| have.contains_key(n);
    let has_optimizer = have.keys().any(|k| k.starts_with(OPTIMIZER_PREFIX));
    let mut want = BTreeMap::new();
    for (n, t) in &named {
        expected_types(n, t.dtype(), t.dims(), in_file, &mut want);
    }
    if has_optimizer {
        for (n, h) in &held {
            let name = format!("{OPTIMIZER_PREFIX}{n}");
            match h {
                HeldState::Whole(t) => {
                    expected_types(&name, t.dtype(), t.dims(), in_file, &mut want)
                }
                HeldState::Blocks { blocks, dims } => {
                    want.insert(name, (blocks.dtype(), dims.clone()));
                }
            }
        }
    }
    check_types(source, &have, &want, None)?;
    let step = step_in(&reader.manifest.metadata, source)?;
    for (name, target) in &named {
        if target.name().is_none() {
            target.set_name(name);
        }
        let host = reader.target(name, target.dims().first().copied().unwrap_or(0))?;
        place(target, &host)?;
    }
    if has_optimizer {
        for (n, h) in &held {
            let name = format!("{OPTIMIZER_PREFIX}{n}");
            match h {
                HeldState::Whole(t) => {
                    let host = reader.target(&name, t.dims().first().copied().unwrap_or(0))?;
                    place(t, &host)?;
                }
                HeldState::Blocks { blocks, dims } => place_blocks(reader, &name, blocks, dims)?,
            }
        }
    }
    Ok(Restored {
        step,
        optimizer: has_optimizer,
    })
}

/// Makes `target` hold `host`, laid out as `target` is (a mesh's blocks, or whole).
fn place(target: &Tensor, host: &HostTensor) -> Result<()> {
    let device = target.device()?;
    let value = match target.sharding() {
        Some(s) => device.tensor_sharded(host, s.spec())?,
        None => device.tensor(host)?,
    };
    target.assign(&value)
}

/// ZeRO-1 state: each local replica's block of tensor `name` (of shape `dims`, flattened and
/// padded to the blocks' length), read alone and put on its replica's device.
fn place_blocks(
    reader: &mut Reader<'_>,
    name: &str,
    blocks: &Tensor,
    dims: &[usize],
) -> Result<()> {
    let device = blocks.device()?;
    let block = blocks.dims()[0];
    let numel: usize = dims.iter().product();
    let size = blocks.dtype().size_in_bytes();
    let mut hosts = Vec::with_capacity(device.replicas());
    for r in 0..device.replicas() {
        let lo = ((device.replica_offset() + r) * block).min(numel);
        let hi = (lo + block).min(numel);
        let mut bytes = reader.range(name, lo, hi)?;
        bytes.resize(block * size, 0);
        hosts.push(HostTensor::from_bytes(blocks.dtype(), &[block], bytes)?);
    }
    // on a mesh the process's one block is split over its devices, as it was made
    let value = match blocks.sharding() {
        Some(s) => device.per_replica_sharded(&hosts[0], &s)?,
        None => device.from_replicas(&hosts)?,
    };
    blocks.assign(&value)
}

/// The manifest of checkpoint `dir`, checked.
pub(super) fn read_manifest(
    loc: &Location,
    dir: &str,
) -> std::result::Result<Manifest, CheckpointError> {
    let name = format!("{dir}/{MANIFEST}");
    let bytes = loc
        .get(&name)?
        .ok_or_else(|| manifest::corrupt(&name, "missing"))?;
    let m = Manifest::parse(&name, &bytes)?;
    if let Some(want) = &m.index_sha256 {
        // the index is what Hugging Face's loaders read: a changed one makes the checkpoint
        // unusable as a whole, as a changed file does
        let index = format!("{dir}/{HF_INDEX}");
        let bytes = loc
            .get(&index)?
            .ok_or_else(|| manifest::corrupt(&index, "missing"))?;
        if manifest::sha256(&bytes) != *want {
            return Err(manifest::corrupt(
                &index,
                "its SHA-256 does not match the manifest",
            ));
        }
    }
    Ok(m)
}

/// Reads checkpoint `dir` whole, checking every file.
pub(super) fn load(loc: &Location, dir: &str) -> std::result::Result<StateDict, CheckpointError> {
    let m = read_manifest(loc, dir)?;
    let mut assembly = Assembly::new(&m);
    for (file, entry) in &m.files {
        let path = format!("{dir}/{file}");
        let bytes = loc
            .get(&path)?
            .ok_or_else(|| manifest::corrupt(&path, "missing"))?;
        manifest::verify(&path, entry, &bytes)?;
        assembly.fill(&m, file, &bytes)?;
    }
    Ok(StateDict {
        tensors: assembly.finish()?,
        metadata: m.metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::manifest::{Block, FileEntry};

    /// A checkpoint in a temporary directory: `m` [2, 3] as two flat chunks in two files (as
    /// two ZeRO-1 replicas write it) and `w` [2, 4] as two [2, 2] boxes (two mesh blocks).
    fn saved(tag: &str) -> (std::path::PathBuf, Manifest) {
        let root = std::env::temp_dir().join(format!("npc-restore-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let loc = Location::Local(root.clone());
        let mut m = Manifest::new(3, 2, BTreeMap::new());
        let f32s = |v: &[f32], dims: &[usize]| HostTensor::from_slice(v, dims).unwrap();
        let files = [
            (
                "a.safetensors",
                vec![
                    ("m", "m#0", f32s(&[1., 2., 3.], &[3]), 0, None),
                    (
                        "w",
                        "w@0,0",
                        f32s(&[1., 2., 5., 6.], &[2, 2]),
                        0,
                        Some(vec![0, 0]),
                    ),
                ],
            ),
            (
                "b.safetensors",
                vec![
                    ("m", "m#1", f32s(&[4., 5., 6.], &[3]), 3, None),
                    (
                        "w",
                        "w@0,2",
                        f32s(&[3., 4., 7., 8.], &[2, 2]),
                        0,
                        Some(vec![0, 2]),
                    ),
                ],
            ),
        ];
        for (file, pieces) in files {
            let mut placed = Vec::new();
            for (tensor, key, host, start, offset) in &pieces {
                let e = m.tensors.entry(tensor.to_string()).or_insert(TensorEntry {
                    dtype: "f32".into(),
                    shape: if *tensor == "m" {
                        vec![2, 3]
                    } else {
                        vec![2, 4]
                    },
                    chunks: Vec::new(),
                });
                e.chunks.push(Chunk {
                    file: file.into(),
                    key: key.to_string(),
                    start: *start,
                    len: host.dims().iter().product(),
                    block: offset.clone().map(|offset| Block {
                        offset,
                        shape: vec![2, 2],
                    }),
                    at: None,
                    sha256: None,
                });
                placed.push((tensor.to_string(), e.chunks.len() - 1));
            }
            let tensors = pieces.iter().map(|(_, k, h, _, _)| (*k, h));
            let path = Path::new(file);
            let bytes = crate::state_dict::serialize(tensors, Default::default(), path).unwrap();
            super::super::snapshot::place_chunks(&mut m, &placed, file, &bytes).unwrap();
            loc.put(&format!("step-00000003/{file}"), &bytes).unwrap();
            let entry = FileEntry {
                bytes: bytes.len() as u64,
                sha256: manifest::sha256(&bytes),
            };
            m.files.insert(file.into(), entry);
        }
        (root, m)
    }

    fn floats(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn a_range_reads_only_the_chunks_that_hold_it() {
        let (root, m) = saved("range");
        let loc = Location::Local(root.clone());
        let mut r = Reader::new(&loc, "step-00000003", m).unwrap();
        assert_eq!(r.state_bytes(), (6 + 8) * 4);
        // the second replica's block: its own chunk, nothing of the first
        assert_eq!(floats(&r.range("m", 3, 6).unwrap()), [4., 5., 6.]);
        assert_eq!(r.read, 12);
        // across both chunks
        assert_eq!(floats(&r.range("m", 2, 4).unwrap()), [3., 4.]);
        assert_eq!(r.read, 12 + 24);
        // boxes put together in place
        let w = r.whole("w").unwrap();
        assert_eq!(w.dims(), [2, 4]);
        assert_eq!(w.to_f64_vec(), [1., 2., 3., 4., 5., 6., 7., 8.]);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_chunk_whose_bytes_changed_is_refused_and_the_others_still_read() {
        let (root, m) = saved("corrupt");
        let at = m.tensors["m"].chunks[1].at.unwrap() as usize;
        let path = root.join("step-00000003/b.safetensors");
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[at + 1] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        let loc = Location::Local(root.clone());
        let mut r = Reader::new(&loc, "step-00000003", m).unwrap();
        assert_eq!(floats(&r.range("m", 0, 3).unwrap()), [1., 2., 3.]);
        let err = r.range("m", 3, 6).unwrap_err().to_string();
        assert!(
            err.contains("step-00000003/b.safetensors is damaged: chunk m#1 is not what was saved"),
            "{err}"
        );
        // a checkpoint of chunks without digests is not read this way
        let mut old = r.manifest.clone();
        old.tensors.get_mut("w").unwrap().chunks[0].sha256 = None;
        assert!(Reader::new(&loc, "step-00000003", old).is_none());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
