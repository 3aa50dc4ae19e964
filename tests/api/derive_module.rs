//! `#[derive(Module)]` names parameters by their field paths, as PyTorch's `named_parameters()`
//! does: lists as `layers.0`, `Option`s when present, renamed and skipped fields, buffers apart,
//! and the layers and `TextEncoder` ported to it keep their names (the checkpoint tests compare
//! those with PyTorch's fixtures).

use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM};
use neuron_pc::models::{TextEncoder, TextEncoderConfig};
use neuron_pc::nn::{
    BatchNorm, Conv2d, ConvConfig, Embedding, GroupNorm, HostRng, LayerNorm, Linear, Module,
    MultiHeadAttention, RMSNorm,
};
use neuron_pc::{HostTensor, LazyDevice, Result, Tensor};

use crate::common::device;

fn names(m: &impl Module) -> Vec<String> {
    m.parameters().into_iter().map(|(n, _)| n).collect()
}

fn buffer_names(m: &impl Module) -> Vec<String> {
    let mut out = Vec::new();
    m.named_buffers("", &mut out);
    out.into_iter().map(|(n, _)| n).collect()
}

#[derive(Module)]
struct Block {
    #[module(rename = "self_attn")]
    attention: Linear,
    norm: Option<RMSNorm>,
    #[module(skip)]
    width: usize,
}

#[derive(Module)]
struct Model {
    embed_tokens: Embedding,
    layers: Vec<Block>,
    head: Option<Linear>,
    scale: Tensor,
    #[module(buffer)]
    positions: Tensor,
    bn: BatchNorm,
    grid: Vec<Vec<Tensor>>,
}

/// A tuple struct: fields are named by position, as `nn.Sequential` names its children.
#[derive(Module)]
struct Pair(Linear, Linear);

fn block(dev: &LazyDevice, rng: &mut HostRng, norm: bool) -> Result<Block> {
    Ok(Block {
        attention: Linear::new(dev, rng, 2, 2, false)?,
        norm: if norm {
            Some(RMSNorm::new(dev, 2)?)
        } else {
            None
        },
        width: 2,
    })
}

#[test]
fn fields_name_parameters_by_path() -> Result<()> {
    let dev = device();
    let mut rng = HostRng::new(0);
    let t = |v: f32| dev.tensor(&HostTensor::from_slice(&[v], &[1]).unwrap());
    let model = Model {
        embed_tokens: Embedding::new(&dev, &mut rng, 4, 2)?,
        layers: vec![block(&dev, &mut rng, true)?, block(&dev, &mut rng, false)?],
        head: None,
        scale: t(1.0)?,
        positions: t(0.0)?,
        bn: BatchNorm::new(&dev, 2)?,
        grid: vec![vec![], vec![t(2.0)?, t(3.0)?]],
    };
    assert_eq!(model.layers[0].width, 2);
    assert_eq!(
        names(&model),
        [
            "embed_tokens.weight",
            "layers.0.self_attn.weight",
            "layers.0.norm.weight",
            "layers.1.self_attn.weight",
            "scale",
            "bn.weight",
            "bn.bias",
            "grid.1.0",
            "grid.1.1",
        ]
    );
    // buffers: the marked field, then the submodules' own (BatchNorm's running statistics)
    assert_eq!(
        buffer_names(&model),
        [
            "positions",
            "bn.running_mean",
            "bn.running_var",
            "bn.num_batches_tracked"
        ]
    );
    let mut under = Vec::new();
    model.named_params("model", &mut under);
    assert_eq!(under[1].0, "model.layers.0.self_attn.weight");

    let pair = Pair(
        Linear::new(&dev, &mut rng, 2, 2, true)?,
        Linear::new(&dev, &mut rng, 2, 2, false)?,
    );
    assert_eq!(names(&pair), ["0.weight", "0.bias", "1.weight"]);
    Ok(())
}

#[test]
fn ported_layers_keep_their_names() -> Result<()> {
    let dev = device();
    let mut rng = HostRng::new(1);
    assert_eq!(
        names(&Linear::new(&dev, &mut rng, 3, 2, true)?),
        ["weight", "bias"]
    );
    assert_eq!(
        names(&Linear::new(&dev, &mut rng, 3, 2, false)?),
        ["weight"]
    );
    assert_eq!(names(&Embedding::new(&dev, &mut rng, 5, 2)?), ["weight"]);
    assert_eq!(names(&LayerNorm::new(&dev, 2)?), ["weight", "bias"]);
    assert_eq!(names(&RMSNorm::with_eps(&dev, 2, 1e-6)?), ["weight"]);
    let config = TextEncoderConfig {
        vocab: 16,
        embed: 4,
        seq_len: 3,
        mlp: vec![8, 8, 6],
        classes: 3,
    };
    let model = TextEncoder::new(&dev, config, 0)?;
    assert_eq!(
        names(&model),
        [
            "embedding.weight",
            "mlp.0.weight",
            "mlp.0.bias",
            "mlp.2.weight",
            "mlp.2.bias",
            "mlp.4.weight",
            "mlp.4.bias",
            "proj.weight",
            "proj.bias",
        ]
    );
    assert!(buffer_names(&model).is_empty());

    let bn = BatchNorm::new(&dev, 3)?;
    assert_eq!(names(&bn), ["weight", "bias"]);
    assert_eq!(
        buffer_names(&bn),
        ["running_mean", "running_var", "num_batches_tracked"]
    );
    assert_eq!(names(&GroupNorm::new(&dev, 2, 4)?), ["weight", "bias"]);
    assert_eq!(
        names(&MultiHeadAttention::new(&dev, &mut rng, 4, 2)?),
        [
            "in_proj_weight",
            "in_proj_bias",
            "out_proj.weight",
            "out_proj.bias"
        ]
    );
    let conv = Conv2d::new(&dev, &mut rng, ConvConfig::new(2, 3, [3, 3]))?;
    assert_eq!(names(&conv), ["weight", "bias"]);

    // Hugging Face's LlamaForCausalLM names (tests/llm/llama.rs checks them against transformers)
    let config = LlamaConfig::new(16, 8, 12, 2, 2, 1)?;
    let llama = LlamaForCausalLM::random(&dev, &config, 0)?;
    let got = names(&llama);
    let layer = |i: usize| {
        [
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
            "input_layernorm.weight",
            "post_attention_layernorm.weight",
        ]
        .map(|n| format!("model.layers.{i}.{n}"))
    };
    let mut want = vec!["model.embed_tokens.weight".to_string()];
    want.extend(layer(0));
    want.extend(layer(1));
    want.extend(["model.norm.weight".into(), "lm_head.weight".into()]);
    assert_eq!(got, want);
    Ok(())
}
