//! The public API as a job in another crate uses it, written from the README's snippets: the
//! lazy device in a training loop, checkpoints (save, resume, load from a file), models of the
//! user's own as a `Module` (derived, and written by hand), a batch built by hand with
//! `DeviceBatch::new`, and `match`es on `neuron_pc::Error`. Only public items are used, so a
//! change that would break a user's job (a new field in a struct they build, a new variant of
//! an enum they match, a renamed method) breaks this file's build first. It also runs, on the
//! cpu plugin.

use std::path::{Path, PathBuf};

use neuron_pc::compile::CacheConfig;
use neuron_pc::data::{DeviceBatch, DeviceLoader, LastBatch};
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::{self, HostRng, LayerNorm, Linear, Module, RMSNorm};
use neuron_pc::optim::{AdamW, WarmupCosine};
use neuron_pc::state_dict::StateDict;
use neuron_pc::{grad, state, DType, DeviceConfig, Error, HostTensor, LazyDevice, Result, Tensor};

/// A device as a job in a test harness makes one: explicit configuration, no cache.
fn device() -> Result<LazyDevice> {
    LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        ..DeviceConfig::default()
    })
}

fn small() -> TextEncoderConfig {
    TextEncoderConfig {
        vocab: 64,
        embed: 8,
        seq_len: 6,
        mlp: vec![16],
        classes: 4,
    }
}

/// The README's loop ("The lazy device in a training loop"), with the step-indexed schedule.
fn train(
    device: &LazyDevice,
    model: &TextEncoder,
    opt: &mut AdamW,
    params: &[Tensor],
    steps: usize,
) -> Result<Vec<f64>> {
    let task = SyntheticTask::new(model.config.clone(), 3);
    let batches: Vec<Vec<HostTensor>> = (0..steps as u64).map(|i| task.batch(0, i, 8)).collect();
    let schedule = WarmupCosine {
        base_lr: 0.05,
        min_lr: 0.005,
        warmup_steps: 1,
        total_steps: steps as u64,
    };
    let mut losses = Vec::new();
    for (step, batch) in DeviceLoader::new(device, batches, 8, LastBatch::Drop, 2).enumerate() {
        let batch: DeviceBatch = batch?;
        let [ids, mask, labels] = &batch.tensors[..] else {
            return Err(Error::Config("a text batch has three tensors".into()));
        };
        let lr = device.scalar(schedule.lr(step as u64), DType::F32)?;
        let loss = model.loss(ids, mask, labels)?;
        let grads = grad(&loss, &params.iter().collect::<Vec<_>>())?;
        opt.step(params, &grads, &lr)?;
        drop(grads);
        device.mark_step()?;
        losses.push(loss.item()?);
    }
    Ok(losses)
}

/// A user's own model: hand-written `named_params` gives PyTorch's names.
struct Head {
    norm: RMSNorm,
    out: Linear,
}

