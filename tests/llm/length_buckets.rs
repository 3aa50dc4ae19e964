//! Length buckets: a stream of random sequence lengths compiles at most one step graph per
//! bucket, the trial run of `neuron-pc compile` visits every bucket so the real run compiles
//! nothing, and padding never counts in the loss.

use std::path::{Path, PathBuf};
use std::process::Command;

use neuron_pc::compile::CacheConfig;
use neuron_pc::data::{DeviceLoader, LastBatch, LengthBuckets};
use neuron_pc::nn::cross_entropy;
use neuron_pc::{DeviceConfig, HostTensor, LazyDevice};

fn probe() -> PathBuf {
    neuron_pc_test_support::paths::example_binary(env!("CARGO_BIN_EXE_neuron-pc"), "bucket_probe")
}

fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_dir("npc-buckets", tag)
}

struct Run {
    lengths: Vec<u64>,
    tokens: Vec<u64>,
    metrics: serde_json::Value,
}

fn run(cache: &Path, args: &[&str]) -> Run {
    let out = Command::new(probe())
        .args(args)
        .arg("--json")
        .env("NEURON_COMPILE_CACHE_URL", cache)
        .env_remove("NEURON_CC_FLAGS")
        .env_remove("NEURON_PC_EXTRACT_DIR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut r = Run {
        lengths: Vec::new(),
        tokens: Vec::new(),
        metrics: serde_json::Value::Null,
    };
    for line in stdout.lines() {
        if let Some(m) = line.strip_prefix("METRICS ") {
            r.metrics = serde_json::from_str(m).unwrap();
        } else if line.starts_with("{\"step\"") {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(v["loss"].as_f64().unwrap().is_finite(), "{line}");
            r.lengths.push(v["length"].as_u64().unwrap());
            r.tokens.push(v["tokens"].as_u64().unwrap());
        }
    }
    r
}

fn distinct(v: &[u64]) -> usize {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

#[test]
fn a_stream_of_random_lengths_compiles_at_most_one_graph_per_bucket() {
    let cache = tmp("stream");
    let bucketed = run(
        &cache.join("a"),
        &["--buckets", "16,32,64", "--steps", "24"],
    );
    assert_eq!(bucketed.lengths.len(), 24);
    assert!(bucketed.lengths.iter().all(|l| [16, 32, 64].contains(l)));
    let used = distinct(&bucketed.lengths);
    assert!(
        used >= 2,
        "the stream should reach several buckets: {:?}",
        bucketed.lengths
    );
    assert_eq!(bucketed.metrics["compiles"], used as u64);
    // real tokens: at most 8 full rows, at least 2 per row
    for (t, l) in bucketed.tokens.iter().zip(&bucketed.lengths) {
        assert!(
            (16..=8 * l).contains(t),
            "{t} tokens in a batch of length {l}"
        );
    }
    // The same stream without buckets: one graph per distinct longest length.
    let ragged = run(&cache.join("b"), &["--max-len", "64", "--steps", "24"]);
    assert_eq!(ragged.tokens, bucketed.tokens, "the same data");
    let lengths = distinct(&ragged.lengths);
    assert_eq!(ragged.metrics["compiles"], lengths as u64);
    assert!(lengths > used + 4, "{lengths} lengths vs {used} buckets");
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn the_trial_run_visits_every_bucket_so_the_real_run_compiles_nothing() {
    let cache = tmp("trial");
    let probe = probe();
    // 4 steps: as many as there are buckets, whatever lengths the data starts with.
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .args(["compile", "--json", "--", probe.to_str().unwrap()])
        .args(["--buckets", "16,32,64,128", "--steps", "4"])
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .env_remove("NEURON_CC_FLAGS")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("visit every length bucket"), "{stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["compiled"], 4, "{report}");
    let real = run(&cache, &["--buckets", "16,32,64,128", "--steps", "30"]);
    assert_eq!(real.metrics["compiles"], 0, "{}", real.metrics);
    assert_eq!(real.metrics["disk_hits"], distinct(&real.lengths) as u64);
    std::fs::remove_dir_all(&cache).unwrap();
}

#[test]
fn padded_rows_and_positions_never_count_in_the_loss() {
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        ..DeviceConfig::default()
    })
    .unwrap();
    let buckets = LengthBuckets::new([4, 8]).unwrap();
    // 3 sequences in a batch of 4 rows: the last row and the tails are padding
    let stream = vec![vec![vec![1, 2, 3], vec![4, 5, 6, 7, 0, 1], vec![2, 3]]];
    let batches = buckets.batches(stream, 4, 0);
    let mut loader = DeviceLoader::for_tokens(&dev, batches, 4, LastBatch::Pad, 1);
    let batch = loader.next().unwrap().unwrap();
    assert!(loader.next().is_none());
    assert_eq!((batch.valid, batch.tokens), (3, Some(11)));
    let labels = &batch.tensors[2];
    assert_eq!(labels.dims(), &[4, 8]);
    let l = labels.to_vec::<i32>().unwrap();
    assert!(l[24..].iter().all(|&x| x == -100), "{l:?}");
    assert_eq!(&l[..8], &[1, 2, 3, -100, -100, -100, -100, -100]);
    // The loss over the padded batch is the loss over the 11 real tokens alone.
    let logits_host: Vec<f32> = (0..4 * 8 * 9)
        .map(|i| ((i * 37) % 17) as f32 * 0.1)
        .collect();
    let logits = dev
        .tensor(&HostTensor::from_slice(&logits_host, &[4, 8, 9]).unwrap())
        .unwrap();
    let padded = cross_entropy(&logits, labels).unwrap().item().unwrap();
    let mut total = 0.0;
    for (i, &y) in l.iter().enumerate().filter(|(_, &y)| y != -100) {
        let row = &logits_host[i * 9..i * 9 + 9];
        let m = row.iter().fold(f64::MIN, |a, &b| a.max(b as f64));
        let z: f64 = row.iter().map(|&x| (x as f64 - m).exp()).sum();
        total += -(row[y as usize] as f64 - m - z.ln());
    }
    let want = total / 11.0;
    assert!((padded - want).abs() < 1e-5, "{padded} vs {want}");
    // a sequence longer than the largest bucket is an error, not a silent cut
    let long = buckets.batches(vec![vec![vec![1; 9]]], 1, 0);
    let mut loader = DeviceLoader::for_tokens(&dev, long, 1, LastBatch::Drop, 1);
    let e = loader.next().unwrap().err().unwrap().to_string();
    assert!(
        e.contains("9 tokens") && e.contains("largest length bucket (8)"),
        "{e}"
    );
}

