//! The LLM example with the models and data users bring: each model family from its
//! directory, fine-tuning on JSON lines with the model's tokenizer (then `generate`), a data
//! run resumed on another device count, and pre-tokenized llm.c shards.

use std::path::{Path, PathBuf};
use std::process::Command;

use neuron_pc::models::llama::{LlamaConfig, LlamaForCausalLM};
use neuron_pc::state_dict::StateDict;
use neuron_pc::{DeviceConfig, LazyDevice};

use crate::llama_job;

use llama_job::{fails_with, job, root, run, tmp, SMALL};

/// Each family's `save_pretrained` directory (tests/llm/families.rs checks them against
/// transformers) trains here by its `model_type` and is saved as the same family; `--family`
/// builds a random one from the size flags.
#[test]
fn every_family_trains_from_its_directory_and_saves_as_itself() {
    let cache = tmp("families");
    let out = tmp("families-out");
    let dev = LazyDevice::new(DeviceConfig {
        cache: neuron_pc::compile::CacheConfig::disabled(),
        ..DeviceConfig::default()
    })
    .unwrap();
    for (case, family) in [
        ("llama3", "llama"),
        ("mistral", "mistral"),
        ("qwen2", "qwen2"),
        ("qwen3", "qwen3"),
    ] {
        let dir = root().join("tests/data/families").join(case);
        let saved = out.join(case);
        let r = run(
            &cache,
            &[
                "--init-from",
                dir.to_str().unwrap(),
                "--steps",
                "6",
                "--batch-size",
                "8",
                "--loss-log",
                "--peak-matmul",
                "0",
                "--save",
                saved.to_str().unwrap(),
            ],
        );
        // the parameters transformers stored (a tied head stores none)
        let stored = StateDict::load(&dir.join("model.safetensors")).unwrap();
        let count: usize = stored.tensors.values().map(|t| t.to_f64_vec().len()).sum();
        let banner = format!("{family}: {count} parameters");
        assert!(r.stdout.contains(&banner), "{case}: {}", r.stdout);
        assert_eq!(r.losses.len(), 6);
        assert!(
            (r.losses[0].1 - 128f64.ln()).abs() < 0.5,
            "{case}: {:?}",
            r.losses
        );
        let model = LlamaForCausalLM::from_pretrained(&dev, &saved).unwrap();
        let want = LlamaConfig::from_file(&dir.join("config.json")).unwrap();
        assert_eq!(model.config, want, "{case}");
        let text = std::fs::read_to_string(saved.join("config.json")).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["model_type"], family, "{case}");
    }
    let mut args = SMALL.to_vec();
    args.extend(["--family", "qwen3", "--steps", "2", "--peak-matmul", "0"]);
    let r = run(&cache, &args);
    assert!(r.stdout.contains("qwen3: "), "{}", r.stdout);
    fails_with(&cache, &["--family", "gemma2"], "--family gemma2");
    for d in [cache, out] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// The fine-tuning recipe of the README: a model directory with its tokenizer, JSON-lines
