//! The Rust blocks of the README and the guide (`docs/guide/`), each run here in the context a
//! job gives it: `tests/api/readme_example.rs` checks that every block is a run of lines of a file
//! CI compiles (this one, or an example), so a block that stops compiling fails CI. Between
//! each `// guide:` marker and `// guide: end` the lines are the docs' own (rustfmt leaves them
//! as written, aligned comments included); the rest is the setup a job would have.

use std::path::Path;
use std::sync::Arc;

use neuron_pc::data::{DeviceLoader, LastBatch};
use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM, LlamaSharding};
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::{self, Module, ScanOptions, VarBuilder};
use neuron_pc::optim::{self, AdamW, AdamWConfig, WarmupCosine};
use neuron_pc::sharding::{split_if_divisible, DATA_AXIS, MODEL_AXIS};
use neuron_pc::tensor::Reduction;
use neuron_pc::{grad, DType, DeviceConfig, HostTensor, LazyDevice, PartitionSpec};
use neuron_pc::{Mesh, Result, Tensor};

fn scratch(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("npc-guide-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
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

/// `n` batches of `rows` from the synthetic task of `config`.
fn host_batches(config: TextEncoderConfig, n: u64, rows: usize) -> Vec<Vec<HostTensor>> {
    let task = SyntheticTask::new(config, 3);
    (0..n).map(|i| task.batch(0, i, rows)).collect()
}

fn llama_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/llama-tiny")
}

/// A device with `n` replicas.
fn devices(n: usize) -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        replicas: n,
        ..DeviceConfig::default()
    })
    .unwrap()
}

#[test]
#[rustfmt::skip]
fn the_lazy_device_in_a_training_loop() -> Result<()> {
    let (seed, batches) = (0, host_batches(TextEncoderConfig::default(), 3, 64));
    let schedule = WarmupCosine { base_lr: 0.05, min_lr: 0.005, warmup_steps: 1, total_steps: 3 };
    // guide: the lazy device in a training loop
    let device = LazyDevice::from_env()?;               // NEURON_CC_FLAGS, NEURON_COMPILE_CACHE_URL
    let model = TextEncoder::new(&device, TextEncoderConfig::default(), seed)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let config = AdamWConfig { weight_decay: 0.01, ..Default::default() }; // PyTorch's keywords
    let mut opt = AdamW::with_config(&device, &params, config)?;
    for (step, batch) in DeviceLoader::new(&device, batches, 64, LastBatch::Drop, 2).enumerate() {
        let [ids, mask, labels] = &batch?.tensors[..] else { unreachable!() };
        let lr = device.scalar(schedule.lr(step as u64), DType::F32)?; // an input, not a constant
        let loss = model.loss(ids, mask, labels)?;
        let grads = grad(&loss, &params.iter().collect::<Vec<_>>())?;
        opt.step(&params, &grads, &lr)?;
        drop(grads);                                       // held at mark_step, it is an output
        device.mark_step()?;                               // forward+backward+AdamW: one graph
    }
    // guide: end
    assert_eq!(device.metrics().graphs_seen, 1);
    Ok(())
}

#[test]
#[rustfmt::skip]
fn steps_without_tracing() -> Result<()> {
    let device = devices(1);
    let model = TextEncoder::new(&device, small(), 0)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&device, &params, 0.01)?;
    let batches = DeviceLoader::new(&device, host_batches(small(), 3, 8), 8, LastBatch::Drop, 2);
    // guide: steps without tracing
    let lr = device.scalar(1e-3, DType::F32)?;
    let mut step = device.step_fn(|a: &[Tensor]| {
        let loss = model.loss(&a[0], &a[1], &a[2])?;
        let grads = grad(&loss, &params.iter().collect::<Vec<_>>())?;
        opt.step(&params, &grads, &a[3])?;
        Ok(vec![loss])                                    // results: new tensors on every call
    });
    let mut losses = Vec::new();
    for batch in batches {
        let [ids, mask, labels] = &batch?.tensors[..] else { unreachable!() };
        let loss = step.call(&[ids.clone(), mask.clone(), labels.clone(), lr.clone()])?.remove(0);
        losses.push(loss);                                // read after the loop: no sync per step
    }
    // guide: end
    drop(step);
    let losses: Vec<f64> = losses.iter().map(|l| l.item()).collect::<Result<_>>()?;
    assert_eq!(losses.len(), 3);
    assert!(losses.iter().all(|l| l.is_finite()));
    Ok(())
}

