//! FSDP and tensor parallelism through XLA's SPMD partitioner on the cpu plugin's 4 devices: a
//! tiny Llama trained on a mesh follows the one-device run, each device holds its share of the
//! parameters and optimizer state (measured from the device buffers), the partitioned program
//! splits the matmuls, and checkpoints move between meshes.

use std::sync::Arc;

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::llama::{Family, LlamaConfig, LlamaForCausalLM, LlamaSharding};
use neuron_pc::nn::{Module, VarBuilder};
use neuron_pc::optim::{average_gradients, AdamW, GradAccumulator};
use neuron_pc::tensor::Reduction;
use neuron_pc::{
    grad, DType, DeviceConfig, HostTensor, LazyDevice, Metrics, PartitionSpec, Tensor,
};

/// The parameters after 30 steps, relative to one device's (each tensor's norm). The losses
/// agree within 1e-5, but AdamW divides by the root of a running square of each gradient, so
/// sums taken in another order (any split of the work) move the parameters apart by more:
/// measured 1.4e-4 for the data-parallel replicas this project has always had, 5.5e-5 to
/// 1.4e-4 for the meshes with the default plugin, and up to 2.4e-4 (FSDP 2 x TP 2's attention
/// projections) with `xla-cpu-pjrt` 0.0.1, whose XLA splits the sums differently. A broken
/// layout is off by orders of magnitude more.
const PARAM_TOLERANCE: f64 = 3e-4;

const BATCH: usize = 4;
const SEQ: usize = 16;

fn device(mesh: &[(&str, usize)], replicas: usize) -> LazyDevice {
    let config = DeviceConfig {
        cache: CacheConfig::disabled(),
        replicas,
        ..DeviceConfig::default()
    };
    let config = if mesh.is_empty() {
        config
    } else {
        config.with_mesh(mesh)
    };
    LazyDevice::new(config).expect("cpu device: run scripts/setup")
}

/// vocabulary 128, hidden 64, intermediate 96, 2 layers, 4 heads of 16, 2 kv heads: every
/// split dimension divides by 4 except the kv projections' 32 by nothing it needs.
fn config() -> LlamaConfig {
    LlamaConfig::new(128, 64, 96, 2, 4, 2).unwrap()
}

/// Step `step`'s token ids and next-token labels, a pure function of the step.
fn batch(step: usize) -> (HostTensor, HostTensor) {
    let ids: Vec<i32> = (0..BATCH * SEQ)
        .map(|i| ((i * 7 + step * 13 + (i / SEQ) * 5) % 128) as i32)
        .collect();
    let labels: Vec<i32> = (0..BATCH * SEQ)
        .map(|i| ((i * 7 + step * 13 + (i / SEQ) * 5 + 3) % 128) as i32)
        .collect();
    (
        HostTensor::from_slice(&ids, &[BATCH, SEQ]).unwrap(),
        HostTensor::from_slice(&labels, &[BATCH, SEQ]).unwrap(),
    )
}

pub(crate) struct Run {
    pub(crate) losses: Vec<f64>,
    pub(crate) params: Vec<(String, Vec<f32>)>,
    pub(crate) metrics: Metrics,
}

/// `steps` AdamW steps on `mesh` (none: one device, or `replicas` data-parallel replicas).
fn train(mesh: &[(&str, usize)], replicas: usize, fsdp: bool, steps: usize) -> Run {
    train_as(mesh, replicas, fsdp, steps, false)
}

/// [`train`], the layers scanned when `scan` says (parameters listed per layer).
fn train_as(mesh: &[(&str, usize)], replicas: usize, fsdp: bool, steps: usize, scan: bool) -> Run {
    let mut c = config();
    c.scan_layers = scan;
    train_config(mesh, replicas, fsdp, steps, &c)
}

