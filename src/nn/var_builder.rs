//! Building layers straight from a checkpoint, by name prefix, in the manner of candle's
//! `VarBuilder`: `Linear::from_vb(&vb.pp("model.layers.0.self_attn.q_proj"), 64, 64, false)`
//! both names the weight (`model.layers.0.self_attn.q_proj.weight`) and reads it, so a layer
//! loaded from a checkpoint is never randomly initialised first. Without a checkpoint
//! ([`VarBuilder::random`]) each layer's PyTorch initialisation is used instead.
//!
//! A safetensors file is opened by reading its header only; each tensor is then read from the
//! file when a layer asks for it (one read of its bytes, one upload), so loading a large model
//! costs one read of each tensor, never an initialisation plus a copy, and never holds the whole
//! file in memory. Several files (the shards of `model.safetensors.index.json`) act as one.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use neuron_pc_compiler::{DType, HostTensor};
use safetensors::tensor::TensorInfo;

use crate::device::{lock, LazyDevice};
use crate::error::Result;
use crate::nn::HostRng;
use crate::sharding::ShardingPlan;
use crate::state_dict::{CheckpointError, StateDict};
use crate::tensor::Tensor;

/// How a layer initialises a parameter when there is no checkpoint (PyTorch's defaults, given
/// by each layer's `from_vb`). Values are drawn on the host in float32.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Every element `value` (norm weights 1, biases 0).
    Const(f64),
    /// Uniform in `[-bound, bound)` (`nn.Linear`: `1 / sqrt(in)`).
    Uniform {
        /// The interval's half-width.
        bound: f64,
    },
    /// Normal with mean 0 (`nn.Embedding`: std 1).
    Normal {
        /// The standard deviation.
        std: f64,
    },
}

impl Init {
    fn draw(self, rng: &mut HostRng, dims: &[usize]) -> Result<HostTensor> {
        let n: usize = dims.iter().product();
        let v: Vec<f32> = match self {
            Init::Const(c) => vec![c as f32; n],
            Init::Uniform { bound } => rng.uniform_vec(n, bound),
            Init::Normal { std } => {
                // straight into the tensor's bytes: a model's weights are millions of draws,
                // and a second buffer of them costs a copy and its page faults
                let mut bytes = Vec::with_capacity(n * 4);
                for _ in 0..n {
                    bytes.extend_from_slice(&((rng.normal() * std) as f32).to_le_bytes());
                }
                return Ok(HostTensor::from_bytes(DType::F32, dims, bytes)?);
            }
        };
        Ok(HostTensor::from_slice(&v, dims)?)
    }
}

/// One safetensors file whose header has been read.
struct MappedFile {
    path: PathBuf,
    file: Mutex<File>,
    /// Where the data section starts (8 + header length).
    data_start: u64,
}

/// Where one tensor of a safetensors file is.
struct Entry {
    file: usize,
    dtype: DType,
    shape: Vec<usize>,
    /// Byte range within the file's data section.
    range: (usize, usize),
}

enum Source {
    Tensors {
        tensors: BTreeMap<String, HostTensor>,
        origin: PathBuf,
    },
    Files {
        files: Vec<MappedFile>,
        index: BTreeMap<String, Entry>,
    },
    Random(Mutex<HostRng>),
    /// Tensors already on the device, by full name: `[rows, ..]` stacks of what a layer
    /// asks for (`rows`), or exactly what it asks for (`None`). What `nn::ScannedLayers`
    /// builds its layer from.
    Device {
        tensors: BTreeMap<String, Tensor>,
        rows: Option<usize>,
    },
}

/// Where a collecting builder puts what it reads (see [`VarBuilder::collecting`]).
pub(crate) type Collected = Arc<Mutex<Vec<(String, HostTensor)>>>;

struct Shared {
    device: LazyDevice,
    source: Source,
    used: Mutex<BTreeSet<String>>,
}

