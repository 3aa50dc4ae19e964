//! The LLM building blocks against values PyTorch and Hugging Face `transformers` computed:
//! `tests/data/torch/llm_blocks.safetensors`, written by `scripts/fixtures/llm_blocks.py`
//! (silu, `LlamaRotaryEmbedding` + `apply_rotary_pos_emb`, `F.scaled_dot_product_attention`
//! with `enable_gqa`, RMSNorm and LayerNorm with an explicit eps). Each case compares the output
//! and the gradients of `sum(out * cot)` for every input; tolerances are in `torch_fixture/`.

use crate::torch_fixture;

use neuron_pc::nn::RMSNorm;
use neuron_pc::nn::{self, scaled_dot_product_attention as sdpa, LayerNorm, RotaryEmbedding};
use neuron_pc::{DType, Tensor};
use torch_fixture::Fixture;

#[test]
fn silu_and_norms_with_eps_match_pytorch() {
    let fx = Fixture::load("llm_blocks");
    fx.check("silu", &["x"], |x| nn::silu(&x[0]));
    // inputs of size ~1e-3 (RMSNorm) and ~0.05 (LayerNorm): the default eps would miss here
    fx.check("rmsnorm", &["x", "weight"], |x| {
        let mut layer = RMSNorm::with_eps(&fx.dev, 8, 1e-6)?;
        layer.weight = x[1].clone();
        layer.forward(&x[0])
    });
    fx.check("layernorm", &["x", "weight", "bias"], |x| {
        let mut layer = LayerNorm::with_eps(&fx.dev, 8, 1e-3)?;
        layer.weight = x[1].clone();
        layer.bias = x[2].clone();
        layer.forward(&x[0])
    });
}

#[test]
fn rotary_embedding_matches_hugging_face() {
    let fx = Fixture::load("llm_blocks");
    for (prefix, theta, head_dim) in [("rope", 10_000.0, 8), ("rope3", 500_000.0, 6)] {
        let rope = RotaryEmbedding::new(&fx.dev, head_dim, theta).unwrap();
        let ids = fx.tensor(&format!("{prefix}.position_ids"));
        // the tables themselves, then the rotation and its gradients
        let (cos, sin) = rope.cos_sin(&ids).unwrap();
        fx.compare(&format!("{prefix}.cos"), &cos, 1e-5, false);
        fx.compare(&format!("{prefix}.sin"), &sin, 1e-5, false);
        fx.check(prefix, &["q", "k"], |x| {
            let (q, k) = rope.forward(&x[0], &x[1], &ids)?;
            Tensor::cat(&[&q, &k], 1)
        });
    }
}

#[test]
fn attention_matches_pytorch() {
    let fx = Fixture::load("llm_blocks");
    fx.check("sdpa_gqa", &["q", "k", "v"], |x| {
        sdpa(&x[0], &x[1], &x[2], None, true, None)
    });
    let keep = fx.tensor("sdpa_bool.mask");
    let keep = keep.ne(&keep.zeros_like().unwrap()).unwrap();
    assert_eq!(keep.dtype(), DType::Pred);
    fx.check("sdpa_bool", &["q", "k", "v"], |x| {
        sdpa(&x[0], &x[1], &x[2], Some(&keep), false, Some(0.3))
    });
    let bias = fx.tensor("sdpa_add.mask");
    fx.check("sdpa_add", &["q", "k", "v"], |x| {
        sdpa(&x[0], &x[1], &x[2], Some(&bias), false, None)
    });
}
