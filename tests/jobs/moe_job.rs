//! `train_llama --family qwen3_moe` as a user runs it: a random mixture of experts from the
//! size flags, its experts split over `--ep 4` devices, compiled ahead by `neuron-pc compile`
//! so the real run compiles nothing, following the one-device run, checkpointed and resumed on
//! one device, and saved as a directory that loads back as the same family; bad expert flags
//! are one line.

use crate::llama_job::{fails_with, precompile, run, tmp, SMALL};

use neuron_pc::models::llama::{Family, LlamaForCausalLM};

/// 4 experts of width 32, 2 per token, the load-balancing loss in the loss.
const MOE: &[&str] = &[
    "--family",
    "qwen3_moe",
    "--experts",
    "4",
    "--experts-per-token",
    "2",
    "--expert-intermediate",
    "32",
    "--router-aux-loss-coef",
    "0.01",
];

#[test]
fn an_expert_parallel_run_precompiles_follows_one_device_and_saves_qwen3_moe() {
    let cache = tmp("moe-cache");
    let saved = tmp("moe-saved");
    let ckpt = tmp("moe-ckpt");
    let ep = [MOE, &["--ep", "4", "--steps", "8"]].concat();
    let report = precompile(&cache, &ep);
    // the partitioned training step and the matmul that measures the peak
    assert_eq!(report["compiled"], 2, "{report}");

    fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        [SMALL, MOE, &["--loss-log", "--json", "--steps", "8"], extra].concat()
    }
    let meshed = run(
        &cache,
        &args(&[
            "--ep",
            "4",
            "--save",
            saved.to_str().unwrap(),
            "--ckpt-dir",
            ckpt.to_str().unwrap(),
            "--ckpt-every",
            "4",
        ]),
    );
    assert_eq!(meshed.metrics["compiles"], 0, "{}", meshed.metrics);
    assert_eq!(meshed.metrics["partitions"], 4, "{}", meshed.metrics);
    assert!(
        meshed
            .stdout
            .contains("experts: 4 per sparse layer, 2 per token, 32 wide"),
        "{}",
        meshed.stdout
    );

    let one_cache = tmp("moe-one");
    let one = run(&one_cache, &args(&[]));
    assert_eq!(one.losses.len(), 8);
    for ((s, g), (_, w)) in meshed.losses.iter().zip(&one.losses) {
        assert!(
            ((g - w) / w).abs() <= 1e-5,
            "step {s}: EP 4 {g} vs one device {w}"
        );
    }
    // the model learns, with the load-balancing loss in its loss
    assert!(one.losses[7].1 < one.losses[0].1, "{:?}", one.losses);

    // step 4's checkpoint, written with the experts split over 4 devices, resumes on one
    // device and continues as the uninterrupted run did
    let resumed = run(
        &one_cache,
        &args(&[
            "--ckpt-dir",
            ckpt.to_str().unwrap(),
            "--resume",
            "step-00000004",
        ]),
    );
    assert!(
        resumed.stdout.contains("resumed from"),
        "{}",
        resumed.stdout
    );
    assert_eq!(resumed.losses.len(), 4);
    for ((s, g), (_, w)) in resumed.losses.iter().zip(&one.losses[4..]) {
        assert!(
            ((g - w) / w).abs() <= 1e-5,
            "step {s}: resumed {g} vs straight {w}"
        );
    }

    // the saved directory is a Qwen3-MoE with every expert under its own name
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(saved.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["architectures"][0], "Qwen3MoeForCausalLM");
    assert_eq!(config["num_experts"], 4);
    let sd = neuron_pc::state_dict::StateDict::load(&saved.join("model.safetensors")).unwrap();
    for e in 0..4 {
        let name = format!("model.layers.1.mlp.experts.{e}.down_proj.weight");
        assert_eq!(sd.tensors[&name].dims(), [32, 32], "{name}");
    }
    let dev = neuron_pc::LazyDevice::new(neuron_pc::DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        ..neuron_pc::DeviceConfig::default()
    })
    .unwrap();
    let model = LlamaForCausalLM::from_pretrained(&dev, &saved).unwrap();
    assert_eq!(model.config.family, Family::Qwen3Moe);
    for d in [cache, one_cache, saved, ckpt] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn bad_expert_flags_are_one_line() {
    let cache = tmp("moe-bad");
    let qwen = ["--family", "qwen3_moe", "--experts", "4"];
    for (extra, needle) in [
        (
            &["--experts-per-token", "5"][..],
            "`num_experts_per_tok`: 5: must be between 1 and the 4 experts",
        ),
        (
            &["--expert-intermediate", "0"][..],
            "`moe_intermediate_size`: must be positive",
        ),
    ] {
        let args = [SMALL, &qwen[..], extra].concat();
        fails_with(&cache, &args, needle);
    }
    let mixtral = [
        SMALL,
        &["--family", "mixtral", "--expert-intermediate", "16"][..],
    ]
    .concat();
    fails_with(
        &cache,
        &mixtral,
        "--expert-intermediate 16: Mixtral's experts are --intermediate wide (64)",
    );
    let _ = std::fs::remove_dir_all(cache);
}
