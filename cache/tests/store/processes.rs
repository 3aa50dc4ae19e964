//! Many processes on one cache: writers SIGKILLed at random points, 8 processes racing on 20
//! keys, eviction under concurrent readers and writers, a full disk, unreadable files.
//!
//! Child processes are this test binary re-invoked on the ignored `child` test with
//! `NPC_CHILD` naming the role.

use crate::common;
use neuron_pc_test_support::process::test_path;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use neuron_pc_cache::{Cache, CacheOptions, EntryKey, Lookup, Obtained, PutOutcome};

const WRITER_KEYS: usize = 6;
const RACE_KEYS: usize = 20;

fn writer_key(i: usize) -> EntryKey {
    key(&format!("killed writer {i}"))
}
fn writer_len(k: &EntryKey) -> usize {
    20_000 + usize::from(k.as_str().as_bytes()[0]) * 700
}
fn race_key(i: usize) -> EntryKey {
    key(&format!("race {i}"))
}

/// Opens the cache a child was told to use.
fn child_cache() -> Cache {
    let url = std::env::var("NPC_URL").expect("NPC_URL");
    let mut o = CacheOptions {
        lock_wait: Duration::from_secs(60),
        compiler_version: "c".into(),
        ..CacheOptions::default()
    };
    if let Ok(e) = std::env::var("NPC_ENDPOINT") {
        o.s3 = s3_opts(&e);
        o.local_tier = false;
    }
    Cache::open(&url, o).expect("child opens the cache")
}