/// [`train`] for the model `c` describes.
pub(crate) fn train_config(
    mesh: &[(&str, usize)],
    replicas: usize,
    fsdp: bool,
    steps: usize,
    c: &LlamaConfig,
) -> Run {
    let dev = device(mesh, replicas);
    let vb = VarBuilder::random(&dev, 11).with_sharding(Arc::new(LlamaSharding { fsdp }));
    let model = LlamaForCausalLM::from_vb(&vb, c).unwrap();
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&dev, &params, 0.1).unwrap();
    let lr = dev.scalar(3e-3, DType::F32).unwrap();
    let mut losses = Vec::new();
    for step in 0..steps {
        let (ids, labels) = batch(step);
        let (ids, labels) = (dev.shard(&ids).unwrap(), dev.shard(&labels).unwrap());
        let loss = model.loss(&ids, None, &labels).unwrap();
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = grad(&loss, &refs).unwrap();
        let (grads, loss) = if replicas > 1 {
            let mean = loss.all_reduce(Reduction::Mean).unwrap();
            (average_gradients(&grads).unwrap(), mean)
        } else {
            (grads, loss)
        };
        opt.step(&params, &grads, &lr).unwrap();
        drop(grads);
        dev.mark_step().unwrap();
        losses.push(loss.item().unwrap());
    }
    let mut params = Vec::new();
    for (n, t) in model.parameters() {
        let v = t.to_vec::<f32>().unwrap();
        if neuron_pc::state_dict::is_stacked(&n) {
            for (i, row) in v.chunks(v.len() / t.dims()[0]).enumerate() {
                params.push((neuron_pc::state_dict::stacked_row_name(&n, i), row.to_vec()));
            }
        } else {
            params.push((n, v));
        }
    }
    params.sort_by(|a, b| a.0.cmp(&b.0));
    Run {
        losses,
        params,
        metrics: dev.metrics(),
    }
}

pub(crate) fn assert_follows(name: &str, got: &Run, want: &Run) {
    for (step, (g, w)) in got.losses.iter().zip(&want.losses).enumerate() {
        assert!(
            ((g - w) / w).abs() <= 1e-5,
            "{name}: step {} loss {g} vs one device's {w}",
            step + 1
        );
    }
    // each tensor as a whole (its norm), within PARAM_TOLERANCE
    let mut failed: Vec<String> = Vec::new();
    for ((n, g), (_, w)) in got.params.iter().zip(&want.params) {
        let diff: f64 = g.iter().zip(w).map(|(a, b)| f64::from(a - b).powi(2)).sum();
        let norm: f64 = w.iter().map(|b| f64::from(*b).powi(2)).sum();
        let rel = (diff / norm).sqrt();
        let worst = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        eprintln!("{name}: {n}: relative {rel:e}, largest difference {worst:e}");
        if rel > PARAM_TOLERANCE {
            failed.push(format!("{n} differs by {rel:e} (relative, whole tensor)"));
        }
    }
    assert!(failed.is_empty(), "{name}: {failed:#?}");
}

#[test]
fn a_tiny_llama_trains_the_same_on_one_device_fsdp_tp_and_both() {
    const STEPS: usize = 30;
    let one = train(&[], 1, false, STEPS);
    let replicas = train(&[], 4, false, STEPS);
    assert_follows("4 data-parallel replicas", &replicas, &one);
    assert!(
        one.losses[STEPS - 1] < one.losses[0] - 0.5,
        "it learns: {:?}",
        one.losses
    );
    let fsdp = train(&[("data", 4)], 1, true, STEPS);
    assert_follows("FSDP 4", &fsdp, &one);
    let tp = train(&[("model", 4)], 1, false, STEPS);
    assert_follows("TP 4", &tp, &one);
    let both = train(&[("data", 2), ("model", 2)], 1, true, STEPS);
    assert_follows("FSDP 2 x TP 2", &both, &one);
    for run in [&fsdp, &tp, &both] {
        assert_eq!(run.metrics.partitions, 4);
        assert_eq!(run.metrics.compiles, one.metrics.compiles);
    }

    // what each device holds, measured from the device buffers
    let held = |m: &Metrics| (m.parameter_bytes + m.optimizer_state_bytes) as f64;
    let whole = held(&one.metrics);
    assert_eq!(held(&replicas.metrics), whole, "replicas hold everything");
    let ratio = held(&fsdp.metrics) / whole;
    eprintln!("FSDP 4 holds {ratio:.3} of one device's parameters and optimizer state");
    assert!(ratio <= 0.27, "FSDP 4 holds {ratio}");
    // TP splits every weight but the norms, which stay whole on each device
    let c = config();
    let norms = (2 * c.num_hidden_layers + 1) * c.hidden_size * 4 * 3;
    let split = whole - norms as f64;
    let ratio = (held(&tp.metrics) - norms as f64) / split;
    eprintln!("TP 4 holds {ratio:.3} of the split layers' parameters and optimizer state");
    assert!(ratio <= 0.3, "TP 4 holds {ratio} of the split layers");
    let ratio = held(&both.metrics) / whole;
    eprintln!("FSDP 2 x TP 2 holds {ratio:.3}");
    assert!(ratio <= 0.27, "FSDP 2 x TP 2 holds {ratio}");
}

