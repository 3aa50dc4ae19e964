//! Moving a model's parameters (and its optimizer's state) between the device and a
//! [`StateDict`], under PyTorch's names, so checkpoints move both ways between neuron-pc and
//! `torch.nn.Module.state_dict()`.
//!
//! Layout (the same as [`crate::state_dict`] describes): parameters under their names
//! (`mlp.0.weight`), optimizer state under [`OPTIMIZER_PREFIX`] (AdamW:
//! `optimizer.mlp.0.weight.exp_avg`, `optimizer.mlp.0.weight.exp_avg_sq`, `optimizer.step`; SGD:
//! `optimizer.mlp.0.weight.momentum_buffer`), and the step in the metadata under
//! [`STEP_KEY`].
//!
//! ```no_run
//! # use std::path::Path;
//! # use neuron_pc::{models::{TextEncoder, TextEncoderConfig}, nn::Module, optim::AdamW};
//! # use neuron_pc::{state, state_dict::StateDict, LazyDevice, Tensor};
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! let model = TextEncoder::new(&device, TextEncoderConfig::default(), 0)?;
//! let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
//! let opt = AdamW::new(&device, &params, 0.01)?;
//! // ... train ...
//! state::training_state(&model, &opt, 100)?.save(Path::new("ckpt/last.safetensors"))?;
//!
//! // A file from `safetensors.torch.save_file(model.state_dict(), path)` loads the same way.
//! let path = Path::new("ckpt/last.safetensors");
//! let restored = state::load_training(&model, &opt, &StateDict::load(path)?, path)?;
//! println!("step {:?}, optimizer state restored: {}", restored.step, restored.optimizer);
//! # Ok(()) }
//! ```
//!
//! A stacked parameter (`nn::ScannedLayers`: one `[layers, ..]` tensor for a stack of
//! identical layers) is named with `*` for the layer index (`model.layers.*.mlp.up_proj.weight`)
//! and stands in a state dict as one tensor per layer (`model.layers.0.mlp.up_proj.weight`,
//! ...): split on the way out, stacked on the way in, so a checkpoint is the same whether the
//! layers were scanned or not ([`crate::state_dict::STACKED`]).
//!
//! Loading checks every name, shape and dtype first and reports all mismatches at once
//! ([`crate::state_dict::CheckpointError::Mismatch`]); on any error nothing is loaded.

mod checkpoints;
mod lease;
mod location;
pub(crate) mod manifest;
mod meter;
mod parts;
mod restore;
mod run;
mod snapshot;
mod tidy;

pub use checkpoints::{CheckpointInfo, CheckpointOptions, Checkpoints, Resumed, LEGACY_FILE};
pub(crate) use location::Location;
pub use location::{CKPT_S3_ANSWER_TIMEOUT, CKPT_S3_TIMEOUT_ENV};
pub use meter::SaveProgress;

use std::collections::BTreeMap;
use std::path::Path;

use neuron_pc_compiler::DType;

use crate::error::Result;
use crate::nn::Module;
use crate::optim::OptimizerState;
use crate::state_dict::{
    host_rows, is_stacked, stack_rows, stacked_row_name, CheckpointError, StateDict,
};
use crate::tensor::Tensor;

/// Prefix of optimizer-state tensors in a training checkpoint.
pub const OPTIMIZER_PREFIX: &str = "optimizer.";

/// Metadata key holding the number of training steps taken.
pub const STEP_KEY: &str = "step";

/// What [`load_training`] restored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    /// The step recorded in the metadata, if the file has one (PyTorch's files do not).
    pub step: Option<u64>,
    /// Whether the optimizer state was loaded; `false` for a model-only file, which leaves
    /// the optimizer as it was.
    pub optimizer: bool,
}

/// Copies every parameter of `module` to the host under its PyTorch name: the equivalent of
/// `model.state_dict()`. Pending parameters are computed first, by one `mark_step`.
pub fn module_state<M: Module + ?Sized>(module: &M) -> Result<StateDict> {
    let mut sd = StateDict::default();
    download(module.state_tensors(), "", &mut sd)?;
    Ok(sd)
}

