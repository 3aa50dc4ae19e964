//! What `train_llama` shows of itself (issue 57): `--tensorboard DIR` event files read back by
//! TensorBoard's own reader (the `tensorboard` package in `.venv`), the JSON-lines log beside
//! them, and the progress bar: drawn on a terminal (a pseudo-terminal by `script`), plain
//! lines on stderr otherwise.

use std::path::Path;
use std::process::Command;

use crate::llama_job::{command, parse_output, root, tmp};

/// Every scalar a logged step carries (`train/grad_norm` too: no ZeRO-1 here).
const TAGS: [&str; 13] = [
    "train/loss",
    "train/learning_rate",
    "train/grad_norm",
    "perf/tokens_per_s",
    "perf/step_time_ms",
    "memory/step_peak_mib",
    "memory/state_mib",
    "cache/hits",
    "cache/compiles",
    "checkpoint/saves",
    "checkpoint/write_ms",
    "checkpoint/blocked_ms",
    "val/loss",
];

/// `{tag: [[step, value], ...]}` of the event files in `dir`, by TensorBoard's reader.
fn read_events(dir: &Path) -> serde_json::Value {
    let python = neuron_pc_test_support::s3::repo_root().join(".venv/bin/python");
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
ea = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
ea.Reload()
print(json.dumps({t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]}))
"#;
    let out = Command::new(&python)
        .args(["-c", script, &dir.display().to_string()])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}; run scripts/setup", python.display()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn tensorboard_reads_every_scalar_of_every_logged_step() {
    let d = tmp("tensorboard");
    let (cache, tb, ck) = (d.join("cache"), d.join("tb"), d.join("ckpt"));
    let (tok, data) = (
        root().join("tests/data/llama-tok"),
        root().join("README.md"),
    );
    let val = root().join("docs/guide/llms.md");
    let ck_path = ck.clone();
    let (ck, tb_dir) = (ck.display().to_string(), tb.display().to_string());
    let (tok, data, val) = (
        tok.display().to_string(),
        data.display().to_string(),
        val.display().to_string(),
    );
    let args: Vec<&str> = vec![
        "--steps",
        "6",
        "--log-every",
        "2",
        "--peak-matmul",
        "0",
        "--loss-log",
        "--init-from",
        &tok,
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--data",
        &data,
        "--val-data",
        &val,
        "--val-every",
        "3",
        "--ckpt-dir",
        &ck,
        "--ckpt-every",
        "3",
        "--tensorboard",
        &tb_dir,
    ];
    let out = command(&cache, &args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let run = parse_output(out, &args);
    let losses = run.losses.clone();
    let events = read_events(&tb);
    for tag in TAGS {
        let points = events[tag]
            .as_array()
            .unwrap_or_else(|| panic!("no {tag}: {events}"));
        let steps: Vec<u64> = points.iter().map(|p| p[0].as_u64().unwrap()).collect();
        let want: &[u64] = match tag {
            "val/loss" => &[3, 6],
            _ => &[2, 4, 6],
        };
        assert_eq!(steps, want, "{tag}");
    }
    // the values are the run's: its losses (f32 in the event file), its learning rates
    for p in events["train/loss"].as_array().unwrap() {
        let step = p[0].as_u64().unwrap();
        let want = losses.iter().find(|(s, _)| *s == step).unwrap().1;
        assert!(
            (p[1].as_f64().unwrap() - want).abs() <= 1e-6 * want.abs(),
            "{p} {want}"
        );
    }
    let lr: Vec<f64> = events["train/learning_rate"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[1].as_f64().unwrap())
        .collect();
    // the default --lr 1e-2, warmed up and decayed
    assert!(lr.iter().all(|l| *l > 0.0 && *l <= 1e-2 * 1.0001), "{lr:?}");
    let norms = events["train/grad_norm"].as_array().unwrap();
    assert!(
        norms.iter().all(|p| p[1].as_f64().unwrap() > 0.0),
        "{norms:?}"
    );
    let saves = events["checkpoint/saves"].as_array().unwrap();
    // step 3's save is done by step 4's log at the latest (each save waits for the one before)
    assert_eq!(saves[0][1].as_f64(), Some(0.0), "{saves:?}");
    let compiles = events["cache/compiles"].as_array().unwrap();
    assert!(compiles[0][1].as_f64().unwrap() >= 1.0, "{compiles:?}");
    // the JSON-lines log holds the same steps and values
    let jsonl = std::fs::read_to_string(tb.join("metrics.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = jsonl
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let train: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l["train/loss"].is_f64()).collect();
    assert_eq!(train.len(), 3, "{jsonl}");
    for (line, p) in train.iter().zip(events["train/loss"].as_array().unwrap()) {
        assert_eq!(line["step"], p[0]);
        let (a, b) = (line["train/loss"].as_f64().unwrap(), p[1].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-6 * a.abs(), "{a} {b}");
    }
    // plain progress lines on stderr (no terminal here)
    assert!(
        stderr.contains("[train] step 2/6 | loss ") && stderr.contains("[train] step 6/6 | loss "),
        "{stderr}"
    );
    // each save said once it ended, with the bytes the metrics count
    let stdout = &run.stdout;
    let saved: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("checkpoint of step "))
        .collect();
    assert_eq!(saved.len(), 2, "{stdout}");
    assert!(
        saved[0].starts_with("checkpoint of step 3 saved: "),
        "{stdout}"
    );
    assert!(
        saved[1].starts_with("checkpoint of step 6 saved: "),
        "{stdout}"
    );
    let mib: f64 = saved
        .iter()
        .map(|l| {
            l.split(": ")
                .nth(1)
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .parse::<f64>()
                .unwrap()
        })
        .sum();
    // the tensor bytes said against the files' bytes, summed over both checkpoints
    let mut bytes = 0;
    for step in ["step-00000003", "step-00000006"] {
        for f in std::fs::read_dir(ck_path.join(step)).unwrap() {
            let f = f.unwrap();
            if f.file_name().to_string_lossy().ends_with(".safetensors") {
                bytes += f.metadata().unwrap().len();
            }
        }
    }
    let bytes = bytes as f64;
    // (within 3%: the files' headers, and the lines' rounding to 0.01 MiB)
    assert!(
        (mib * (1 << 20) as f64 - bytes).abs() <= 0.03 * bytes,
        "{mib} MiB, {bytes} B"
    );
    // a short corpus tokenizes without plain progress lines
    assert!(!stderr.contains("[tokenize"), "{stderr}");
    let _ = std::fs::remove_dir_all(d);
}

