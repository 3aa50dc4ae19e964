//! The LLM example (`examples/train_llama/main.rs`) end to end, as a user runs it: it learns the
//! synthetic reversal task, runs under `neuron-pc compile` so that the real run compiles
//! nothing, starts from and saves `save_pretrained` directories, resumes, trains data-parallel
//! and on the bytes of a file, and reports bad input as one clear line.

use std::process::Command;

use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM};
use neuron_pc::nn::Module;
use neuron_pc::state::Checkpoints;
use neuron_pc::{DType, DeviceConfig, LazyDevice};

use crate::llama_job;

use llama_job::{
    command, fails_with, job, mean, precompile, root, run, run_command, tmp, Run, SMALL,
};

#[test]
fn the_default_task_is_learned_and_throughput_and_mfu_are_reported() {
    let cache = tmp("learn");
    let r = run(
        &cache,
        &["--steps", "300", "--loss-log", "--peak-matmul", "256"],
    );
    assert_eq!(r.losses.len(), 300);
    // the answer half of the sequences: ln(16) = 2.77 for a model that has learned only the
    // alphabet, near 0 for one that reverses
    let (first, last) = (mean(&r.losses[..5]), mean(&r.losses[295..]));
    assert!(first > 2.6, "initial loss {first}");
    assert!(last < 0.8, "loss after 300 steps {last}");
    assert!(r.stdout.contains("tokens/s (after step 1)"), "{}", r.stdout);
    let mfu = r
        .stdout
        .split("model FLOPs utilisation ")
        .nth(1)
        .and_then(|s| s.split('%').next())
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no MFU line: {}", r.stdout));
    // no upper bound: tests run side by side on shared cores, so the peak measured at the start
    // and the steps timed later need not see the same load
    assert!(mfu > 0.0 && mfu.is_finite(), "MFU {mfu}%");
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn after_neuron_pc_compile_a_real_run_compiles_nothing_and_matches_jit() {
    let cache = tmp("aot-cache");
    let saved = tmp("aot-save").join("model");
    let report = precompile(&cache, &["--steps", "3", "--save", saved.to_str().unwrap()]);
    // the training step and the matmul that measures the peak
    assert_eq!(report["compiled"], 2, "{report}");
    assert!(!saved.exists(), "a trial run writes no model");

    let mut args = SMALL.to_vec();
    args.extend(["--steps", "20", "--loss-log", "--json"]);
    let real = run(&cache, &args);
    assert_eq!(real.metrics["compiles"], 0, "{}", real.metrics);
    assert_eq!(real.metrics["disk_hits"], 2, "{}", real.metrics);
    let jit_cache = tmp("jit-cache");
    let jit = run(&jit_cache, &args);
    assert_eq!(jit.metrics["compiles"], 2, "{}", jit.metrics);
    assert_eq!(real.losses.len(), 20);
    assert_eq!(real.losses, jit.losses);
    for d in [cache, jit_cache, saved.parent().unwrap().to_path_buf()] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// `--scan-layers`: precompiled by `neuron-pc compile`, the real run compiles nothing, and it
/// trains as the unrolled model does (float32, 10 steps: the same losses within 1e-5).
#[test]
fn scanned_layers_precompile_and_train_as_the_unrolled_model() {
    let cache = tmp("scan-cache");
    let model = ["--layers", "4", "--peak-matmul", "0"];
    let mut trial = model.to_vec();
    trial.extend(["--steps", "3", "--scan-layers"]);
    let report = precompile(&cache, &trial);
    assert_eq!(report["compiled"], 1, "{report}");
    let mut args = SMALL.to_vec();
    args.extend(model);
    args.extend(["--steps", "10", "--loss-log", "--json"]);
    let mut scanned = args.clone();
    scanned.push("--scan-layers");
    let real = run(&cache, &scanned);
    assert!(
        real.stdout.contains("4 layers (scanned)"),
        "{}",
        real.stdout
    );
    assert_eq!(real.metrics["compiles"], 0, "{}", real.metrics);
    assert_eq!(real.metrics["disk_hits"], 1, "{}", real.metrics);
    let unrolled_cache = tmp("unrolled-cache");
    let unrolled = run(&unrolled_cache, &args);
    assert_eq!(real.losses.len(), 10);
    for ((_, a), (_, b)) in real.losses.iter().zip(&unrolled.losses) {
        assert!((a - b).abs() <= 1e-5 * b, "scanned {a} vs unrolled {b}");
    }
    for d in [cache, unrolled_cache] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// `--step-fn`: the step traced on its first calls, then replayed without tracing, trains as
/// the traced loop does (the same losses, bit for bit); it takes no `--grad-accum`.
#[test]
fn a_step_function_trains_as_the_traced_loop() {
    let cache = tmp("step-fn");
    let mut args = SMALL.to_vec();
    args.extend([
        "--layers",
        "2",
        "--peak-matmul",
        "0",
        "--steps",
        "8",
        "--loss-log",
    ]);
    let traced = run(&cache, &args);
    let mut replayed_args = args.clone();
    replayed_args.push("--step-fn");
    let replayed = run(&cache, &replayed_args);
    assert!(
        replayed.stdout.contains("step function: replayed"),
        "{}",
        replayed.stdout
    );
    assert_eq!(replayed.losses.len(), 8);
    assert_eq!(replayed.losses, traced.losses);
    replayed_args.extend(["--grad-accum", "2"]);
    fails_with(
        &cache,
        &replayed_args,
        "--step-fn runs one update per batch",
    );
    std::fs::remove_dir_all(&cache).unwrap();
}

/// `NEURON_CC_FLAGS=--auto-cast` does not enter loop bodies: with scanned layers the run says
/// so, once; unrolled it has nothing to say.
#[test]
fn auto_cast_says_once_that_it_leaves_scanned_layers_alone() {
    let cache = tmp("autocast-scan");
    let stderr = |extra: &[&str]| -> String {
        let mut args = SMALL.to_vec();
        args.extend(["--layers", "2", "--steps", "3", "--peak-matmul", "0"]);
        args.extend(extra);
        let out = command(&cache, &args)
            .env("NEURON_CC_FLAGS", "--auto-cast=matmult")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    let warning = "--auto-cast does not reach inside loops";
    let scanned = stderr(&["--scan-layers"]);
    assert_eq!(scanned.matches(warning).count(), 1, "{scanned}");
    let unrolled = stderr(&[]);
    assert!(!unrolled.contains(warning), "{unrolled}");
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn starts_from_a_save_pretrained_directory_saves_one_and_resumes() {
    let cache = tmp("hf");
    let out = tmp("hf-out");
    let tiny = root().join("tests/data/llama-tiny");
    let saved = out.join("saved");
    let ckpt = out.join("ckpt");
    let base = [
        "--init-from",
        tiny.to_str().unwrap(),
        "--batch-size",
        "8",
        "--loss-log",
        "--peak-matmul",
        "0",
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let straight = with(&["--steps", "12", "--save", saved.to_str().unwrap()]);
    let straight: Vec<&str> = straight.iter().map(String::as_str).collect();
    let a = run(&cache, &straight);
    assert_eq!(a.losses.len(), 12);
    // tests/data/llama-tiny's vocabulary is 128 and its loss starts near ln(128) = 4.85
    assert!(
        (a.losses[0].1 - 128f64.ln()).abs() < 0.3,
        "{:?}",
        a.losses[0]
    );

    // the saved directory is the trained model, in transformers' layout
    let dev = LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        ..DeviceConfig::default()
    })
    .unwrap();
    let model = LlamaForCausalLM::from_pretrained(&dev, &saved).unwrap();
    let want = LlamaConfig::from_file(&tiny.join("config.json")).unwrap();
    assert_eq!(model.config, want);
    // the same run wrote the committed tests/data/llama-saved-by-example, which
    // `scripts/fixtures/llama.py --check` loaded with transformers (tests/llm/llama.rs compares
    // its logits): this run's directory holds the same tensors
    let committed = neuron_pc::state_dict::StateDict::load(
        &root().join("tests/data/llama-saved-by-example/model.safetensors"),
    )
    .unwrap();
    let written = neuron_pc::state_dict::StateDict::load(&saved.join("model.safetensors")).unwrap();
    assert_eq!(
        written.tensors.keys().collect::<Vec<_>>(),
        committed.tensors.keys().collect::<Vec<_>>()
    );
    for (name, t) in &written.tensors {
        let (a, b) = (t.to_f64_vec(), committed.tensors[name].to_f64_vec());
        let d = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f64::max);
        assert!(
            d < 1e-4,
            "{name}: max |diff| {d:e} from the committed directory"
        );
    }
    let before = LlamaForCausalLM::from_pretrained(&dev, &tiny).unwrap();
    let (p, q) = (&model.parameters()[1].1, &before.parameters()[1].1);
    let moved = p.sub(q).unwrap().abs().unwrap().mean_all().unwrap();
    dev.mark_step().unwrap();
    assert!(moved.item().unwrap() > 1e-3, "12 steps moved the weights");

    // 6 steps with checkpoints, then a resumed run to 12: the same losses as straight through
    let ckpt_args = ["--ckpt-dir", ckpt.to_str().unwrap(), "--ckpt-every", "3"];
    let first = with(&[&["--steps", "6"][..], &ckpt_args].concat());
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    assert_eq!(run(&cache, &first).losses, a.losses[..6]);
    let second = with(&[&["--steps", "12", "--resume"][..], &ckpt_args].concat());
    let second: Vec<&str> = second.iter().map(String::as_str).collect();
    let b = run(&cache, &second);
    assert!(b.stdout.contains("resumed from"), "{}", b.stdout);
    assert_eq!(b.losses, a.losses[6..]);

    // bf16 saving
    let bf16 = out.join("bf16");
    let args = with(&[
        "--steps",
        "1",
        "--save",
        bf16.to_str().unwrap(),
        "--save-dtype",
        "bf16",
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run(&cache, &args);
    let model = LlamaForCausalLM::from_pretrained(&dev, &bf16).unwrap();
    assert_eq!(model.config.dtype, DType::BF16);
    assert_eq!(model.parameters()[0].1.dtype(), DType::BF16);
    for d in [cache, out] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

#[test]
fn trains_data_parallel_and_on_the_bytes_of_a_file() {
    let cache = tmp("dp");
    let mut args = SMALL.to_vec();
    args.extend(["--steps", "10", "--loss-log", "--peak-matmul", "0"]);
    let one = run(&cache, &args);
    args.extend(["--devices", "2"]);
    let two = run(&cache, &args);
    assert!(
        two.stdout
            .contains("data-parallel: 2 replica(s), global batch 16 x 24 tokens, 8"),
        "{}",
        two.stdout
    );
    // the same global batches (every row scores the same number of tokens, so the mean of the
    // replicas' means is the global mean): the same losses up to float reassociation
    assert_eq!(two.losses.len(), 10);
    for ((s, a), (_, b)) in two.losses.iter().zip(&one.losses) {
        assert!((a - b).abs() <= 1e-4 * b.abs(), "step {s}: {a} vs {b}");
    }

    let readme = root().join("README.md");
    let mut args = SMALL.to_vec();
    args.extend([
        "--text",
        readme.to_str().unwrap(),
        "--steps",
        "40",
        "--loss-log",
    ]);
    args.extend(["--peak-matmul", "0", "--seq-len", "32"]);
    let text = run(&cache, &args);
    let (first, last) = (mean(&text.losses[..3]), mean(&text.losses[37..]));
    assert!(
        (first - 256f64.ln()).abs() < 0.5,
        "byte-level loss starts near ln 256: {first}"
    );
    assert!(
        last < first - 1.5,
        "it learns byte statistics: {first} -> {last}"
    );
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn bad_input_is_one_clear_error() {
    let cache = tmp("bad");
    let small = ["--steps", "1", "--peak-matmul", "0"];
    let with = |extra: &[&str]| -> Vec<String> {
        small.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let tiny = root().join("tests/data/llama-tiny");
    let readme = root().join("README.md");
    for (extra, needle) in [
        (
            vec!["--config", "/nonexistent/config.json"],
            "/nonexistent/config.json",
        ),
        (vec!["--init-from", "/nonexistent/dir"], "/nonexistent/dir"),
        (
            vec![
                "--init-from",
                tiny.to_str().unwrap(),
                "--text",
                readme.to_str().unwrap(),
            ],
            "vocabulary of at least 256",
        ),
        (
            vec!["--heads", "4", "--kv-heads", "3"],
            "`num_key_value_heads`",
        ),
        (vec!["--save-dtype", "f8"], "--save-dtype"),
        (
            vec!["--init-from", tiny.to_str().unwrap(), "--hidden", "64"],
            "cannot be used with",
        ),
        (
            vec!["--batch-size", "5", "--devices", "2"],
            "does not split over 2 replica(s)",
        ),
        (
            vec!["--batch-size", "16", "--fsdp", "3"],
            "--batch-size 16 does not split over --fsdp 3: use a multiple of 3",
        ),
        (
            vec!["--fsdp", "2", "--zero1"],
            "--zero1 with --fsdp/--tp shards AdamW's moments over the processes of a \
             multi-process launch",
        ),
        (
            vec!["--tp", "2", "--devices", "2"],
            "its data axis replaces --devices",
        ),
        (vec!["--tp", "0"], "each needs at least 1 device"),
        (
            vec!["--remat", "all"],
            "checkpoint policy \"all\": use none, full or dots",
        ),
        (
            vec!["--precision", "fp8"],
            "'--precision <PRECISION>': precision \"fp8\": use f32 or bf16",
        ),
        (
            vec!["--text", "/nonexistent/corpus.txt"],
            "/nonexistent/corpus.txt",
        ),
    ] {
        let args = with(&extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&cache, &args, needle);
    }
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn the_guide_fine_tuning_example_is_quoted_verbatim_and_runs() {
    let guide = std::fs::read_to_string(root().join("docs/guide/llms.md")).unwrap();
    let example = std::fs::read_to_string(root().join("examples/llama_finetune.rs")).unwrap();
    assert!(
        guide.contains(&format!("```rust\n{example}```\n")),
        "docs/guide/llms.md must quote examples/llama_finetune.rs verbatim in a rust block"
    );
    let bin = job().with_file_name("llama_finetune");
    assert!(bin.exists(), "run `cargo build --examples` first");
    let cache = tmp("finetune");
    let out_dir = cache.join("out");
    let out = Command::new(&bin)
        .args([root().join("tests/data/llama-tiny"), out_dir.clone()])
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let loss = |line: &str| -> f64 { line.rsplit(' ').next().unwrap().parse().unwrap() };
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 20, "{stdout}");
    assert!(loss(lines[19]) < loss(lines[0]) - 1.0, "{stdout}");
    let dev = LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        ..DeviceConfig::default()
    })
    .unwrap();
    let model = LlamaForCausalLM::from_pretrained(&dev, &out_dir).unwrap();
    assert_eq!(model.config.dtype, DType::BF16);
    let usage = Command::new(&bin).output().unwrap();
    assert!(!usage.status.success());
    assert!(String::from_utf8_lossy(&usage.stderr).contains("usage: llama_finetune"));
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn a_config_json_gives_a_random_model_of_its_size() {
    let cache = tmp("config");
    let config = root().join("tests/data/llama-tiny/config.json");
    let r = run(
        &cache,
        &[
            "--config",
            config.to_str().unwrap(),
            "--steps",
            "3",
            "--loss-log",
        ],
    );
    // transformers counts 23712 parameters for this config (untied head)
    assert!(
        r.stdout
            .contains("llama: 23712 parameters, 2 layers, hidden 32, 4 heads over 2 kv heads"),
        "{}",
        r.stdout
    );
    // random weights with the config's initializer range (0.05): the loss starts near ln(128)
    assert_eq!(r.losses.len(), 3);
    assert!((r.losses[0].1 - 128f64.ln()).abs() < 0.3, "{:?}", r.losses);
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn accumulation_zero1_and_buckets_train_as_the_plain_run_and_compile_ahead() {
    let cache = tmp("levers");
    let base = [SMALL, &["--steps", "8", "--loss-log"]].concat();
    let plain = run(&cache, &base);
    assert_eq!(plain.losses.len(), 8);
    let close = |other: &Run, tol: f64, what: &str| {
        assert_eq!(other.losses.len(), plain.losses.len(), "{what}");
        for ((s, a), (_, b)) in other.losses.iter().zip(&plain.losses) {
            assert!(
                (a - b).abs() <= tol * b.abs(),
                "{what} step {s}: {a} vs {b}"
            );
        }
    };
    // 4 micro-batches of 4 sequences: the update of one batch of 16
    let accumulated = run(
        &cache,
        &[&base[..], &["--grad-accum", "4", "--json"]].concat(),
    );
    close(&accumulated, 1e-5, "--grad-accum 4");
    // the micro-batch graph, the update graph and the peak-measuring matmul
    assert_eq!(accumulated.metrics["compiles"], 3);
    // ZeRO-1 over two replicas, with and without accumulation
    let zero1 = run(
        &cache,
        &[&base[..], &["--zero1", "--devices", "2", "--json"]].concat(),
    );
    close(&zero1, 1e-4, "--zero1 --devices 2");
    let both = [
        &base[..],
        &["--zero1", "--devices", "2", "--grad-accum", "2"],
    ]
    .concat();
    close(
        &run(&cache, &both),
        1e-4,
        "--zero1 --devices 2 --grad-accum 2",
    );
    let plain_dp = run(&cache, &[&base[..], &["--devices", "2", "--json"]].concat());
    let (z, p) = (
        zero1.metrics["optimizer_state_bytes"].as_u64().unwrap(),
        plain_dp.metrics["optimizer_state_bytes"].as_u64().unwrap(),
    );
    assert!(
        z * 2 >= p && z * 2 < p + 1024,
        "zero1 {z} vs plain {p} bytes per replica"
    );
    // Length buckets with accumulation: the trial visits every bucket's micro-batch and update
    // graphs, so the real run compiles nothing.
    let bucketed = [SMALL, &["--buckets", "8,16,24", "--grad-accum", "2"]].concat();
    let job = job();
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .args(["compile", "--json", "--", job.to_str().unwrap()])
        .args(&bucketed)
        .args(["--steps", "3"])
        .env("NEURON_COMPILE_CACHE_URL", cache.join("b"))
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_DEVICES")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // 3 buckets x (micro-batch, update), and the peak matmul
    assert_eq!(report["compiled"], 7, "{report}");
    let real = run(
        &cache.join("b"),
        &[&bucketed[..], &["--steps", "12", "--json"]].concat(),
    );
    assert_eq!(real.metrics["compiles"], 0, "{}", real.metrics);
    assert!(real.losses.iter().all(|(_, l)| l.is_finite()));
    std::fs::remove_dir_all(&cache).unwrap();
}

/// Losses within 1e-5 relative of `want`'s, step by step.
fn same_losses(what: &str, got: &[(u64, f64)], want: &[(u64, f64)]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for ((s, g), (_, w)) in got.iter().zip(want) {
        assert!(((g - w) / w).abs() <= 1e-5, "{what}: step {s}: {g} vs {w}");
    }
}

#[test]
fn fsdp_and_tp_precompile_follow_one_device_and_resume_on_any_mesh() {
    let cache = tmp("mesh-cache");
    let ckpt = tmp("mesh-ckpt");
    let mesh = ["--fsdp", "2", "--tp", "2"];
    let report = precompile(&cache, &[&mesh[..], &["--steps", "3"]].concat());
    // the partitioned training step and the matmul that measures the peak
    assert_eq!(report["compiled"], 2, "{report}");

    // the real run on the mesh compiles nothing, checkpointing at step 6
    let ckpt_args = ["--ckpt-dir", ckpt.to_str().unwrap(), "--ckpt-every", "6"];
    fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let mut a: Vec<&str> = SMALL.to_vec();
        a.extend(["--loss-log", "--json"]);
        a.extend(extra);
        a
    }
    let meshed = run(
        &cache,
        &args(&[&mesh[..], &["--steps", "6"], &ckpt_args].concat()),
    );
    assert_eq!(meshed.metrics["compiles"], 0, "{}", meshed.metrics);
    assert_eq!(meshed.metrics["partitions"], 4, "{}", meshed.metrics);

    // a sharded parameter is saved as its blocks, never gathered on the host
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("step-00000006/manifest.json")).unwrap())
            .unwrap();
    let up = &manifest["tensors"]["model.layers.0.mlp.up_proj.weight"];
    let chunks = up["chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), 4, "{up}");
    assert!(
        chunks.iter().all(|c| c["block"]["shape"].is_array()),
        "{up}"
    );

    // one device, straight through 12 steps: the reference
    let one_cache = tmp("mesh-one");
    let one = run(&one_cache, &args(&["--steps", "12"]));
    same_losses("fsdp 2 x tp 2", &meshed.losses, &one.losses[..6]);
    // the checkpoint written on (data 2, model 2) resumes at (data 4), at (model 4) and on one
    // device, each continuing as the uninterrupted run did
    for layout in [&["--fsdp", "4"][..], &["--tp", "4"], &[]] {
        let dir = tmp("mesh-resume");
        let saved = ckpt.join("step-00000006");
        std::fs::create_dir_all(dir.join("step-00000006")).unwrap();
        for f in std::fs::read_dir(&saved).unwrap() {
            let f = f.unwrap().path();
            let to = dir.join("step-00000006").join(f.file_name().unwrap());
            std::fs::copy(&f, to).unwrap();
        }
        let resume = [
            "--ckpt-dir",
            dir.to_str().unwrap(),
            "--resume",
            "--steps",
            "12",
        ];
        let r = run(&cache, &args(&[layout, &resume[..]].concat()));
        assert!(r.stdout.contains("resumed from"), "{}", r.stdout);
        same_losses(
            &format!("resumed at {layout:?}"),
            &r.losses,
            &one.losses[6..],
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
    for d in [cache, ckpt, one_cache] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// `--precision bf16` (autocast over float32 master weights) follows the float32 run of the
/// synthetic task within 2% (the mean loss of every window of 20 steps over 200 steps), and
/// `--remat full --loss-chunk` changes nothing but memory: the float32 losses, with
/// smaller step temporaries.
#[test]
fn bf16_follows_f32_and_checkpointing_changes_only_memory() {
    let cache = tmp("memory");
    let common = [
        "--steps",
        "200",
        "--batch-size",
        "8",
        "--peak-matmul",
        "0",
        "--loss-log",
        "--json",
    ];
    // At XLA's default backend optimization level, the level this band was set at: bf16's lag
    // behind float32 grows over the run (1.5% in the last window), and the tests' level 0
    // (scripts/test) rounds the chaotic little run elsewhere, to 2.3%.
    let go = |extra: &[&str]| -> Run {
        let args: Vec<&str> = common.iter().chain(extra).copied().collect();
        let mut c = command(&cache, &args);
        c.env_remove("XLA_FLAGS");
        run_command(c, &args)
    };
    let f32_run = go(&[]);
    let ckpt = tmp("bf16-ckpt");
    let bf16_run = go(&[
        "--precision",
        "bf16",
        "--ckpt-dir",
        ckpt.to_str().unwrap(),
        "--ckpt-every",
        "0",
    ]);
    // the checkpoint holds the float32 master weights and moments, under PyTorch's names
    let ckpts = Checkpoints::open(ckpt.to_str().unwrap(), Default::default()).unwrap();
    let saved = ckpts.list().unwrap();
    assert_eq!(saved.iter().map(|c| c.step).collect::<Vec<_>>(), [200]);
    let sd = ckpts.load(&saved[0]).unwrap();
    for name in [
        "model.layers.0.mlp.down_proj.weight",
        "optimizer.model.layers.0.mlp.down_proj.weight.exp_avg",
        "optimizer.model.layers.0.mlp.down_proj.weight.exp_avg_sq",
    ] {
        let t = sd.tensors.get(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(t.dtype(), DType::F32, "{name}");
    }
    std::fs::remove_dir_all(&ckpt).unwrap();
    let remat = go(&["--remat", "full", "--loss-chunk", "40"]);
    assert_eq!(f32_run.losses.len(), 200);
    for (a, b) in f32_run.losses.chunks(20).zip(bf16_run.losses.chunks(20)) {
        let (fa, fb) = (mean(a), mean(b));
        assert!(
            (fa - fb).abs() <= 0.02 * fa,
            "steps {}..: f32 {fa} vs bf16 {fb}",
            a[0].0
        );
    }
    let last = mean(&f32_run.losses[180..]);
    assert!(
        last < 0.95 * mean(&f32_run.losses[..20]),
        "it learns: {last}"
    );
    // the same up to the chunks' summation order, which 200 steps of this chaotic little run
    // amplify (0.3% by the end): close over the first 30 steps, and window by window after
    for ((_, a), (_, b)) in f32_run.losses.iter().zip(&remat.losses).take(30) {
        assert!((a - b).abs() <= 1e-4 * a, "remat: {b} vs {a}");
    }
    for (a, b) in f32_run.losses.chunks(20).zip(remat.losses.chunks(20)) {
        let (fa, fb) = (mean(a), mean(b));
        assert!(
            (fa - fb).abs() <= 0.01 * fa,
            "steps {}..: f32 {fa} vs remat {fb}",
            a[0].0
        );
    }
    let temp = |r: &Run| r.metrics["step_temp_bytes"].as_u64().unwrap();
    assert!(
        temp(&remat) < temp(&f32_run),
        "remat temporaries {} vs {}",
        temp(&remat),
        temp(&f32_run)
    );
    std::fs::remove_dir_all(&cache).unwrap();
}