/// training and validation documents, packed with document masks, precompiled by
/// `neuron-pc compile` (the real run compiles nothing), saved with its tokenizer, and
/// `generate` on the result (precompiled too) printing decoded text.
#[test]
fn fine_tuning_on_json_lines_then_generate_compile_ahead_and_print_text() {
    let cache = tmp("finetune");
    let out = tmp("finetune-out");
    let docs = [
        r#"{"text": "The lazy device records every operation and compiles the step graph."}"#,
        r#"{"prompt": "Q: where do tensors stay?", "completion": " On the accelerator."}"#,
        r#"{"text": "A training loop marks a step; the cache keeps the executable."}"#,
    ];
    let train = out.join("train.jsonl");
    std::fs::write(&train, docs.repeat(8).join("\n")).unwrap();
    let val = out.join("val.jsonl");
    std::fs::write(&val, docs[..2].join("\n")).unwrap();
    let saved = out.join("tuned");
    let dir = root().join("tests/data/llama-tok");
    let args = |steps: &str| -> Vec<String> {
        [
            "--init-from",
            dir.to_str().unwrap(),
            "--data",
            train.to_str().unwrap(),
            "--val-data",
            val.to_str().unwrap(),
            "--val-every",
            "10",
            "--document-masks",
            "--seq-len",
            "32",
            "--batch-size",
            "4",
            "--peak-matmul",
            "0",
            "--loss-log",
            "--json",
            "--steps",
            steps,
            "--save",
            saved.to_str().unwrap(),
        ]
        .map(str::to_string)
        .to_vec()
    };
    let compile = |program: &Path, args: &[String]| {
        let out = Command::new(env!("CARGO_BIN_EXE_neuron-pc"))
            .args(["compile", "--json", "--"])
            .arg(program)
            .args(args)
            .env("NEURON_COMPILE_CACHE_URL", &cache)
            .env(neuron_pc::data::DATA_CACHE_ENV, cache.join("packed"))
            .env_remove("NEURON_CC_FLAGS")
            .env_remove("NEURON_PC_DEVICES")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    // the training step and the validation loss
    let report = compile(&job(), &args("2"));
    assert_eq!(report["compiled"], 2, "{report}");
    assert!(
        !saved.exists(),
        "a trial run writes no model and no tokenizer"
    );
    let a = args("30");
    let refs: Vec<&str> = a.iter().map(String::as_str).collect();
    let r = run(&cache, &refs);
    assert_eq!(r.metrics["compiles"], 0, "{}", r.metrics);
    // the trial run tokenized both files; the real run maps what it stored
    assert_eq!(
        r.stdout.matches("read from the packed-rows cache").count(),
        2,
        "{}",
        r.stdout
    );
    // each step's batch came from the loader, its wait counted
    assert_eq!(r.metrics["batches_loaded"], 30, "{}", r.metrics);
    assert!(r.metrics["batch_wait_ms"].as_f64().unwrap() >= 0.0);
    let val: Vec<f64> = r
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("{\"val_step\": "))
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(&format!("{{\"s\": {l}")).unwrap();
            v["val_loss"].as_f64().unwrap()
        })
        .collect();
    assert_eq!(val.len(), 3, "steps 10, 20, 30: {}", r.stdout);
    assert!(val[2] < val[0] - 1.0, "the validation loss falls: {val:?}");
    assert!(r.stdout.contains("perplexity"), "{}", r.stdout);
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(saved.join(file).exists(), "{file}");
    }

    let generate = job().with_file_name("generate");
    let gen_args: Vec<String> = [
        saved.to_str().unwrap(),
        "--prompt",
        "The lazy device",
        "--max-new-tokens",
        "12",
        "--buckets",
        "16",
        "--json",
    ]
    .map(str::to_string)
    .to_vec();
    let report = compile(&generate, &gen_args);
    assert_eq!(
        report["compiled"], 2,
        "a prefill and a decode graph: {report}"
    );
    let done = Command::new(&generate)
        .args(&gen_args)
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let metrics: serde_json::Value =
        serde_json::from_str(&stdout[stdout.find("\n{").unwrap()..]).unwrap();
    assert_eq!(metrics["compiles"], 0, "{metrics}");
    // the decoded continuation is the tokenizer's text of the printed tokens
    let first = stdout.lines().next().unwrap();
    let tokens = stdout.lines().nth(1).unwrap();
    let ids: Vec<i32> = tokens[tokens.find('[').unwrap() + 1..tokens.find(']').unwrap()]
        .split(", ")
        .map(|t| t.parse().unwrap())
        .collect();
    let tok = neuron_pc::data::Tokenizer::from_dir(&saved).unwrap();
    assert_eq!(
        first,
        format!("The lazy device{}", tok.decode(&ids, true).unwrap())
    );
    assert!(first.len() > "The lazy device".len() + 5, "{first}");
    for d in [cache, out] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// The data position of a `--data` run is its step: a run killed after a checkpoint and resumed
