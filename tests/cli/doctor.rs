//! `neuron-pc doctor`, the binary the user runs: a healthy cpu setup with four devices passes
//! every check with a consistent bandwidth table; a missing plugin, a missing bucket, refused
//! credentials (the S3 test server), a read-only cache and too little disk each fail with their
//! line and exit status 1.

use crate::server;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use neuron_pc_test_support::proxy;
use serde_json::Value;

/// Small and few: the table's sizes are 1, 4 and 16 KiB.
const QUICK: [&str; 6] = ["--max-bytes", "16K", "--iters", "3", "--warmup", "1"];
/// The quickest full run: one device (no table), nothing timed.
const ONE_DEVICE: [&str; 3] = ["--devices", "1", "--skip-bandwidth"];

fn doctor(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_neuron-pc"));
    c.arg("doctor").args(args);
    for v in [
        "NEURON_COMPILE_CACHE_URL",
        "NEURON_CC_FLAGS",
        "NEURON_PC_CACHE",
        "NEURON_PC_CACHE_READ_ONLY",
        "NEURON_PC_CACHE_SIGNING_KEY",
        "NEURON_PC_CACHE_LOCAL_DIR",
        "NEURON_PC_CACHE_LOCAL_TIER",
        "NEURON_PC_CACHE_S3_TIMEOUT",
        "NEURON_PC_CACHE_STRICT",
        "NEURON_PC_CPU_PLUGIN",
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
    ] {
        c.env_remove(v);
    }
    c.envs(envs.iter().copied());
    c.output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The line of check `name`, as `(verdict, detail)`.
fn line(out: &Output, name: &str) -> (String, String) {
    let text = stdout(out);
    text.lines()
        .find_map(|l| {
            let mut words = l.split_whitespace();
            let verdict = words.next()?;
            (words.next()? == name).then(|| {
                let detail = words.collect::<Vec<_>>().join(" ");
                (verdict.to_string(), detail)
            })
        })
        .unwrap_or_else(|| panic!("no {name} line in\n{text}\n{}", stderr(out)))
}

/// Every check's verdict, in order.
fn verdicts(out: &Output) -> Vec<(String, String)> {
    stdout(out)
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with(' ') && !l.starts_with("doctor"))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.to_string()))
        })
        .collect()
}

fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_path("npc-doctor", tag)
}

/// Every file under `dir`.
fn files(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .flat_map(|e| {
            if e.path().is_dir() {
                files(&e.path())
            } else {
                vec![e.path()]
            }
        })
        .collect()
}