#[test]
fn a_panicking_batch_iterator_is_an_error_not_a_short_epoch() {
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        ..DeviceConfig::default()
    })
    .unwrap();
    let stream = (0..3).map(|i| {
        assert!(i < 1, "batch {i} is broken");
        vec![HostTensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap()]
    });
    let got: Vec<_> = DeviceLoader::new(&dev, stream, 2, LastBatch::Drop, 1).collect();
    assert_eq!(got.len(), 2);
    assert!(got[0].is_ok());
    let e = got[1].as_ref().err().unwrap().to_string();
    assert!(
        e.contains("panicked") && e.contains("batch 1 is broken"),
        "{e}"
    );
}

#[test]
fn analyze_proposes_buckets_from_the_lengths_it_saw() {
    let cache = tmp("analyze");
    let probe = probe();
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .args(["analyze", "--json", "--", probe.to_str().unwrap()])
        .args(["--max-len", "64", "--steps", "10"])
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .env_remove("NEURON_CC_FLAGS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let groups = v["shape_groups"].as_array().unwrap();
    let g = groups
        .iter()
        .find(|g| g["buckets"].is_object())
        .unwrap_or_else(|| panic!("no bucket proposal: {v}"));
    let b = &g["buckets"];
    let lengths: Vec<u64> = serde_json::from_value(b["lengths"].clone()).unwrap();
    let buckets: Vec<u64> = serde_json::from_value(b["buckets"].clone()).unwrap();
    assert_eq!(b["dim"], 1, "{b}");
    assert!(lengths.len() >= 5, "{b}");
    // every length fits a bucket, each bucket is a power of two, and the saving adds up
    for l in &lengths {
        assert!(buckets.iter().any(|x| x >= l), "{l} fits no bucket: {b}");
    }
    assert!(buckets.iter().all(|x| x.is_power_of_two()), "{b}");
    assert_eq!(
        b["compiles_saved"].as_u64().unwrap(),
        (lengths.len() - buckets.len()) as u64
    );
    std::fs::remove_dir_all(&cache).unwrap();
}