/// on another device count reads exactly the rows the uninterrupted run read (stream packing:
/// every row scores the same number of tokens, so the replicas' mean is the batch's mean).
#[test]
fn a_data_run_resumed_on_two_devices_continues_with_the_next_rows() {
    let cache = tmp("data-resume");
    let out = tmp("data-resume-out");
    let train = out.join("train.txt");
    let paragraphs = [
        "The lazy device records every operation and compiles the step graph.",
        "A training loop marks a step; the cache keeps the executable.",
        "Tensors stay on the accelerator until the host asks for a value.",
    ];
    std::fs::write(&train, paragraphs.repeat(10).join("\n\n")).unwrap();
    let dir = root().join("tests/data/llama-tok");
    let ckpt = out.join("ckpt");
    let args = |extra: &[&str]| -> Vec<String> {
        let base = [
            "--init-from",
            dir.to_str().unwrap(),
            "--data",
            train.to_str().unwrap(),
            "--seq-len",
            "24",
            "--batch-size",
            "4",
            "--peak-matmul",
            "0",
            "--loss-log",
        ];
        base.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let go = |extra: &[&str]| {
        let a = args(extra);
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        run(&cache, &refs)
    };
    let straight = go(&["--steps", "8"]);
    let c = ckpt.to_str().unwrap();
    let first = go(&["--steps", "4", "--ckpt-dir", c, "--ckpt-every", "2"]);
    assert_eq!(first.losses, straight.losses[..4]);
    let resumed = go(&[
        "--steps",
        "8",
        "--ckpt-dir",
        c,
        "--resume",
        "--devices",
        "2",
    ]);
    assert!(
        resumed.stdout.contains("resumed from"),
        "{}",
        resumed.stdout
    );
    assert_eq!(resumed.losses.len(), 4);
    for ((s, a), (_, b)) in resumed.losses.iter().zip(&straight.losses[4..]) {
        assert!((a - b).abs() <= 1e-4 * b.abs(), "step {s}: {a} vs {b}");
    }
    for d in [cache, out] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// A pre-tokenized llm.c shard trains as rows of the stream (here one written in the tiny
/// tokenizer's range), validates on another, and a token past the model's vocabulary is one
/// error before any step.
#[test]
fn an_llm_c_shard_trains_and_validates_and_out_of_vocabulary_ids_are_refused() {
    let cache = tmp("shard");
    let out = tmp("shard-out");
    let shard = |name: &str, tokens: &[u16]| -> PathBuf {
        let mut header = vec![0i32; 256];
        (header[0], header[1], header[2]) = (20240520, 1, tokens.len() as i32);
        let mut bytes: Vec<u8> = header.iter().flat_map(|w| w.to_le_bytes()).collect();
        bytes.extend(tokens.iter().flat_map(|t| t.to_le_bytes()));
        let path = out.join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    };
    let stream: Vec<u16> = (0..2400).map(|i| 40 + (i % 60) as u16).collect();
    let train = shard("train.bin", &stream);
    let val = shard("val.bin", &stream[..320]);
    let dir = root().join("tests/data/llama-tok");
    let r = run(
        &cache,
        &[
            "--init-from",
            dir.to_str().unwrap(),
            "--data",
            train.to_str().unwrap(),
            "--val-data",
            val.to_str().unwrap(),
            "--seq-len",
            "32",
            "--batch-size",
            "4",
            "--steps",
            "30",
            "--peak-matmul",
            "0",
            "--loss-log",
        ],
    );
    assert!(
        r.stdout.contains("2400 tokens, 75 rows of 32"),
        "{}",
        r.stdout
    );
    assert!(r.losses[29].1 < r.losses[0].1 - 2.0, "{:?}", r.losses);
    assert!(r.stdout.contains("val loss"), "{}", r.stdout);
    let gpt2 = root().join("tests/data/shards/gpt2.bin");
    fails_with(
        &cache,
        &[
            "--init-from",
            dir.to_str().unwrap(),
            "--data",
            gpt2.to_str().unwrap(),
        ],
        "outside the model's vocabulary of 384",
    );
    for d in [cache, out] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// `--data` reads the files `datasets` and `pyarrow` wrote (scripts/fixtures/datasets_formats.py):
/// a `save_to_disk` directory, a Parquet file and the same documents as JSON lines train to the
/// same losses, and validate on Parquet.
#[test]
fn save_to_disk_parquet_and_json_lines_of_the_same_documents_train_alike() {
    let cache = tmp("datasets");
    let out = tmp("datasets-out");
    let fixtures = root().join("tests/data/datasets");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures.join("expected.json")).unwrap())
            .unwrap();
    let jsonl = out.join("docs.jsonl");
    let lines: Vec<String> = expected["text"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string())
        .collect();
    std::fs::write(&jsonl, lines.join("\n")).unwrap();
    let dir = root().join("tests/data/llama-tok");
    let val = fixtures.join("hub");
    let train = |data: &Path| {
        let args = [
            "--init-from",
            dir.to_str().unwrap(),
            "--data",
            data.to_str().unwrap(),
            "--val-data",
            val.to_str().unwrap(),
            "--seq-len",
            "24",
            "--batch-size",
            "4",
            "--steps",
            "3",
            "--peak-matmul",
            "0",
            "--loss-log",
        ];
        run(&cache, &args)
    };
    let json = train(&jsonl);
    assert_eq!(json.losses.len(), 3, "{}", json.stdout);
    assert!(json.stdout.contains("val_loss"), "{}", json.stdout);
    for data in [fixtures.join("text-arrow"), fixtures.join("text.parquet")] {
        let r = train(&data);
        assert_eq!(r.losses, json.losses, "{}", data.display());
    }
    for d in [cache, out] {
        std::fs::remove_dir_all(d).unwrap();
    }
}
