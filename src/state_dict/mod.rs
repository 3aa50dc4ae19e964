//! Checkpoints as safetensors files with PyTorch's parameter names, so a state dict moves
//! between this crate and PyTorch (`safetensors.torch.save_file(model.state_dict())` /
//! `load_file`) and between accelerators.
//!
//! Layout of a full training checkpoint: model parameters under their PyTorch names
//! (`mlp.0.weight`), optimizer state under `optimizer.<param name>.<slot>` (`exp_avg`,
//! `exp_avg_sq`, `momentum_buffer`), and the step and any scalars in the file's string metadata.
//! A model-only file (what PyTorch writes from `model.state_dict()`) loads as parameters alone.
//!
//! Saving is atomic: the bytes go to a temporary file in the same directory, are fsynced and
//! renamed over the target, and the directory is fsynced, so a crash leaves the old checkpoint
//! or the new one, never half of one.
//!
//! ```
//! use std::collections::BTreeMap;
//! use neuron_pc::state_dict::StateDict;
//! use neuron_pc::{DType, HostTensor};
//! # fn main() -> neuron_pc::Result<()> {
//! let mut sd = StateDict::default();
//! let w = HostTensor::from_slice(&[0.5f32, -1.0, 2.0, 0.0], &[2, 2])?;
//! sd.tensors.insert("mlp.0.weight".into(), w);
//! sd.metadata.insert("step".into(), "100".into());
//! let dir = std::env::temp_dir().join(format!("neuron-pc-doc-{}", std::process::id()));
//! let path = dir.join("last.safetensors");
//! sd.save(&path)?; // what `safetensors.torch.load_file(path)` reads
//!
//! let back = StateDict::load(&path)?;
//! assert_eq!(back, sd);
//! // Check names, dtypes and shapes against the model's; optimizer state is optional.
//! let expected = BTreeMap::from([("mlp.0.weight".to_string(), (DType::F32, vec![2, 2]))]);
//! back.check_against(&path, &expected, Some("optimizer."))?;
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```

pub use neuron_pc_cache::{PartOptions, S3Options};

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use neuron_pc_compiler::{DType, HostTensor};
use safetensors::{Dtype, SafeTensors};

/// Errors of saving and loading checkpoints.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// Reading or writing the file failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The checkpoint file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid safetensors (or could not be serialized as such).
    #[error("checkpoint {path}: not a valid safetensors file: {message}")]
    Format {
        /// The checkpoint file.
        path: PathBuf,
        /// The safetensors library's error.
        message: String,
    },
    /// A tensor of the file has a dtype with no [`DType`] (such as `F8_E4M3` or `I16`).
    #[error(
        "checkpoint {path}: tensor {name} has dtype {dtype}, which neuron-pc does not support"
    )]
    UnsupportedDType {
        /// The checkpoint file.
        path: PathBuf,
        /// The tensor's name in the file.
        name: String,
        /// The file's dtype, as safetensors names it.
        dtype: String,
    },
    /// Names, shapes or dtypes that do not match what the model expects; one line per problem.
    #[error("checkpoint {path} does not match the model:\n{}", problems.join("\n"))]
    Mismatch {
        /// The checkpoint file.
        path: PathBuf,
        /// One line per missing, unexpected or mismatched tensor.
        problems: Vec<String>,
    },
    /// The checkpoint location (a directory, an S3 prefix) cannot be used, or a save in it
    /// failed.
    #[error("checkpoints in {location}: {message}")]
    Storage {
        /// The directory or URL (with the object, when one is at fault).
        location: String,
        /// What went wrong.
        message: String,
    },
    /// A saved checkpoint that fails its checks (a file missing, of the wrong size or digest,
    /// a manifest that does not parse).
    #[error("checkpoint {name} is damaged: {message}")]
    Corrupt {
        /// The file or object.
        name: String,
        /// Which check failed.
        message: String,
    },
    /// A metadata entry (such as the step) that cannot be read.
    #[error("checkpoint {path}: metadata {key} = {value:?} is not valid: {message}")]
    Metadata {
        /// The checkpoint file.
        path: PathBuf,
        /// The metadata key (`step`).
        key: String,
        /// Its value in the file.
        value: String,
        /// Why it is not valid (the parser's error).
        message: String,
    },
    /// A checkpoint another run wrote, which this run (named otherwise) may not continue
    /// without being told to ([`crate::state::CheckpointOptions::adopt_run`]).
    #[error(
        "checkpoint {location} belongs to run {theirs}, and this run is {ours}: to continue it, \
         run under its id ({}={theirs}) or adopt it on purpose (train_llama: --adopt-run); to \
         start over, give this run another checkpoint location",
        crate::store::RUN_ID_ENV
    )]
    OtherRun {
        /// The checkpoint.
        location: String,
        /// The run that wrote it.
        theirs: String,
        /// This run's id.
        ours: String,
    },
}

/// The `Result` of saving and loading checkpoints.
pub type Result<T> = std::result::Result<T, CheckpointError>;

/// A state dict: tensors by name, plus string metadata (step, config).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StateDict {
    /// The tensors, by PyTorch parameter name (`mlp.0.weight`); sorted by name.
    pub tensors: BTreeMap<String, HostTensor>,
    /// The file's string metadata (`step`, config values).
    pub metadata: BTreeMap<String, String>,
}

fn to_st(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::BF16 => Dtype::BF16,
        DType::F16 => Dtype::F16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U32 => Dtype::U32,
        DType::U8 => Dtype::U8,
        DType::Pred => Dtype::BOOL,
    }
}

pub(crate) fn from_st(d: Dtype) -> Option<DType> {
    DType::ALL.into_iter().find(|x| to_st(*x) == d)
}

impl StateDict {
    /// Writes the state dict to `path` atomically. In a trial run (see
    /// [`crate::trial`]) nothing is written: the values are zero-filled stand-ins, and the file
    /// at `path` (a real checkpoint, maybe) is left as it was; one line says so per path.
    pub fn save(&self, path: &Path) -> Result<()> {
        if crate::trial::skip_write("checkpoint", path) {
            return Ok(());
        }
        let io = |source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        };
        let metadata: HashMap<String, String> = self.metadata.clone().into_iter().collect();
        let bytes = serialize(
            self.tensors.iter().map(|(n, t)| (n.as_str(), t)),
            metadata,
            path,
        )?;
        write_atomic(path, &bytes).map_err(io)
    }

    /// Reads a safetensors file (written by this crate, PyTorch or anything else).
    pub fn load(path: &Path) -> Result<StateDict> {
        let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let format = |message: String| CheckpointError::Format {
            path: path.to_path_buf(),
            message,
        };
        let (_, meta) = SafeTensors::read_metadata(&bytes).map_err(|e| format(e.to_string()))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| format(e.to_string()))?;
        let mut out = StateDict::default();
        if let Some(m) = meta.metadata() {
            out.metadata = m.clone().into_iter().collect();
        }
        for (name, view) in st.iter() {
            let dtype = from_st(view.dtype()).ok_or_else(|| CheckpointError::UnsupportedDType {
                path: path.to_path_buf(),
                name: name.to_string(),
                dtype: format!("{:?}", view.dtype()),
            })?;
            let t = HostTensor::from_bytes(dtype, view.shape(), view.data().to_vec())
                .map_err(|e| format(e.to_string()))?;
            out.tensors.insert(name.to_string(), t);
        }
        Ok(out)
    }

    /// Checks that `self` has exactly the tensors in `expected` (name → dtype and shape), and
    /// lists every missing, unexpected or mismatched tensor. Tensors under `optional_prefix`
    /// (for example optimizer state when loading a model-only file) are not required.
    pub fn check_against(
        &self,
        path: &Path,
        expected: &BTreeMap<String, (DType, Vec<usize>)>,
        optional_prefix: Option<&str>,
    ) -> Result<()> {
        let have = self
            .tensors
            .iter()
            .map(|(n, t)| (n.clone(), (t.dtype(), t.dims().to_vec())))
            .collect();
        check_types(path, &have, expected, optional_prefix)
    }
}

/// Checks that `have` (name → dtype and shape, what a file holds) is exactly `expected`, and
/// lists every missing, unexpected or mismatched tensor; names under `optional_prefix` may be
/// missing.
pub(crate) fn check_types(
    path: &Path,
    have: &BTreeMap<String, (DType, Vec<usize>)>,
    expected: &BTreeMap<String, (DType, Vec<usize>)>,
    optional_prefix: Option<&str>,
) -> Result<()> {
    let mut problems = Vec::new();
    for (name, (dtype, dims)) in expected {
        match have.get(name) {
            None if optional_prefix.is_some_and(|p| name.starts_with(p)) => {}
            None => problems.push(format!("  missing: {name} ({dtype}{dims:?})")),
            Some((d, s)) if d != dtype || s != dims => problems.push(format!(
                "  {name}: file has {d}{s:?}, model expects {dtype}{dims:?}"
            )),
            Some(_) => {}
        }
    }
    for name in have.keys() {
        if !expected.contains_key(name) {
            problems.push(format!("  unexpected: {name}"));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CheckpointError::Mismatch {
            path: path.to_path_buf(),
            problems,
        })
    }
}

/// The safetensors bytes of `tensors` with `metadata`; `path` names the file in errors.
pub(crate) fn serialize<'a>(
    tensors: impl Iterator<Item = (&'a str, &'a HostTensor)>,
    metadata: HashMap<String, String>,
    path: &Path,
) -> Result<Vec<u8>> {
    let views: Vec<(&str, safetensors::tensor::TensorView<'_>)> = tensors
        .map(|(name, t)| {
            let view = safetensors::tensor::TensorView::new(
                to_st(t.dtype()),
                t.dims().to_vec(),
                t.bytes(),
            )
            .expect("HostTensor guarantees its byte length matches its shape");
            (name, view)
        })
        .collect();
    safetensors::serialize(views, Some(metadata)).map_err(|e| CheckpointError::Format {
        path: path.to_path_buf(),
        message: e.to_string(),
    })
}

/// Writes `bytes` to `path` so that readers see the old file or the whole new one.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp.{}", std::process::id()));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // Make the rename itself durable.
        std::fs::File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The name component standing for the leading index of a stacked tensor.
pub const STACKED: &str = "*";

/// Whether `name` is a stacked tensor's (has a [`STACKED`] component).
pub fn is_stacked(name: &str) -> bool {
    name.split('.').any(|c| c == STACKED)
}

/// `name` with its [`STACKED`] component replaced by `i`: the name of row `i`.
pub fn stacked_row_name(name: &str, i: usize) -> String {
    let parts: Vec<String> = name
        .split('.')
        .map(|c| match c {
            STACKED => i.to_string(),
            c => c.to_string(),
        })
        .collect();
    parts.join(".")
}

/// The rows of `host` along its first dimension.
pub(crate) fn host_rows(host: &HostTensor) -> neuron_pc_compiler::Result<Vec<HostTensor>> {
    let rows = host.dims().first().copied().unwrap_or(0);
    let per_row = host.bytes().len() / rows.max(1);
    host.bytes()
        .chunks(per_row.max(1))
        .take(rows)
        .map(|b| HostTensor::from_bytes(host.dtype(), &host.dims()[1..], b.to_vec()))
        .collect()
}

/// `rows` (of one type) stacked along a new first dimension.
pub(crate) fn stack_rows(rows: &[&HostTensor]) -> neuron_pc_compiler::Result<HostTensor> {
    let mut dims = vec![rows.len()];
    dims.extend_from_slice(rows.first().map_or(&[][..], |r| r.dims()));
    let dtype = rows
        .first()
        .map_or(neuron_pc_compiler::DType::F32, |r| r.dtype());
    let mut bytes = Vec::with_capacity(rows.iter().map(|r| r.bytes().len()).sum());
    for r in rows {
        bytes.extend_from_slice(r.bytes());
    }
    HostTensor::from_bytes(dtype, &dims, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("npc-ckpt-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn sample() -> StateDict {
        let mut s = StateDict::default();
        s.tensors.insert(
            "mlp.0.weight".into(),
            HostTensor::from_slice(&[1.0f32, -2.0, 3.5, 4.25, 0.0, 6.0], &[2, 3]).unwrap(),
        );
        s.tensors.insert(
            "mlp.0.bias".into(),
            HostTensor::from_slice(&[0.5f32, -0.5], &[2]).unwrap(),
        );
        s.tensors.insert(
            "tokens".into(),
            HostTensor::from_slice(&[3i64, 9], &[2]).unwrap(),
        );
        s.tensors.insert(
            "half".into(),
            HostTensor::from_slice(&[half::bf16::from_f32(1.5)], &[1]).unwrap(),
        );
        s.metadata.insert("step".into(), "42".into());
        s
    }

    #[test]
    fn round_trip_keeps_names_values_and_metadata() {
        let d = tmpdir("rt");
        let p = d.join("ckpt.safetensors");
        let s = sample();
        s.save(&p).unwrap();
        let back = StateDict::load(&p).unwrap();
        assert_eq!(back, s);
        // No temporary file is left behind.
        let names: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn mismatches_are_listed_by_name() {
        let s = sample();
        let mut expected = BTreeMap::new();
        expected.insert("mlp.0.weight".to_string(), (DType::F32, vec![3, 2]));
        expected.insert("mlp.0.bias".to_string(), (DType::F32, vec![2]));
        expected.insert("mlp.1.weight".to_string(), (DType::F32, vec![2, 2]));
        expected.insert(
            "optimizer.mlp.0.bias.exp_avg".to_string(),
            (DType::F32, vec![2]),
        );
        let err = s
            .check_against(Path::new("x"), &expected, Some("optimizer."))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mlp.0.weight: file has f32[2, 3], model expects f32[3, 2]"),
            "{err}"
        );
        assert!(err.contains("missing: mlp.1.weight"), "{err}");
        assert!(err.contains("unexpected: tokens"), "{err}");
        assert!(!err.contains("exp_avg"), "{err}");
    }

    #[test]
    fn garbage_and_truncated_files_are_errors() {
        let d = tmpdir("bad");
        let p = d.join("bad.safetensors");
        std::fs::write(&p, b"not a checkpoint at all").unwrap();
        assert!(matches!(
            StateDict::load(&p),
            Err(CheckpointError::Format { .. })
        ));
        sample().save(&p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
        assert!(matches!(
            StateDict::load(&p),
            Err(CheckpointError::Format { .. })
        ));
        assert!(matches!(
            StateDict::load(&d.join("missing")),
            Err(CheckpointError::Io { .. })
        ));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
