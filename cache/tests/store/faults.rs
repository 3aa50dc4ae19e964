//! Fault classes of issue 14 at the cache level: special files (FIFOs) and symlinks where
//! objects belong, records that are directories or hard links, read-only mode that must write
//! nothing, far-future leases, and a hung S3 server that may cost one timeout and no more.
//! Each test prints a `FAULT-REPORT` line (see `scripts/fault-report`).

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use neuron_pc_cache::{
    Cache, CacheOptions, Error, Lookup, Obtained, PutMode, PutOutcome, S3Options,
};

/// Runs `f` on its own thread and fails the test if it does not finish within `secs` (a hang
/// is the failure these tests look for, so it must not hang the test run).
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what}: still running after {secs} s (blocked?)"))
}

fn mkfifo(path: &Path) {
    let _ = std::fs::remove_file(path);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "mkfifo {}", path.display());
}

fn local(root: &Path) -> Cache {
    Cache::open(root.to_str().unwrap(), opts()).unwrap()
}

/// A FIFO in place of the record, the executable or the lock: the job's lookup and compile
/// and every maintenance call finish; the FIFO is reported as damage and `--fix` removes it.
#[test]
fn a_fifo_in_place_of_a_record_executable_or_lock_blocks_nothing() {
    let mut trials = 0;
    for place in ["record", "executable", "lock"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("c");
        let k = key(&format!("fifo {place}"));
        let exe = exe_for(&k, 300);
        assert_eq!(
            local(&root).put(&k, &exe, "prog", &inputs("f"), 1.0),
            PutOutcome::Stored
        );
        let obj = match place {
            "record" => record_obj(&k),
            "executable" => exe_obj(&k, &exe),
            _ => lock_obj(&k),
        };
        mkfifo(&root.join(&obj));
        let (r, k2, exe2) = (root.clone(), k.clone(), exe.clone());
        let outcome = within(20, place, move || {
            let c = local(&r);
            let looked = c.get(&k2);
            let listed = c.list().unwrap();
            let report = c.verify(false).unwrap();
            let _ = (
                c.record(&k2),
                c.check(&k2),
                c.failure(&k2),
                c.stats().unwrap(),
            );
            let fixed = c.verify(true).unwrap();
            let after = c.verify(false).unwrap();
            let got = c
                .get_or_compile(&k2, "prog", &inputs("f"), false, || Ok(exe2.clone()))
                .unwrap();
            (looked, listed, report, got, fixed, after)
        });
        let (looked, listed, report, got, fixed, after) = outcome;
        match place {
            // The lock is not part of the entry: the entry is still served.
            "lock" => assert!(matches!(looked, Lookup::Hit(_)), "{place}"),
            _ => assert!(matches!(looked, Lookup::Miss), "{place}: a FIFO is a miss"),
        }
        if place == "record" {
            assert!(
                listed.iter().any(|e| e.problem.is_some()),
                "ls shows the unreadable record: {listed:?}"
            );
        }
        assert!(
            report
                .bad
                .iter()
                .any(|(n, p)| n.contains(k.as_str()) || p.contains("FIFO")),
            "{place}: verify reports it: {report:?}"
        );
        match got {
            Obtained::Hit(h) | Obtained::Waited(h) => assert_eq!(h.executable, exe),
            Obtained::Compiled { executable, .. } => assert_eq!(executable, exe),
        }
        assert!(fixed.removed >= 1, "{place}: --fix removes it: {fixed:?}");
        assert!(
            after.bad.is_empty(),
            "{place}: sound after --fix: {after:?}"
        );
        assert!(
            !root.join(&obj).exists() || std::fs::metadata(root.join(&obj)).unwrap().is_file(),
            "{place}: the FIFO is gone"
        );
        trials += 1;
    }
    fault_report(
        "fifo in record/executable/lock (local)",
        trials,
        "miss, compiled, --fix removes",
        0,
        0,
    );
}