#[test]
#[rustfmt::skip]
fn checkpoints_move_to_and_from_pytorch() -> Result<()> {
    let dir = scratch("state");
    let device = devices(1);
    let model = TextEncoder::new(&device, small(), 0)?;
    let torch = TextEncoder::new(&device, small(), 1)?;
    neuron_pc::state::module_state(&torch)?.save(&dir.join("from_torch.safetensors"))?;
    // guide: checkpoints
    use neuron_pc::{state, state_dict::StateDict};
    // read in PyTorch with model.load_state_dict(load_file(path))
    state::module_state(&model)?.save(&dir.join("model.safetensors"))?;
    // written in PyTorch with save_file(model.state_dict(), path)
    let path = dir.join("from_torch.safetensors");
    // strict: every mismatch listed, nothing loaded
    state::load_module(&model, &StateDict::load(&path)?, &path)?;
    // guide: end
    let loaded = neuron_pc::state::module_state(&model)?;
    let theirs = neuron_pc::state::module_state(&torch)?;
    assert_eq!(loaded.tensors, theirs.tensors, "the file's values are the model's");
    std::fs::remove_dir_all(dir).unwrap();
    Ok(())
}

#[test]
#[rustfmt::skip]
fn data_parallel_training() -> Result<()> {
    let batches = host_batches(small(), 2, 64);
    // guide: data-parallel
    let mut config = DeviceConfig::from_env()?;          // NEURON_PC_DEVICES (CPU_NUM_DEVICES)
    config.replicas = 4;
    let device = LazyDevice::new(config)?;
    // guide: end
    let model = TextEncoder::new(&device, small(), 0)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let param_refs: Vec<&Tensor> = params.iter().collect();
    let mut opt = AdamW::new(&device, &params, 0.01)?;
    let lr = device.scalar(1e-2, DType::F32)?;
    // guide: data-parallel loop
    let loader = DeviceLoader::new(&device, batches, 64, LastBatch::Drop, 2); // the global batch
    for batch in loader {
        let b = batch?;                                  // each replica holds its 16 rows
        let loss = model.loss(&b.tensors[0], &b.tensors[1], &b.tensors[2])?;  // per replica
        let mut grads = optim::average_gradients(&grad(&loss, &param_refs)?)?; // DDP's all-reduce
        optim::clip_grad_norm(&mut grads, 1.0)?;         // the global norm: grads are averaged
        opt.step(&params, &grads, &lr)?;                 // one step graph, as on one device
        let global_loss = loss.all_reduce(Reduction::Mean)?;  // replicated, in the step graph
        device.mark_step()?;
        println!("loss {}", global_loss.item()?);        // reads a computed value: no sync
    }
    // guide: end
    assert_eq!(device.replicas(), 4);
    assert_eq!(device.metrics().implicit_syncs, 0, "the loss is read, not run apart");
    assert_eq!(device.metrics().graphs_seen, 1, "the all-reduce of the loss is in the step");
    Ok(())
}

#[test]
#[rustfmt::skip]
fn zero1_splits_the_moments() -> Result<()> {
    let device = devices(2);
    let model = TextEncoder::new(&device, small(), 0)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let param_refs: Vec<&Tensor> = params.iter().collect();
    let lr = device.scalar(1e-2, DType::F32)?;
    let [ids, mask, labels] = &host_batches(small(), 1, 8)[0][..] else { unreachable!() };
    let (ids, mask, labels) = (device.shard(ids)?, device.shard(mask)?, device.shard(labels)?);
    let loss = model.loss(&ids, &mask, &labels)?;
    // guide: zero-1
    let mut opt = AdamW::zero1(&device, &params, 0.01)?;   // moments: 1/N per replica
    let grads = grad(&loss, &param_refs)?;                 // each replica's own gradients
    opt.step(&params, &grads, &lr)?;                       // reduce-scatter, update, all-gather
    // guide: end
    device.mark_step()?;
    assert!(loss.all_reduce(Reduction::Mean)?.item()?.is_finite());
    Ok(())
}