/// A view of a checkpoint (or of a random initialiser) under a name prefix; cheap to clone.
/// [`VarBuilder::pp`] descends one level (`vb.pp("model").pp("layers.0")`), and the layers'
/// `from_vb` constructors take the parameters they need from it.
#[derive(Clone)]
pub struct VarBuilder {
    shared: Arc<Shared>,
    prefix: String,
    dtype: Option<DType>,
    /// On a mesh device: each parameter's layout (see [`VarBuilder::with_sharding`]).
    plan: Option<Arc<dyn ShardingPlan>>,
    /// Parameters go here, on the host, instead of to the device.
    collect: Option<Collected>,
}

impl std::fmt::Debug for VarBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.shared.source {
            Source::Tensors { .. } => "state dict",
            Source::Files { .. } => "safetensors",
            Source::Random(_) => "random",
            Source::Device { .. } => "device tensors",
        };
        write!(f, "VarBuilder({kind}, prefix {:?})", self.prefix)
    }
}

fn join(prefix: &str, name: &str) -> String {
    match (prefix.is_empty(), name.is_empty()) {
        (true, _) => name.to_string(),
        (_, true) => prefix.to_string(),
        _ => format!("{prefix}.{name}"),
    }
}

fn from_st(d: safetensors::Dtype) -> Option<DType> {
    Some(match d {
        safetensors::Dtype::F32 => DType::F32,
        safetensors::Dtype::F64 => DType::F64,
        safetensors::Dtype::BF16 => DType::BF16,
        safetensors::Dtype::F16 => DType::F16,
        safetensors::Dtype::I32 => DType::I32,
        safetensors::Dtype::I64 => DType::I64,
        safetensors::Dtype::U32 => DType::U32,
        safetensors::Dtype::U8 => DType::U8,
        safetensors::Dtype::BOOL => DType::Pred,
        _ => return None,
    })
}

fn mismatch(origin: &Path, problems: Vec<String>) -> crate::Error {
    CheckpointError::Mismatch {
        path: origin.to_path_buf(),
        problems,
    }
    .into()
}

impl VarBuilder {
    fn with_source(device: &LazyDevice, source: Source) -> VarBuilder {
        VarBuilder {
            shared: Arc::new(Shared {
                device: device.clone(),
                source,
                used: Mutex::new(BTreeSet::new()),
            }),
            prefix: String::new(),
            dtype: None,
            plan: None,
            collect: None,
        }
    }

    /// Tensors already on `device`, by full name: each `[rows, ..]` (a stack of what a layer
    /// asks for) or, with `rows` `None`, of the asked shape.
    pub(crate) fn from_device_tensors(
        device: &LazyDevice,
        tensors: BTreeMap<String, Tensor>,
        rows: Option<usize>,
    ) -> VarBuilder {
        VarBuilder::with_source(device, Source::Device { tensors, rows })
    }

    /// This builder, reading into `into` on the host (full name, value after any dtype
    /// conversion) instead of uploading; `get` then returns a constant of zeros that is never
    /// computed. The source is read in the same order as by an uploading builder.
    pub(crate) fn collecting(&self, into: &Collected) -> VarBuilder {
        VarBuilder {
            collect: Some(into.clone()),
            ..self.clone()
        }
    }

    /// Uploads `host`, the stacked parameter `name` (`layers.*.…`), laid out by the builder's
    /// plan on a mesh device (see [`crate::sharding::spec_of`]).
    pub(crate) fn upload_stacked(&self, name: &str, host: &HostTensor) -> Result<Tensor> {
        let device = &self.shared.device;
        let t = match (&self.plan, device.mesh()) {
            (Some(plan), Some(mesh)) => {
                let spec = crate::sharding::spec_of(plan.as_ref(), name, host.dims(), mesh);
                device.tensor_sharded(host, &spec)?
            }
            _ => device.tensor(host)?,
        };
        t.set_name(name);
        Ok(t)
    }