/// Scanned layers on a mesh: the stacked parameters split as the plan splits each layer's (the
/// stacking dimension whole), trained as on one device unrolled, holding a quarter as much.
#[test]
fn scanned_layers_train_the_same_with_fsdp_and_tp() {
    const STEPS: usize = 8;
    let one = train(&[], 1, false, STEPS);
    let both = train_as(&[("data", 2), ("model", 2)], 1, true, STEPS, true);
    assert_follows("scanned, FSDP 2 x TP 2", &both, &one);
    let held = |m: &Metrics| (m.parameter_bytes + m.optimizer_state_bytes) as f64;
    let ratio = held(&both.metrics) / held(&one.metrics);
    eprintln!("scanned, FSDP 2 x TP 2 holds {ratio:.3}");
    assert!(ratio <= 0.27, "scanned, FSDP 2 x TP 2 holds {ratio}");
}

/// True when `e` names this file at a line in `line..line + 4` (the call, however formatted).
/// The families' switches on a mesh: Qwen2's q/k/v biases (split with their outputs over
/// `model`) and a windowed layer, Qwen3's per-head q/k norms (whole) with biases on q/k/v/o.
#[test]
fn qwen_biases_norms_and_windows_train_the_same_with_fsdp_and_tp() {
    const STEPS: usize = 8;
    let mut qwen2 = config().with_family(Family::Qwen2);
    (qwen2.sliding_window, qwen2.sliding_layers) = (Some(5), vec![false, true]);
    let mut qwen3 = config().with_family(Family::Qwen3);
    qwen3.attention_bias = true;
    for (name, c) in [("qwen2", qwen2), ("qwen3", qwen3)] {
        let one = train_config(&[], 1, false, STEPS, &c);
        let both = train_config(&[("data", 2), ("model", 2)], 1, true, STEPS, &c);
        assert_follows(&format!("{name}, FSDP 2 x TP 2"), &both, &one);
        assert!(
            one.losses[STEPS - 1] < one.losses[0],
            "{name}: {:?}",
            one.losses
        );
    }
}

fn names_line(e: &str, line: u32) -> bool {
    let Some((_, rest)) = e.split_once("sharded_training.rs:") else {
        return false;
    };
    let n: u32 = rest.split(':').next().unwrap().parse().unwrap();
    (line..line + 4).contains(&n)
}

#[test]
fn bad_meshes_and_specs_are_one_line_naming_the_dimension_sizes_and_line() {
    let dev = device(&[("data", 2), ("model", 2)], 1);
    let host = HostTensor::from_slice(&[0f32; 24], &[6, 4]).unwrap();
    let line = line!() + 1;
    let e = dev
        .tensor_sharded(&host, &PartitionSpec::new(&[&["data"], &["fsdp"]]))
        .unwrap_err()
        .to_string();
    assert!(
        names_line(&e, line)
            && e.contains(
                "dimension 1 of shape [6, 4]: no mesh axis \"fsdp\" in the mesh (data 2, model 2)"
            ),
        "{e}"
    );
    let line = line!() + 1;
    let e = dev
        .tensor_sharded(&host, &PartitionSpec::new(&[&["data", "model"]]))
        .unwrap_err()
        .to_string();
    assert!(
        names_line(&e, line)
            && e.contains(
                "dimension 0 of shape [6, 4] has size 6, which data x model (4 devices) does \
                 not divide"
            ),
        "{e}"
    );
    // a spec that splits: each device holds its block; a read gathers the whole
    let values: Vec<f32> = (0..24).map(|i| i as f32).collect();
    let t = dev
        .tensor_sharded(
            &HostTensor::from_slice(&values, &[6, 4]).unwrap(),
            &PartitionSpec::new(&[&[], &["model"]]),
        )
        .unwrap();
    assert_eq!(t.sharding().unwrap().shard_dims(), [6, 2]);
    assert_eq!(t.to_vec::<f32>().unwrap(), values);
    assert_eq!(dev.metrics().bytes_to_device, 4 * 6 * 2 * 4, "blocks only");
    assert_eq!(
        format!("{dev:?}"),
        "LazyDevice(cpu devices 0..4, mesh (data 2, model 2))"
    );
    // and the mesh itself
    let config = |mesh: &[(&str, usize)], replicas| {
        DeviceConfig {
            cache: CacheConfig::disabled(),
            replicas,
            ..DeviceConfig::default()
        }
        .with_mesh(mesh)
    };
    let e = LazyDevice::new(config(&[("data", 2), ("data", 2)], 1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("mesh axis \"data\" is named twice"), "{e}");
    let e = LazyDevice::new(config(&[("data", 2)], 2))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a device mesh replaces replicas (2 asked for)"),
        "{e}"
    );
    let e = device(&[], 1)
        .tensor_sharded(&host, &PartitionSpec::new(&[&["data"]]))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a partition spec P('data',) for a device without a mesh"),
        "{e}"
    );
    // a plan that does not fit the model names the parameter
    let plan =
        |_: &str, _: &[usize], _: &neuron_pc::Mesh| PartitionSpec::new(&[&["data", "model"]]);
    let vb = VarBuilder::random(&dev, 1).with_sharding(Arc::new(plan));
    let Err(e) = LlamaForCausalLM::from_vb(&vb, &LlamaConfig::new(130, 64, 96, 1, 4, 2).unwrap())
    else {
        panic!("a vocabulary of 130 split 4 ways");
    };
    let e = e.to_string();
    assert!(
        e.contains(
            "parameter model.embed_tokens.weight: sharding: dimension 0 of shape [130, 64] has \
             size 130"
        ),
        "{e}"
    );
}