impl Head {
    fn new(device: &LazyDevice, seed: u64) -> Result<Head> {
        let mut rng = HostRng::new(seed);
        Ok(Head {
            norm: RMSNorm::new(device, 4)?,
            out: Linear::new(device, &mut rng, 4, 2, true)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.out.forward(&nn::gelu(&self.norm.forward(x)?)?)
    }
}

impl Module for Head {
    fn named_params(&self, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        let join = |n: &str| {
            if prefix.is_empty() {
                n.to_string()
            } else {
                format!("{prefix}.{n}")
            }
        };
        self.norm.named_params(&join("norm"), out);
        self.out.named_params(&join("out"), out);
    }
}

/// A user's model declared once: the derive names its parameters by field path.
#[derive(Module)]
struct Mlp {
    layers: Vec<Linear>,
    #[module(rename = "ln_f")]
    norm: Option<LayerNorm>,
    #[module(skip)]
    width: usize,
}

impl Mlp {
    fn new(device: &LazyDevice, width: usize, depth: usize, seed: u64) -> Result<Mlp> {
        let mut rng = HostRng::new(seed);
        let layers = (0..depth)
            .map(|_| Linear::new(device, &mut rng, width, width, true))
            .collect::<Result<_>>()?;
        Ok(Mlp {
            layers,
            norm: Some(LayerNorm::new(device, width)?),
            width,
        })
    }
}

/// What a job reports for each kind of failure; a job's `match` needs the `_` arm
/// (`Error` is `#[non_exhaustive]`).
fn kind(e: &Error) -> &'static str {
    match e {
        Error::Op { .. } => "op",
        Error::Checkpoint(_) => "checkpoint",
        Error::Io { .. } => "io",
        Error::Json { .. } => "json",
        Error::Config(_) => "config",
        _ => "other",
    }
}

/// `?` on the standard library's and serde_json's errors in a job returning
/// `neuron_pc::Result`.
fn read_settings(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path)?;
    Ok(serde_json::from_str(&text)?)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("neuron-pc-public-api-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn a_job_trains_checkpoints_and_resumes() -> Result<()> {
    let device = device()?;
    let model = TextEncoder::new(&device, small(), 0)?;
    let names: Vec<String> = model.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names[0], "embedding.weight");
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&device, &params, 0.01)?;
    let losses = train(&device, &model, &mut opt, &params, 6)?;
    assert_eq!(losses.len(), 6);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    let metrics = device.metrics();
    assert!(metrics.steps >= 6, "{}", metrics.report());

    // A full training checkpoint, then a fresh model and optimizer resumed from it.
    let path = scratch("last.safetensors");
    state::training_state(&model, &opt, 6)?.save(&path)?;
    let resumed = TextEncoder::new(&device, small(), 1)?;
    let resumed_params: Vec<Tensor> = resumed.parameters().into_iter().map(|(_, t)| t).collect();
    let resumed_opt = AdamW::new(&device, &resumed_params, 0.01)?;
    let restored = state::load_training(&resumed, &resumed_opt, &StateDict::load(&path)?, &path)?;
    assert_eq!(restored.step, Some(6));
    assert!(restored.optimizer);
    for (a, b) in params.iter().zip(&resumed_params) {
        assert_eq!(a.to_vec::<f32>()?, b.to_vec::<f32>()?);
    }

    // Model-only weights, as PyTorch's `save_file(model.state_dict(), f)` writes them.
    let weights = scratch("model.safetensors");
    state::module_state(&model)?.save(&weights)?;
    state::load_module(&resumed, &StateDict::load(&weights)?, &weights)?;
    Ok(())
}

#[test]
fn a_custom_module_and_a_hand_built_batch() -> Result<()> {
    let device = device()?;
    let head = Head::new(&device, 7)?;
    let names: Vec<String> = head.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["norm.weight", "out.weight", "out.bias"]);

    let x = device.tensor(&HostTensor::from_slice(&[0.5f32; 12], &[3, 4])?)?;
    let labels = device.tensor(&HostTensor::from_slice(&[0i32, 1, 0], &[3])?)?;
    let batch = DeviceBatch::new(vec![x, labels], 3, 0);
    assert_eq!((batch.valid, batch.index, batch.tokens), (3, 0, None));
    let loss = nn::cross_entropy(&head.forward(&batch.tensors[0])?, &batch.tensors[1])?;
    let params: Vec<Tensor> = head.parameters().into_iter().map(|(_, t)| t).collect();
    let grads = grad(&loss, &params.iter().collect::<Vec<_>>())?;
    assert_eq!(grads.len(), params.len());
    device.mark_step()?;
    assert!(loss.item()?.is_finite());

    let path = scratch("head.safetensors");
    state::module_state(&head)?.save(&path)?;
    assert_eq!(
        StateDict::load(&path)?.tensors.keys().collect::<Vec<_>>(),
        ["norm.weight", "out.bias", "out.weight"]
    );
    Ok(())
}

#[test]
fn a_derived_model_saves_and_loads_by_name() -> Result<()> {
    let device = device()?;
    let model = Mlp::new(&device, 3, 2, 0)?;
    assert_eq!(model.width, 3);
    let names: Vec<String> = model.parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "layers.0.weight",
            "layers.0.bias",
            "layers.1.weight",
            "layers.1.bias",
            "ln_f.weight",
            "ln_f.bias",
        ]
    );
    let path = scratch("mlp.safetensors");
    state::module_state(&model)?.save(&path)?;
    let other = Mlp::new(&device, 3, 2, 1)?;
    state::load_module(&other, &StateDict::load(&path)?, &path)?;
    let (a, b) = (model.parameters(), other.parameters());
    for ((_, x), (_, y)) in a.iter().zip(&b) {
        assert_eq!(x.to_vec::<f32>()?, y.to_vec::<f32>()?);
    }
    Ok(())
}