    /// Tensors already on the host (a loaded [`StateDict`]); `origin` names them in errors.
    pub fn from_state_dict(device: &LazyDevice, sd: StateDict, origin: &Path) -> VarBuilder {
        let source = Source::Tensors {
            tensors: sd.tensors,
            origin: origin.to_path_buf(),
        };
        VarBuilder::with_source(device, source)
    }

    /// Safetensors files, read lazily: only their headers now, each tensor when a layer asks
    /// for it. Several files (a sharded checkpoint) act as one; a name in two files is an error.
    pub fn from_safetensors<P: AsRef<Path>>(
        device: &LazyDevice,
        paths: &[P],
    ) -> Result<VarBuilder> {
        let mut files = Vec::new();
        let mut index = BTreeMap::new();
        for (i, p) in paths.iter().enumerate() {
            let path = p.as_ref();
            let (mapped, infos) = read_header(path)?;
            for (name, info) in infos {
                let dtype =
                    from_st(info.dtype).ok_or_else(|| CheckpointError::UnsupportedDType {
                        path: path.to_path_buf(),
                        name: name.clone(),
                        dtype: format!("{:?}", info.dtype),
                    })?;
                let entry = Entry {
                    file: i,
                    dtype,
                    shape: info.shape,
                    range: info.data_offsets,
                };
                if index.insert(name.clone(), entry).is_some() {
                    return Err(CheckpointError::Format {
                        path: path.to_path_buf(),
                        message: format!("tensor {name} is also in another of the files"),
                    }
                    .into());
                }
            }
            files.push(mapped);
        }
        Ok(VarBuilder::with_source(
            device,
            Source::Files { files, index },
        ))
    }

