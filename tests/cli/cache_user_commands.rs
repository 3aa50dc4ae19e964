//! `neuron-pc cache` as a user drives it (issue 13 item 4): key prefixes, `rm` of a missing
//! key, `ls` and `stats` over both tiers of an S3 cache, unreadable records listed as bad,
//! `verify --fix` that repairs and succeeds, and `clear` of a shared cache that asks first.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use neuron_pc_test_support::s3 as server;

use neuron_pc_cache::{Cache, CacheOptions, EntryKey, S3Options};
use sha2::{Digest, Sha256};

fn npc(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_neuron-pc"));
    c.args(args).stdin(Stdio::null());
    for v in [
        "NEURON_COMPILE_CACHE_URL",
        "NEURON_PC_CACHE_READ_ONLY",
        "NEURON_PC_CACHE_SIGNING_KEY",
        "AWS_ENDPOINT_URL",
        "AWS_PROFILE",
    ] {
        c.env_remove(v);
    }
    c.envs(envs.iter().copied());
    c.output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_dir("npc-ccmd", tag)
}

fn key(label: &str) -> EntryKey {
    EntryKey::parse(&hex::encode(Sha256::digest(label.as_bytes()))).unwrap()
}

fn inputs() -> BTreeMap<String, String> {
    BTreeMap::from([("program".to_string(), "p".to_string())])
}

/// Two keys that share their first `n` hex characters.
fn twins(n: usize) -> (EntryKey, EntryKey) {
    let mut seen: BTreeMap<String, EntryKey> = BTreeMap::new();
    for i in 0.. {
        let k = key(&format!("twin {i}"));
        if let Some(other) = seen.insert(k.as_str()[..n].to_string(), k.clone()) {
            return (other, k);
        }
    }
    unreachable!()
}

#[test]
fn prefixes_missing_keys_bad_records_and_verify_fix() {
    let d = tmp("local");
    let root = d.join("c");
    let url = root.to_str().unwrap();
    let c = Cache::open(url, CacheOptions::default()).unwrap();
    let (a, b) = twins(3);
    let solo = key("solo");
    for k in [&a, &b, &solo] {
        c.put(k, k.as_str().as_bytes(), "p", &inputs(), 1.0);
    }

    // The 12-character prefix `compile` prints.
    let show = npc(
        &[
            "cache",
            "show",
            &solo.as_str()[..12],
            "--json",
            "--cache",
            url,
        ],
        &[],
    );
    assert_eq!(show.status.code(), Some(0), "{:?}", text(&show));
    let v: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(v["key"], solo.as_str());
    // An ambiguous prefix lists the candidates.
    let amb = npc(&["cache", "show", &a.as_str()[..3], "--cache", url], &[]);
    assert_eq!(amb.status.code(), Some(1));
    let (_, err) = text(&amb);
    assert!(
        err.contains("ambiguous") && err.contains(a.as_str()) && err.contains(b.as_str()),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    // rm by prefix removes; rm of a key that is not there fails.
    let rm = npc(&["cache", "rm", &solo.as_str()[..12], "--cache", url], &[]);
    assert_eq!(rm.status.code(), Some(0), "{:?}", text(&rm));
    assert!(text(&rm).0.contains(solo.as_str()));
    let again = npc(&["cache", "rm", solo.as_str(), "--cache", url], &[]);
    assert_eq!(again.status.code(), Some(1), "{:?}", text(&again));
    assert!(text(&again).1.contains("no entry"), "{:?}", text(&again));

    // An unreadable record is listed as bad, not hidden.
    let rec = root
        .join("entries")
        .join(&a.as_str()[..2])
        .join(format!("{a}.json"));
    std::fs::write(&rec, b"{ not json").unwrap();
    let ls = npc(&["cache", "ls", "--json", "--cache", url], &[]);
    let listed: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    let bad = listed.iter().find(|e| e["key"] == a.as_str()).unwrap();
    assert!(
        bad["problem"].as_str().unwrap().contains("unreadable"),
        "{bad}"
    );
    assert!(text(&npc(&["cache", "ls", "--cache", url], &[]))
        .0
        .contains("BAD"));

    // verify --fix repairs, says what it removed, and exits 0; verify is then clean.
    let fix = npc(&["cache", "verify", "--fix", "--cache", url], &[]);
    let (out, err) = text(&fix);
    assert_eq!(fix.status.code(), Some(0), "{out}{err}");
    assert!(out.contains(&format!("removed entry {a}")), "{out}");
    assert_eq!(
        npc(&["cache", "verify", "--cache", url], &[]).status.code(),
        Some(0)
    );

    // Read-only: --fix and prune refuse, and nothing changes.
    c.put(&solo, b"x", "p", &inputs(), 1.0);
    let ro = [("NEURON_PC_CACHE_READ_ONLY", "1")];
    for args in [
        &["cache", "verify", "--fix", "--cache", url][..],
        &["cache", "prune", "--max-size", "0", "--cache", url],
    ] {
        let o = npc(args, &ro);
        assert_eq!(o.status.code(), Some(1), "{args:?}");
        assert!(text(&o).1.contains("read-only"), "{:?}", text(&o));
    }
    assert_eq!(
        c.list().unwrap().len(),
        2,
        "read-only commands removed nothing"
    );
    std::fs::remove_dir_all(d).unwrap();
}

#[test]
fn an_s3_cache_lists_both_tiers_counts_remote_entries_and_clear_asks() {
    let m = server::moto();
    let bucket = server::new_bucket(&m, "cmds");
    let d = tmp("s3");
    let local = d.join("local");
    let url = format!("s3://{bucket}/x");
    let endpoint = m.endpoint();
    let opts = |dir: &PathBuf| CacheOptions {
        local_dir: Some(dir.clone()),
        s3: S3Options {
            endpoint: Some(endpoint.clone()),
            credentials: Some(("testing".into(), "testing".into())),
            ..S3Options::default()
        },
        ..CacheOptions::default()
    };
    // A writer elsewhere filled the bucket (its own local tier); this machine's local tier
    // holds one of the entries.
    let writer = Cache::open(&url, opts(&d.join("writer"))).unwrap();
    let (one, two) = (key("remote one"), key("remote two"));
    for k in [&one, &two] {
        writer.put(k, k.as_str().as_bytes(), "p", &inputs(), 1.0);
    }
    let here = Cache::open(&url, opts(&local)).unwrap();
    assert!(matches!(here.get(&one), neuron_pc_cache::Lookup::Hit(_)));

    let envs = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("NEURON_PC_CACHE_LOCAL_DIR", local.to_str().unwrap()),
    ];
    let stats = npc(&["cache", "stats", "--json", "--cache", &url], &envs);
    let s: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(s["stats"]["entries"], 2, "{s}");
    assert_eq!(s["stats"]["tiers"][0]["entries"], 1, "{s}");
    assert_eq!(s["stats"]["tiers"][1]["entries"], 2, "{s}");
    assert_eq!(s["stats"]["shared"], true);
    assert_eq!(s["stats"]["signed"], false);
    let (out, _) = text(&npc(&["cache", "stats", "--cache", &url], &envs));
    assert!(out.contains("OFF on a shared cache"), "{out}");

    let ls = npc(&["cache", "ls", "--json", "--cache", &url], &envs);
    let l: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let tiers = |k: &EntryKey| {
        l.as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == k.as_str())
            .map(|e| e["tiers"].clone())
            .unwrap()
    };
    assert_eq!(tiers(&one), serde_json::json!(["local", "remote"]), "{l}");
    assert_eq!(tiers(&two), serde_json::json!(["remote"]), "{l}");

    // clear on a shared cache without a terminal: refused unless --yes.
    let refused = npc(&["cache", "clear", "--cache", &url], &envs);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused).1.contains("--yes"), "{:?}", text(&refused));
    assert_eq!(
        writer.stats().unwrap().tiers[1].entries,
        2,
        "nothing removed"
    );
    let cleared = npc(&["cache", "clear", "--yes", "--cache", &url], &envs);
    assert_eq!(cleared.status.code(), Some(0), "{:?}", text(&cleared));
    assert_eq!(writer.stats().unwrap().tiers[1].entries, 0);
    std::fs::remove_dir_all(d).unwrap();
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &std::path::Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.clone(), std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    out
}