/// `NEURON_PC_CACHE_READ_ONLY`: prune and `verify --fix` refuse, and opening a missing cache
/// directory creates nothing.
#[test]
fn read_only_prune_fix_and_open_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("c");
    let c = local(&root);
    let k = key("read only prune");
    c.put(&k, &exe_for(&k, 200), "p", &inputs("r"), 1.0);
    // Damage a second entry so that --fix would have something to remove.
    let bad = key("read only damaged");
    c.put(&bad, &exe_for(&bad, 200), "p", &inputs("r"), 1.0);
    std::fs::write(root.join(exe_obj(&bad, &exe_for(&bad, 200))), b"x").unwrap();
    let ro = || {
        Cache::open(
            root.to_str().unwrap(),
            CacheOptions {
                read_only: true,
                ..opts()
            },
        )
        .unwrap()
    };
    let before = snapshot(&root);
    assert!(matches!(ro().prune(0), Err(Error::ReadOnly)));
    assert_eq!(
        ro().verify(true).unwrap().removed,
        0,
        "read-only --fix only reports"
    );
    assert!(matches!(ro().clear(false), Err(Error::ReadOnly)));
    assert!(matches!(ro().remove(&k), Err(Error::ReadOnly)));
    assert_eq!(ro().verify(false).unwrap().bad.len(), 1);
    assert_eq!(snapshot(&root), before, "nothing changed");
    assert_eq!(hit_bytes(&ro(), &k), Some(exe_for(&k, 200)));

    let missing = dir.path().join("never-made");
    let c = Cache::open(
        missing.to_str().unwrap(),
        CacheOptions {
            read_only: true,
            ..opts()
        },
    )
    .unwrap();
    assert!(matches!(c.get(&k), Lookup::Miss));
    assert!(c.list().unwrap().is_empty());
    assert_eq!(c.put(&k, &[1], "", &inputs("r"), 1.0), PutOutcome::ReadOnly);
    let got = c
        .get_or_compile(&k, "", &inputs("r"), false, || Ok(vec![9]))
        .unwrap();
    assert!(matches!(got, Obtained::Compiled { .. }));
    assert!(
        !missing.exists(),
        "a read-only open made {}",
        missing.display()
    );
    fault_report(
        "read-only prune/fix/clear/rm/open",
        6,
        "refused, zero writes",
        0,
        0,
    );
}

/// Every file under `root` with its size and modification time.
fn snapshot(root: &Path) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                stack.push(e.path());
            }
            out.push((e.path(), m.len(), m.modified().unwrap()));
        }
    }
    out.sort();
    out
}

