//! Packed rows against `transformers` (`scripts/fixtures/packing.py`): documents told apart by
//! position ids that restart, with no attention mask, attend only inside themselves (a
//! block-diagonal causal mask, on top of a sliding window where a layer has one). Logits
//! `1e-5 + 1e-4 |torch|`, the loss `1e-6` relative, every gradient `1e-4` relative plus `1e-4`
//! of its largest entry.

use crate::llm_check;
use crate::torch_fixture;

use neuron_pc::grad;
use neuron_pc::models::llama::LlamaForCausalLM;
use neuron_pc::nn::Module;
use neuron_pc::Tensor;

use llm_check::{close, data, values};
use torch_fixture::Fixture;

#[test]
fn packed_documents_attend_only_inside_themselves_as_in_transformers() {
    let fx = Fixture::load("packing");
    let ids = fx.tensor("input_ids");
    let positions = fx.tensor("position_ids");
    let labels = fx.tensor("labels");
    for (case, dir) in [
        ("llama", "llama-saved-by-rust"),
        ("qwen2", "families/qwen2-saved-by-rust"),
    ] {
        let model = LlamaForCausalLM::from_pretrained(&fx.dev, &data(dir)).unwrap();
        let (loss, logits) = model
            .forward_loss(&ids, Some(&positions), None, &labels)
            .unwrap();
        let named = model.parameters();
        let params: Vec<&Tensor> = named.iter().map(|(_, t)| t).collect();
        let grads = grad(&loss, &params).unwrap();
        fx.dev.mark_step().unwrap();
        let want = fx.host(&format!("{case}.logits")).to_f64_vec();
        let d = close(case, &values(&logits), &want, 1e-5, 1e-4);
        let (got, want) = (
            loss.item().unwrap(),
            fx.host(&format!("{case}.loss")).to_f64_vec()[0],
        );
        assert!(
            ((got - want) / want).abs() < 1e-6,
            "{case}: loss {got} vs {want}"
        );
        for ((name, _), g) in named.iter().zip(&grads) {
            let want = fx.host(&format!("{case}.grad.{name}")).to_f64_vec();
            let largest = want.iter().fold(0f64, |m, v| m.max(v.abs()));
            close(
                &format!("{case} grad.{name}"),
                &values(g),
                &want,
                1e-4 * largest,
                1e-4,
            );
        }
        eprintln!("{case}: logits max |diff| {d:e}, loss {got} vs {want}");
    }
}

/// Position ids that only count up (one document per row) are the plain causal mask: the
/// logits of the default positions (within round-off: the graphs differ by a zero mask).
#[test]
fn one_document_per_row_is_the_plain_causal_mask() {
    let fx = Fixture::load("packing");
    let ids = fx.tensor("input_ids");
    let model = LlamaForCausalLM::from_pretrained(&fx.dev, &data("llama-saved-by-rust")).unwrap();
    let counting = fx.dev.arange(16, neuron_pc::DType::I32).unwrap();
    let plain = model.forward(&ids, None, None).unwrap();
    let counted = model.forward(&ids, Some(&counting), None).unwrap();
    fx.dev.mark_step().unwrap();
    close(
        "counting positions",
        &values(&counted),
        &values(&plain),
        1e-6,
        0.0,
    );
}
