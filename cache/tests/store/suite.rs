//! The one suite every backend passes: local directory, S3 (moto_server on loopback) and tiered.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use neuron_pc_cache::{
    Cache, CacheOptions, EntryKey, Error, Lookup, Obtained, PutMode, PutOutcome, Tier,
    ENTRY_FORMAT_VERSION,
};

fn expected_tier(b: Backend) -> Tier {
    if b == Backend::S3 {
        Tier::Remote
    } else {
        Tier::Local
    }
}

#[test]
fn round_trip_on_every_backend() {
    for b in ALL {
        let f = Fixture::new(b);
        let c = f.cache(opts());
        let k = key(&format!("round-trip {b:?}"));
        assert!(
            matches!(c.get(&k), Lookup::Miss),
            "{b:?}: empty cache misses"
        );
        let exe = exe_for(&k, 70_000);
        assert_eq!(
            c.put(&k, &exe, "module @m {}", &inputs("p1"), 12.5),
            PutOutcome::Stored,
            "{b:?}"
        );
        let reader = f.cache(opts());
        let Lookup::Hit(h) = reader.get(&k) else {
            panic!("{b:?}: miss after put")
        };
        assert_eq!(h.executable, exe, "{b:?}");
        assert_eq!(h.tier, expected_tier(b), "{b:?}");
        assert_eq!(h.record.key, k.as_str());
        assert_eq!(h.record.key_inputs, inputs("p1"));
        assert_eq!(h.record.executable_size, 70_000);
        assert_eq!(h.record.program_size, "module @m {}".len() as u64);
        assert_eq!(h.record.compile_ms, 12.5);
        assert_eq!(h.record.format_version, ENTRY_FORMAT_VERSION);
        assert_eq!(h.record.tool_version, env!("CARGO_PKG_VERSION"));
        assert!(h.record.created_at > 1_700_000_000);
        assert_eq!(reader.program(&k).as_deref(), Some("module @m {}"));
        let listed = reader.list().unwrap();
        assert_eq!(listed.len(), 1, "{b:?}");
        assert_eq!(listed[0].key, k.as_str());
        assert_eq!(reader.stats().unwrap().entries, 1, "{b:?}");
        let report = reader.verify(false).unwrap();
        // Each tier is checked.
        assert!(
            report.bad.is_empty() && report.checked == f.stores.len(),
            "{b:?}: {report:?}"
        );

        // The first complete entry wins: a second writer's bytes do not replace it.
        let other = exe_for(&key("other"), 100);
        assert_eq!(
            f.cache(opts()).put(&k, &other, "", &inputs("p1"), 1.0),
            PutOutcome::Stored
        );
        assert_eq!(hit_bytes(&reader, &k), Some(exe.clone()), "{b:?}");
        // ...and the loser's executable is not left behind.
        for s in &f.stores {
            assert_eq!(s.get(&exe_obj(&k, &other)).unwrap(), None, "{b:?}");
        }
        // `replace` does replace (an entry that verified but would not load).
        assert_eq!(
            reader.replace(&k, &other, "", &inputs("p1"), 1.0),
            PutOutcome::Stored
        );
        assert_eq!(hit_bytes(&reader, &k), Some(other.clone()), "{b:?}");
        for s in &f.stores {
            assert_eq!(
                s.get(&exe_obj(&k, &exe)).unwrap(),
                None,
                "{b:?}: replaced executable removed"
            );
        }

        reader.remove(&k).unwrap();
        assert!(matches!(reader.get(&k), Lookup::Miss), "{b:?}");
        assert!(reader.list().unwrap().is_empty());
    }
}

#[test]
fn opening_by_url_reaches_the_same_entries() {
    for b in ALL {
        let f = Fixture::new(b);
        let k = key(&format!("url {b:?}"));
        let exe = exe_for(&k, 1000);
        let (url, o) = f.url_and_opts(opts());
        let c = Cache::open(&url, o.clone()).unwrap();
        assert_eq!(c.put(&k, &exe, "p", &inputs("u"), 1.0), PutOutcome::Stored);
        assert_eq!(hit_bytes(&f.cache(opts()), &k), Some(exe.clone()), "{b:?}");
        if b == Backend::Local {
            let c2 = Cache::open(&format!("file://{url}"), o).unwrap();
            assert_eq!(hit_bytes(&c2, &k), Some(exe), "file:// form");
        }
    }
}