#[test]
fn a_job_matches_on_errors() -> Result<()> {
    let device = device()?;
    let a = device.tensor(&HostTensor::from_slice(&[1f32, 2.0], &[2])?)?;
    let b = device.tensor(&HostTensor::from_slice(&[1f32, 2.0, 3.0], &[3])?)?;
    let shape = a.add(&b).unwrap_err();
    assert_eq!(kind(&shape), "op", "{shape}");
    // the user's line, not the library's
    assert!(shape.to_string().contains("public_api.rs"), "{shape}");

    let missing = scratch("missing.safetensors");
    let e = StateDict::load(&missing).map_err(Error::from).unwrap_err();
    assert_eq!(kind(&e), "checkpoint", "{e}");

    let e = read_settings(&scratch("missing.json")).unwrap_err();
    assert_eq!(kind(&e), "io", "{e}");
    let bad = scratch("bad.json");
    std::fs::write(&bad, "{").map_err(|e| Error::io_at(&bad, e))?;
    let e = read_settings(&bad).unwrap_err();
    assert_eq!(kind(&e), "json", "{e}");
    assert!(!e.to_string().contains('\n'), "{e}");

    let e = Error::Config("bad flag".into());
    assert_eq!(kind(&e), "config");
    Ok(())
}

/// A user's own optimizer implements only `named_state`: the trait's default restores it.
struct Momentum {
    buffer: Tensor,
}

impl neuron_pc::optim::OptimizerState for Momentum {
    fn named_state(&self, names: &[String]) -> Result<Vec<(String, Tensor)>> {
        Ok(vec![(
            format!("{}.momentum_buffer", names[0]),
            self.buffer.clone(),
        )])
    }
}

#[test]
fn a_users_optimizer_restores_through_the_default() -> Result<()> {
    use neuron_pc::optim::OptimizerState;
    let dev = device()?;
    let opt = Momentum {
        buffer: dev.tensor(&HostTensor::zeros(DType::F32, &[2]))?,
    };
    let value = dev.tensor(&HostTensor::from_slice(&[1.5f32, -2.0], &[2])?)?;
    let names = vec!["w".to_string()];
    opt.restore_state(&names, vec![("w.momentum_buffer".into(), value)])?;
    assert_eq!(opt.buffer.to_vec::<f32>()?, vec![1.5, -2.0]);
    let e = opt
        .restore_state(&names, Vec::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("w.momentum_buffer is missing"), "{e}");
    Ok(())
}

/// Renamed items keep their old names for one release, as deprecated aliases of the new ones
/// (`CHANGELOG.md`): a job written against them still builds and computes the same.
#[test]
#[allow(deprecated)]
fn renamed_items_answer_to_their_old_names() -> Result<()> {
    // `checkpoint` (the state-dict format) is `state_dict`
    let old: neuron_pc::checkpoint::StateDict = StateDict::default();
    assert!(old.tensors.is_empty());
    assert_eq!(
        neuron_pc::checkpoint::STACKED,
        neuron_pc::state_dict::STACKED
    );
    // `nn::checkpoint` (activation recomputation) is `nn::remat`, with the same values
    let dev = device()?;
    let x = dev.from_slice(&[0.5f32, -1.0, 2.0], &[3])?;
    let f = |xs: &[Tensor]| Ok(vec![xs[0].tanh()?.mul(&xs[0])?]);
    let old = nn::checkpoint(nn::Remat::Full, &[&x], f)?;
    let new = nn::remat(nn::Remat::Full, &[&x], f)?;
    let (old, new) = (
        grad(&old[0].sum_all()?, &[&x])?,
        grad(&new[0].sum_all()?, &[&x])?,
    );
    assert_eq!(old[0].to_vec::<f32>()?, new[0].to_vec::<f32>()?);
    // `is_extracting` is `is_trial_run`; the cache-key and compiler types kept their old names
    assert_eq!(dev.is_extracting(), dev.is_trial_run());
    let _: Option<neuron_pc::compile::Compiler> = None::<neuron_pc::compile::CachingCompiler>;
    let _: Option<neuron_pc::compile::Key> = None::<neuron_pc::compile::ProgramKey>;
    let _: Option<neuron_pc_cache::CacheKey> = None::<neuron_pc_cache::EntryKey>;
    let _: Option<neuron_pc_compiler::key::CacheKey> =
        None::<neuron_pc_compiler::key::ExecutableKey>;
    Ok(())
}