#[test]
fn the_progress_bar_draws_on_a_terminal() {
    let d = tmp("progress-tty");
    let cache = d.join("cache");
    // `script` runs the job on a pseudo-terminal and copies what it drew to stdout
    let (tok, data, ck) = (
        root().join("tests/data/llama-tok"),
        root().join("README.md"),
        d.join("ckpt"),
    );
    let (tok, data, ck) = (
        tok.display().to_string(),
        data.display().to_string(),
        ck.display().to_string(),
    );
    let args = [
        "--steps",
        "30",
        "--peak-matmul",
        "0",
        "--init-from",
        &tok,
        "--data",
        &data,
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--ckpt-dir",
        &ck,
        "--ckpt-every",
        "10",
        "--ckpt-shard-size",
        "50K",
    ];
    let mut job = command(&cache, &args);
    // each checkpoint file takes 200 ms more to write, so the bar shows the saves under way
    job.env("NEURON_PC_TEST_CKPT_DELAY_MS", "200");
    let mut line = vec![job.get_program().to_string_lossy().into_owned()];
    line.extend(job.get_args().map(|a| a.to_string_lossy().into_owned()));
    let mut s = Command::new("script");
    s.args(["-qfec", &line.join(" "), "/dev/null"]);
    for (k, v) in job.get_envs() {
        match v {
            Some(v) => s.env(k, v),
            None => s.env_remove(k),
        };
    }
    let out = s.output().unwrap();
    let drawn = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{drawn}");
    // the bar, redrawn in place (cursor movements), and no plain progress lines
    assert!(
        drawn.contains("train [") && drawn.contains("30/30"),
        "{drawn}"
    );
    // the tokenizing's bar, in bytes, drawn to the end (`[###...] 12.03 kB/12.03 kB`)
    let full = format!("tokenize README.md [{}] ", "#".repeat(30));
    let ended = drawn
        .split(&full)
        .nth(1)
        .unwrap_or_else(|| panic!("{drawn}"));
    let (done, total) = ended.split(" | ").next().unwrap().split_once('/').unwrap();
    assert!(done == total && total.ends_with("kB"), "{drawn}");
    // the saves: shown on the bar while written, then a line each
    assert!(drawn.contains("| checkpoint 10 "), "{drawn}");
    for step in [10, 20, 30] {
        assert!(
            drawn.contains(&format!("checkpoint of step {step} saved: ")),
            "{drawn}"
        );
    }
    assert!(drawn.contains("\u{1b}["), "{drawn}");
    assert!(!drawn.contains("[train] step"), "{drawn}");
    let _ = std::fs::remove_dir_all(d);
}
