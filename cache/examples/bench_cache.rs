//! Cache figures: hit latency (p50, p99) for 1 MiB entries and write throughput on a local
//! directory, S3 (a loopback S3-compatible server) and tiered (warm local tier).
//!
//! Run by `scripts/bench-cache`, which starts the server and sets `AWS_ENDPOINT_URL`.
//! Usage: bench_cache [s3://bucket/prefix]   (without an S3 URL only the local row is printed)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use neuron_pc_cache::{Cache, CacheKey, CacheOptions, Lookup, PutOutcome};
use sha2::{Digest, Sha256};

const MIB: usize = 1 << 20;

fn key(label: &str) -> CacheKey {
    CacheKey::parse(&hex::encode(Sha256::digest(label.as_bytes()))).expect("a SHA-256 is a key")
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e3
}

/// `(p50 ms, p99 ms, write MiB/s)`.
fn measure(c: &Cache, tag: &str, hits: usize, writes: usize) -> (f64, f64, f64) {
    let inputs = BTreeMap::new();
    let exe: Vec<u8> = (0..MIB).map(|i| (i * 31 % 251) as u8).collect();
    let started = Instant::now();
    for i in 0..writes {
        let mut e = exe.clone();
        e[0] = i as u8;
        e[1] = (i >> 8) as u8;
        let k = key(&format!("{tag} write {i} {}", std::process::id()));
        assert_eq!(
            c.put(&k, &e, "", &inputs, 1.0),
            PutOutcome::Stored,
            "write failed"
        );
    }
    let mib_s = writes as f64 / started.elapsed().as_secs_f64();
    let k = key(&format!("{tag} hit {}", std::process::id()));
    c.put(&k, &exe, "", &inputs, 1.0);
    // Warm-up (fills the local tier of a tiered cache).
    assert!(matches!(c.get(&k), Lookup::Hit(_)));
    let mut times = Vec::with_capacity(hits);
    for _ in 0..hits {
        let t = Instant::now();
        let Lookup::Hit(h) = c.get(&k) else {
            panic!("{tag}: miss")
        };
        times.push(t.elapsed());
        assert_eq!(h.executable.len(), MIB);
    }
    times.sort();
    (percentile(&times, 0.5), percentile(&times, 0.99), mib_s)
}

fn main() {
    let s3_url = std::env::args().nth(1);
    let dir = std::env::temp_dir().join(format!("npc-bench-cache-{}", std::process::id()));
    let mut rows = Vec::new();
    let local = Cache::open(
        dir.join("local").to_str().expect("utf-8 temp dir"),
        CacheOptions::default(),
    )
    .expect("local cache");
    rows.push(("local", measure(&local, "local", 200, 20)));
    if let Some(url) = s3_url {
        let s3 = Cache::open(
            &url,
            CacheOptions {
                local_tier: false,
                ..CacheOptions::default()
            },
        )
        .expect("s3 cache");
        rows.push(("s3 (loopback)", measure(&s3, "s3", 100, 10)));
        let tiered = Cache::open(
            &url,
            CacheOptions {
                local_dir: Some(dir.join("tier")),
                ..CacheOptions::default()
            },
        )
        .expect("tiered");
        rows.push(("tiered (warm)", measure(&tiered, "tiered", 200, 10)));
    }
    println!(
        "{:<14} {:>10} {:>10} {:>14}",
        "backend", "hit p50", "hit p99", "write"
    );
    for (name, (p50, p99, w)) in rows {
        println!("{name:<14} {p50:>8.2}ms {p99:>8.2}ms {w:>9.1} MiB/s");
    }
    println!("(1 MiB entries; hits verified with SHA-256; writes fsynced locally)");
    let _ = std::fs::remove_dir_all(dir);
}