    /// The shards named by a Hugging Face `model.safetensors.index.json` (its `weight_map`),
    /// relative to the index's directory.
    pub fn from_safetensors_index(device: &LazyDevice, index: &Path) -> Result<VarBuilder> {
        let format = |message: String| CheckpointError::Format {
            path: index.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(index).map_err(|source| CheckpointError::Io {
            path: index.to_path_buf(),
            source,
        })?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format(e.to_string()))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| format("no weight_map object".into()))?;
        let shards: BTreeSet<&str> = map.values().filter_map(|v| v.as_str()).collect();
        let dir = index.parent().unwrap_or(Path::new("."));
        let paths: Vec<PathBuf> = shards.iter().map(|s| dir.join(s)).collect();
        VarBuilder::from_safetensors(device, &paths)
    }

    /// No checkpoint: every parameter is drawn by its layer's [`Init`] from a host generator
    /// seeded with `seed`.
    pub fn random(device: &LazyDevice, seed: u64) -> VarBuilder {
        VarBuilder::with_source(device, Source::Random(Mutex::new(HostRng::new(seed))))
    }

    /// The builder one level down: names are prefixed with `name.` (which may itself hold dots,
    /// `vb.pp("model.layers.0")`).
    pub fn pp(&self, name: &str) -> VarBuilder {
        VarBuilder {
            shared: self.shared.clone(),
            prefix: join(&self.prefix, name),
            dtype: self.dtype,
            plan: self.plan.clone(),
            collect: self.collect.clone(),
        }
    }

    /// Tensors are converted to `dtype` on the host as they are read (a bfloat16 checkpoint
    /// into a float32 model); by default they keep the file's dtype (random ones are float32).
    pub fn with_dtype(&self, dtype: DType) -> VarBuilder {
        VarBuilder {
            dtype: Some(dtype),
            ..self.clone()
        }
    }

    /// On a mesh device, each parameter is uploaded straight into the blocks `plan` gives it
    /// (by its full state-dict name): no device ever holds a whole sharded parameter. Without
    /// a mesh the plan is not consulted.
    pub fn with_sharding(&self, plan: Arc<dyn ShardingPlan>) -> VarBuilder {
        VarBuilder {
            plan: Some(plan),
            ..self.clone()
        }
    }

    /// The current prefix (`""` at the top).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The device the parameters are uploaded to.
    pub fn device(&self) -> &LazyDevice {
        &self.shared.device
    }

    /// Whether the checkpoint holds `name` under this prefix (always false for a random one).
    pub fn contains(&self, name: &str) -> bool {
        let full = join(&self.prefix, name);
        match &self.shared.source {
            Source::Tensors { tensors, .. } => tensors.contains_key(&full),
            Source::Files { index, .. } => index.contains_key(&full),
            Source::Device { tensors, .. } => tensors.contains_key(&full),
            Source::Random(_) => false,
        }
    }

    /// The parameter `name` under this prefix, of shape `dims`, on the device: read from the
    /// checkpoint (whose shape must be `dims`), or drawn by `init` when there is none. A name
    /// the checkpoint lacks is an error naming the full path and what is there under the
    /// prefix.
    pub fn get(&self, dims: &[usize], name: &str, init: Init) -> Result<Tensor> {
        let full = join(&self.prefix, name);
        let host = match &self.shared.source {
            Source::Random(rng) => init.draw(&mut lock(rng), dims)?,
            Source::Tensors { tensors, origin } => match tensors.get(&full) {
                Some(t) => {
                    self.check_shape(origin, &full, t.dtype(), t.dims(), dims)?;
                    t.clone()
                }
                None => return Err(self.missing(origin, &full, dims, tensors.keys())),
            },
            Source::Files { files, index } => match index.get(&full) {
                Some(e) => {
                    let f = &files[e.file];
                    self.check_shape(&f.path, &full, e.dtype, &e.shape, dims)?;
                    read_tensor(f, e)?
                }
                None => {
                    let origin = files.first().map(|f| f.path.clone()).unwrap_or_default();
                    return Err(self.missing(&origin, &full, dims, index.keys()));
                }
            },
            Source::Device { tensors, rows } => {
                let origin = Path::new("stacked layers");
                let Some(t) = tensors.get(&full) else {
                    return Err(self.missing(origin, &full, dims, tensors.keys()));
                };
                let want: Vec<usize> = rows.iter().copied().chain(dims.iter().copied()).collect();
                self.check_shape(origin, &full, t.dtype(), t.dims(), &want)?;
                lock(&self.shared.used).insert(full);
                return Ok(t.clone());
            }
        };
        let host = match self.dtype {
            Some(d) if d != host.dtype() => {
                HostTensor::from_f64s(d, &host.to_f64_vec(), host.dims())?
            }
            _ => host,
        };
        let device = &self.shared.device;
        if let Some(into) = &self.collect {
            let zeros = device.zeros(host.dims(), host.dtype())?;
            lock(into).push((full.clone(), host));
            lock(&self.shared.used).insert(full);
            return Ok(zeros);
        }
        let t = match (&self.plan, device.mesh()) {
            (Some(plan), Some(mesh)) => device
                .tensor_sharded(&host, &plan.spec(&full, host.dims(), mesh))
                .map_err(|e| match e {
                    crate::Error::Placement { location, message } => crate::Error::Placement {
                        location,
                        message: format!("parameter {full}: {message}"),
                    },
                    e => e,
                })?,
            _ => device.tensor(&host)?,
        };
        // The state-dict name from the start, so the first step's diagnostics name it.
        t.set_name(&full);
        lock(&self.shared.used).insert(full);
        Ok(t)
    }

    /// The checkpoint's names that no layer has read yet (for a strict load, expect none).
    pub fn unused(&self) -> Vec<String> {
        let used = lock(&self.shared.used);
        let names: Vec<&String> = match &self.shared.source {
            Source::Tensors { tensors, .. } => tensors.keys().collect(),
            Source::Files { index, .. } => index.keys().collect(),
            Source::Device { tensors, .. } => tensors.keys().collect(),
            Source::Random(_) => Vec::new(),
        };
        names
            .into_iter()
            .filter(|n| !used.contains(*n))
            .cloned()
            .collect()
    }

    fn check_shape(
        &self,
        origin: &Path,
        full: &str,
        dtype: DType,
        shape: &[usize],
        dims: &[usize],
    ) -> Result<()> {
        if shape == dims {
            return Ok(());
        }
        Err(mismatch(
            origin,
            vec![format!(
                "  {full}: file has {dtype}{shape:?}, model expects {dims:?}"
            )],
        ))
    }

    fn missing<'a>(
        &self,
        origin: &Path,
        full: &str,
        dims: &[usize],
        names: impl Iterator<Item = &'a String>,
    ) -> crate::Error {
        let names: Vec<&String> = names.collect();
        // the names under the longest prefix of the path that the checkpoint has, to show
        // what is there instead (a typo, another naming scheme)
        let mut scope = full;
        let hint = loop {
            scope = match scope.rfind('.') {
                Some(i) => &scope[..i],
                None => "",
            };
            let under = if scope.is_empty() {
                String::new()
            } else {
                format!("{scope}.")
            };
            let near: Vec<&str> = names
                .iter()
                .filter(|n| n.starts_with(&under))
                .take(8)
                .map(|n| n.as_str())
                .collect();
            if !near.is_empty() {
                break format!("under {under:?} it has: {}", near.join(", "));
            }
            if scope.is_empty() {
                break "the checkpoint is empty".to_string();
            }
        };
        mismatch(
            origin,
            vec![format!("  missing: {full} ({dims:?}); {hint}")],
        )
    }
}