#[test]
#[ignore = "run as a child process by the tests below"]
fn child() {
    let Ok(role) = std::env::var("NPC_CHILD") else {
        return;
    };
    let c = child_cache();
    match role.as_str() {
        "writer" => {
            // Writes (and rewrites) entries until it is killed.
            for i in 0.. {
                let k = writer_key(i % WRITER_KEYS);
                let exe = exe_for(&k, writer_len(&k));
                if i % 3 == 0 {
                    c.replace(&k, &exe, "prog", &inputs("w"), 1.0);
                } else {
                    c.put(&k, &exe, "prog", &inputs("w"), 1.0);
                }
            }
        }
        "racer" => {
            let compiles = std::env::var("NPC_COMPILES").expect("NPC_COMPILES");
            let seed: u64 = std::env::var("NPC_SEED")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(1);
            let mut order: Vec<usize> = (0..RACE_KEYS).collect();
            let mut rng = Rng(seed | 1);
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i as u64 + 1) as usize);
            }
            for i in order {
                let k = race_key(i);
                let exe = exe_for(&k, 4096 + i * 100);
                let got = c
                    .get_or_compile(&k, "p", &inputs("race"), false, || {
                        let marker =
                            Path::new(&compiles).join(format!("{k}.{}", std::process::id()));
                        std::fs::write(marker, b"").map_err(|e| e.to_string())?;
                        std::thread::sleep(Duration::from_millis(30));
                        Ok(exe.clone())
                    })
                    .expect("get_or_compile");
                let bytes = match got {
                    Obtained::Hit(h) | Obtained::Waited(h) => h.executable,
                    Obtained::Compiled { executable, .. } => executable,
                };
                assert_eq!(bytes, exe, "racer got a wrong executable for key {i}");
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn_child(
    role: &str,
    url: &str,
    endpoint: Option<&str>,
    extra: &[(&str, String)],
) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
    cmd.args([
        &test_path(module_path!(), "child"),
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("NPC_CHILD", role)
    .env("NPC_URL", url)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    if let Some(e) = endpoint {
        cmd.env("NPC_ENDPOINT", e);
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn child")
}

fn killed_writers(b: Backend, rounds: usize) {
    let f = Fixture::new(b);
    let (url, _) = f.url_and_opts(opts());
    let reader = f.cache(opts());
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut hits = 0;
    // Kills land anywhere from process start-up to mid-write; S3 writes are slower.
    let max_ms = if b == Backend::Local { 60 } else { 400 };
    for round in 0..rounds {
        let mut child = spawn_child("writer", &url, f.endpoint.as_deref(), &[]);
        if round + 1 == rounds {
            // The last writer runs until an entry is complete, so the test cannot pass
            // vacuously on a loaded machine where every earlier kill came too soon.
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(20)
                && (0..WRITER_KEYS).all(|i| hit_bytes(&reader, &writer_key(i)).is_none())
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(Duration::from_millis(rng.below(20)));
        } else {
            std::thread::sleep(Duration::from_millis(3 + rng.below(max_ms)));
        }
        child.kill().expect("SIGKILL the writer");
        child.wait().expect("reap the writer");
        for i in 0..WRITER_KEYS {
            let k = writer_key(i);
            if let Some(bytes) = hit_bytes(&reader, &k) {
                assert_eq!(
                    bytes,
                    exe_for(&k, writer_len(&k)),
                    "{b:?} round {round}: a wrong executable"
                );
                hits += 1;
            }
        }
    }
    assert!(
        hits > 0,
        "{b:?}: the writers never completed an entry; the test proves nothing"
    );
    // Leftovers of killed writers are cleaned, and what remains verifies.
    let fixed = reader.verify(true).unwrap();
    let after = reader.verify(false).unwrap();
    assert!(
        after.bad.is_empty(),
        "{b:?}: {after:?} (fix said {fixed:?})"
    );
    if b == Backend::Local {
        assert!(
            temporaries(&f.local_root()).is_empty(),
            "temporary files left behind"
        );
    }
    fault_report(
        &format!("writer SIGKILLed at a random point ({b:?})"),
        rounds,
        &format!(
            "{hits} verified hits, every other lookup a miss; --fix removed {} bad",
            fixed.removed
        ),
        after.bad.len(),
        0,
    );
}

#[test]
fn writers_killed_at_random_points_never_expose_a_partial_entry_local() {
    killed_writers(Backend::Local, 200);
}

#[test]
fn writers_killed_at_random_points_never_expose_a_partial_entry_s3() {
    killed_writers(Backend::S3, 40);
}

fn race(b: Backend) {
    let f = Fixture::new(b);
    let (url, _) = f.url_and_opts(opts());
    let compiles = f.dir.path().join("compiles");
    std::fs::create_dir_all(&compiles).unwrap();
    let children: Vec<_> = (0..8)
        .map(|p| {
            spawn_child(
                "racer",
                &url,
                f.endpoint.as_deref(),
                &[
                    ("NPC_COMPILES", compiles.display().to_string()),
                    ("NPC_SEED", (p * 7919 + 1).to_string()),
                ],
            )
        })
        .collect();
    for mut c in children {
        assert!(
            c.wait().unwrap().success(),
            "{b:?}: a racer failed (wrong bytes or an error)"
        );
    }
    let reader = f.cache(opts());
    for i in 0..RACE_KEYS {
        let k = race_key(i);
        let n = std::fs::read_dir(&compiles)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(k.as_str()))
            .count();
        assert_eq!(n, 1, "{b:?}: key {i} compiled {n} times");
        assert_eq!(hit_bytes(&reader, &k), Some(exe_for(&k, 4096 + i * 100)));
    }
    fault_report(
        &format!("8 processes racing on {RACE_KEYS} keys ({b:?})"),
        RACE_KEYS,
        "each key compiled exactly once, every racer got its bytes",
        0,
        0,
    );
}

#[test]
fn eight_processes_racing_on_twenty_keys_compile_each_once_local() {
    race(Backend::Local);
}

#[test]
fn eight_processes_racing_on_twenty_keys_compile_each_once_s3() {
    race(Backend::S3);
}

#[test]
fn least_recently_used_entries_go_first() {
    let f = Fixture::new(Backend::Local);
    let c = f.cache(opts());
    let ks: Vec<EntryKey> = (0..3).map(|i| key(&format!("lru {i}"))).collect();
    for k in &ks {
        c.put(k, &exe_for(k, 10_000), "", &inputs("l"), 1.0);
        std::thread::sleep(Duration::from_millis(20));
    }
    // A hit refreshes the oldest one.
    assert!(hit_bytes(&c, &ks[0]).is_some());
    std::thread::sleep(Duration::from_millis(20));
    let bounded = f.cache(CacheOptions {
        max_local_bytes: Some(25_000),
        ..opts()
    });
    let k3 = key("lru 3");
    bounded.put(&k3, &exe_for(&k3, 10_000), "", &inputs("l"), 1.0);
    let present: Vec<bool> = ks
        .iter()
        .chain([&k3])
        .map(|k| hit_bytes(&c, k).is_some())
        .collect();
    assert_eq!(
        present,
        [true, false, false, true],
        "entries 1 and 2 were least recently used"
    );
    assert!(c.stats().unwrap().bytes <= 25_000);
}

#[test]
fn eviction_under_concurrent_readers_and_writers() {
    let f = Arc::new(Fixture::new(Backend::Local));
    let stop = Arc::new(AtomicBool::new(false));
    let hits = Arc::new(AtomicUsize::new(0));
    let bound = 120_000;
    let mut threads = Vec::new();
    for t in 0..4u64 {
        let (f, stop, hits) = (f.clone(), stop.clone(), hits.clone());
        threads.push(std::thread::spawn(move || {
            let c = f.cache(CacheOptions {
                max_local_bytes: Some(bound),
                ..opts()
            });
            let mut rng = Rng(t * 31 + 7);
            while !stop.load(Ordering::Relaxed) {
                let k = key(&format!("evict {}", rng.below(30)));
                let exe = exe_for(&k, 8_000 + (k.as_str().as_bytes()[1] as usize) * 20);
                if rng.below(2) == 0 {
                    assert_ne!(c.put(&k, &exe, "", &inputs("e"), 1.0), PutOutcome::ReadOnly);
                } else if let Lookup::Hit(h) = c.get(&k) {
                    assert_eq!(h.executable, exe, "a wrong executable under eviction");
                    hits.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    {
        let (f, stop) = (f.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let c = f.cache(opts());
            while !stop.load(Ordering::Relaxed) {
                c.prune(40_000)
                    .expect("prune never fails on files that are already gone");
                let _ = c.list().expect("list");
                let _ = c.verify(false).expect("verify");
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("no thread panicked");
    }
    assert!(hits.load(Ordering::Relaxed) > 0);
    let c = f.cache(opts());
    c.prune(bound).unwrap();
    assert!(c.stats().unwrap().bytes <= bound);
    c.verify(true).unwrap();
    assert!(c.verify(false).unwrap().bad.is_empty());
}

/// Unmounts on drop.
struct Mount(std::path::PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Every file below `dir`, as paths.
fn files(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.path().is_dir() {
                true => stack.push(e.path()),
                false => out.push(e.path().display().to_string()),
            }
        }
    }
    out
}

#[test]
fn a_full_disk_fails_writes_softly_and_keeps_serving_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let ok = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
        .arg(&mnt)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "this test needs root to mount a 1 MiB tmpfs (mount -t tmpfs -o size=1m)"
    );
    let _guard = Mount(mnt.clone());
    let c = Cache::open(mnt.to_str().unwrap(), opts()).unwrap();
    let mut stored = Vec::new();
    let mut failed = None;
    for i in 0..20 {
        let k = key(&format!("full {i}"));
        let exe = exe_for(&k, 150_000);
        match c.put(&k, &exe, "", &inputs("f"), 1.0) {
            PutOutcome::Stored => stored.push((k, exe)),
            PutOutcome::Failed(msg) => {
                failed = Some((k, msg));
                break;
            }
            PutOutcome::ReadOnly => unreachable!(),
        }
    }
    let (fk, msg) = failed.expect("a 1 MiB disk fills up");
    assert!(msg.to_lowercase().contains("space"), "{msg}");
    assert!(!stored.is_empty());
    assert!(matches!(c.get(&fk), Lookup::Miss));
    for (k, exe) in &stored {
        assert_eq!(
            hit_bytes(&c, k).as_ref(),
            Some(exe),
            "earlier entries still served"
        );
    }
    assert!(
        temporaries(&mnt).is_empty(),
        "failed writes leave no temporary files"
    );
    // get_or_compile still returns the executable.
    let got = c
        .get_or_compile(&fk, "", &inputs("f"), false, || Ok(vec![1; 10]))
        .unwrap();
    assert!(matches!(got, Obtained::Compiled { ref executable, .. } if executable == &vec![1; 10]));
    // room for an executable and not one page more: its record cannot be written, and the
    // executable is taken back rather than left as an orphan
    let ok2 = key("full orphan");
    let exe2 = exe_for(&ok2, 150_000);
    let (first, _) = stored.remove(0);
    for p in files(&mnt)
        .iter()
        .filter(|p| p.contains(&first.to_string()))
    {
        std::fs::remove_file(p).unwrap();
    }
    let filler = mnt.join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        while f.write_all(&[0u8; 4096]).is_ok() {}
        let pages = f.metadata().unwrap().len().div_ceil(4096);
        f.set_len((pages - 150_000u64.div_ceil(4096)) * 4096)
            .unwrap();
    }
    assert!(matches!(
        c.put(&ok2, &exe2, "", &inputs("f"), 1.0),
        PutOutcome::Failed(_)
    ));
    let orphans: Vec<String> = files(&mnt)
        .into_iter()
        .filter(|p| p.contains(&ok2.to_string()) && p.ends_with(".exe"))
        .collect();
    assert!(orphans.is_empty(), "orphans: {orphans:?}");
    // with room again, the next job compiles and stores it, and the one after hits it
    std::fs::remove_file(&filler).unwrap();
    let got = c
        .get_or_compile(&ok2, "", &inputs("f"), false, || Ok(exe2.clone()))
        .unwrap();
    assert!(matches!(got, Obtained::Compiled { .. }));
    assert_eq!(hit_bytes(&c, &ok2), Some(exe2));
    fault_report(
        "full disk (1 MiB tmpfs)",
        stored.len() + 1,
        &format!(
            "{} stored, then Failed(no space); reads still served",
            stored.len()
        ),
        0,
        0,
    );
}

#[test]
fn unreadable_files_are_misses() {
    let f = Fixture::new(Backend::Local);
    let c = f.cache(opts());
    let (a, b) = (key("unreadable a"), key("unreadable b"));
    let (ea, eb) = (exe_for(&a, 100), exe_for(&b, 100));
    c.put(&a, &ea, "", &inputs("u"), 1.0);
    c.put(&b, &eb, "", &inputs("u"), 1.0);
    // Root reads any file regardless of mode, so make the objects unreadable as files: a
    // directory where the executable (or record) should be.
    let root = f.local_root();
    let exe_path = root.join(exe_obj(&a, &ea));
    std::fs::remove_file(&exe_path).unwrap();
    std::fs::create_dir(&exe_path).unwrap();
    let rec_path = root.join(record_obj(&b));
    std::fs::remove_file(&rec_path).unwrap();
    std::fs::create_dir(&rec_path).unwrap();
    let t = Instant::now();
    assert!(matches!(c.get(&a), Lookup::Miss));
    assert!(matches!(c.get(&b), Lookup::Miss));
    assert!(t.elapsed() < Duration::from_secs(1));
    // A symlink planted inside the cache is refused, not followed.
    let k = key("symlinked");
    let e = exe_for(&k, 100);
    c.put(&k, &e, "", &inputs("u"), 1.0);
    let target = f.dir.path().join("elsewhere.exe");
    std::fs::write(&target, &e).unwrap();
    let p = root.join(exe_obj(&k, &e));
    std::fs::remove_file(&p).unwrap();
    std::os::unix::fs::symlink(&target, &p).unwrap();
    assert!(
        matches!(c.get(&k), Lookup::Miss),
        "symlinks inside the cache are refused"
    );
}
