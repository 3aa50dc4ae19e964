//! A training state held on the device for a save in the background: the device buffers of
//! every parameter and optimizer-state tensor at one step, kept alive (the next step then
//! copies instead of updating them in place), and written out by another thread one file at a
//! time, each file's buffers released once it is written.

use std::collections::BTreeMap;
use std::sync::Arc;

use neuron_pc_compiler::sharding::Sharding;
use neuron_pc_compiler::HostTensor;

use super::meter::Meter;
use super::{OPTIMIZER_PREFIX, STEP_KEY};
use crate::device::trace::DeviceData;
use crate::device::DeviceInner;
use crate::error::Result;
use crate::nn::Module;
use crate::optim::{HeldState, OptimizerState};
use crate::state::manifest::{self, Block, Chunk, FileEntry, Manifest, TensorEntry};
use crate::state::Location;
use crate::state_dict::{host_rows, is_stacked, stacked_row_name, CheckpointError};
use crate::tensor::Tensor;
use crate::LazyDevice;

/// One tensor of the state.
struct Entry {
    name: String,
    /// Released once written.
    data: Option<Arc<DeviceData>>,
    dtype: neuron_pc_compiler::DType,
    /// The whole tensor's shape.
    dims: Vec<usize>,
    /// ZeRO-1: the length of each replica's block (the data is per replica).
    block: Option<usize>,
}

impl Entry {
    fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// Bytes this process writes of it.
    fn bytes(&self, s: &Snapshot) -> usize {
        let elems = match self.block {
            Some(b) => b * s.local_replicas,
            None => self.numel(),
        };
        elems * self.dtype.size_in_bytes()
    }

    /// Whether this process writes it: each rank its blocks, rank 0 what is whole.
    fn written_by(&self, rank: usize) -> bool {
        self.block.is_some() || rank == 0
    }
}

/// The state of a module and its optimizer at one step, on the device.
pub(crate) struct Snapshot {
    dev: Arc<DeviceInner>,
    pub(crate) step: u64,
    pub(crate) metadata: BTreeMap<String, String>,
    entries: Vec<Entry>,
    pub(crate) rank: usize,
    pub(crate) processes: usize,
    /// A run of several processes: the save's nonce, written into this rank's part.
    pub(crate) nonce: Option<String>,
    replica_offset: usize,
    local_replicas: usize,
}

impl Snapshot {
    /// Holds the values of `module`'s parameters and buffers and of `opt`'s state (made for
    /// `module.parameters()` in order). Pending values are computed first, by one step.
    pub(crate) fn take<M: Module + ?Sized, O: OptimizerState + ?Sized>(
        module: &M,
        opt: &O,
        step: u64,
    ) -> Result<Snapshot> {
        let names: Vec<String> = module.parameters().into_iter().map(|(n, _)| n).collect();
        let mut tensors: Vec<(String, Tensor, Option<Vec<usize>>)> = module
            .state_tensors()
            .into_iter()
            .map(|(n, t)| (n, t, None))
            .collect();
        for (n, held) in opt.held_state(&names)? {
            let name = format!("{OPTIMIZER_PREFIX}{n}");
            tensors.push(match held {
                HeldState::Whole(t) => (name, t, None),
                HeldState::Blocks { blocks, dims } => (name, blocks, Some(dims)),
            });
        }
        let Some((_, first, _)) = tensors.first() else {
            return Err(CheckpointError::Storage {
                location: "checkpoint".into(),
                message: "the module has no parameters to save".into(),
            }
            .into());
        };
        let device = first.device()?;
        if tensors.iter().any(|(_, t, _)| t.is_pending()) {
            device.mark_step()?;
        }
        let dev = first.device_inner()?;
        let topology = &dev.config().topology;
        let (rank, processes) = (topology.rank, topology.world_size.max(1));
        let mut entries = Vec::with_capacity(tensors.len());
        for (name, t, whole) in tensors {
            let block = whole.as_ref().map(|_| t.dims()[0]);
            entries.push(Entry {
                data: Some(t.held_data()?),
                dtype: t.dtype(),
                dims: whole.unwrap_or_else(|| t.dims().to_vec()),
                block,
                name,
            });
        }
        let mut metadata = BTreeMap::new();
        metadata.insert(STEP_KEY.to_string(), step.to_string());
        Ok(Snapshot {
            step,
            metadata,
            entries,
            rank,
            processes,
            nonce: None,
            replica_offset: device.replica_offset(),
            local_replicas: device.replicas(),
            dev,
        })
    }