/// Opens `path` and reads the safetensors header only: the tensors' dtypes, shapes and byte
/// ranges, each checked against the file's length.
fn read_header(path: &Path) -> Result<(MappedFile, Vec<(String, TensorInfo)>)> {
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let format = |message: String| CheckpointError::Format {
        path: path.to_path_buf(),
        message,
    };
    let mut file = File::open(path).map_err(io)?;
    let file_len = file.metadata().map_err(io)?.len();
    let mut len8 = [0u8; 8];
    file.read_exact(&mut len8)
        .map_err(|_| format("shorter than a safetensors header".into()))?;
    let n = u64::from_le_bytes(len8);
    // safetensors' own limit on the header size
    if n > 100_000_000 || 8 + n > file_len {
        return Err(format(format!("a header of {n} bytes does not fit the file")).into());
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact(&mut header).map_err(io)?;
    let json: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| format(e.to_string()))?;
    let data_len = (file_len - 8 - n) as usize;
    let mut infos = Vec::new();
    for (name, v) in json {
        if name == "__metadata__" {
            continue;
        }
        let info: TensorInfo =
            serde_json::from_value(v).map_err(|e| format(format!("{name}: {e}")))?;
        let (start, end) = info.data_offsets;
        let want = info.shape.iter().product::<usize>() * info.dtype.bitsize() / 8;
        if start > end || end > data_len || end - start != want {
            return Err(format(format!(
                "tensor {name}: bytes {start}..{end} do not hold {:?}{:?} within the file",
                info.dtype, info.shape
            ))
            .into());
        }
        infos.push((name, info));
    }
    let mapped = MappedFile {
        path: path.to_path_buf(),
        file: Mutex::new(file),
        data_start: 8 + n,
    };
    Ok((mapped, infos))
}

/// One read of the tensor's bytes.
fn read_tensor(f: &MappedFile, e: &Entry) -> Result<HostTensor> {
    let (start, end) = e.range;
    let io = |source| CheckpointError::Io {
        path: f.path.clone(),
        source,
    };
    let mut bytes = vec![0u8; end - start];
    let mut file = lock(&f.file);
    file.seek(SeekFrom::Start(f.data_start + start as u64))
        .map_err(io)?;
    file.read_exact(&mut bytes).map_err(io)?;
    Ok(HostTensor::from_bytes(e.dtype, &e.shape, bytes)?)
}
