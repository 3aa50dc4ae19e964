//! The programs a tensor-parallel and an expert-parallel step run are partitioned: XLA's
//! optimized HLO (dumped by the plugin as `XLA_FLAGS=--xla_dump_to` asks) multiplies each
//! device's quarter of the q projection's output features, not the whole, and keeps each expert
//! on its device. Each test runs in a process of its own: XLA reads `XLA_FLAGS` once per
//! process.

use neuron_pc_test_support::process::run_alone;
use std::path::PathBuf;
use std::sync::Arc;

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM, LlamaSharding};
use neuron_pc::nn::{Module, VarBuilder};
use neuron_pc::{grad, DeviceConfig, HostTensor, LazyDevice, Tensor};

/// In the process [`run_alone`] starts for `test` (else `None`: this process only waits for
/// it): a device of `mesh` whose compiled programs XLA dumps into the returned directory.
fn dumping_device(test: &str, mesh: &[(&str, usize)]) -> Option<(LazyDevice, PathBuf)> {
    if !run_alone(module_path!(), test) {
        return None;
    }
    let dump = std::env::temp_dir().join(format!("neuron-pc-hlo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dump);
    // before the plugin reads it (this process's one test)
    std::env::set_var(
        "XLA_FLAGS",
        format!("--xla_dump_to={} --xla_dump_hlo_as_text", dump.display()),
    );
    let config = DeviceConfig {
        cache: CacheConfig::disabled(),
        ..DeviceConfig::default()
    };
    Some((LazyDevice::new(config.with_mesh(mesh)).unwrap(), dump))
}

#[test]
fn a_tensor_parallel_step_multiplies_a_quarter_of_the_q_projection_on_each_device() {
    let Some((dev, dump)) = dumping_device(
        "a_tensor_parallel_step_multiplies_a_quarter_of_the_q_projection_on_each_device",
        &[("model", 4)],
    ) else {
        return;
    };
    // hidden 64, 4 heads of 16: q_proj.weight is [64, 64], a [16, 64] block per device;
    // intermediate 96 makes gate/up [96, 64], o/down distinct shapes
    let config = LlamaConfig::new(128, 64, 96, 1, 4, 4).unwrap();
    let vb = VarBuilder::random(&dev, 3).with_sharding(Arc::new(LlamaSharding { fsdp: false }));
    let model = LlamaForCausalLM::from_vb(&vb, &config).unwrap();
    let q = &model.model.layers[0].self_attn.q_proj.weight;
    let sharding = q.sharding().expect("q_proj.weight is split");
    assert_eq!(sharding.shard_dims(), [16, 64]);
    // 12 tokens, a count no weight dimension shares
    let ids: Vec<i32> = (0..2 * 6).map(|i| i * 5 % 128).collect();
    let ids = dev
        .tensor(&HostTensor::from_slice(&ids, &[2, 6]).unwrap())
        .unwrap();
    let loss = model.loss(&ids, None, &ids).unwrap();
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let grads = grad(&loss, &params.iter().collect::<Vec<_>>()).unwrap();
    dev.mark_step().unwrap();
    assert!(loss.item().unwrap().is_finite());
    drop(grads);

    let hlo = optimized_hlo(&dump);
    let dot_results: Vec<&str> = hlo
        .lines()
        .filter_map(|l| l.split_once(" dot(")?.0.split_once(" = ").map(|(_, ty)| ty))
        .collect();
    // q (and k, v) projected on each device: 12 tokens by a quarter of the 64 features
    assert!(
        dot_results.iter().any(|t| t.starts_with("f32[12,16]{")),
        "no dot giving [12 tokens, 16 features]: {dot_results:?}"
    );
    // the weight gradients are blocks too: no dot gives a whole [64, 64] projection gradient
    assert!(
        !dot_results.iter().any(|t| t.starts_with("f32[64,64]{")),
        "a whole projection's product: {dot_results:?}"
    );
    let _ = std::fs::remove_dir_all(&dump);
}

/// The optimized programs XLA dumped into `dump`, joined.
fn optimized_hlo(dump: &std::path::Path) -> String {
    let optimized: Vec<String> = std::fs::read_dir(dump)
        .expect("XLA dumped the programs")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with("after_optimizations.txt"))
        })
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    assert!(!optimized.is_empty(), "no optimized program in {dump:?}");
    optimized.join("\n")
}