/// Copies `opt`'s state to the host under [`OPTIMIZER_PREFIX`]: for AdamW
/// `optimizer.<param name>.exp_avg`, `optimizer.<param name>.exp_avg_sq` and `optimizer.step`,
/// for SGD `optimizer.<param name>.momentum_buffer`; `param_names` are the names of the
/// parameters `opt` was made for, in the same order.
pub fn optimizer_state<O: OptimizerState + ?Sized>(
    opt: &O,
    param_names: &[String],
) -> Result<StateDict> {
    let mut sd = StateDict::default();
    download(opt.named_state(param_names)?, OPTIMIZER_PREFIX, &mut sd)?;
    Ok(sd)
}

/// A full training checkpoint: the parameters of `module`, the state of `opt` (made for
/// `module.parameters()` in that order) and `step` in the metadata.
pub fn training_state<M: Module + ?Sized, O: OptimizerState + ?Sized>(
    module: &M,
    opt: &O,
    step: u64,
) -> Result<StateDict> {
    let names: Vec<String> = module.parameters().into_iter().map(|(n, _)| n).collect();
    let mut sd = StateDict::default();
    download(module.state_tensors(), "", &mut sd)?;
    download(opt.named_state(&names)?, OPTIMIZER_PREFIX, &mut sd)?;
    sd.metadata.insert(STEP_KEY.to_string(), step.to_string());
    Ok(sd)
}

/// Loads `sd` into the parameters of `module` (like `load_state_dict(strict=True)`): `sd` must
/// hold exactly the module's parameters with the same shapes and dtypes. Tensors under
/// [`OPTIMIZER_PREFIX`] are ignored, so the weights of a training checkpoint load too.
/// `source` names the file in error messages.
pub fn load_module<M: Module + ?Sized>(module: &M, sd: &StateDict, source: &Path) -> Result<()> {
    let named = module.state_tensors();
    let mut model_only = StateDict {
        tensors: BTreeMap::new(),
        metadata: sd.metadata.clone(),
    };
    for (name, t) in &sd.tensors {
        if !name.starts_with(OPTIMIZER_PREFIX) {
            model_only.tensors.insert(name.clone(), t.clone());
        }
    }
    model_only.check_against(source, &expected(&named, ""), None)?;
    upload(
        &model_only,
        named.iter().map(|(n, t)| (n.clone(), t)),
        source,
    )
}

/// Loads a training checkpoint into `module` and `opt` (made for `module.parameters()` in that
/// order). A file with optimizer state must have all of it; a model-only file (no tensor under
/// [`OPTIMIZER_PREFIX`], as PyTorch writes from `model.state_dict()`) loads the parameters
/// alone. Everything is checked before anything is loaded.
pub fn load_training<M: Module + ?Sized, O: OptimizerState + ?Sized>(
    module: &M,
    opt: &O,
    sd: &StateDict,
    source: &Path,
) -> Result<Restored> {
    let names: Vec<String> = module.parameters().into_iter().map(|(n, _)| n).collect();
    let named = module.state_tensors();
    let state = opt.named_state(&names)?;
    let has_optimizer = sd.tensors.keys().any(|k| k.starts_with(OPTIMIZER_PREFIX));
    let mut want = expected(&named, "");
    if has_optimizer {
        want.extend(expected(&state, OPTIMIZER_PREFIX));
    }
    sd.check_against(source, &want, None)?;
    let step = step_in(&sd.metadata, source)?;
    // Everything is uploaded before anything is assigned, so a failed upload loads nothing.
    let params = stage(sd, named.iter().map(|(n, t)| (n.clone(), t)), source)?;
    let optimizer = if has_optimizer {
        let targets = state
            .iter()
            .map(|(n, t)| (format!("{OPTIMIZER_PREFIX}{n}"), t));
        Some(stage(sd, targets, source)?)
    } else {
        None
    };
    for (target, value) in params {
        target.assign(&value)?;
    }
    if let Some(values) = optimizer {
        let values = state
            .iter()
            .zip(values)
            .map(|((n, _), (_, v))| (n.clone(), v))
            .collect();
        opt.restore_state(&names, values)?;
    }
    Ok(Restored {
        step,
        optimizer: has_optimizer,
    })
}