/// A symlinked `entries/`, a symlinked record, a record that is a directory: reported by
/// `verify`, removed by `--fix`/`rm`/`prune` without touching what a link points to, and the
/// cache stores again afterwards.
#[test]
fn symlinks_and_directories_where_objects_belong() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("c");
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let c = local(&root);
    let k = key("symlinked entries");
    let exe = exe_for(&k, 100);
    c.put(&k, &exe, "p", &inputs("s"), 1.0);

    // entries/ a symlink to a directory outside the cache.
    std::fs::rename(root.join("entries"), outside.join("entries")).unwrap();
    std::os::unix::fs::symlink(outside.join("entries"), root.join("entries")).unwrap();
    let report = c.verify(false).unwrap();
    assert!(
        report
            .bad
            .iter()
            .any(|(n, p)| n == "entries" && p.contains("symlink")),
        "{report:?}"
    );
    assert!(
        matches!(c.get(&k), Lookup::Miss),
        "never read through a symlink"
    );
    let fixed = c.verify(true).unwrap();
    assert_eq!(fixed.removed, 1, "{fixed:?}");
    assert!(
        outside.join("entries").join(&k.as_str()[..2]).exists(),
        "target untouched"
    );
    assert_eq!(c.put(&k, &exe, "p", &inputs("s"), 1.0), PutOutcome::Stored);
    assert_eq!(hit_bytes(&c, &k), Some(exe.clone()));

    // The record a symlink to a file outside: rm removes the link, not the file.
    let target = outside.join("record.json");
    std::fs::copy(root.join(record_obj(&k)), &target).unwrap();
    std::fs::remove_file(root.join(record_obj(&k))).unwrap();
    std::os::unix::fs::symlink(&target, root.join(record_obj(&k))).unwrap();
    assert!(matches!(c.get(&k), Lookup::Miss));
    c.remove(&k).unwrap();
    assert!(std::fs::symlink_metadata(root.join(record_obj(&k))).is_err());
    assert!(
        target.exists(),
        "the file a symlink pointed to is untouched"
    );

    // The same through verify --fix and prune.
    for how in ["fix", "prune"] {
        c.put(&k, &exe, "p", &inputs("s"), 1.0);
        std::fs::remove_file(root.join(record_obj(&k))).unwrap();
        std::os::unix::fs::symlink(&target, root.join(record_obj(&k))).unwrap();
        match how {
            "fix" => {
                let r = c.verify(true).unwrap();
                assert!(r.removed >= 1, "{r:?}");
            }
            _ => {
                c.prune(0).unwrap();
            }
        }
        assert!(
            std::fs::symlink_metadata(root.join(record_obj(&k))).is_err(),
            "{how} removes the symlinked record"
        );
        assert!(target.exists(), "{how}: target untouched");
    }

    // A symlinked record is replaced (the link, not its target) by the next write.
    std::fs::remove_file(root.join(record_obj(&k))).ok();
    std::os::unix::fs::symlink(&target, root.join(record_obj(&k))).unwrap();
    let before = std::fs::read(&target).unwrap();
    assert_eq!(c.put(&k, &exe, "p", &inputs("s"), 1.0), PutOutcome::Stored);
    assert_eq!(hit_bytes(&c, &k), Some(exe.clone()));
    assert_eq!(std::fs::read(&target).unwrap(), before, "target untouched");

    // A record that is a directory: a miss, and the next write replaces it (no run after
    // the first recompiles).
    c.remove(&k).unwrap();
    std::fs::create_dir_all(root.join(record_obj(&k)).join("inner")).unwrap();
    assert!(matches!(c.get(&k), Lookup::Miss));
    assert_eq!(c.put(&k, &exe, "p", &inputs("s"), 1.0), PutOutcome::Stored);
    assert_eq!(hit_bytes(&c, &k), Some(exe.clone()));

    // ... and reported, removed by --fix; then stored again.
    c.remove(&k).unwrap();
    std::fs::create_dir_all(root.join(record_obj(&k)).join("inner")).unwrap();
    assert!(matches!(c.get(&k), Lookup::Miss));
    let r = c.verify(false).unwrap();
    assert!(r.bad.iter().any(|(_, p)| p.contains("directory")), "{r:?}");
    let r = c.verify(true).unwrap();
    assert!(r.removed >= 1, "{r:?}");
    assert!(c.verify(false).unwrap().bad.is_empty());
    assert_eq!(c.put(&k, &exe, "p", &inputs("s"), 1.0), PutOutcome::Stored);
    assert_eq!(hit_bytes(&c, &k), Some(exe));
    fault_report(
        "symlinked entries/ or record, record a directory",
        5,
        "miss, reported, removed, stored again",
        0,
        0,
    );
}

/// A hit refreshes the record's recency, but never through a hard link to a file outside.
#[test]
fn a_hit_on_a_hard_linked_record_changes_nothing_outside() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("c");
    let c = local(&root);
    let k = key("hard link");
    c.put(&k, &exe_for(&k, 100), "p", &inputs("h"), 1.0);
    let outside = dir.path().join("outside.json");
    std::fs::hard_link(root.join(record_obj(&k)), &outside).unwrap();
    let old = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    std::fs::File::options()
        .write(true)
        .open(&outside)
        .unwrap()
        .set_modified(old)
        .unwrap();
    assert_eq!(hit_bytes(&c, &k), Some(exe_for(&k, 100)));
    assert_eq!(
        std::fs::metadata(&outside).unwrap().modified().unwrap(),
        old
    );
    fault_report(
        "hit on a hard-linked record",
        1,
        "served, outside file untouched",
        0,
        0,
    );
}