/// Issue 23 item 1: each layout directory in turn a link to an outside directory holding files
/// named like the objects of the key; `cache rm KEY` and every other command leave them as
/// they were (the old delete fallback removed `<outside>/<key>.json`).
#[test]
fn no_cache_command_follows_a_layout_directory_out_of_the_root() {
    let k = key("linked layout");
    let shard = &k.as_str()[..2];
    for rel in ["entries", &format!("entries/{shard}"), "failures", "locks"] {
        let d = tmp(&format!("link-{}", rel.replace('/', "-")));
        let root = d.join("c");
        let url = root.to_str().unwrap();
        let c = Cache::open(url, CacheOptions::default()).unwrap();
        c.put(&k, b"exe", "p", &inputs(), 1.0);
        c.put_failure(&key("other"), "failed");
        let outside = d.join("outside");
        let names = [
            format!("entries/{shard}/{k}.json"),
            format!("entries/{shard}/{k}.mlir"),
            format!("entries/{shard}/{k}.0123456789abcdef.exe"),
            format!("failures/{k}.json"),
            format!("locks/{k}.lock"),
        ];
        for name in &names {
            if let Some(inside) = name.strip_prefix(&format!("{rel}/")) {
                let p = outside.join(inside);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, format!("not the cache's: {inside}")).unwrap();
            }
        }
        let before = snapshot(&outside);
        let link = root.join(rel);
        let _ = std::fs::remove_dir_all(&link);
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let key_arg = k.to_string();
        for args in [
            &["cache", "rm", &key_arg][..],
            &["cache", "ls"],
            &["cache", "stats"],
            &["cache", "show", &key_arg],
            &["cache", "verify"],
            &["cache", "prune", "--max-size", "0"],
            &["cache", "clear", "--failed", "--yes"],
            &["cache", "clear", "--yes"],
            &["cache", "verify", "--fix"],
            &["cache", "rm", &key_arg],
        ] {
            let mut args = args.to_vec();
            args.extend(["--cache", url]);
            let o = npc(&args, &[]);
            let (out, err) = text(&o);
            assert!(!err.contains("panicked"), "{args:?}: {out}{err}");
            assert_eq!(
                snapshot(&outside),
                before,
                "{rel} linked out of the root: {args:?} changed the files it points to"
            );
        }
        std::fs::remove_dir_all(d).unwrap();
    }
}
