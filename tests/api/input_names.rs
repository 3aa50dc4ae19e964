//! Graph inputs are named by their tensors' names where one is known: a module's parameters by
//! their state-dict names (kept across steps as their values are replaced), tensors named with
//! `set_name`, and AdamW's moments after their parameters. The recompile warning, the graph log
//! and `neuron-pc analyze` use them instead of a bare position.

use neuron_pc_test_support::process::test_path;
use std::path::Path;
use std::process::Command;

use neuron_pc::nn::{HostRng, Linear, Module, VarBuilder};
use neuron_pc::optim::AdamW;
use neuron_pc::state_dict::StateDict;
use neuron_pc::{grad, state, DType, DeviceConfig, LazyDevice, Tensor};

const CHILD: &str = "NPC_INPUT_NAMES_CHILD";

/// Four AdamW steps of a linear model on batches of 32, 32, 32 and 31 rows named `features`.
fn train(dev: &LazyDevice) -> neuron_pc::Result<()> {
    let model = Linear::new(dev, &mut HostRng::new(3), 3, 1, true)?;
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let refs: Vec<&Tensor> = params.iter().collect();
    let mut opt = AdamW::new(dev, &params, 0.0)?;
    let lr = dev.scalar(1e-2, DType::F32)?;
    for rows in [32usize, 32, 32, 31] {
        let x = dev.from_slice(&vec![0.5f32; rows * 3], &[rows, 3])?;
        x.set_name("features");
        let loss = model.forward(&x)?.sum_all()?;
        let grads = grad(&loss, &refs)?;
        opt.step(&params, &grads, &lr)?;
        dev.mark_step()?;
    }
    Ok(())
}

/// Run by the tests below as a separate process (the job `analyze` extracts).
#[test]
fn child_job() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    train(&LazyDevice::from_env().unwrap()).unwrap();
}

#[test]
fn the_recompile_message_names_the_input_that_changed() {
    let dev = LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        fail_on_new_graph_after_warmup: true,
        ..DeviceConfig::default()
    })
    .unwrap();
    let msg = train(&dev).unwrap_err().to_string();
    assert!(
        msg.contains("(features): f32[31,3] vs f32[32,3]"),
        "names the batch tensor: {msg}"
    );
    assert!(!msg.contains("weight"), "only what differs: {msg}");
}

#[test]
fn names_reach_the_graph_log_and_analyze() {
    let dir = std::env::temp_dir().join(format!("npc-names-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("graphs.jsonl");
    let me = std::env::current_exe().unwrap();
    let child = test_path(module_path!(), "child_job");
    let child_args = ["--exact", child.as_str(), "--test-threads", "1"];

    // A real run with the graph log: the 31-row step's graph is logged with every input named,
    // parameters and moments included (their values were replaced by three steps by then).
    let real = Command::new(&me)
        .args(child_args)
        .env(CHILD, "1")
        .env("NEURON_PC_GRAPH_LOG", &log)
        .env("NEURON_COMPILE_CACHE_URL", dir.join("cache"))
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_EXTRACT_DIR")
        .output()
        .unwrap();
    assert!(
        real.status.success(),
        "{}",
        String::from_utf8_lossy(&real.stderr)
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let names: Vec<&str> = last["param_names"]
        .as_array()
        .unwrap_or_else(|| panic!("no param_names in {last}"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for want in [
        "features",
        "weight",
        "bias",
        "optimizer.weight.exp_avg",
        "optimizer.bias.exp_avg_sq",
        // the step count, the one scalar besides the learning rate
        "optimizer.step",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    let features = names.iter().position(|n| *n == "features").unwrap();
    assert_eq!(last["params"][features], "f32[31,3]", "{last}");

    // analyze: the two step graphs differ only in the named batch tensor's shape.
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .args(["analyze", "--cache"])
        .arg(dir.join("empty-cache"))
        .arg("--")
        .arg(&me)
        .args(child_args)
        .env(CHILD, "1")
        .env_remove("NEURON_CC_FLAGS")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.contains("f32[31,3] vs f32[32,3]") || l.contains("f32[32,3] vs f32[31,3]"))
        .unwrap_or_else(|| panic!("no shape group in\n{stdout}"));
    assert!(line.contains("(features)"), "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The first graph's inputs in the graph log of a job that loads its weights before any step.
fn first_graph_inputs(
    tag: &str,
    load: impl FnOnce(&LazyDevice, &Path) -> neuron_pc::Result<Tensor>,
) -> Vec<String> {
    let dir = std::env::temp_dir().join(format!("npc-loaded-names-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let saved = dir.join("model.safetensors");
    {
        let dev = LazyDevice::new(DeviceConfig {
            cache: neuron_pc::compile::CacheConfig::disabled(),
            ..DeviceConfig::default()
        })
        .unwrap();
        let model = Linear::new(&dev, &mut HostRng::new(3), 3, 2, true).unwrap();
        state::module_state(&model).unwrap().save(&saved).unwrap();
    }
    let log = dir.join("graphs.jsonl");
    let dev = LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        graph_log: Some(log.clone()),
        ..DeviceConfig::default()
    })
    .unwrap();
    let out = load(&dev, &saved).unwrap();
    dev.mark_step().unwrap();
    out.to_vec::<f32>().unwrap();
    drop(dev);
    let text = std::fs::read_to_string(&log).unwrap();
    let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    first["param_names"]
        .as_array()
        .unwrap_or_else(|| panic!("no param_names in {first}"))
        .iter()
        .map(|v| v.as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn parameters_loaded_with_load_module_are_named_in_the_first_step() {
    let names = first_graph_inputs("load_module", |dev, saved| {
        // a fresh model whose weights come from the file before any step runs
        let model = Linear::new(dev, &mut HostRng::new(9), 3, 2, true)?;
        state::load_module(&model, &StateDict::load(saved)?, saved)?;
        let x = dev.from_slice(&[0.5f32; 6], &[2, 3])?;
        model.forward(&x)?.sum_all()
    });
    for want in ["weight", "bias"] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
}

#[test]
fn parameters_built_by_a_var_builder_are_named_in_the_first_step() {
    let names = first_graph_inputs("var_builder", |dev, saved| {
        // no call to `parameters()`: the builder names what it reads
        let vb = VarBuilder::from_safetensors(dev, &[saved])?;
        let model = Linear::from_vb(&vb, 3, 2, true)?;
        let x = dev.from_slice(&[0.5f32; 6], &[2, 3])?;
        model.forward(&x)?.sum_all()
    });
    for want in ["weight", "bias"] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from {names:?}"
        );
    }
}