#[test]
fn a_healthy_four_device_setup_passes_with_a_consistent_table() {
    let cache = tmp("healthy");
    let c = cache.to_str().unwrap();
    let mut args = vec!["--devices", "4", "--json", "--cache", c];
    args.extend(QUICK);
    let out = doctor(&args, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v:#}");
    assert_eq!(v["devices"], 4, "{v:#}");
    assert_eq!(v["target"], "cpu");
    let checks = v["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "plugin",
            "compute",
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "cache/local",
            "disk/cache",
            "disk/temp",
            "bandwidth"
        ]
    );
    for check in checks {
        assert_eq!(check["status"], "ok", "{check:#}");
    }
    let by_name = |n: &str| checks.iter().find(|c| c["name"] == n).unwrap();
    assert_eq!(by_name("plugin")["data"]["devices"], 4);
    let compute = by_name("compute")["data"]["devices"].as_array().unwrap();
    assert_eq!(compute.len(), 4);
    for (d, e) in compute.iter().enumerate() {
        assert_eq!(e["device"], d);
        assert!(e["max_relative_error"].as_f64().unwrap() < 1e-4, "{e}");
    }
    assert!(
        by_name("all_gather")["detail"]
            .as_str()
            .unwrap()
            .contains("-> f32[32, 16]"),
        "four [8, 16] blocks gathered"
    );

    // The table: every collective at 1, 4 and 16 KiB; busbw = algbw times nccl-tests' factor.
    let rows = v["bandwidth"].as_array().unwrap();
    let factors = [
        ("all_reduce", 1.5),
        ("all_gather", 0.75),
        ("reduce_scatter", 0.75),
    ];
    for (collective, factor) in factors {
        let mine: Vec<&Value> = rows
            .iter()
            .filter(|r| r["collective"] == collective)
            .collect();
        let sizes: Vec<u64> = mine
            .iter()
            .map(|r| r["size_bytes"].as_u64().unwrap())
            .collect();
        assert_eq!(sizes, [1024, 4096, 16384], "{collective}");
        for r in mine {
            let size = r["size_bytes"].as_f64().unwrap();
            let time_us = r["time_us"].as_f64().unwrap();
            let algbw = r["algbw_gbps"].as_f64().unwrap();
            let busbw = r["busbw_gbps"].as_f64().unwrap();
            assert_eq!(r["count"].as_f64().unwrap() * 4.0, size, "{r}");
            assert!(time_us > 0.0, "{r}");
            assert!(
                (algbw - size / (time_us * 1e3)).abs() <= 1e-9 * algbw,
                "{r}"
            );
            assert!((busbw - algbw * factor).abs() <= 1e-9 * busbw, "{r}");
            assert_eq!(r["wrong"], 0, "{r}");
        }
    }
    assert_eq!(rows.len(), 9);

    // The probe entry is gone; the free space is the file system's available space.
    assert_eq!(files(&cache), Vec::<PathBuf>::new());
    let disk = &by_name("disk/cache")["data"];
    let st = rustix::fs::statvfs(&cache).unwrap();
    let available = (st.f_bavail * st.f_frsize) as f64;
    let reported = disk["free_bytes"].as_f64().unwrap();
    assert!(
        (reported - available).abs() < (1u64 << 30) as f64,
        "{reported} vs {available}"
    );
    assert_eq!(disk["min_free_bytes"], 1u64 << 30);
    std::fs::remove_dir_all(cache).unwrap();
}

#[test]
fn the_text_report_has_one_line_per_check_and_the_table() {
    let cache = tmp("text");
    let c = cache.to_str().unwrap();
    let mut args = vec!["--devices", "2", "--cache", c];
    args.extend(QUICK);
    let out = doctor(&args, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    for (verdict, name) in verdicts(&out) {
        assert_eq!(verdict, "ok", "{name}: {text}");
    }
    assert!(line(&out, "plugin").1.ends_with(", 2 devices"), "{text}");
    let header = text.lines().filter(|l| l.starts_with('#')).count();
    assert_eq!(header, 3, "{text}");
    let rows: Vec<Vec<&str>> = text
        .lines()
        .filter(|l| l.starts_with(' '))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 9, "{text}");
    for r in &rows {
        assert_eq!(r.len(), 8, "{r:?}");
        let (algbw, busbw): (f64, f64) = (r[5].parse().unwrap(), r[6].parse().unwrap());
        // Two devices: busbw = algbw for all_reduce, half of it for the others (to 3 places).
        let factor = if r[0] == "all_reduce" { 1.0 } else { 0.5 };
        assert!((busbw - algbw * factor).abs() <= 0.0015, "{r:?}");
    }
    assert!(text
        .trim_end()
        .ends_with("doctor passed: 9 ok, 0 warn, 0 FAIL, 0 skipped"));
    std::fs::remove_dir_all(cache).unwrap();
}