#[test]
fn tiered_reads_through_and_writes_through() {
    let f = Fixture::new(Backend::Tiered);
    let (local, remote) = (f.stores[0].clone(), f.stores[1].clone());
    let k = key("tiered");
    let exe = exe_for(&k, 5000);
    // Written by a remote-only client (another machine).
    let remote_only = Cache::with_stores(vec![remote.clone()], opts()).unwrap();
    assert_eq!(
        remote_only.put(&k, &exe, "prog", &inputs("t"), 3.0),
        PutOutcome::Stored
    );
    assert_eq!(local.get(&record_obj(&k)).unwrap(), None);
    let c = f.cache(opts());
    let Lookup::Hit(h) = c.get(&k) else {
        panic!("miss")
    };
    assert_eq!((h.executable.clone(), h.tier), (exe.clone(), Tier::Remote));
    assert!(
        local.get(&record_obj(&k)).unwrap().is_some(),
        "read-through filled the local tier"
    );
    assert_eq!(
        local.get(&program_obj(&k)).unwrap().as_deref(),
        Some(&b"prog"[..])
    );
    let Lookup::Hit(h) = c.get(&k) else {
        panic!("miss")
    };
    assert_eq!((h.executable, h.tier), (exe, Tier::Local));

    let k2 = key("tiered write");
    let exe2 = exe_for(&k2, 10);
    assert_eq!(c.put(&k2, &exe2, "", &inputs("t"), 1.0), PutOutcome::Stored);
    assert!(
        local.get(&record_obj(&k2)).unwrap().is_some()
            && remote.get(&record_obj(&k2)).unwrap().is_some()
    );

    // A damaged local copy falls through to the remote one and is repaired.
    local
        .put(&exe_obj(&k2, &exe2), b"junk", PutMode::Overwrite)
        .unwrap();
    let Lookup::Hit(h) = c.get(&k2) else {
        panic!("miss")
    };
    assert_eq!((h.executable.clone(), h.tier), (exe2.clone(), Tier::Remote));
    assert_eq!(local.get(&exe_obj(&k2, &exe2)).unwrap(), Some(exe2));
}

/// Each way an entry can be damaged, applied to every store of the fixture.
fn damage(f: &Fixture, k: &EntryKey, exe: &[u8], how: &str, donor: &(EntryKey, Vec<u8>)) {
    for s in &f.stores {
        let e = exe_obj(k, exe);
        match how {
            "truncated" => s
                .put(&e, &exe[..exe.len() / 2], PutMode::Overwrite)
                .unwrap(),
            "empty" => s.put(&e, b"", PutMode::Overwrite).unwrap(),
            "bit flip" => {
                let mut b = exe.to_vec();
                b[exe.len() / 3] ^= 0x10;
                s.put(&e, &b, PutMode::Overwrite).unwrap()
            }
            "garbage appended" => {
                let mut b = exe.to_vec();
                b.extend_from_slice(b"garbage");
                s.put(&e, &b, PutMode::Overwrite).unwrap()
            }
            "another key's executable" => s.put(&e, &donor.1, PutMode::Overwrite).unwrap(),
            "another key's entry" => {
                // The donor's record and executable copied under this key's names.
                let rec = s.get(&record_obj(&donor.0)).unwrap().unwrap();
                s.put(&record_obj(k), &rec, PutMode::Overwrite).unwrap();
                s.put(&exe_obj(k, &donor.1), &donor.1, PutMode::Overwrite)
                    .unwrap();
                true
            }
            "record without executable" => {
                s.delete(&e).unwrap();
                true
            }
            "executable without record" => {
                s.delete(&record_obj(k)).unwrap();
                true
            }
            "garbage record" => s
                .put(
                    &record_obj(k),
                    b"{\"format_version\": 1, \"key\"",
                    PutMode::Overwrite,
                )
                .unwrap(),
            "older format" => {
                let rec = s.get(&record_obj(k)).unwrap().unwrap();
                let mut v: serde_json::Value = serde_json::from_slice(&rec).unwrap();
                v["format_version"] = serde_json::json!(ENTRY_FORMAT_VERSION - 1);
                s.put(
                    &record_obj(k),
                    &serde_json::to_vec(&v).unwrap(),
                    PutMode::Overwrite,
                )
                .unwrap()
            }
            other => panic!("unknown damage {other}"),
        };
    }
}

