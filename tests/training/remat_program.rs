//! Checkpointing survives XLA: the optimized program (dumped by the plugin as
//! `XLA_FLAGS=--xla_dump_to` asks) of a step with checkpointed layers holds more products than
//! the plain step's, as many more as the policy recomputes: every projection and attention
//! product of every layer with `full`, only the attention products with `dots`. Without the
//! fence XLA's CSE would merge the recomputed forward into the original (PyTorch/XLA #3455)
//! and the counts would be equal. Its own test binary: XLA reads `XLA_FLAGS` once per process.

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM};
use neuron_pc::nn::{Module, Remat};
use neuron_pc::{grad, DeviceConfig, HostTensor, LazyDevice, Tensor};
use neuron_pc_test_support::process::run_alone;

/// The optimized programs under `dump`, in the order they were compiled.
fn optimized(dump: &std::path::Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(dump) else {
        return Vec::new();
    };
    let mut files: Vec<std::path::PathBuf> = dir
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with("after_optimizations.txt"))
        })
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

fn dots(hlo: &str) -> usize {
    hlo.lines().filter(|l| l.contains(" dot(")).count()
}

#[test]
fn the_optimized_step_recomputes_the_products_each_policy_names() {
    // alone in a process of its own: XLA_FLAGS is read once, when the plugin loads
    if !run_alone(
        module_path!(),
        "the_optimized_step_recomputes_the_products_each_policy_names",
    ) {
        return;
    }
    let dump = std::env::temp_dir().join(format!("neuron-pc-remat-hlo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dump);
    // before the plugin reads it (this binary's one test)
    std::env::set_var(
        "XLA_FLAGS",
        format!("--xla_dump_to={} --xla_dump_hlo_as_text", dump.display()),
    );
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        warmup_steps: u64::MAX,
        ..DeviceConfig::default()
    })
    .unwrap();
    let layers = 3;
    let config = LlamaConfig::new(96, 32, 48, layers, 4, 2).unwrap();
    let ids: Vec<i32> = (0..2 * 10).map(|i| (i * 7 + 3) % 96).collect();
    let ids = dev
        .tensor(&HostTensor::from_slice(&ids, &[2, 10]).unwrap())
        .unwrap();
    let mut counts = Vec::new();
    for policy in [Remat::None, Remat::Full, Remat::Dots] {
        let before = optimized(&dump).len();
        let mut model = LlamaForCausalLM::random(&dev, &config, 5).unwrap();
        model.set_remat(policy);
        let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
        let loss = model.loss(&ids, None, &ids).unwrap();
        let grads = grad(&loss, &params.iter().collect::<Vec<_>>()).unwrap();
        dev.mark_step().unwrap();
        assert!(loss.item().unwrap().is_finite());
        drop(grads);
        let programs = optimized(&dump);
        assert_eq!(programs.len(), before + 1, "{policy}: one new program");
        counts.push(dots(programs.last().unwrap()));
    }
    let (none, full, dots) = (counts[0], counts[1], counts[2]);
    println!("products in the optimized step: none {none}, full {full}, dots {dots}");
    // per layer: q, k, v, o, gate and up (no batch dimensions) and the two attention
    // products (batched over heads); not down, whose result no gradient rule reads
    assert!(
        full == none + 8 * layers,
        "full recomputes every product of every layer: none {none}, full {full}"
    );
    assert!(
        dots == none + 2 * layers,
        "dots recomputes the attention products alone: none {none}, dots {dots}, full {full}"
    );
    let _ = std::fs::remove_dir_all(&dump);
}