/// A lease claiming an expiry far beyond what a renewing holder can have is void: nobody
/// waits for it, and `verify --fix` removes it.
#[test]
fn a_lease_with_a_far_future_expiry_is_void() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for b in ALL {
        let f = Fixture::new(b);
        let k = key(&format!("far future {b:?}"));
        // pid 1 is alive on this host, so only the expiry can make it invalid.
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
        let expires_at = now + 10 * 365 * 86400;
        let lease = serde_json::json!({"pid": 1, "host": host.trim(), "expires_at": expires_at});
        f.last()
            .put(
                &lock_obj(&k),
                lease.to_string().as_bytes(),
                PutMode::CreateOnly,
            )
            .unwrap();
        let t = Instant::now();
        let got = f
            .cache(opts())
            .get_or_compile(&k, "", &inputs("l"), false, || Ok(vec![5]))
            .unwrap();
        assert!(matches!(got, Obtained::Compiled { .. }), "{b:?}");
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{b:?}: waited {:?}",
            t.elapsed()
        );
        // Planted again (after the compile released ours): --fix removes it.
        f.last()
            .put(
                &lock_obj(&k),
                lease.to_string().as_bytes(),
                PutMode::CreateOnly,
            )
            .unwrap();
        let r = f.cache(opts()).verify(true).unwrap();
        assert!(r.leftovers >= 1, "{b:?}: {r:?}");
        assert_eq!(f.last().get(&lock_obj(&k)).unwrap(), None, "{b:?}");
    }
    fault_report(
        "far-future lease (local, s3, tiered)",
        3,
        "ignored, compiled, --fix removes",
        0,
        0,
    );
}

/// A listener that accepts connections and never answers.
fn hung_server() -> (std::net::TcpListener, String) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", l.local_addr().unwrap());
    (l, endpoint)
}

fn budget_opts(endpoint: &str) -> S3Options {
    S3Options {
        timeout: Duration::from_millis(750),
        connect_timeout: Duration::from_millis(500),
        max_retries: 2,
        retry_timeout: Duration::from_millis(750),
        initial_backoff: Duration::from_millis(20),
        endpoint: Some(endpoint.to_string()),
        credentials: Some(("testing".into(), "testing".into())),
        ..S3Options::default()
    }
}

/// A server that accepts and never answers, from the start: opening, looking up, compiling
/// with a lease, storing and releasing cost one budget in all, not one per operation.
#[test]
fn a_hung_server_costs_one_timeout_per_job() {
    let (_listener, endpoint) = hung_server();
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts();
    o.s3 = budget_opts(&endpoint);
    o.local_dir = Some(dir.path().to_path_buf());
    let budget = o.s3.budget();
    let t = Instant::now();
    let c = Cache::open("s3://hung-bucket/x", o).expect("a hung server is not fatal");
    for i in 0..5 {
        let k = key(&format!("hung {i}"));
        let got = c
            .get_or_compile(&k, "", &inputs("h"), false, || Ok(exe_for(&k, 100)))
            .unwrap();
        assert!(matches!(got, Obtained::Compiled { .. }));
        assert_eq!(
            hit_bytes(&c, &k),
            Some(exe_for(&k, 100)),
            "the local tier serves"
        );
    }
    drop(c);
    let took = t.elapsed();
    assert!(
        took < budget + Duration::from_secs(3),
        "{took:?} for a budget of {budget:?}"
    );
    fault_report(
        "hung S3 server from the start",
        5,
        &format!(
            "compiled locally; {:.1} s in all, budget {:.1} s",
            took.as_secs_f64(),
            budget.as_secs_f64()
        ),
        0,
        0,
    );
}