const DAMAGE: [&str; 10] = [
    "truncated",
    "empty",
    "bit flip",
    "garbage appended",
    "another key's executable",
    "another key's entry",
    "record without executable",
    "executable without record",
    "garbage record",
    "older format",
];

#[test]
fn damaged_entries_are_misses_and_the_next_write_repairs_them() {
    for b in ALL {
        let f = Fixture::new(b);
        let c = f.cache(opts());
        let dk = key("donor");
        let donor = (dk.clone(), exe_for(&dk, 3000));
        c.put(&donor.0, &donor.1, "", &inputs("d"), 1.0);
        for how in DAMAGE {
            let k = key(&format!("damage {how}"));
            let exe = exe_for(&k, 3000);
            assert_eq!(c.put(&k, &exe, "p", &inputs(how), 1.0), PutOutcome::Stored);
            damage(&f, &k, &exe, how, &donor);
            let reader = f.cache(opts());
            assert!(
                matches!(reader.get(&k), Lookup::Miss),
                "{b:?}: {how} must be a miss"
            );
            let report = reader.verify(false).unwrap();
            assert!(
                report.bad.iter().any(|(bk, _)| bk == k.as_str()),
                "{b:?}: verify reports {how}: {report:?}"
            );
            // get_or_compile recompiles, and the entry is whole again.
            let compiled = reader
                .get_or_compile(&k, "p", &inputs(how), false, || Ok(exe.clone()))
                .unwrap();
            assert!(
                matches!(compiled, Obtained::Compiled { .. }),
                "{b:?}: {how}"
            );
            assert_eq!(
                hit_bytes(&f.cache(opts()), &k),
                Some(exe.clone()),
                "{b:?}: {how} repaired"
            );
        }
        assert_eq!(
            hit_bytes(&c, &donor.0),
            Some(donor.1.clone()),
            "{b:?}: the donor is untouched"
        );
        // verify --fix removes what is bad and nothing else.
        let k = key("to fix");
        let exe = exe_for(&k, 100);
        c.put(&k, &exe, "", &inputs("f"), 1.0);
        damage(&f, &k, &exe, "bit flip", &donor);
        let r = c.verify(true).unwrap();
        assert_eq!(r.bad.len(), f.stores.len(), "{b:?}: one per tier: {r:?}");
        assert!(c.verify(false).unwrap().bad.is_empty(), "{b:?}");
        assert_eq!(hit_bytes(&c, &donor.0), Some(donor.1.clone()));
        assert_eq!(c.list().unwrap().len(), DAMAGE.len() + 1, "{b:?}");
        fault_report(
            &format!("damaged entry, {} kinds ({b:?})", DAMAGE.len()),
            DAMAGE.len(),
            "miss, reported by verify, recompiled and repaired",
            0,
            0,
        );
    }
}