#[test]
#[rustfmt::skip]
fn fsdp_and_tensor_parallel_on_a_mesh() -> Result<()> {
    let llama_config = LlamaConfig::from_file(&llama_dir().join("config.json"))?;
    let tokens: Vec<i32> = (0..32).map(|i| i % 50).collect();
    let host_ids = HostTensor::from_slice(&tokens, &[2, 16])?;
    // guide: mesh
    let config = DeviceConfig::from_env()?.with_mesh(&[("data", 2), ("model", 2)]);
    let device = LazyDevice::new(config)?;
    // every parameter read straight into its blocks: the Megatron layout over `model`
    // (q/k/v, gate/up by output features; o, down by input features; embeddings by vocabulary),
    // FSDP over `data`
    let vb = VarBuilder::random(&device, 0).with_sharding(Arc::new(LlamaSharding { fsdp: true }));
    let model = LlamaForCausalLM::from_vb(&vb, &llama_config)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&device, &params, 0.1)?;    // moments split as their parameters
    let ids = device.shard(&host_ids)?;                  // the batch split over `data`
    let h = model.model.embed_tokens.forward(&ids)?;
    let x = h.constrain(&PartitionSpec::new(&[&["data"], &[], &[]]))?; // an activation's layout
    // guide: end
    let loss = model.loss(&ids, None, &ids)?.add(&x.sum_all()?.mul_scalar(0.0)?)?;
    let grads = grad(&loss, &params.iter().collect::<Vec<_>>())?;
    opt.step(&params, &grads, &device.scalar(1e-3, DType::F32)?)?;
    device.mark_step()?;
    assert!(loss.item()?.is_finite());
    Ok(())
}

#[test]
#[rustfmt::skip]
fn memory_levers() -> Result<()> {
    let device = devices(1);
    let mut model = LlamaForCausalLM::from_pretrained(&device, &llama_dir())?;
    let host = HostTensor::from_slice(&(0..32).map(|i| i % 50).collect::<Vec<i32>>(), &[2, 16])?;
    let (ids, labels) = (device.tensor(&host)?, device.tensor(&host)?);
    let mlp = nn::Linear::new(&device, &mut nn::HostRng::new(0), 8, 8, true)?;
    let x = device.tensor(&HostTensor::from_slice(&[0.5f32; 16], &[2, 8])?)?;
    // guide: memory
    use neuron_pc::nn::{remat, Remat};
    model.set_remat(Remat::Full);        // or per layer: model.model.layers[i].remat = Remat::Dots
    model.loss_chunk = Some(512);        // LlamaForCausalLM::loss computes the head in chunks
    let loss = device.autocast(Some(DType::BF16), || model.loss(&ids, None, &labels))?;
    // any block of your own: its activations recomputed in the backward pass
    let y = remat(Remat::Full, &[&x], |xs| Ok(vec![mlp.forward(&xs[0])?]))?;
    // guide: end
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let grads = grad(&loss.add(&y[0].sum_all()?)?, &params.iter().collect::<Vec<_>>())?;
    device.mark_step()?;
    assert_eq!(grads.len(), params.len());
    assert!(loss.item()?.is_finite());
    Ok(())
}

#[test]
#[rustfmt::skip]
fn scanned_layers() -> Result<()> {
    let device = devices(1);
    let dir = llama_dir();
    let dir = dir.as_path();
    let mut rng = nn::HostRng::new(0);
    let h = device.tensor(&HostTensor::from_slice(&[0.1f32; 8], &[2, 4])?)?;
    let w: Vec<f32> = (0..12 * 16).map(|_| rng.normal() as f32 * 0.3).collect();
    let weights = device.tensor(&HostTensor::from_slice(&w, &[12, 4, 4])?)?;
    // guide: scanned layers
    use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM, LoadOptions};
    let mut config = LlamaConfig::from_file(&dir.join("config.json"))?;
    config.scan_layers = true;                     // LlamaForCausalLM::from_vb(&vb, &config)
    let options = LoadOptions { scan_layers: true, ..LoadOptions::default() };
    let model = LlamaForCausalLM::from_pretrained_with(&device, dir, &options)?;
    // any loop of your own: h through 12 stacked weights [12, d, d], one loop in the graph
    let (h, _) = nn::scan(&[&h], &[&weights], ScanOptions::default(), |h, w| {
        Ok((vec![h[0].matmul(&w[0])?.tanh()?], vec![]))
    })?;
    // guide: end
    assert!(config.scan_layers && model.config.scan_layers);
    assert_eq!(h[0].dims(), &[2, 4]);
    assert!(h[0].to_vec::<f32>()?.iter().all(|v| v.is_finite()));
    Ok(())
}

// guide: own model on a mesh
/// One block of your own model: an MLP with a residual connection.
#[derive(nn::Module)]
struct Block {
    up: nn::Linear,
    down: nn::Linear,
}