/// The step a checkpoint's metadata records under [`STEP_KEY`], if any (PyTorch's files have
/// none); `source` names it in the error when the value is not a number.
fn step_in(metadata: &BTreeMap<String, String>, source: &Path) -> Result<Option<u64>> {
    let Some(v) = metadata.get(STEP_KEY) else {
        return Ok(None);
    };
    let step = v.parse::<u64>().map_err(|e| CheckpointError::Metadata {
        path: source.to_path_buf(),
        key: STEP_KEY.to_string(),
        value: v.clone(),
        message: e.to_string(),
    })?;
    Ok(Some(step))
}

fn expected(named: &[(String, Tensor)], prefix: &str) -> BTreeMap<String, (DType, Vec<usize>)> {
    let mut want = BTreeMap::new();
    for (n, t) in named {
        let name = format!("{prefix}{n}");
        if is_stacked(&name) {
            for i in 0..t.dims()[0] {
                let row = (t.dtype(), t.dims()[1..].to_vec());
                want.insert(stacked_row_name(&name, i), row);
            }
        } else {
            want.insert(name, (t.dtype(), t.dims().to_vec()));
        }
    }
    want
}

fn download(named: Vec<(String, Tensor)>, prefix: &str, sd: &mut StateDict) -> Result<()> {
    // One step graph for everything still pending instead of one implicit sync per tensor.
    if let Some((_, t)) = named.iter().find(|(_, t)| t.is_pending()) {
        t.device()?.mark_step()?;
    }
    for (name, t) in named {
        let name = format!("{prefix}{name}");
        let host = t.to_host()?;
        if is_stacked(&name) {
            for (i, row) in host_rows(&host)?.into_iter().enumerate() {
                sd.tensors.insert(stacked_row_name(&name, i), row);
            }
        } else {
            sd.tensors.insert(name, host);
        }
    }
    Ok(())
}

/// Uploads every target's value and only then assigns them, so a failed upload loads nothing.
/// The caller has checked that `sd` holds every name with the right shape and dtype.
fn upload<'a>(
    sd: &StateDict,
    targets: impl IntoIterator<Item = (String, &'a Tensor)>,
    source: &Path,
) -> Result<()> {
    for (target, value) in stage(sd, targets, source)? {
        target.assign(&value)?;
    }
    Ok(())
}

/// Each target with its value from `sd` uploaded to the device (nothing assigned yet).
fn stage<'a>(
    sd: &StateDict,
    targets: impl IntoIterator<Item = (String, &'a Tensor)>,
    source: &Path,
) -> Result<Vec<(&'a Tensor, Tensor)>> {
    let mut staged = Vec::new();
    for (name, target) in targets {
        // Named from the moment they are loaded (buffers too, which `parameters()` skips):
        // the first step's diagnostics and `neuron-pc analyze` use the state-dict name.
        if target.name().is_none() {
            target.set_name(&name);
        }
        let missing = |name: &str| -> crate::Error {
            CheckpointError::Mismatch {
                path: source.to_path_buf(),
                problems: vec![format!("  missing: {name}")],
            }
            .into()
        };
        let stacked;
        let host = if is_stacked(&name) {
            let rows = (0..target.dims()[0])
                .map(|i| {
                    let row = stacked_row_name(&name, i);
                    sd.tensors.get(&row).ok_or_else(|| missing(&row))
                })
                .collect::<Result<Vec<_>>>()?;
            stacked = stack_rows(&rows)?;
            &stacked
        } else {
            sd.tensors.get(&name).ok_or_else(|| missing(&name))?
        };
        // into the target's layout: a sharded parameter's blocks, never the whole on each device
        let value = match target.sharding() {
            Some(s) => target.device()?.tensor_sharded(host, s.spec())?,
            None => target.device()?.tensor(host)?,
        };
        staged.push((target, value));
    }
    Ok(staged)
}