#[test]
fn failure_records_block_the_same_compiler_only() {
    for b in ALL {
        let f = Fixture::new(b);
        let c = f.cache(opts());
        let k = key(&format!("fails {b:?}"));
        let calls = AtomicUsize::new(0);
        let err = c
            .get_or_compile(&k, "p", &inputs("x"), false, || {
                calls.fetch_add(1, Ordering::SeqCst);
                Err("error: unsupported op".to_string())
            })
            .unwrap_err();
        assert!(
            matches!(err, Error::Compile(ref m) if m.contains("unsupported op")),
            "{err}"
        );
        let other_proc = f.cache(opts());
        let Lookup::Failed(rec) = other_proc.get(&k) else {
            panic!("{b:?}: failure not recorded")
        };
        assert_eq!(
            (rec.message.as_str(), rec.compiler_version.as_str()),
            ("error: unsupported op", "test-compiler 1")
        );
        let err = other_proc
            .get_or_compile(&k, "p", &inputs("x"), false, || {
                panic!("must not recompile")
            })
            .unwrap_err();
        assert!(err.to_string().contains("unsupported op"));
        // Another compiler version is not blocked.
        let newer = f.cache(CacheOptions {
            compiler_version: "test-compiler 2".into(),
            ..opts()
        });
        assert!(matches!(newer.get(&k), Lookup::Miss), "{b:?}");
        // The retry flag retries; success clears the failure.
        let exe = exe_for(&k, 64);
        let got = other_proc
            .get_or_compile(&k, "p", &inputs("x"), true, || Ok(exe.clone()))
            .unwrap();
        assert!(matches!(got, Obtained::Compiled { ref executable, .. } if *executable == exe));
        assert_eq!(hit_bytes(&f.cache(opts()), &k), Some(exe));
        assert_eq!(f.last().get(&failure_obj(&k)).unwrap(), None, "{b:?}");
        // clear --failed removes only failure records.
        let k2 = key(&format!("fails again {b:?}"));
        c.put_failure(&k2, "boom");
        assert_eq!(c.clear(true).unwrap(), f.stores.len());
        assert!(matches!(c.get(&k2), Lookup::Miss));
        assert_eq!(c.list().unwrap().len(), 1);
        assert!(c.clear(false).unwrap() >= 3);
        assert!(c.list().unwrap().is_empty());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn signing_refuses_unsigned_and_mis_signed_entries() {
    for b in ALL {
        let f = Fixture::new(b);
        let signed = |secret: &str| {
            f.cache(CacheOptions {
                signing_key: Some(secret.as_bytes().to_vec()),
                ..opts()
            })
        };
        let k = key(&format!("signed {b:?}"));
        let exe = exe_for(&k, 500);
        signed("s3cret").put(&k, &exe, "", &inputs("s"), 1.0);
        assert_eq!(hit_bytes(&signed("s3cret"), &k), Some(exe.clone()), "{b:?}");
        assert_eq!(
            hit_bytes(&signed("wrong"), &k),
            None,
            "{b:?}: mis-signed refused"
        );
        assert!(!signed("wrong").verify(false).unwrap().bad.is_empty());
        // A planted entry (written without the key) is refused by signing readers.
        let planted = key(&format!("planted {b:?}"));
        f.cache(opts())
            .put(&planted, &exe_for(&planted, 10), "", &inputs("p"), 1.0);
        assert_eq!(
            hit_bytes(&signed("s3cret"), &planted),
            None,
            "{b:?}: unsigned refused"
        );
        // Re-signing the planted record with a forged signature does not help.
        for s in &f.stores {
            let rec = s.get(&record_obj(&planted)).unwrap().unwrap();
            let mut v: serde_json::Value = serde_json::from_slice(&rec).unwrap();
            v["signature"] = serde_json::json!("00".repeat(32));
            s.put(
                &record_obj(&planted),
                &serde_json::to_vec(&v).unwrap(),
                PutMode::Overwrite,
            )
            .unwrap();
        }
        assert_eq!(
            hit_bytes(&signed("s3cret"), &planted),
            None,
            "{b:?}: forged signature refused"
        );
        fault_report(
            &format!("signing: wrong key, unsigned, forged ({b:?})"),
            3,
            "refused (miss)",
            0,
            0,
        );
    }
}

#[test]
fn processes_missing_on_one_key_compile_it_once() {
    for b in ALL {
        let f = Arc::new(Fixture::new(b));
        let k = key(&format!("once {b:?}"));
        let exe = exe_for(&k, 2048);
        let calls = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (f, k, exe, calls) = (f.clone(), k.clone(), exe.clone(), calls.clone());
                std::thread::spawn(move || {
                    let c = f.cache(opts());
                    let got = c
                        .get_or_compile(&k, "p", &inputs("o"), false, || {
                            calls.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(400));
                            Ok(exe.clone())
                        })
                        .unwrap();
                    match got {
                        Obtained::Hit(h) | Obtained::Waited(h) => h.executable,
                        Obtained::Compiled { executable, .. } => executable,
                    }
                })
            })
            .collect();
        for t in threads {
            assert_eq!(t.join().unwrap(), exe, "{b:?}");
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "{b:?}: compiled once");
        assert_eq!(
            f.last().get(&lock_obj(&k)).unwrap(),
            None,
            "{b:?}: lock released"
        );
    }
}