#[test]
fn kept_gradients_are_split_as_their_parameters() {
    let held = |mesh: &[(&str, usize)]| {
        let dev = device(mesh, 1);
        let vb = VarBuilder::random(&dev, 5).with_sharding(Arc::new(LlamaSharding { fsdp: true }));
        let model = LlamaForCausalLM::from_vb(&vb, &config()).unwrap();
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        let _sums = GradAccumulator::new(&dev, &params, 2).unwrap();
        dev.metrics().gradient_bytes
    };
    let (one, fsdp) = (held(&[]), held(&[("data", 4)]));
    assert_eq!(one, 4 * config().num_parameters() as u64);
    assert_eq!(4 * fsdp, one);
}

#[test]
fn index_checks_on_a_mesh_count_each_label_once() {
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        check_indices: true,
        ..DeviceConfig::default().with_mesh(&[("data", 4)])
    })
    .unwrap();
    // 8 rows of logits and labels split over `data`, one label out of range
    let logits = dev
        .shard(&HostTensor::from_slice(&[0.5f32; 40], &[8, 5]).unwrap())
        .unwrap();
    let labels = dev
        .shard(&HostTensor::from_slice(&[1i32, 7, 0, 4, 2, 3, 1, 0], &[8]).unwrap())
        .unwrap();
    let loss = neuron_pc::nn::cross_entropy(&logits, &labels).unwrap();
    dev.mark_step().unwrap();
    let e = loss.item().unwrap_err().to_string();
    assert!(e.contains("1 of 8 labels outside [0, 5)"), "{e}");
}

#[test]
fn the_llama_plan_is_the_megatron_layout_with_fsdp_on_the_other_dimension() {
    use neuron_pc::sharding::ShardingPlan;
    let mesh = neuron_pc::Mesh::new(&[("data", 2), ("model", 2)], &[0, 1, 2, 3]).unwrap();
    let spec = |fsdp: bool, name: &str, dims: &[usize]| {
        LlamaSharding { fsdp }.spec(name, dims, &mesh).to_string()
    };
    let l = "model.layers.3";
    for proj in [
        "self_attn.q_proj",
        "self_attn.k_proj",
        "self_attn.v_proj",
        "mlp.gate_proj",
    ] {
        let name = format!("{l}.{proj}.weight");
        assert_eq!(spec(false, &name, &[64, 32]), "P('model',)", "{name}");
        assert_eq!(spec(true, &name, &[64, 32]), "P('model', 'data')", "{name}");
    }
    for proj in ["self_attn.o_proj", "mlp.down_proj"] {
        let name = format!("{l}.{proj}.weight");
        assert_eq!(spec(false, &name, &[32, 64]), "P(None, 'model')", "{name}");
        assert_eq!(spec(true, &name, &[32, 64]), "P('data', 'model')", "{name}");
    }
    for name in ["model.embed_tokens.weight", "lm_head.weight"] {
        assert_eq!(spec(true, name, &[128, 32]), "P('model', 'data')", "{name}");
    }
    // a bias is split as its weight's outputs; Qwen3's per-head norms only by FSDP
    let bias = format!("{l}.self_attn.q_proj.bias");
    assert_eq!(spec(true, &bias, &[64]), "P('model',)");
    let bias = format!("{l}.self_attn.o_proj.bias");
    assert_eq!(spec(true, &bias, &[32]), "P('data',)");
    assert_eq!(
        spec(false, &format!("{l}.self_attn.q_norm.weight"), &[16]),
        "P()"
    );
    let norm = format!("{l}.input_layernorm.weight");
    assert_eq!(spec(false, &norm, &[32]), "P()");
    assert_eq!(spec(true, &norm, &[32]), "P('data',)");
    // a dimension an axis does not divide stays whole
    assert_eq!(
        spec(true, &format!("{l}.self_attn.k_proj.weight"), &[3, 32]),
        "P(None, 'data')"
    );
}
