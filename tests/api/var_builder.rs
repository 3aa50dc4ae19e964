//! Layers built from a checkpoint by name prefix (`VarBuilder`, `vb.pp("model.layers.0")`):
//! values equal to the file's, one upload per tensor and no random initialisation, lazy reads
//! from safetensors files (sharded too), dtype conversion, errors naming the full path, and
//! PyTorch's initialisation when there is no checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use neuron_pc::nn::{Embedding, Init, LayerNorm, Linear, Module, RMSNorm, VarBuilder};
use neuron_pc::state_dict::StateDict;
use neuron_pc::{DType, DeviceConfig, HostTensor, LazyDevice, Tensor};

fn device() -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        warmup_steps: u64::MAX,
        ..DeviceConfig::default()
    })
    .expect("cpu device: run scripts/setup")
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("npc-vb-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn ramp(n: usize, offset: f32) -> Vec<f32> {
    (0..n).map(|i| offset + i as f32 * 0.25).collect()
}

/// A small checkpoint with Hugging Face Llama names (one layer) and a bfloat16 head.
fn llama_like() -> StateDict {
    let mut sd = StateDict::default();
    let mut put = |name: &str, dims: &[usize], offset: f32| {
        let n = dims.iter().product();
        let t = HostTensor::from_slice(&ramp(n, offset), dims).unwrap();
        sd.tensors.insert(name.to_string(), t);
    };
    put("model.embed_tokens.weight", &[6, 4], 0.0);
    put("model.layers.0.self_attn.q_proj.weight", &[4, 4], 1.0);
    put("model.layers.0.self_attn.o_proj.weight", &[4, 4], 2.0);
    put("model.layers.0.self_attn.o_proj.bias", &[4], 3.0);
    put("model.layers.0.input_layernorm.weight", &[4], 4.0);
    put("model.norm.weight", &[4], 5.0);
    put("model.norm.bias", &[4], 6.0);
    let head: Vec<half::bf16> = ramp(24, -3.0)
        .into_iter()
        .map(half::bf16::from_f32)
        .collect();
    sd.tensors.insert(
        "lm_head.weight".into(),
        HostTensor::from_slice(&head, &[6, 4]).unwrap(),
    );
    sd
}

struct Model {
    embed: Embedding,
    q: Linear,
    o: Linear,
    input_norm: RMSNorm,
    norm: LayerNorm,
    head: Linear,
}

fn build(vb: &VarBuilder) -> neuron_pc::Result<Model> {
    let layer = vb.pp("model.layers.0");
    Ok(Model {
        embed: Embedding::from_vb(&vb.pp("model").pp("embed_tokens"), 6, 4)?,
        q: Linear::from_vb(&layer.pp("self_attn").pp("q_proj"), 4, 4, false)?,
        o: Linear::from_vb(&layer.pp("self_attn.o_proj"), 4, 4, true)?,
        input_norm: RMSNorm::from_vb(&layer.pp("input_layernorm"), 4, Some(1e-6))?,
        norm: LayerNorm::from_vb(&vb.pp("model.norm"), 4, 1e-5)?,
        head: Linear::from_vb(&vb.pp("lm_head"), 4, 6, false)?,
    })
}

fn tensors(m: &Model) -> Vec<(&'static str, Tensor)> {
    vec![
        ("model.embed_tokens.weight", m.embed.weight.clone()),
        ("model.layers.0.self_attn.q_proj.weight", m.q.weight.clone()),
        ("model.layers.0.self_attn.o_proj.weight", m.o.weight.clone()),
        (
            "model.layers.0.self_attn.o_proj.bias",
            m.o.bias.clone().unwrap(),
        ),
        (
            "model.layers.0.input_layernorm.weight",
            m.input_norm.weight.clone(),
        ),
        ("model.norm.weight", m.norm.weight.clone()),
        ("model.norm.bias", m.norm.bias.clone()),
        ("lm_head.weight", m.head.weight.clone()),
    ]
}

/// Every layer holds exactly the file's tensor (same dtype, same bits).
fn assert_loaded(m: &Model, sd: &StateDict, what: &str) {
    for (name, t) in tensors(m) {
        let want = &sd.tensors[name];
        let got = t.to_host().unwrap();
        assert_eq!(got.dtype(), want.dtype(), "{what}: {name}");
        assert_eq!(got.dims(), want.dims(), "{what}: {name}");
        assert_eq!(got.bytes(), want.bytes(), "{what}: {name}");
    }
}