    /// The device the state is on (its metrics count the save).
    pub(crate) fn device(&self) -> LazyDevice {
        LazyDevice {
            inner: self.dev.clone(),
        }
    }

    /// Writes this process's files of the checkpoint into directory `dir` of `loc`, files of
    /// about `shard_size` bytes; returns this process's part of the manifest (files and
    /// chunks). Each file's device buffers are released once it is written.
    /// `meter` counts the bytes as each file is written.
    pub(crate) fn write(
        mut self,
        loc: &Location,
        dir: &str,
        shard_size: u64,
        meter: &Meter,
    ) -> Result<Manifest> {
        let mut files: Vec<Vec<usize>> = vec![Vec::new()];
        // the tensor bytes of each file
        let mut sizes = vec![0u64];
        let mut size = 0u64;
        for (i, e) in self.entries.iter().enumerate() {
            if !e.written_by(self.rank) {
                continue;
            }
            let bytes = e.bytes(&self) as u64;
            if size > 0 && size + bytes > shard_size {
                files.push(Vec::new());
                sizes.push(0);
                size = 0;
            }
            files.last_mut().expect("at least one file").push(i);
            *sizes.last_mut().expect("at least one file") += bytes;
            size += bytes;
        }
        if files[0].is_empty() {
            // (only the first can be empty: a file is started for an entry)
            files.clear();
            sizes.clear();
        }
        meter.set_total(sizes.iter().sum());
        let mut part = Manifest::new(self.step, self.processes, self.metadata.clone());
        part.nonce = self.nonce.clone();
        let n = files.len();
        for (k, (members, tensor_bytes)) in files.into_iter().zip(sizes).enumerate() {
            let file = match self.processes {
                1 => format!("model-{:05}-of-{n:05}.safetensors", k + 1),
                _ => format!(
                    "rank-{:05}-model-{:05}-of-{n:05}.safetensors",
                    self.rank,
                    k + 1
                ),
            };
            let mut stored: Vec<(String, HostTensor)> = Vec::new();
            // (tensor, chunk index) of each chunk in this file, placed once it is serialized
            let mut placed: Vec<(String, usize)> = Vec::new();
            for i in members {
                let data = self.entries[i].data.take().expect("written once");
                let e = &self.entries[i];
                for piece in self.pieces(e, &data)? {
                    let entry =
                        part.tensors
                            .entry(piece.tensor.clone())
                            .or_insert_with(|| TensorEntry {
                                dtype: manifest::dtype_name(e.dtype),
                                shape: match (&e.block, is_stacked(&e.name)) {
                                    (None, true) => e.dims[1..].to_vec(),
                                    _ => e.dims.clone(),
                                },
                                chunks: Vec::new(),
                            });
                    entry.chunks.push(Chunk {
                        file: file.clone(),
                        key: piece.key.clone(),
                        start: piece.start,
                        len: piece.host.dims().iter().product(),
                        block: piece.block,
                        at: None,
                        sha256: None,
                    });
                    placed.push((piece.tensor, entry.chunks.len() - 1));
                    stored.push((piece.key, piece.host));
                }
            }
            let bytes = serialize(&stored, &file)?;
            drop(stored);
            place_chunks(&mut part, &placed, &file, &bytes)?;
            test_delay();
            loc.put(&format!("{dir}/{file}"), &bytes)?;
            meter.add(tensor_bytes);
            let entry = FileEntry {
                bytes: bytes.len() as u64,
                sha256: manifest::sha256(&bytes),
            };
            part.files.insert(file, entry);
        }
        Ok(part)
    }