/// The server answers at open, then hangs mid-job (the issue's case: executable PUT, lease
/// renewal and release each waiting a full timeout). The first timeout switches the tier
/// off for every later operation, leases included.
#[test]
fn a_server_hanging_mid_job_costs_one_timeout() {
    let proxy = std::cell::RefCell::new(None);
    let f = Fixture::with_endpoint(
        Backend::Tiered,
        Some(&|m: &Moto| {
            let p = Proxy::start(m.port);
            let e = p.endpoint();
            *proxy.borrow_mut() = Some(p);
            e
        }),
    );
    let p = proxy.into_inner().expect("proxy started");
    let (url, mut o) = f.url_and_opts(CacheOptions {
        lease_secs: 3, // renewed every second
        ..opts()
    });
    // A budget long enough that one extra operation on the hung server (a lease release
    // or renewal that ignores the tier's state) shows clearly over the margin.
    o.s3 = S3Options {
        timeout: Duration::from_millis(1500),
        retry_timeout: Duration::from_millis(1500),
        ..budget_opts(&o.s3.endpoint.clone().unwrap())
    };
    let budget = o.s3.budget();
    let c = Cache::open(&url, o).unwrap();
    let k = key("hang mid job");
    // Long enough for the first renewal on the hung server to run out of its budget (it
    // starts 1 s in): from then on nothing may wait on the server again.
    let compile_for = Duration::from_millis(4500);
    let compiled_at = std::cell::Cell::new(None);
    let t = Instant::now();
    let got = c
        .get_or_compile(&k, "", &inputs("m"), false, || {
            // The lease is taken; now the server hangs while we compile.
            p.set_always(Some(Fault::Delay(Duration::from_secs(60))));
            std::thread::sleep(compile_for);
            compiled_at.set(Some(Instant::now()));
            Ok(exe_for(&k, 100))
        })
        .unwrap();
    assert!(matches!(got, Obtained::Compiled { .. }));
    for i in 0..3 {
        let other = key(&format!("after the hang {i}"));
        c.get_or_compile(&other, "", &inputs("m"), false, || Ok(vec![1]))
            .unwrap();
    }
    drop(c);
    let took = t.elapsed();
    let after_compile = compiled_at.get().unwrap().elapsed();
    p.set_always(None);
    assert!(
        took < compile_for + budget + Duration::from_millis(1500),
        "{took:?}: compile {compile_for:?} + one budget {budget:?}"
    );
    // Storing, releasing the lease and three more jobs' lookups: none waits on the server.
    assert!(
        after_compile < Duration::from_millis(1500),
        "{after_compile:?} after the compile (one budget is {budget:?})"
    );
    assert_eq!(
        hit_bytes(&f.cache(opts()), &k).as_deref(),
        Some(&exe_for(&k, 100)[..]),
        "the local tier kept the entry"
    );
    fault_report(
        "S3 server hanging mid-job (lease held)",
        4,
        &format!(
            "compiled; {:.1} s with a {:.1} s compile, budget {:.1} s",
            took.as_secs_f64(),
            compile_for.as_secs_f64(),
            budget.as_secs_f64()
        ),
        0,
        0,
    );
}

/// A bucket that does not exist, and credentials the server refuses, fail at open with the
/// problem named (the CLI prints it; a job turns it into one error line, or fails when
/// strict: see the root crate's tests).
#[test]
fn a_missing_bucket_fails_at_open_naming_it() {
    let m = moto();
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts();
    o.s3 = s3_opts(&m.endpoint());
    o.local_dir = Some(dir.path().to_path_buf());
    let err = Cache::open("s3://npc-no-such-bucket-here/x", o)
        .err()
        .expect("a missing bucket must fail at open");
    let text = err.to_string();
    assert!(matches!(err, Error::InvalidUrl { .. }), "{text}");
    assert!(
        text.contains("npc-no-such-bucket-here") && text.contains("does not exist"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
    fault_report("missing bucket", 1, "error at open naming the bucket", 0, 0);
}

/// A record whose bytes were damaged (a server that mangles what it stores) and rewritten by
/// the next job: the executable the damaged record named is deleted with it, not left as an
/// executable no record names.
#[test]
fn a_damaged_record_rewritten_leaves_no_orphan_executable() {
    let dir = tempfile::tempdir().unwrap();
    let c = local(dir.path());
    let k = key("damaged record");
    let a = exe_for(&k, 1000);
    assert!(matches!(
        c.put(&k, &a, "", &inputs("d"), 1.0),
        PutOutcome::Stored
    ));
    let shard = dir.path().join("entries").join(&k.as_str()[..2]);
    std::fs::write(shard.join(format!("{k}.json")), b"{ not a record").unwrap();
    assert!(matches!(c.get(&k), Lookup::Miss));
    // the next job compiles other bytes (a compiler that is not deterministic) and stores them
    let b: Vec<u8> = a.iter().map(|x| x ^ 0x5a).collect();
    let got = c
        .get_or_compile(&k, "", &inputs("d"), false, || Ok(b.clone()))
        .unwrap();
    assert!(matches!(got, Obtained::Compiled { .. }));
    assert_eq!(hit_bytes(&c, &k), Some(b));
    let exes: Vec<String> = (std::fs::read_dir(&shard).unwrap().flatten())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(k.as_str()) && n.ends_with(".exe"))
        .collect();
    assert_eq!(exes.len(), 1, "{exes:?}");
    fault_report(
        "damaged record rewritten",
        1,
        "the damaged record's executable deleted with it",
        0,
        0,
    );
}
