//! The mixtures of experts' configs (Qwen3-MoE, Mixtral) as `transformers` reads them, what
//! they do not compute refused by name, and their training step under activation
//! checkpointing and a chunked loss. Their numerics against `transformers` are
//! tests/llm/families.rs's (`qwen3_moe`, `mixtral`).

use crate::llm_check;
use crate::torch_fixture;

use llm_check::{close, data, values};
use neuron_pc::models::llama::{Family, LlamaConfig, LlamaForCausalLM, LoadOptions};
use neuron_pc::nn::{Module, Remat};
use neuron_pc::{grad, Tensor};
use torch_fixture::Fixture;

fn config_json(case: &str) -> serde_json::Value {
    let path = data(&format!("families/{case}/config.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn read(json: &serde_json::Value) -> neuron_pc::Result<LlamaConfig> {
    LlamaConfig::from_json_str(&json.to_string(), "config.json")
}

#[test]
fn moe_configs_read_each_key_as_transformers_does() {
    let qwen = read(&config_json("qwen3_moe")).unwrap();
    assert_eq!(qwen.family, Family::Qwen3Moe);
    let moe = qwen.moe.clone().unwrap();
    assert_eq!(
        (
            moe.num_experts,
            moe.experts_per_token,
            moe.expert_intermediate_size
        ),
        (4, 2, 24)
    );
    assert!(!moe.norm_topk_prob && moe.output_router_logits);
    assert_eq!(moe.router_aux_loss_coef, 0.05);
    assert_eq!(moe.mlp_only_layers, [1]);
    let sparse: Vec<bool> = (0..3).map(|l| qwen.is_sparse(l)).collect();
    assert_eq!(sparse, [true, false, true]);

    // transformers 5 writes `num_local_experts`, the Hub's configs `num_experts`: one config
    let mut json = config_json("qwen3_moe");
    let map = json.as_object_mut().unwrap();
    let n = map
        .remove("num_local_experts")
        .or_else(|| map.remove("num_experts"))
        .unwrap();
    map.insert("num_experts".into(), n.clone());
    assert_eq!(read(&json).unwrap(), qwen);
    let map = json.as_object_mut().unwrap();
    map.remove("num_experts");
    map.insert("num_local_experts".into(), n);
    assert_eq!(read(&json).unwrap(), qwen);

    // Qwen3MoeDecoderLayer's rule: experts where (l + 1) % decoder_sparse_step == 0 and l is
    // not in mlp_only_layers
    let mut json = config_json("qwen3_moe");
    json["num_hidden_layers"] = 6.into();
    json["decoder_sparse_step"] = 2.into();
    json["mlp_only_layers"] = serde_json::json!([3]);
    let c = read(&json).unwrap();
    let sparse: Vec<bool> = (0..6).map(|l| c.is_sparse(l)).collect();
    assert_eq!(sparse, [false, true, false, false, false, true]);

    let mixtral = read(&config_json("mixtral")).unwrap();
    assert_eq!(mixtral.family, Family::Mixtral);
    let moe = mixtral.moe.clone().unwrap();
    assert_eq!(moe.expert_intermediate_size, mixtral.intermediate_size);
    assert!(moe.norm_topk_prob, "Mixtral always renormalises");
    assert_eq!(mixtral.sliding_window, Some(5));

    // the parameter counts are those of the model built from the config
    for (case, c) in [("qwen3_moe", &qwen), ("mixtral", &mixtral)] {
        let fx = Fixture::load(&format!("family_{case}"));
        let model =
            LlamaForCausalLM::from_pretrained(&fx.dev, &data(&format!("families/{case}"))).unwrap();
        let count: usize = model
            .parameters()
            .iter()
            .map(|(_, t)| t.dims().iter().product::<usize>())
            .sum();
        assert_eq!(c.num_parameters(), count, "{case}");
        // a token uses 2 of the 4 experts of each sparse layer
        let moe = c.moe.as_ref().unwrap();
        let sparse = (0..c.num_hidden_layers).filter(|&l| c.is_sparse(l)).count();
        let unused = sparse * 2 * 3 * c.hidden_size * moe.expert_intermediate_size;
        assert_eq!(c.active_parameters(), count - unused, "{case}");
    }
}

#[test]
fn expert_settings_nothing_here_computes_are_one_line_naming_the_key() {
    let edits = [
        (
            "qwen3_moe",
            serde_json::json!({"n_group": 8, "topk_group": 4}),
            "`n_group`",
        ),
        (
            "qwen3_moe",
            serde_json::json!({"shared_expert_intermediate_size": 64}),
            "`shared_expert_intermediate_size`",
        ),
        (
            "qwen3_moe",
            serde_json::json!({"swiglu_limit": 7.0}),
            "`swiglu_limit`",
        ),
        (
            "qwen3_moe",
            serde_json::json!({"num_experts_per_tok": 5}),
            "`num_experts_per_tok`",
        ),
        (
            "qwen3_moe",
            serde_json::json!({"mlp_only_layers": [3]}),
            "`mlp_only_layers`",
        ),
        (
            "mixtral",
            serde_json::json!({"router_jitter_noise": 0.1}),
            "`router_jitter_noise`",
        ),
        (
            "qwen2",
            serde_json::json!({"num_experts": 4}),
            "`num_experts`",
        ),
        (
            "mistral",
            serde_json::json!({"num_local_experts": 8}),
            "`num_local_experts`",
        ),
    ];
    for (case, edit, key) in edits {
        let mut json = config_json(case);
        for (k, v) in edit.as_object().unwrap() {
            json[k] = v.clone();
        }
        let e = read(&json).unwrap_err().to_string();
        assert!(e.contains(key), "{case} {edit}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    // a DeepSeek or gpt-oss config is refused at its model_type
    let mut json = config_json("qwen3_moe");
    json["model_type"] = "deepseek_v3".into();
    let e = read(&json).unwrap_err().to_string();
    assert!(
        e.contains("`model_type`") && e.contains("qwen3_moe, mixtral"),
        "{e}"
    );

    // experts are not scanned
    let fx = Fixture::load("family_qwen3_moe");
    let options = LoadOptions {
        scan_layers: true,
        ..LoadOptions::default()
    };
    let e = LlamaForCausalLM::from_pretrained_with(&fx.dev, &data("families/qwen3_moe"), &options)
        .err()
        .expect("experts cannot be scanned")
        .to_string();
    assert!(e.contains("scan_layers") && e.contains("experts"), "{e}");
}

/// Recomputing each layer in the backward pass (its router and experts included) and a
/// chunked head give the loss and gradients of the plain step.
#[test]
fn remat_and_a_chunked_loss_change_nothing_but_memory() {
    let fx = Fixture::load("family_qwen3_moe");
    let dir = data("families/qwen3_moe");
    let (ids, mask, labels) = (
        fx.tensor("batch.input_ids"),
        fx.tensor("batch.attention_mask"),
        fx.tensor("batch.labels"),
    );
    let step = |model: &LlamaForCausalLM| -> (Vec<f64>, Vec<Vec<f64>>) {
        let loss = model.loss(&ids, Some(&mask), &labels).unwrap();
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        let grads = grad(&loss, &params.iter().collect::<Vec<_>>()).unwrap();
        fx.dev.mark_step().unwrap();
        (values(&loss), grads.iter().map(values).collect())
    };
    let plain = LlamaForCausalLM::from_pretrained(&fx.dev, &dir).unwrap();
    let (want_loss, want_grads) = step(&plain);
    // transformers' loss, the load-balancing loss included
    close("loss", &want_loss, &fx.host("loss").to_f64_vec(), 0.0, 1e-6);
    let mut remat = LlamaForCausalLM::from_pretrained(&fx.dev, &dir).unwrap();
    remat.set_remat(Remat::Full);
    remat.loss_chunk = Some(5);
    let (loss, grads) = step(&remat);
    close("loss", &loss, &want_loss, 0.0, 1e-6);
    for (g, w) in grads.iter().zip(&want_grads) {
        let largest = w.iter().fold(0f64, |m, v| m.max(v.abs()));
        close("grad", g, w, 1e-5 * largest, 1e-4);
    }
}