#[test]
fn a_missing_or_broken_plugin_fails_its_line_and_skips_the_devices() {
    let cache = tmp("noplugin");
    let c = cache.to_str().unwrap();
    let junk = cache.with_extension("so");
    std::fs::write(&junk, b"not a shared library").unwrap();
    let junk_s = junk.to_str().unwrap();
    for (plugin, says) in [
        (
            "/nonexistent/libpjrt_cpu.so",
            "NEURON_PC_CPU_PLUGIN names a file that does not exist",
        ),
        (junk_s, junk_s),
    ] {
        let out = doctor(&["--cache", c], &[("NEURON_PC_CPU_PLUGIN", plugin)]);
        assert_eq!(out.status.code(), Some(1), "{plugin}: {}", stderr(&out));
        let (verdict, detail) = line(&out, "plugin");
        assert_eq!(verdict, "FAIL", "{detail}");
        assert!(detail.contains(says), "{detail}");
        for name in ["compute", "all_reduce", "bandwidth"] {
            assert_eq!(line(&out, name).0, "skip", "{name}");
        }
        // The storage checks still run.
        assert_eq!(line(&out, "cache/local").0, "ok");
        assert_eq!(line(&out, "disk/temp").0, "ok");
        let fails = verdicts(&out).iter().filter(|(v, _)| v == "FAIL").count();
        assert_eq!(fails, 1, "{}", stdout(&out));
    }
    std::fs::remove_file(junk).unwrap();
    let _ = std::fs::remove_dir_all(cache);
}

