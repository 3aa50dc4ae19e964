//! Expert parallelism on the cpu plugin's 4 devices: a tiny Qwen3-MoE whose experts are split
//! over an `expert` mesh axis (alone, with FSDP and with tensor parallelism) trains as on one
//! device, and each device holds its share of the experts (measured from the device buffers).

use crate::sharded_training::{assert_follows, train_config};

use neuron_pc::models::llama::{Family, LlamaConfig, MoeConfig};
use neuron_pc::Metrics;

/// The sharded tests' sizes (vocabulary 128, hidden 64, 2 layers, 4 heads of 16, 2 kv heads)
/// with 4 experts of width 32 in every layer, 2 per token, and the load-balancing loss.
fn config() -> LlamaConfig {
    let mut moe = MoeConfig::new(4, 2, 32);
    moe.output_router_logits = true;
    moe.router_aux_loss_coef = 0.01;
    LlamaConfig::new(128, 64, 96, 2, 4, 2)
        .unwrap()
        .with_family(Family::Qwen3Moe)
        .with_moe(moe)
        .unwrap()
}

/// Bytes of the experts' parameters of `c` on one device, whole (float32).
fn expert_bytes(c: &LlamaConfig) -> f64 {
    let moe = c.moe.as_ref().unwrap();
    (c.num_hidden_layers * moe.num_experts * 3 * c.hidden_size * moe.expert_intermediate_size * 4)
        as f64
}

#[test]
fn experts_split_over_an_expert_axis_train_as_on_one_device() {
    const STEPS: usize = 30;
    let c = config();
    let one = train_config(&[], 1, false, STEPS, &c);
    assert!(
        one.losses[STEPS - 1] < one.losses[0] - 0.5,
        "it learns: {:?}",
        one.losses
    );
    let ep = train_config(&[("expert", 4)], 1, false, STEPS, &c);
    assert_follows("EP 4", &ep, &one);
    assert_eq!(ep.metrics.partitions, 4);
    assert_eq!(ep.metrics.compiles, one.metrics.compiles);

    // each device holds a quarter of the experts, everything else whole: measured from the
    // device buffers, the experts' share is what is left after the rest
    let params = |m: &Metrics| m.parameter_bytes as f64;
    let experts = expert_bytes(&c);
    let rest = params(&one.metrics) - experts;
    let ratio = (params(&ep.metrics) - rest) / experts;
    eprintln!("EP 4 holds {ratio:.4} of the experts' parameter bytes per device");
    assert!(
        (ratio - 0.25).abs() <= 0.02,
        "EP 4 holds {ratio} of the experts"
    );

    // with FSDP and with tensor parallelism
    let fsdp = train_config(&[("data", 2), ("expert", 2)], 1, true, STEPS, &c);
    assert_follows("FSDP 2 x EP 2", &fsdp, &one);
    let tp = train_config(&[("model", 2), ("expert", 2)], 1, false, STEPS, &c);
    assert_follows("TP 2 x EP 2", &tp, &one);
    let held = |m: &Metrics| params(m) / params(&one.metrics);
    eprintln!(
        "FSDP 2 x EP 2 holds {:.3}, TP 2 x EP 2 {:.3} of the parameters",
        held(&fsdp.metrics),
        held(&tp.metrics)
    );
    // the experts a quarter (their axis, then FSDP or TP within each), the rest half (FSDP) or
    // half but for the norms (TP): between 0.25 and 0.5 of the whole
    for (name, run) in [("FSDP 2 x EP 2", &fsdp), ("TP 2 x EP 2", &tp)] {
        let ratio = held(&run.metrics);
        assert!(ratio > 0.25 && ratio < 0.4, "{name} holds {ratio}");
        let ratio = (params(&run.metrics) - rest / 2.0) / experts;
        assert!(ratio <= 0.26, "{name} holds {ratio} of the experts");
    }
}

/// The stacked experts' first dimension over `expert`, each expert's projections as a dense
/// MLP's over `model`; the router, and scanned layers' stacking dimension, are not split by it.
#[test]
fn the_llama_plan_splits_stacked_experts_over_the_expert_axis() {
    use neuron_pc::models::llama::LlamaSharding;
    use neuron_pc::sharding::spec_of;
    let mesh = neuron_pc::Mesh::new(&[("expert", 2), ("model", 2)], &[0, 1, 2, 3]).unwrap();
    let spec = |name: &str, dims: &[usize]| {
        spec_of(&LlamaSharding::default(), name, dims, &mesh).to_string()
    };
    for block in ["model.layers.0.mlp", "model.layers.0.block_sparse_moe"] {
        let (gate, down) = match block.ends_with("mlp") {
            true => ("gate_proj", "down_proj"),
            false => ("w1", "w2"),
        };
        let gate = format!("{block}.experts.*.{gate}.weight");
        assert_eq!(spec(&gate, &[4, 32, 64]), "P('expert', 'model')", "{gate}");
        let down = format!("{block}.experts.*.{down}.weight");
        assert_eq!(
            spec(&down, &[4, 64, 32]),
            "P('expert', None, 'model')",
            "{down}"
        );
        // 3 experts: the axis does not divide them, they stay whole
        assert_eq!(spec(&gate, &[3, 32, 64]), "P(None, 'model')", "{gate}");
        assert_eq!(spec(&format!("{block}.gate.weight"), &[4, 64]), "P()");
    }
    let scanned = "model.layers.*.mlp.gate_proj.weight";
    assert_eq!(spec(scanned, &[2, 32, 64]), "P(None, 'model')");
}