    /// The host tensors of `e` this process writes. A stacked tensor gives one tensor per
    /// layer; a parameter sharded over the mesh one piece per distinct block (never gathered
    /// on the host); ZeRO-1 state one piece per local replica's block (the padding past the end
    /// left out).
    fn pieces(&self, e: &Entry, data: &DeviceData) -> Result<Vec<Piece>> {
        let whole = |key: String, host| Piece {
            tensor: key.clone(),
            key,
            host,
            start: 0,
            block: None,
        };
        let Some(block) = e.block else {
            let blocks = data.sharding.as_deref().filter(|s| !s.is_replicated());
            if let (Some(s), false) = (blocks, is_stacked(&e.name)) {
                return self.mesh_blocks(e, data, s);
            }
            // the first replica's copy, or a mesh's blocks put together (replicated here)
            let host = self.dev.download_whole(data)?;
            if !is_stacked(&e.name) {
                return Ok(vec![whole(e.name.clone(), host)]);
            }
            return Ok(host_rows(&host)?
                .into_iter()
                .enumerate()
                .map(|(i, row)| whole(stacked_row_name(&e.name, i), row))
                .collect());
        };
        let numel = e.numel();
        let mut out = Vec::new();
        for r in 0..self.local_replicas {
            let start = (self.replica_offset + r) * block;
            if start >= numel {
                continue;
            }
            let len = block.min(numel - start);
            // on a mesh the process's one block is split over its devices
            let host = match data.sharding {
                Some(_) => self.dev.download_whole(data)?,
                None => self.dev.download(data, r)?,
            };
            let size = e.dtype.size_in_bytes();
            let bytes = host.bytes()[..len * size].to_vec();
            out.push(Piece {
                tensor: e.name.clone(),
                key: format!("{}#{}", e.name, self.replica_offset + r),
                host: HostTensor::from_bytes(e.dtype, &[len], bytes)?,
                start,
                block: None,
            });
        }
        Ok(out)
    }

    /// Each distinct block of a tensor sharded over the mesh, where it lies in the whole.
    fn mesh_blocks(&self, e: &Entry, data: &DeviceData, s: &Sharding) -> Result<Vec<Piece>> {
        let shard = s.shard_dims();
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for p in 0..data.buffers()?.len() {
            let index = s.block_of(p);
            if !seen.insert(index.clone()) {
                continue;
            }
            let offset: Vec<usize> = index.iter().zip(&shard).map(|(i, d)| i * d).collect();
            let at: Vec<String> = offset.iter().map(usize::to_string).collect();
            out.push(Piece {
                tensor: e.name.clone(),
                key: format!("{}@{}", e.name, at.join(",")),
                host: self.dev.download(data, p)?,
                start: 0,
                block: Some(Block {
                    offset,
                    shape: shard.clone(),
                }),
            });
        }
        Ok(out)
    }
}

/// Fills in where each chunk `placed` names lies in `bytes` (file `file`, safetensors) and its
/// digest, so a resume can fetch it alone.
pub(crate) fn place_chunks(
    part: &mut Manifest,
    placed: &[(String, usize)],
    file: &str,
    bytes: &[u8],
) -> Result<()> {
    let (header, meta) =
        safetensors::SafeTensors::read_metadata(bytes).map_err(|e| manifest::corrupt(file, e))?;
    // the data follows the 8 bytes of the header's length and the header
    let data = 8 + header;
    for (tensor, i) in placed {
        let chunk = &mut part.tensors.get_mut(tensor).expect("pushed above").chunks[*i];
        let info = meta
            .info(&chunk.key)
            .ok_or_else(|| manifest::corrupt(file, format!("{} was not written", chunk.key)))?;
        let (from, to) = (data + info.data_offsets.0, data + info.data_offsets.1);
        chunk.at = Some(from as u64);
        chunk.sha256 = Some(manifest::sha256(&bytes[from..to]));
    }
    Ok(())
}

/// Some of a tensor's elements as written: a whole tensor, a ZeRO-1 block or a mesh block.
struct Piece {
    /// The checkpoint tensor it belongs to.
    tensor: String,
    /// Its name in the file.
    key: String,
    host: HostTensor,
    /// Its first element in the flattened tensor (ZeRO-1 blocks).
    start: usize,
    /// Where it lies in the tensor (mesh blocks).
    block: Option<Block>,
}

/// The safetensors bytes of `tensors`, with the `format` Hugging Face's loaders look for as
/// their only metadata: the step is in the manifest. safetensors writes the metadata map in hash
/// order, so a second key would make the bytes of one state differ from process to process.
fn serialize(tensors: &[(String, HostTensor)], file: &str) -> Result<Vec<u8>> {
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let tensors = tensors.iter().map(|(n, t)| (n.as_str(), t));
    Ok(crate::state_dict::serialize(
        tensors,
        metadata,
        std::path::Path::new(file),
    )?)
}

/// Test builds only: `NEURON_PC_TEST_CKPT_DELAY_MS` slows each file of a save down, so a test
/// that kills the process during a save lands in one.
pub(crate) fn test_delay() {
    #[cfg(feature = "test-hooks")]
    if let Some(ms) = std::env::var("NEURON_PC_TEST_CKPT_DELAY_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}