#[test]
fn a_read_only_cache_and_too_little_disk_fail() {
    let cache = tmp("ro");
    std::fs::create_dir_all(&cache).unwrap();
    let c = cache.to_str().unwrap();
    let mut args = vec!["--cache", c];
    args.extend(ONE_DEVICE);
    let out = doctor(&args, &[("NEURON_PC_CACHE_READ_ONLY", "1")]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let (verdict, detail) = line(&out, "cache/local");
    assert_eq!(verdict, "FAIL");
    assert!(
        detail.contains("read-only (NEURON_PC_CACHE_READ_ONLY is set)"),
        "{detail}"
    );
    assert_eq!(files(&cache), Vec::<PathBuf>::new(), "nothing written");
    assert_eq!(line(&out, "disk/cache").0, "ok");

    args.extend(["--min-free-gib", "1000000000"]);
    let out = doctor(&args, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(line(&out, "cache/local").0, "ok");
    for name in ["disk/cache", "disk/temp"] {
        let (verdict, detail) = line(&out, name);
        assert_eq!(verdict, "FAIL", "{name}");
        assert!(
            detail.contains("below --min-free-gib 1000000000"),
            "{detail}"
        );
    }
    std::fs::remove_dir_all(cache).unwrap();
}

#[test]
fn an_s3_cache_probes_both_tiers_and_a_missing_bucket_fails() {
    let m = server::moto();
    let bucket = server::new_bucket(&m, "doctor");
    let endpoint = m.endpoint();
    let local = tmp("s3-local");
    let envs = [
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("NEURON_PC_CACHE_LOCAL_DIR", local.to_str().unwrap()),
    ];
    let url = format!("s3://{bucket}/doctor");
    let mut args = vec!["--cache", url.as_str()];
    args.extend(ONE_DEVICE);
    let out = doctor(&args, &envs);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let (verdict, detail) = line(&out, "cache/remote");
    assert_eq!(verdict, "ok");
    assert!(
        detail.starts_with(&format!("{url}: probe entry written")),
        "{detail}"
    );
    assert_eq!(line(&out, "cache/local").0, "ok");
    let (_, listing) = server::http(m.port, "GET", &format!("/{bucket}?list-type=2"), b"").unwrap();
    let listing = String::from_utf8_lossy(&listing);
    assert!(
        !listing.contains("<Key>"),
        "the probe left objects: {listing}"
    );

    let out = doctor(
        &[
            "--cache",
            "s3://npc-doctor-no-such-bucket/x",
            "--devices",
            "1",
        ],
        &envs,
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let (verdict, detail) = line(&out, "cache/remote");
    assert_eq!(verdict, "FAIL");
    assert!(
        detail.contains("the bucket npc-doctor-no-such-bucket does not exist"),
        "{detail}"
    );
    let _ = std::fs::remove_dir_all(local);
}

/// Issue 23 item 5: a server that ignores `If-None-Match: *` (the tests' proxy drops it in
/// front of moto) is named in its own line: a warning with the fallback, a FAIL in strict
/// mode; an honest server is `ok`. (doctor used to say such a cache was fine.)
#[test]
fn a_server_that_ignores_conditional_put_is_named() {
    let m = server::moto();
    let local = tmp("cond-local");
    for (strip, strict, verdict, code) in [
        (false, "0", "ok", 0),
        (true, "0", "warn", 0),
        (true, "1", "FAIL", 1),
    ] {
        let bucket = server::new_bucket(&m, "doctor-cond");
        let p = proxy::Proxy::start(m.port);
        if strip {
            p.set_always(Some(proxy::Fault::StripConditional));
        }
        let endpoint = p.endpoint();
        let envs = [
            ("AWS_ENDPOINT_URL", endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("NEURON_PC_CACHE_LOCAL_DIR", local.to_str().unwrap()),
            ("NEURON_PC_CACHE_STRICT", strict),
        ];
        let url = format!("s3://{bucket}/doctor");
        let mut args = vec!["--cache", url.as_str()];
        args.extend(ONE_DEVICE);
        let out = doctor(&args, &envs);
        let (v, detail) = line(&out, "cache/conditional-put");
        assert_eq!(v, verdict, "strip {strip} strict {strict}: {detail}");
        assert_eq!(out.status.code(), Some(code), "{}", stdout(&out));
        assert_eq!(line(&out, "cache/remote").0, "ok");
        if strip {
            assert!(detail.contains("ignores If-None-Match"), "{detail}");
        }
    }
    let _ = std::fs::remove_dir_all(local);
}

/// The server starts refusing requests whose key it does not know (moto's IAM checks, switched
/// on after the bucket exists): the doctor that passed a moment before fails with one line.
#[test]
fn refused_credentials_fail_the_remote_tier() {
    let m = server::start();
    let bucket = server::new_bucket(&m, "doctor-creds");
    let endpoint = m.endpoint();
    let local = tmp("creds-local");
    let url = format!("s3://{bucket}/x");
    let mut args = vec!["--cache", url.as_str()];
    args.extend(ONE_DEVICE);
    let envs = |secret: &'static str| {
        vec![
            ("AWS_ENDPOINT_URL", endpoint.clone()),
            ("AWS_ACCESS_KEY_ID", "AKIADOCTORTESTKEY000".to_string()),
            ("AWS_SECRET_ACCESS_KEY", secret.to_string()),
            ("NEURON_PC_CACHE_LOCAL_DIR", local.display().to_string()),
        ]
    };
    let run = |secret| {
        let e = envs(secret);
        let e: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
        doctor(&args, &e)
    };
    assert_eq!(
        run("wrong-secret").status.code(),
        Some(0),
        "auth is not on yet"
    );
    let (status, body) = server::http(m.port, "POST", "/moto-api/reset-auth", b"0").unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let out = run("wrong-secret");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let (verdict, detail) = line(&out, "cache/remote");
    assert_eq!(verdict, "FAIL");
    assert!(
        detail.contains(&format!("cannot open {url}: {url}: access denied")),
        "{detail}"
    );
    assert!(detail.contains("403"), "{detail}");
    let _ = std::fs::remove_dir_all(local);
}

#[test]
fn bad_options_are_usage_errors() {
    for bad in [
        &["--max-bytes", "1T"][..],
        &["--max-bytes", "lots"],
        &["--min-bytes", "64K", "--max-bytes", "4K"],
        &["--devices", "0"],
        &["--iters", "0"],
        &["--min-free-gib", "-1"],
        &["--factor", "1"],
    ] {
        let out = doctor(bad, &[]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {}", stderr(&out));
        assert_eq!(stdout(&out), "", "{bad:?}");
    }
}