/// Expert parallelism's collectives are the partitioner's: in a training step with 4 experts
/// over an `expert` axis of 4 (the batch split over it too), no device gathers the experts'
/// weights (or their gradients); the tokens are all-gathered, each device runs its expert over
/// all of them, and an all-reduce of `[tokens, hidden]` sums the experts' outputs.
#[test]
fn an_expert_parallel_step_keeps_each_expert_on_its_device_and_all_reduces_the_combine() {
    use neuron_pc::models::llama::{Family, MoeConfig};
    let Some((dev, dump)) = dumping_device(
        "an_expert_parallel_step_keeps_each_expert_on_its_device_and_all_reduces_the_combine",
        &[("expert", 4)],
    ) else {
        return;
    };
    // hidden 64, experts of width 40: a shape no other tensor has
    let config = LlamaConfig::new(128, 64, 96, 1, 4, 4)
        .unwrap()
        .with_family(Family::Qwen3Moe)
        .with_moe(MoeConfig::new(4, 2, 40))
        .unwrap();
    let vb = VarBuilder::random(&dev, 3).with_sharding(Arc::new(LlamaSharding { fsdp: false }));
    let model = LlamaForCausalLM::from_vb(&vb, &config).unwrap();
    // 4 rows of 3 tokens, split over the expert axis as a batch is (data parallel outside
    // the experts)
    let ids: Vec<i32> = (0..4 * 3).map(|i| i * 5 % 128).collect();
    let ids = dev
        .shard(&HostTensor::from_slice(&ids, &[4, 3]).unwrap())
        .unwrap();
    // a training step: the gradients used by AdamW within it, as a training loop does
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = neuron_pc::optim::AdamW::new(&dev, &params, 0.1).unwrap();
    let lr = dev.scalar(1e-3, neuron_pc::DType::F32).unwrap();
    let loss = model.loss(&ids, None, &ids).unwrap();
    let grads = grad(&loss, &params.iter().collect::<Vec<_>>()).unwrap();
    opt.step(&params, &grads, &lr).unwrap();
    drop(grads);
    dev.mark_step().unwrap();
    assert!(loss.item().unwrap().is_finite());

    let hlo = optimized_hlo(&dump);
    let collectives: Vec<&str> = hlo
        .lines()
        .filter(|l| l.contains(" all-gather(") || l.contains(" all-reduce("))
        .filter_map(|l| l.split_once(" = ").map(|(_, rest)| rest))
        .collect();
    let whole_experts = ["f32[4,40,64]", "f32[4,64,40]"];
    assert!(
        !collectives
            .iter()
            .any(|c| whole_experts.iter().any(|w| c.starts_with(w))),
        "an expert's weights gathered: {collectives:#?}"
    );
    let result = |c: &&str| c.split(" all-").next().unwrap_or("").to_string();
    assert!(
        collectives
            .iter()
            .any(|c| c.contains("all-reduce(") && result(c).contains("f32[12,64]")),
        "no all-reduce of the combined [12 tokens, 64] output: {collectives:#?}"
    );
    assert!(
        collectives
            .iter()
            .any(|c| c.contains("all-gather(") && result(c).starts_with("f32[12,64]")),
        "the tokens are not gathered for the experts: {collectives:#?}"
    );
    // each device multiplies its expert alone: an expert's [40, 64] block, never all four
    assert!(
        hlo.contains("f32[1,40,64]"),
        "no expert-sized block in the program"
    );
    let _ = std::fs::remove_dir_all(&dump);
}