#[test]
fn layers_load_by_prefix_with_one_upload_per_tensor() {
    let dir = tmpdir("load");
    let sd = llama_like();
    let path = dir.join("model.safetensors");
    sd.save(&path).unwrap();
    let bytes: u64 = sd.tensors.values().map(|t| t.bytes().len() as u64).sum();

    for source in ["file", "state dict"] {
        let dev = device();
        let vb = match source {
            "file" => VarBuilder::from_safetensors(&dev, &[&path]).unwrap(),
            _ => VarBuilder::from_state_dict(&dev, sd.clone(), &path),
        };
        assert!(vb.pp("model.layers.0").contains("self_attn.q_proj.weight"));
        assert!(!vb.pp("model.layers.1").contains("self_attn.q_proj.weight"));
        let before = dev.metrics();
        let m = build(&vb).unwrap();
        let after = dev.metrics();
        // no random tensor uploaded and then replaced: one transfer of each tensor's bytes
        assert_eq!(
            (
                after.transfers_to_device - before.transfers_to_device,
                after.bytes_to_device - before.bytes_to_device
            ),
            (sd.tensors.len() as u64, bytes),
            "{source}"
        );
        assert_loaded(&m, &sd, source);
        assert!(vb.unused().is_empty(), "{source}: {:?}", vb.unused());
        // layers keep PyTorch's relative names for named_params
        let names: Vec<String> = m.o.parameters().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["weight", "bias"]);
    }

    // a bfloat16 tensor read into a float32 model: converted on the host (exactly)
    let dev = device();
    let vb = VarBuilder::from_safetensors(&dev, &[&path])
        .unwrap()
        .with_dtype(DType::F32);
    let head = Linear::from_vb(&vb.pp("lm_head"), 4, 6, false).unwrap();
    assert_eq!(head.weight.dtype(), DType::F32);
    let want: Vec<f32> = sd.tensors["lm_head.weight"]
        .to_f64_vec()
        .into_iter()
        .map(|v| v as f32)
        .collect();
    assert_eq!(head.weight.to_vec::<f32>().unwrap(), want);
    // what no layer asked for is listed (a strict load expects none)
    assert_eq!(vb.unused().len(), sd.tensors.len() - 1);
    assert!(!vb.unused().contains(&"lm_head.weight".to_string()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn safetensors_are_read_lazily_and_shards_act_as_one_file() {
    let dir = tmpdir("lazy");
    let sd = llama_like();
    // two shards and the index Hugging Face writes for them
    let (mut a, mut b) = (StateDict::default(), StateDict::default());
    let mut weight_map = BTreeMap::new();
    for (i, (name, t)) in sd.tensors.iter().enumerate() {
        let (shard, file) = if i % 2 == 0 {
            (&mut a, "model-00001-of-00002.safetensors")
        } else {
            (&mut b, "model-00002-of-00002.safetensors")
        };
        shard.tensors.insert(name.clone(), t.clone());
        weight_map.insert(name.clone(), serde_json::Value::from(file));
    }
    a.save(&dir.join("model-00001-of-00002.safetensors"))
        .unwrap();
    b.save(&dir.join("model-00002-of-00002.safetensors"))
        .unwrap();
    let index = dir.join("model.safetensors.index.json");
    let json = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(&index, json.to_string()).unwrap();

    let dev = device();
    let vb = VarBuilder::from_safetensors_index(&dev, &index).unwrap();
    assert_loaded(&build(&vb).unwrap(), &sd, "shards");

    // Opening reads the header only: bytes changed on disk afterwards are what a layer gets.
    let path = dir.join("one.safetensors");
    sd.save(&path).unwrap();
    let vb = VarBuilder::from_safetensors(&dev, &[&path]).unwrap();
    let mut file = std::fs::read(&path).unwrap();
    let norm = &sd.tensors["model.norm.bias"];
    let at = find(&file, norm.bytes());
    let changed = HostTensor::from_slice(&[-1.0f32, -2.0, -3.0, -4.0], &[4]).unwrap();
    file[at..at + 16].copy_from_slice(changed.bytes());
    std::fs::write(&path, &file).unwrap();
    let ln = LayerNorm::from_vb(&vb.pp("model.norm"), 4, 1e-5).unwrap();
    assert_eq!(ln.bias.to_vec::<f32>().unwrap(), [-1.0, -2.0, -3.0, -4.0]);
    assert_eq!(ln.weight.to_vec::<f32>().unwrap(), ramp(4, 5.0));
    std::fs::remove_dir_all(&dir).unwrap();
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    let hits: Vec<usize> = (0..=hay.len() - needle.len())
        .filter(|&i| &hay[i..i + needle.len()] == needle)
        .collect();
    assert_eq!(hits.len(), 1, "the bytes must be unique in the file");
    hits[0]
}

#[test]
fn missing_and_mismatched_tensors_are_errors_naming_the_path() {
    let dir = tmpdir("errors");
    let sd = llama_like();
    let path = dir.join("model.safetensors");
    sd.save(&path).unwrap();
    let dev = device();
    let vb = VarBuilder::from_safetensors(&dev, &[&path]).unwrap();
    let layer = vb.pp("model.layers.0");
    let e = Linear::from_vb(&layer.pp("self_attn.k_proj"), 4, 4, false)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("missing: model.layers.0.self_attn.k_proj.weight ([4, 4])")
            && e.contains("under \"model.layers.0.self_attn.\" it has: ")
            && e.contains("model.layers.0.self_attn.q_proj.weight")
            && e.contains("model.safetensors"),
        "{e}"
    );
    let e = Linear::from_vb(&layer.pp("self_attn.q_proj"), 5, 4, false)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains(
            "model.layers.0.self_attn.q_proj.weight: file has f32[4, 4], model expects [4, 5]"
        ),
        "{e}"
    );
    let e = vb
        .pp("model.layers.7")
        .get(&[4], "x", Init::Const(0.0))
        .unwrap_err();
    let e = e.to_string();
    assert!(
        e.contains("missing: model.layers.7.x ([4])")
            && e.contains("under \"model.layers.\" it has: model.layers.0."),
        "{e}"
    );

    // a name in two shards, a truncated file: errors when opened, not when read
    let e = VarBuilder::from_safetensors(&dev, &[&path, &path])
        .unwrap_err()
        .to_string();
    assert!(e.contains("also in another of the files"), "{e}");
    let bytes = std::fs::read(&path).unwrap();
    let cut = dir.join("cut.safetensors");
    std::fs::write(&cut, &bytes[..bytes.len() - 4]).unwrap();
    let e = VarBuilder::from_safetensors(&dev, &[&cut])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cut.safetensors") && e.contains("within the file"),
        "{e}"
    );
    std::fs::write(&cut, b"short").unwrap();
    assert!(VarBuilder::from_safetensors(&dev, &[&cut]).is_err());
    assert!(VarBuilder::from_safetensors(&dev, &[Path::new("/nonexistent/x")]).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn without_a_checkpoint_layers_take_pytorch_initialisation() {
    let dev = device();
    let draw = |seed: u64| {
        let vb = VarBuilder::random(&dev, seed);
        build(&vb).unwrap()
    };
    let (m, again, other) = (draw(3), draw(3), draw(4));
    let vals = |t: &Tensor| t.to_vec::<f32>().unwrap();
    // nn.Linear: uniform in +-1/sqrt(in); the same seed gives the same values
    let q = vals(&m.q.weight);
    assert!(q.iter().all(|v| v.abs() <= 0.5) && q.iter().any(|v| v.abs() > 0.25));
    assert_eq!(q, vals(&again.q.weight));
    assert_ne!(q, vals(&other.q.weight));
    // norms: weight 1, bias 0
    assert_eq!(vals(&m.input_norm.weight), [1.0; 4]);
    assert_eq!(vals(&m.norm.bias), [0.0; 4]);
    // nn.Embedding: standard normal (24 draws: some beyond 0.5 in size)
    let e = vals(&m.embed.weight);
    assert!(e.iter().any(|v| v.abs() > 0.5) && e.iter().all(|v| v.abs() < 6.0));
    assert_eq!(m.head.weight.dims(), &[6, 4]);
    assert!(VarBuilder::random(&dev, 0).unused().is_empty());
}

#[test]
fn a_saved_module_rebuilds_from_its_file_and_saves_back_the_same() {
    use neuron_pc::nn::{Conv2d, ConvConfig, HostRng, MultiHeadAttention};
    use neuron_pc::state;
    let dir = tmpdir("roundtrip");
    let dev = device();
    let mut rng = HostRng::new(11);
    let mut config = ConvConfig::new(4, 6, [3, 2]);
    config.groups = 2;
    let conv = Conv2d::new(&dev, &mut rng, config.clone()).unwrap();
    let mha = MultiHeadAttention::new(&dev, &mut rng, 8, 2).unwrap();
    // one file holding both, under prefixes, as a parent module's state_dict() would
    let mut sd = StateDict::default();
    for (prefix, part) in [
        ("encoder.conv", state::module_state(&conv).unwrap()),
        ("encoder.attn", state::module_state(&mha).unwrap()),
    ] {
        for (name, t) in part.tensors {
            sd.tensors.insert(format!("{prefix}.{name}"), t);
        }
    }
    let path = dir.join("encoder.safetensors");
    sd.save(&path).unwrap();

    let vb = VarBuilder::from_safetensors(&dev, &[&path])
        .unwrap()
        .pp("encoder");
    let conv2 = Conv2d::from_vb(&vb.pp("conv"), config.clone()).unwrap();
    let mha2 = MultiHeadAttention::from_vb(&vb.pp("attn"), 8, 2).unwrap();
    assert!(vb.unused().is_empty(), "{:?}", vb.unused());
    // saved back, each is the file it came from
    assert_eq!(
        state::module_state(&conv2).unwrap(),
        state::module_state(&conv).unwrap()
    );
    assert_eq!(
        state::module_state(&mha2).unwrap(),
        state::module_state(&mha).unwrap()
    );
    // and computes the same
    let x = dev
        .from_slice(&ramp(2 * 3 * 8, -1.0), &[2, 3, 8])
        .unwrap()
        .mul_scalar(0.1)
        .unwrap();
    let (a, b) = (
        mha.forward_with(&x, None, true).unwrap(),
        mha2.forward_with(&x, None, true).unwrap(),
    );
    assert_eq!(a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
    // a wrong geometry is caught by the shape check
    let mut wide = config;
    wide.kernel = [3, 3];
    let e = Conv2d::from_vb(&vb.pp("conv"), wide)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("encoder.conv.weight: file has f32[6, 2, 3, 2]"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
