//! Cache figures: hit latency (p50, p99) for 1 MiB entries and write throughput on a local
//! directory, S3 (a loopback S3-compatible server) and tiered (warm local tier).
//!
//! With `--scale`, a second table: a local cache of 2,000, 10,000 and 20,000 entries, and the
//! time of a job's put of one new graph with the size bound reached, `prune`, `ls`, `stats`
//! and `verify` on it.
//!
//! Run by `scripts/bench-cache`, which starts the server and sets `AWS_ENDPOINT_URL`.
//! With `--s3-scale N` (and an S3 URL), `ls`, `stats` and `verify` of N entries on S3.
//!
//! Usage: bench_cache [--scale] [--s3-scale N] [s3://bucket/prefix]   (no URL: local rows only)

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use neuron_pc_cache::{
    Cache, CacheOptions, EntryKey, EntryRecord, Lookup, Obtained, PutOutcome, ENTRY_FORMAT_VERSION,
};
use sha2::{Digest, Sha256};

const MIB: usize = 1 << 20;

fn key(label: &str) -> EntryKey {
    EntryKey::parse(&hex::encode(Sha256::digest(label.as_bytes()))).expect("a SHA-256 is a key")
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

/// Writes `n` entries of `size`-byte executables straight into the layout (no fsync: this is
/// the fixture, not what is measured), each a second older than the next.
fn fill(root: &std::path::Path, n: usize, size: usize) {
    let now = std::time::SystemTime::now();
    for i in 0..n {
        let k = key(&format!("scale entry {i}"));
        let mut exe = vec![0u8; size];
        exe[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let digest = hex::encode(Sha256::digest(&exe));
        let shard = root.join("entries").join(&k.as_str()[..2]);
        std::fs::create_dir_all(&shard).expect("shard directory");
        std::fs::write(shard.join(format!("{k}.{}.exe", &digest[..16])), &exe).expect("exe");
        std::fs::write(shard.join(format!("{k}.mlir")), b"prog").expect("program");
        let record = EntryRecord {
            format_version: ENTRY_FORMAT_VERSION,
            key: k.to_string(),
            key_inputs: BTreeMap::new(),
            executable_size: size as u64,
            executable_sha256: digest,
            program_size: 4,
            compile_ms: 1.0,
            tool_version: "bench".into(),
            created_at: 0,
            signature: None,
        };
        let path = shard.join(format!("{k}.json"));
        std::fs::write(&path, serde_json::to_vec_pretty(&record).expect("json")).expect("rec");
        let when = now - Duration::from_secs((n - i) as u64);
        let f = std::fs::File::options()
            .write(true)
            .open(&path)
            .expect("record");
        f.set_modified(when).expect("mtime");
    }
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

/// The scale table: seconds per operation on caches of 2k, 10k and 20k entries.
fn scale(dir: &std::path::Path) {
    println!(
        "{:>8} {:>13} {:>9} {:>9} {:>9} {:>9}",
        "entries", "job at bound", "prune", "ls", "stats", "verify"
    );
    for n in [2_000, 10_000, 20_000] {
        let root = dir.join(format!("scale-{n}"));
        fill(&root, n, 1024);
        let url = root.to_str().expect("utf-8 temp dir");
        let c = Cache::open(url, CacheOptions::default()).expect("cache");
        let t = Instant::now();
        let listed = c.list().expect("ls").len();
        let ls = secs(t);
        assert_eq!(listed, n);
        let t = Instant::now();
        let total = c.stats().expect("stats").bytes;
        let stats = secs(t);
        let t = Instant::now();
        let r = c.verify(false).expect("verify");
        let verify = secs(t);
        assert_eq!((r.checked, r.bad.len()), (n, 0));
        // A job with one new graph, the size bound reached: a new process, so its first put
        // lists the tier and evicts.
        let bounded = CacheOptions {
            max_local_bytes: Some(total),
            ..CacheOptions::default()
        };
        let job = Cache::open(url, bounded).expect("cache");
        let k = key(&format!("scale new graph {n}"));
        let t = Instant::now();
        let got = job
            .get_or_compile(&k, "prog", &BTreeMap::new(), false, || Ok(vec![7; 1024]))
            .expect("job");
        let job_s = secs(t);
        assert!(matches!(got, Obtained::Compiled { .. }));
        let t = Instant::now();
        let removed = c.prune(total / 2).expect("prune");
        let prune = secs(t);
        assert!(removed > 0);
        println!("{n:>8} {job_s:>12.3}s {prune:>8.3}s {ls:>8.3}s {stats:>8.3}s {verify:>8.3}s");
        let _ = std::fs::remove_dir_all(&root);
    }
    println!("(1 KiB entries; job: lookup, lease, compile, put with the size bound reached;");
    println!(" prune: down to half the bytes; verify: every digest)");
}

/// Four waiters on a lease another "process" holds for 5 s on the S3 store: requests per
/// waiter per minute, from the cache's wait metrics.
fn waiters(url: &str) -> f64 {
    let opts = || CacheOptions {
        local_tier: false,
        ..CacheOptions::default()
    };
    let k = key(&format!("waited on {}", std::process::id()));
    let holder = Cache::open(url, opts()).expect("s3 cache");
    let (tx, rx) = std::sync::mpsc::channel();
    let hk = k.clone();
    let h = std::thread::spawn(move || {
        holder
            .get_or_compile(&hk, "prog", &BTreeMap::new(), false, || {
                tx.send(()).expect("signal");
                std::thread::sleep(Duration::from_secs(5));
                Ok(vec![1; 1024])
            })
            .expect("holder");
    });
    rx.recv().expect("holder compiling");
    let ws: Vec<_> = (0..4)
        .map(|_| {
            let (url, k) = (url.to_string(), k.clone());
            std::thread::spawn(move || {
                let c = Cache::open(&url, opts()).expect("s3 cache");
                let got = c.get_or_compile(&k, "prog", &BTreeMap::new(), false, || {
                    Err("a waiter compiled".into())
                });
                assert!(matches!(got, Ok(Obtained::Waited(_))), "{got:?}");
                c.wait_metrics().requests_per_waiter_minute
            })
        })
        .collect();
    let rates: Vec<f64> = ws.into_iter().map(|w| w.join().expect("waiter")).collect();
    h.join().expect("holder");
    rates.iter().sum::<f64>() / rates.len() as f64
}

/// `ls`, `stats` and `verify` of an S3-only cache of `n` entries (record and executable each,
/// written by 8 writers): seconds each, with the default per-request budget.
fn s3_scale(url: &str, n: usize) -> (f64, f64, f64) {
    let opts = || CacheOptions {
        local_tier: false,
        ..CacheOptions::default()
    };
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let url = url.to_string();
            std::thread::spawn(move || {
                let s = neuron_pc_cache::S3Store::open(&url, &opts().s3).expect("s3 store");
                for i in (w..n).step_by(8) {
                    let k = key(&format!("s3 scale entry {i}"));
                    let mut exe = vec![0u8; 256];
                    exe[..8].copy_from_slice(&(i as u64).to_le_bytes());
                    let digest = hex::encode(Sha256::digest(&exe));
                    let shard = &k.as_str()[..2];
                    let record = EntryRecord {
                        format_version: ENTRY_FORMAT_VERSION,
                        key: k.to_string(),
                        key_inputs: BTreeMap::new(),
                        executable_size: exe.len() as u64,
                        executable_sha256: digest.clone(),
                        program_size: 0,
                        compile_ms: 1.0,
                        tool_version: "bench".into(),
                        created_at: 0,
                        signature: None,
                    };
                    let overwrite = neuron_pc_cache::PutMode::Overwrite;
                    let exe_name = format!("entries/{shard}/{k}.{}.exe", &digest[..16]);
                    neuron_pc_cache::Store::put(&s, &exe_name, &exe, overwrite).expect("exe");
                    let rec = serde_json::to_vec(&record).expect("json");
                    let rec_name = format!("entries/{shard}/{k}.json");
                    neuron_pc_cache::Store::put(&s, &rec_name, &rec, overwrite).expect("record");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    let c = Cache::open(url, opts()).expect("s3 cache");
    let t = Instant::now();
    assert_eq!(c.list().expect("ls").len(), n);
    let ls = secs(t);
    let t = Instant::now();
    assert_eq!(c.stats().expect("stats").entries, n);
    let stats = secs(t);
    let t = Instant::now();
    let r = c.verify(false).expect("verify");
    assert_eq!((r.checked, r.bad.len()), (n, 0));
    (ls, stats, secs(t))
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let with_scale = args.iter().any(|a| a == "--scale");
    args.retain(|a| a != "--scale");
    // `--s3-scale N`: also `ls`, `stats` and `verify` of N entries on the S3 server.
    let s3_scale_n = args.iter().position(|a| a == "--s3-scale").map(|i| {
        let n = args.get(i + 1).and_then(|v| v.parse().ok());
        args.drain(i..(i + 2).min(args.len()));
        n.expect("--s3-scale takes a number of entries")
    });
    let s3_url = args.into_iter().next();
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
    if let Some(url) = std::env::args().skip(1).find(|a| a.starts_with("s3://")) {
        println!(
            "waiting on a remote lease: {:.0} requests per waiter per minute (4 waiters, 5 s)",
            waiters(&url)
        );
    }
    if with_scale {
        println!();
        scale(&dir);
    }
    if let (Some(n), Some(url)) = (
        s3_scale_n,
        std::env::args().find(|a| a.starts_with("s3://")),
    ) {
        let (ls, stats, verify) = s3_scale(&format!("{url}-scale"), n);
        println!(
            "s3 (loopback), {n} entries: ls {ls:.1}s, stats {stats:.1}s, verify {verify:.1}s \
             (default {:.0} s budget per request)",
            neuron_pc_cache::DEFAULT_S3_BUDGET.as_secs_f64()
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}