#[test]
fn stale_and_foreign_locks() {
    let dead_pid = {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        pid
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    for b in ALL {
        let f = Fixture::new(b);
        let quick = CacheOptions {
            lock_wait: Duration::from_millis(700),
            ..opts()
        };
        // A lease left by a killed process on this host: broken at once.
        // A lease on another host that expired: broken at once.
        for (i, (pid, h, exp)) in [
            (dead_pid, host.clone(), now + 3600),
            (1, "elsewhere".to_string(), now - 5),
        ]
        .into_iter()
        .enumerate()
        {
            let k = key(&format!("stale {b:?} {i}"));
            let lease = serde_json::json!({"pid": pid, "host": h, "expires_at": exp});
            f.last()
                .put(
                    &lock_obj(&k),
                    lease.to_string().as_bytes(),
                    PutMode::CreateOnly,
                )
                .unwrap();
            let t = Instant::now();
            let got = f
                .cache(quick.clone())
                .get_or_compile(&k, "", &inputs("s"), false, || Ok(vec![1, 2, 3]))
                .unwrap();
            assert!(matches!(got, Obtained::Compiled { .. }), "{b:?} {i}");
            assert!(
                t.elapsed() < Duration::from_millis(600),
                "{b:?} {i}: stale lease broken without waiting"
            );
        }
        // A live lease held elsewhere: wait up to the bound, then compile here anyway. (Its
        // expiry is one a holder renewing a 60 s lease can have; one far beyond that is void,
        // see `a_lease_with_a_far_future_expiry_is_void`.)
        let k = key(&format!("held {b:?}"));
        let lease = serde_json::json!({"pid": 1, "host": "elsewhere", "expires_at": now + 50});
        f.last()
            .put(
                &lock_obj(&k),
                lease.to_string().as_bytes(),
                PutMode::CreateOnly,
            )
            .unwrap();
        let t = Instant::now();
        let got = f
            .cache(quick.clone())
            .get_or_compile(&k, "", &inputs("s"), false, || Ok(vec![4]))
            .unwrap();
        assert!(matches!(got, Obtained::Compiled { .. }));
        assert!(
            t.elapsed() >= Duration::from_millis(700),
            "{b:?}: waited for the holder"
        );
        assert_eq!(hit_bytes(&f.cache(opts()), &k), Some(vec![4]));
        // verify --fix clears stale locks but not live ones.
        let k2 = key(&format!("stale again {b:?}"));
        let lease = serde_json::json!({"pid": dead_pid, "host": host, "expires_at": now + 3600});
        f.last()
            .put(
                &lock_obj(&k2),
                lease.to_string().as_bytes(),
                PutMode::CreateOnly,
            )
            .unwrap();
        f.cache(opts()).verify(true).unwrap();
        assert_eq!(f.last().get(&lock_obj(&k2)).unwrap(), None, "{b:?}");
        assert!(f.last().get(&lock_obj(&k)).unwrap().is_some(), "{b:?}");
    }
}

#[test]
fn read_only_clients_never_write() {
    for b in ALL {
        let f = Fixture::new(b);
        let k = key(&format!("ro {b:?}"));
        let exe = exe_for(&k, 100);
        f.cache(opts()).put(&k, &exe, "", &inputs("r"), 1.0);
        let ro = f.cache(CacheOptions {
            read_only: true,
            ..opts()
        });
        let k2 = key(&format!("ro new {b:?}"));
        assert_eq!(
            ro.put(&k2, &exe, "", &inputs("r"), 1.0),
            PutOutcome::ReadOnly
        );
        assert_eq!(hit_bytes(&ro, &k), Some(exe.clone()));
        let got = ro
            .get_or_compile(&k2, "", &inputs("r"), false, || Ok(vec![9]))
            .unwrap();
        assert!(matches!(got, Obtained::Compiled { .. }));
        assert!(matches!(ro.get(&k2), Lookup::Miss), "{b:?}: nothing stored");
        assert!(matches!(ro.remove(&k), Err(Error::ReadOnly)));
        assert!(matches!(ro.clear(false), Err(Error::ReadOnly)));
        assert_eq!(hit_bytes(&ro, &k), Some(exe));
    }
}

#[test]
fn bad_urls_and_endpoints_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        "",
        "   ",
        "ftp://host/x",
        "gs://bucket/x",
        "file://relative/path",
        "s3://",
        "s3://B",
        "s3://bucket/../x",
        "s3://a/b",
        "x\0y",
    ] {
        let r = Cache::open(url, opts());
        assert!(
            matches!(r, Err(Error::InvalidUrl { .. })),
            "{url:?} must be refused: {:?}",
            r.as_ref().map(|c| c.describe())
        );
    }
    // Plain http only on loopback.
    let mut o = opts();
    o.local_tier = false;
    o.s3.endpoint = Some("http://10.1.2.3:9000".into());
    let err = Cache::open("s3://bucket/x", o).err().expect("refused");
    assert!(err.to_string().contains("loopback"), "{err}");
    // A symlink as the cache root is refused.
    let target = dir.path().join("real");
    std::fs::create_dir(&target).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    assert!(Cache::open(link.to_str().unwrap(), opts()).is_err());
}