impl Block {
    fn from_vb(vb: &VarBuilder) -> Result<Block> {
        let up = nn::Linear::from_vb(&vb.pp("up"), 64, 256, true)?;
        let down = nn::Linear::from_vb(&vb.pp("down"), 256, 64, true)?;
        Ok(Block { up, down })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.add(&self.down.forward(&nn::gelu(&self.up.forward(x)?)?)?)
    }
}

/// Megatron's pair over `model` (`up` by output features, `down` by input features) and FSDP
/// over `data` (the other dimension). `dims` are a stack's: `[layers, outputs, inputs]`.
fn plan(name: &str, dims: &[usize], mesh: &Mesh) -> PartitionSpec {
    // a weight's last two dimensions (a bias has one: left whole below)
    let (outputs, inputs) = (dims.len().saturating_sub(2), dims.len().saturating_sub(1));
    if name.ends_with("up.weight") {
        split_if_divisible(dims, &[(outputs, MODEL_AXIS), (inputs, DATA_AXIS)], mesh)
    } else if name.ends_with("down.weight") {
        split_if_divisible(dims, &[(inputs, MODEL_AXIS), (outputs, DATA_AXIS)], mesh)
    } else {
        PartitionSpec::replicated()
    }
}

/// Four blocks, stacked (`blocks.*.up.weight`: `[4, 256, 64]`) and run as one loop. The field's
/// name is the stack's prefix: state dicts and checkpoints name its layers `blocks.0.up.weight`,
/// ..., as an unrolled `Vec<Block>` field named `blocks` would, read back by `vb.pp("blocks")`.
#[derive(nn::Module)]
struct Model {
    blocks: nn::ScannedLayers<Block>,
}

fn model(device: &LazyDevice, sharded: bool) -> Result<Model> {
    let mut vb = VarBuilder::random(device, 0);
    if sharded {
        vb = vb.with_sharding(Arc::new(plan));
    }
    let blocks = nn::ScannedLayers::from_vb(&vb.pp("blocks"), 4, Arc::new(Block::from_vb))?;
    Ok(Model { blocks })
}
// guide: end

/// Three AdamW steps of [`model`] on `device` (sharded over its mesh, or not): the losses,
/// and the bytes of the parameters one device holds.
fn train_blocks(device: &LazyDevice, sharded: bool) -> Result<(Vec<f64>, u64)> {
    let model = model(device, sharded)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::with_config(device, &params, AdamWConfig::default())?;
    let host: Vec<f32> = (0..8 * 64).map(|i| ((i % 17) as f32 - 8.0) / 8.0).collect();
    let x = device.tensor(&HostTensor::from_slice(&host, &[8, 64])?)?;
    let mut losses = Vec::new();
    for _ in 0..3 {
        let y = (model.blocks).forward(&[&x], |block, c| Ok(vec![block.forward(&c[0])?]))?;
        let loss = y[0].mul(&y[0])?.mean_all()?;
        let grads = grad(&loss, &params.iter().collect::<Vec<_>>())?;
        opt.step(&params, &grads, &device.scalar(1e-3, DType::F32)?)?;
        device.mark_step()?;
        losses.push(loss.item()?);
    }
    Ok((losses, device.metrics().parameter_bytes))
}

#[test]
fn a_model_of_ones_own_sharded_over_fsdp_2_x_tp_2_and_scanned() -> Result<()> {
    let mesh = LazyDevice::new(DeviceConfig::from_env()?.with_mesh(&[("data", 2), ("model", 2)]))?;
    let (sharded, bytes) = train_blocks(&mesh, true)?;
    let (one, whole) = train_blocks(&devices(1), false)?;
    for (a, b) in sharded.iter().zip(&one) {
        assert!((a - b).abs() <= 1e-5 * b.abs(), "{sharded:?} vs {one:?}");
    }
    // f32 weights [4, 256, 64] and [4, 64, 256], split 4 ways; biases [4, 256] and [4, 64] whole
    let (weights, biases) = (2 * 4 * 256 * 64 * 4, (4 * 256 + 4 * 64) * 4);
    assert_eq!(whole, weights + biases);
    assert_eq!(bytes, weights / 4 + biases);
    // a state dict (and a checkpoint) names the stack's layers as the unrolled blocks'
    let sd = neuron_pc::state::module_state(&model(&devices(1), false)?)?;
    let names: Vec<&String> = sd.tensors.keys().collect();
    assert!(
        names.contains(&&"blocks.3.down.weight".to_string()),
        "{names:?}"
    );
    assert_eq!(sd.tensors["blocks.0.up.weight"].dims(), &[256, 64]);
    Ok(())
}
