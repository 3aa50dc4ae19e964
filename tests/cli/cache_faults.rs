//! Cache faults seen by a job and by `neuron-pc cache` (issues 13 and 14): a planted executable
//! consistent with its record, a cache root that is a symlink, a missing bucket and missing
//! credentials (one error line, `cache_unavailable`, strict mode), and a hung S3 server.
//! Each test prints a `FAULT-REPORT` line (see `scripts/fault-report`).

use crate::server;
use neuron_pc_test_support::process::test_path;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use neuron_pc::{HostTensor, LazyDevice, Metrics};
use neuron_pc_cache::{PutMode, Store};
use neuron_pc_test_support::proxy;
use sha2::{Digest, Sha256};
use std::sync::Arc;

const CHILD: &str = "NEURON_PC_TEST_CHILD";
/// The side of the square weight the child trains: different sizes, different graphs.
const SIZE: &str = "NEURON_PC_TEST_SIZE";

fn fault_report(class: &str, trials: usize, outcome: &str, lost: usize, wrong: usize) {
    println!("FAULT-REPORT\t{class}\t{trials}\t{outcome}\t{lost}\t{wrong}");
}

/// A small training-like loop (one graph); prints its results and metrics.
fn child_loop() {
    let n: usize = std::env::var(SIZE).map_or(8, |v| v.parse().unwrap());
    let dev = LazyDevice::from_env().unwrap();
    let w = dev
        .tensor(
            &HostTensor::from_slice(
                &(0..n * n).map(|i| i as f32 / 64.0).collect::<Vec<_>>(),
                &[n, n],
            )
            .unwrap(),
        )
        .unwrap();
    for step in 0..4 {
        let x = dev
            .tensor(&HostTensor::from_slice(&vec![step as f32 * 0.1; n * n], &[n, n]).unwrap())
            .unwrap();
        let y = x.matmul(&w).unwrap().tanh().unwrap().add(&w).unwrap();
        w.assign(&y).unwrap();
        dev.mark_step().unwrap();
    }
    let bits: Vec<u32> = w
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect();
    println!("RESULT {}", serde_json::to_string(&bits).unwrap());
    println!("METRICS {}", serde_json::to_string(&dev.metrics()).unwrap());
}

struct Run {
    out: Output,
    took: Duration,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn field(&self, tag: &str) -> String {
        let s = self.stdout();
        s.lines()
            .find_map(|l| l.find(tag).map(|i| l[i + tag.len()..].to_string()))
            .unwrap_or_else(|| panic!("no {tag} in {s}\n{}", self.stderr()))
    }
    fn ok(&self) -> (Vec<u32>, Metrics) {
        assert!(
            self.out.status.success(),
            "child failed:\n{}\n{}",
            self.stdout(),
            self.stderr()
        );
        (
            serde_json::from_str(&self.field("RESULT ")).unwrap(),
            serde_json::from_str(&self.field("METRICS ")).unwrap(),
        )
    }
}

/// Runs this test's child with a clean cache environment plus `envs`.
fn child(test: &str, envs: &[(&str, &str)]) -> Run {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        &test_path(module_path!(), test),
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, "1");
    clean_env(&mut c);
    c.envs(envs.iter().copied());
    let t = Instant::now();
    let out = c.output().unwrap();
    Run {
        out,
        took: t.elapsed(),
    }
}

fn clean_env(c: &mut Command) {
    for v in [
        "NEURON_COMPILE_CACHE_URL",
        "NEURON_CC_FLAGS",
        "NEURON_PC_CACHE_STRICT",
        "NEURON_PC_CACHE_READ_ONLY",
        "NEURON_PC_CACHE_SIGNING_KEY",
        "NEURON_PC_CACHE_S3_TIMEOUT",
        "NEURON_PC_LOG",
        "RUST_LOG",
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
    ] {
        c.env_remove(v);
    }
}

fn npc(args: &[&str], envs: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_neuron-pc"));
    c.args(args);
    clean_env(&mut c);
    c.envs(envs.iter().copied());
    c.output().unwrap()
}

fn tmp(tag: &str) -> PathBuf {
    neuron_pc_test_support::paths::fresh_dir("npc-cfaults", tag)
}

/// The one key of a cache filled by one child run.
fn only_key(cache: &Path) -> String {
    let mut keys = Vec::new();
    for shard in std::fs::read_dir(cache.join("entries")).unwrap() {
        for f in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let p = f.unwrap().path();
            if p.extension().is_some_and(|e| e == "json") {
                keys.push(p.file_stem().unwrap().to_string_lossy().into_owned());
            }
        }
    }
    assert_eq!(keys.len(), 1, "{keys:?}");
    keys.remove(0)
}

fn entry_dir(cache: &Path, key: &str) -> PathBuf {
    cache.join("entries").join(&key[..2])
}

fn exe_path(cache: &Path, key: &str) -> PathBuf {
    std::fs::read_dir(entry_dir(cache, key))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.extension().is_some_and(|x| x == "exe")
                && p.file_name().unwrap().to_string_lossy().starts_with(key)
        })
        .unwrap()
}

/// Issue 14 A. Another graph's executable under this graph's key, with the record's digest
/// and size rewritten to match it: `verify` reports it, the job recompiles (same results as
/// a clean run), replaces the entry, and the next run and `verify` are clean.
#[test]
fn a_planted_executable_consistent_with_its_record_is_recompiled() {
    let name = "a_planted_executable_consistent_with_its_record_is_recompiled";
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let (a, b) = (tmp("plant-a"), tmp("plant-b"));
    let url_a = a.to_str().unwrap();
    let (clean, m) = child(name, &[("NEURON_COMPILE_CACHE_URL", url_a)]).ok();
    assert_eq!(m.compiles, 1);
    let (_, _) = child(
        name,
        &[
            ("NEURON_COMPILE_CACHE_URL", b.to_str().unwrap()),
            (SIZE, "4"),
        ],
    )
    .ok();
    let (ka, kb) = (only_key(&a), only_key(&b));
    assert_ne!(ka, kb);

    // Plant b's executable as a's, consistent with a rewritten record.
    let donor = std::fs::read(exe_path(&b, &kb)).unwrap();
    let digest = hex::encode(Sha256::digest(&donor));
    std::fs::remove_file(exe_path(&a, &ka)).unwrap();
    std::fs::write(
        entry_dir(&a, &ka).join(format!("{ka}.{}.exe", &digest[..16])),
        &donor,
    )
    .unwrap();
    let rec_path = entry_dir(&a, &ka).join(format!("{ka}.json"));
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
    rec["executable_sha256"] = digest.into();
    rec["executable_size"] = donor.len().into();
    std::fs::write(&rec_path, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();

    let v = npc(&["cache", "verify", "--json", "--cache", url_a], &[]);
    assert_eq!(
        v.status.code(),
        Some(1),
        "verify finds the planted executable"
    );
    let report: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    // Counted as bad, not as loaded or digest-only.
    assert_eq!(
        (
            &report["checked"],
            &report["loaded"],
            &report["digest_only"]
        ),
        (&1.into(), &0.into(), &0.into()),
        "{report}"
    );
    let bad = report["bad"].to_string();
    assert!(
        bad.contains(&ka) && bad.contains("does not match its program"),
        "{bad}"
    );

    let run = child(name, &[("NEURON_COMPILE_CACHE_URL", url_a)]);
    let (again, m) = run.ok();
    assert_eq!(m.compiles, 1, "the planted entry is a miss: {m:?}");
    // the first run's hint named the key, so the planted executable was also loaded ahead:
    // the same interface check kept it out
    assert!(a.join("hints").is_dir());
    assert_eq!(m.prefetched, 0, "{m:?}");
    assert_eq!(again, clean, "losses of a clean run");
    let err = run.stderr();
    assert_eq!(
        err.matches("does not match its program").count(),
        1,
        "warned once: {err}"
    );
    let (third, m) = child(name, &[("NEURON_COMPILE_CACHE_URL", url_a)]).ok();
    assert_eq!((m.compiles, m.disk_hits), (0, 1), "the entry was replaced");
    assert_eq!(m.prefetched, 1, "the replaced entry is loaded ahead: {m:?}");
    assert_eq!(third, clean);
    let v = npc(&["cache", "verify", "--cache", url_a], &[]);
    assert_eq!(
        v.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&v.stdout)
    );
    fault_report(
        "planted executable consistent with its record",
        1,
        "verify reports it; job recompiles, replaces",
        0,
        0,
    );
    for d in [a, b] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// Issue 19: a run leaves a hint naming the keys its first graphs had; the next run loads
/// those entries while it builds (counted as `prefetched`) and computes the same values. A
/// garbled hint or one naming a missing entry is only a lost head start.
#[test]
fn the_next_run_loads_its_first_executables_ahead_and_a_bad_hint_costs_nothing() {
    let name = "the_next_run_loads_its_first_executables_ahead_and_a_bad_hint_costs_nothing";
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let dir = tmp("prefetch");
    let url = dir.to_str().unwrap();
    let env = [("NEURON_COMPILE_CACHE_URL", url)];
    let (clean, m) = child(name, &env).ok();
    assert_eq!((m.compiles, m.prefetched), (1, 0), "{m:?}");
    let hints: Vec<PathBuf> = std::fs::read_dir(dir.join("hints"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(hints.len(), 1, "{hints:?}");
    let key = only_key(&dir);
    // the key, and the temporary bytes its execution allocates, as the plugin says
    let said = |path: &PathBuf| -> Vec<(String, Option<u64>)> {
        let v: Vec<serde_json::Value> =
            serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
        v.iter()
            .map(|n| (n["key"].as_str().unwrap().into(), n["temp_bytes"].as_u64()))
            .collect()
    };
    let first = said(&hints[0]);
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].0, key);
    // the plugin reports the size (none for this small program: 0)
    assert!(first[0].1.is_some(), "{first:?}");

    let (warm, m) = child(name, &env).ok();
    assert_eq!((m.compiles, m.disk_hits, m.prefetched), (0, 1, 1), "{m:?}");
    assert_eq!(
        warm, clean,
        "the prefetched executable computes the same values"
    );
    assert_eq!(
        said(&hints[0]),
        first,
        "a hint that agrees is left as it is"
    );

    // a hint of the earlier form (bare keys) is still followed, and rewritten with the sizes
    std::fs::write(&hints[0], serde_json::to_vec(&[&key]).unwrap()).unwrap();
    let (again, m) = child(name, &env).ok();
    assert_eq!((m.compiles, m.disk_hits, m.prefetched), (0, 1, 1), "{m:?}");
    assert_eq!(again, clean);
    assert_eq!(said(&hints[0]), first);

    // a garbled hint: an ordinary disk hit, and the hint is written again
    std::fs::write(&hints[0], b"{not json").unwrap();
    let (again, m) = child(name, &env).ok();
    assert_eq!((m.compiles, m.disk_hits, m.prefetched), (0, 1, 0), "{m:?}");
    assert_eq!(again, clean);
    assert_eq!(said(&hints[0]), first);

    // a hint naming an entry that is gone: compiled as a miss, same values
    std::fs::remove_dir_all(dir.join("entries")).unwrap();
    let (fresh, m) = child(name, &env).ok();
    assert_eq!((m.compiles, m.prefetched), (1, 0), "{m:?}");
    assert_eq!(fresh, clean);
    std::fs::remove_dir_all(dir).unwrap();
}

/// Issue 23 item 4: an executable of this compiler that does not load (garbage consistent with
/// its record: digest and size rewritten) is bad: `verify` reports it and exits 1 (it used to
/// skip it, count it as checked and exit 0), `--fix` removes it, and the counts say what was
/// checked how (loaded vs digest only).
#[test]
fn verify_reports_an_executable_that_does_not_load_and_fix_removes_it() {
    let name = "verify_reports_an_executable_that_does_not_load_and_fix_removes_it";
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let a = tmp("noload");
    let url = a.to_str().unwrap();
    let (_, m) = child(name, &[("NEURON_COMPILE_CACHE_URL", url)]).ok();
    assert_eq!(m.compiles, 1);
    let k = only_key(&a);

    // A sound entry: loaded, against its program.
    let v = npc(&["cache", "verify", "--json", "--cache", url], &[]);
    assert_eq!(
        v.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&v.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&v.stdout).unwrap();
    assert_eq!(
        (
            &report["checked"],
            &report["loaded"],
            &report["programs_checked"]
        ),
        (&1.into(), &1.into(), &1.into()),
        "{report}"
    );
    assert_eq!(report["digest_only"], 0, "{report}");

    // Garbage in place of the executable, consistent with a rewritten record.
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
    let digest = hex::encode(Sha256::digest(&garbage));
    std::fs::remove_file(exe_path(&a, &k)).unwrap();
    std::fs::write(
        entry_dir(&a, &k).join(format!("{k}.{}.exe", &digest[..16])),
        &garbage,
    )
    .unwrap();
    let rec_path = entry_dir(&a, &k).join(format!("{k}.json"));
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
    rec["executable_sha256"] = digest.into();
    rec["executable_size"] = garbage.len().into();
    std::fs::write(&rec_path, serde_json::to_vec_pretty(&rec).unwrap()).unwrap();

    let v = npc(&["cache", "verify", "--cache", url], &[]);
    let out = String::from_utf8_lossy(&v.stdout).into_owned();
    assert_eq!(v.status.code(), Some(1), "verify reports it: {out}");
    assert!(
        out.contains(&format!("bad {k}")) && out.contains("does not load"),
        "{out}"
    );
    assert!(out.contains("checked 1 entries: 0 loaded"), "{out}");
    let fix = npc(&["cache", "verify", "--fix", "--cache", url], &[]);
    let out = String::from_utf8_lossy(&fix.stdout).into_owned();
    assert_eq!(fix.status.code(), Some(0), "--fix repairs: {out}");
    assert!(out.contains(&format!("removed entry {k}")), "{out}");
    assert!(!rec_path.exists(), "the entry is gone");
    // The next job compiles it again and stores a sound entry.
    let (_, m) = child(name, &[("NEURON_COMPILE_CACHE_URL", url)]).ok();
    assert_eq!(m.compiles, 1);
    let v = npc(&["cache", "verify", "--cache", url], &[]);
    assert_eq!(v.status.code(), Some(0));
    fault_report(
        "executable that does not load (consistent record)",
        1,
        "verify reports it, --fix removes it",
        0,
        0,
    );
    std::fs::remove_dir_all(a).unwrap();
}

/// Issue 14 F: a cache URL that is a symlink. The job goes on without the cache (one loud
/// line, `cache_unavailable`), strict mode makes it fatal, and the CLI refuses in one line.
#[test]
fn a_symlinked_cache_root_costs_the_job_its_cache_not_the_job() {
    let name = "a_symlinked_cache_root_costs_the_job_its_cache_not_the_job";
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let d = tmp("symroot");
    std::fs::create_dir_all(d.join("real")).unwrap();
    std::os::unix::fs::symlink(d.join("real"), d.join("link")).unwrap();
    let link = d.join("link");
    let url = link.to_str().unwrap();
    let run = child(name, &[("NEURON_COMPILE_CACHE_URL", url)]);
    let (_, m) = run.ok();
    assert_eq!(m.compiles, 1);
    let why = m.cache_unavailable.expect("recorded in the metrics");
    assert!(why.contains("symlink"), "{why}");
    let err = run.stderr();
    assert_eq!(err.matches("compile cache unavailable").count(), 1, "{err}");
    assert!(err.contains("ERROR"), "error level: {err}");

    let strict = child(
        name,
        &[
            ("NEURON_COMPILE_CACHE_URL", url),
            ("NEURON_PC_CACHE_STRICT", "1"),
        ],
    );
    assert!(!strict.out.status.success(), "strict mode makes it fatal");
    assert!(
        strict.stderr().contains("NEURON_PC_CACHE_STRICT"),
        "{}",
        strict.stderr()
    );

    let ls = npc(&["cache", "ls", "--cache", url], &[]);
    assert_eq!(ls.status.code(), Some(1));
    let e = String::from_utf8_lossy(&ls.stderr);
    assert_eq!(e.trim().lines().count(), 1, "{e}");
    assert!(e.contains("symlink"), "{e}");
    assert!(
        std::fs::read_dir(d.join("real")).unwrap().next().is_none(),
        "nothing written through the link"
    );
    fault_report(
        "cache root a symlink",
        3,
        "job runs without cache; strict fails; CLI refuses",
        0,
        0,
    );
    std::fs::remove_dir_all(d).unwrap();
}

/// Issue 13 item 3 / 14 C against the real S3 test server: a missing bucket and missing
/// credentials. The CLI fails with one line naming the problem and the fix; a job prints one
/// error line, records `cache_unavailable`, and compiles; strict mode fails it.
#[test]
fn a_missing_bucket_or_missing_credentials_is_one_loud_line() {
    let name = "a_missing_bucket_or_missing_credentials_is_one_loud_line";
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let m = server::moto();
    let bucket = server::new_bucket(&m, "creds");
    let endpoint = m.endpoint();
    let home = tmp("nohome");
    let with_creds: Vec<(&str, &str)> = vec![
        ("AWS_ENDPOINT_URL", &endpoint),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
    ];
    // No key anywhere: object_store asks the instance metadata service, which here is a port
    // nobody listens on (as on a machine without an instance role).
    let home_s = home.to_str().unwrap();
    let no_creds: Vec<(&str, &str)> = vec![
        ("AWS_ENDPOINT_URL", &endpoint),
        ("HOME", home_s),
        ("AWS_METADATA_ENDPOINT", "http://127.0.0.1:9"),
    ];
    let missing = "s3://npc-no-such-bucket-at-all/x".to_string();
    let present = format!("s3://{bucket}/x");
    // (what, URL, environment, the problem named, the fix named)
    type Case<'a> = (
        &'a str,
        &'a String,
        &'a Vec<(&'a str, &'a str)>,
        &'a str,
        &'a str,
    );
    let cases: [Case<'_>; 2] = [
        (
            "missing bucket",
            &missing,
            &with_creds,
            "does not exist",
            "bucket",
        ),
        (
            "missing credentials",
            &present,
            &no_creds,
            "no usable credentials",
            "AWS_ACCESS_KEY_ID",
        ),
    ];
    for (what, url, envs, problem, fix) in cases {
        let local = tmp("creds-local");
        let local_s = local.to_str().unwrap();
        let mut e = envs.clone();
        e.push(("NEURON_PC_CACHE_LOCAL_DIR", local_s));
        let ls = npc(&["cache", "ls", "--cache", url], &e);
        assert_eq!(ls.status.code(), Some(1), "{what}");
        let err = String::from_utf8_lossy(&ls.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{what}: {err}");
        assert!(err.contains(problem) && err.contains(fix), "{what}: {err}");

        e.push(("NEURON_COMPILE_CACHE_URL", url));
        let run = child(name, &e);
        let (_, m) = run.ok();
        assert_eq!(m.compiles, 1, "{what}");
        let why = m.cache_unavailable.unwrap_or_default();
        assert!(why.contains(problem), "{what}: {why}");
        let err = run.stderr();
        assert_eq!(
            err.lines().filter(|l| l.contains("ERROR")).count(),
            1,
            "{what}: one error line at start: {err}"
        );
        e.push(("NEURON_PC_CACHE_STRICT", "1"));
        let strict = child(name, &e);
        assert!(!strict.out.status.success(), "{what}: strict is fatal");
        assert!(
            strict.stderr().contains(problem),
            "{what}: {}",
            strict.stderr()
        );
        std::fs::remove_dir_all(local).unwrap();
    }
    fault_report(
        "missing bucket / missing credentials (moto)",
        2,
        "CLI one line; job one error line + metric; strict fatal",
        0,
        0,
    );
    std::fs::remove_dir_all(home).unwrap();
}

/// Issue 14 B: an S3 endpoint that accepts connections and never answers costs a job one
/// timeout (`NEURON_PC_CACHE_S3_TIMEOUT`) plus a margin over a cache-less run, with the same
/// results.
#[test]
fn a_hung_s3_server_costs_a_job_one_timeout() {
    let name = "a_hung_s3_server_costs_a_job_one_timeout";
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    // Accept and hold every connection, answering nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            held.push(s);
        }
    });
    let (base, _) = {
        let r = child(name, &[("NEURON_PC_CACHE", "0")]);
        let took = r.took;
        (took, r.ok())
    };
    let (clean, _) = child(name, &[("NEURON_PC_CACHE", "0")]).ok();
    let local = tmp("hung-local");
    let run = child(
        name,
        &[
            ("NEURON_COMPILE_CACHE_URL", "s3://hung-bucket/x"),
            ("AWS_ENDPOINT_URL", &endpoint),
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("NEURON_PC_CACHE_S3_TIMEOUT", "2"),
            ("NEURON_PC_CACHE_LOCAL_DIR", local.to_str().unwrap()),
        ],
    );
    let took = run.took;
    let (got, m) = run.ok();
    assert_eq!(got, clean, "same results as a cache-less run");
    assert!(m.cache_unavailable.is_some(), "{m:?}");
    assert!(
        took < base + Duration::from_secs(2) + Duration::from_secs(3),
        "{took:?} against {base:?} without a cache and a 2 s timeout"
    );
    fault_report(
        "hung S3 server (job)",
        1,
        &format!(
            "finished in {:.1} s vs {:.1} s cache-less (2 s timeout)",
            took.as_secs_f64(),
            base.as_secs_f64()
        ),
        0,
        0,
    );
    std::fs::remove_dir_all(local).unwrap();
}

/// Runs `cmd` and kills it if it has not finished within `secs`: a hang is the failure.
fn finishes(mut cmd: Command, secs: u64, what: &str) -> Output {
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {secs} s (blocked on a FIFO?)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Issue 14 E: a FIFO in place of the record, the executable or the lock. The job finishes
/// with a clean run's results, and `ls`, `show`, `verify` and `verify --fix` finish; `--fix`
/// removes the FIFO and leaves a sound cache.
#[test]
fn a_fifo_in_the_cache_hangs_neither_the_job_nor_any_command() {
    let name = "a_fifo_in_the_cache_hangs_neither_the_job_nor_any_command";
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let mut trials = 0;
    for place in ["record", "executable", "lock"] {
        let d = tmp(&format!("fifo-{place}"));
        let url = d.to_str().unwrap();
        let (clean, _) = child(name, &[("NEURON_COMPILE_CACHE_URL", url)]).ok();
        let k = only_key(&d);
        let target = match place {
            "record" => entry_dir(&d, &k).join(format!("{k}.json")),
            "executable" => exe_path(&d, &k),
            _ => d.join("locks").join(format!("{k}.lock")),
        };
        let _ = std::fs::remove_file(&target);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        assert!(Command::new("mkfifo")
            .arg(&target)
            .status()
            .unwrap()
            .success());

        let mut job = Command::new(std::env::current_exe().unwrap());
        job.args([
            &test_path(module_path!(), name),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1");
        clean_env(&mut job);
        job.env("NEURON_COMPILE_CACHE_URL", url);
        let out = finishes(job, 60, &format!("job, FIFO as {place}"));
        let run = Run {
            out,
            took: Duration::ZERO,
        };
        let (got, _) = run.ok();
        assert_eq!(got, clean, "{place}");
        for args in [
            vec!["cache", "ls"],
            vec!["cache", "show", &k],
            vec!["cache", "verify"],
            vec!["cache", "verify", "--fix"],
        ] {
            let mut c = Command::new(env!("CARGO_BIN_EXE_neuron-pc"));
            c.args(&args).args(["--cache", url]);
            clean_env(&mut c);
            let o = finishes(c, 30, &format!("{args:?}, FIFO as {place}"));
            if args == ["cache", "verify", "--fix"] {
                assert_eq!(
                    o.status.code(),
                    Some(0),
                    "{place}: {:?}",
                    String::from_utf8_lossy(&o.stdout)
                );
            }
        }
        let v = npc(&["cache", "verify", "--cache", url], &[]);
        assert_eq!(v.status.code(), Some(0), "{place}: sound after --fix");
        assert!(
            std::fs::symlink_metadata(&target).map_or(true, |m| m.is_file()),
            "{place}: the FIFO is gone"
        );
        trials += 1;
        std::fs::remove_dir_all(d).unwrap();
    }
    fault_report(
        "FIFO as record/executable/lock (job + ls/show/verify/--fix)",
        trials,
        "finished, same results, --fix removes",
        0,
        0,
    );
}

/// Issue 14 F: waiting on another process's compile lease says so at the default log level,
/// once, naming the holder (pid and host), and says how long the wait took.
#[test]
fn waiting_on_another_process_says_who_and_how_long() {
    let name = "waiting_on_another_process_says_who_and_how_long";
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let d = tmp("wait");
    let url = d.to_str().unwrap();
    let (clean, _) = child(name, &[("NEURON_COMPILE_CACHE_URL", url)]).ok();
    let k = only_key(&d);
    // Take the entry away, and hold its lease as a live process on this host would.
    let saved = tmp("wait-saved");
    let entries = entry_dir(&d, &k);
    for f in std::fs::read_dir(&entries).unwrap() {
        let p = f.unwrap().path();
        std::fs::rename(&p, saved.join(p.file_name().unwrap())).unwrap();
    }
    let mut holder = Command::new("sleep").arg("60").spawn().unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    std::fs::create_dir_all(d.join("locks")).unwrap();
    let lease =
        serde_json::json!({"pid": holder.id(), "host": host.trim(), "expires_at": now + 50});
    std::fs::write(d.join("locks").join(format!("{k}.lock")), lease.to_string()).unwrap();
    // The "holder" finishes after two seconds: its entry appears (record last) and it lets go.
    let (s2, e2, d2, k2) = (saved.clone(), entries.clone(), d.clone(), k.clone());
    let finisher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        let mut files: Vec<PathBuf> = std::fs::read_dir(&s2)
            .unwrap()
            .map(|f| f.unwrap().path())
            .collect();
        files.sort_by_key(|p| p.extension().is_some_and(|x| x == "json"));
        for p in files {
            std::fs::rename(&p, e2.join(p.file_name().unwrap())).unwrap();
        }
        let _ = std::fs::remove_file(d2.join("locks").join(format!("{k2}.lock")));
    });
    let run = child(name, &[("NEURON_COMPILE_CACHE_URL", url)]);
    finisher.join().unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    let (got, m) = run.ok();
    assert_eq!(got, clean);
    assert_eq!((m.compiles, m.waited_for_others), (0, 1), "{m:?}");
    let err = run.stderr();
    let who = format!("pid {} on {}", holder.id(), host.trim());
    assert_eq!(err.matches(&who).count(), 1, "named once: {err}");
    assert!(err.contains(&k) && err.contains("waiting"), "{err}");
    assert!(err.contains("arrived after waiting"), "{err}");
    fault_report(
        "compile lease held by a live process",
        1,
        "waited, said who once and how long, no compile",
        0,
        0,
    );
    for x in [d, saved] {
        std::fs::remove_dir_all(x).unwrap();
    }
}

/// Issue 23 item 6, as a job sees it: a lease on S3 held by a live process for 2 s; the job
/// waits (no compile), and its metrics say how many S3 requests waiting cost: a few with the
/// backoff, where the old 50 ms loop sent over 40 a second.
#[test]
fn waiting_on_an_s3_lease_backs_off_and_counts_its_requests() {
    let name = "waiting_on_an_s3_lease_backs_off_and_counts_its_requests";
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let m = server::moto();
    let bucket = server::new_bucket(&m, "wait");
    let url = format!("s3://{bucket}/w");
    let endpoint = m.endpoint();
    let envs = [
        ("NEURON_COMPILE_CACHE_URL", url.as_str()),
        ("NEURON_PC_CACHE_LOCAL_TIER", "0"),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
    ];
    let (clean, _) = child(name, &envs).ok();
    let s3_opts = neuron_pc_cache::S3Options {
        endpoint: Some(endpoint.clone()),
        credentials: Some(("testing".into(), "testing".into())),
        ..neuron_pc_cache::S3Options::default()
    };
    let store = Arc::new(neuron_pc_cache::S3Store::open(&url, &s3_opts).unwrap());
    let names: Vec<String> = store
        .list("entries/")
        .unwrap()
        .into_iter()
        .map(|o| o.name)
        .collect();
    let record = names
        .iter()
        .find(|n| n.ends_with(".json"))
        .expect("a record");
    let k = record
        .rsplit('/')
        .next()
        .unwrap()
        .trim_end_matches(".json")
        .to_string();
    // Take the entry away (keeping its bytes), and hold its lease as a live process would.
    let saved: Vec<(String, Vec<u8>)> = names
        .iter()
        .map(|n| {
            let bytes = store.get(n).unwrap().expect("listed");
            store.delete(n).unwrap();
            (n.clone(), bytes)
        })
        .collect();
    let mut holder = Command::new("sleep").arg("60").spawn().unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let lease =
        serde_json::json!({"pid": holder.id(), "host": host.trim(), "expires_at": now + 50});
    let lock = format!("locks/{k}.lock");
    store
        .put(&lock, lease.to_string().as_bytes(), PutMode::Overwrite)
        .unwrap();
    // The "holder" finishes after two seconds: its entry appears (record last), it lets go.
    let s2 = store.clone();
    let finisher = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        let mut saved = saved;
        saved.sort_by_key(|(n, _)| n.ends_with(".json"));
        for (n, bytes) in saved {
            s2.put(&n, &bytes, PutMode::Overwrite).unwrap();
        }
        s2.delete(&lock).unwrap();
    });
    let run = child(name, &envs);
    finisher.join().unwrap();
    let _ = holder.kill();
    let _ = holder.wait();
    let (got, m) = run.ok();
    assert_eq!(got, clean);
    assert_eq!((m.compiles, m.waited_for_others), (0, 1), "{m:?}");
    assert!(
        (3..=40).contains(&m.lease_wait_requests),
        "requests while waiting about 2 s: {m:?}"
    );
    assert!(m.lease_requests_per_waiter_minute > 0.0, "{m:?}");
    fault_report(
        "job waiting on an S3 lease (metrics)",
        1,
        &format!(
            "waited, no compile; {} requests ({:.0} per waiter-minute)",
            m.lease_wait_requests, m.lease_requests_per_waiter_minute
        ),
        0,
        0,
    );
}

/// Issue 23 item 5, as a job sees it: an S3 server that ignores `If-None-Match: *` (the tests'
/// proxy drops it) is named in one warning and the job goes on with the compare-after-write
/// fallback (its entry is then a remote hit for the next job); in strict mode the job fails.
#[test]
fn a_job_on_a_server_without_conditional_put_warns_once_or_fails_strict() {
    let name = "a_job_on_a_server_without_conditional_put_warns_once_or_fails_strict";
    if std::env::var(CHILD).is_ok() {
        return child_loop();
    }
    let m = server::moto();
    let bucket = server::new_bucket(&m, "nocond");
    let p = proxy::Proxy::start(m.port);
    p.set_always(Some(proxy::Fault::StripConditional));
    let url = format!("s3://{bucket}/j");
    let endpoint = p.endpoint();
    let mut envs = vec![
        ("NEURON_COMPILE_CACHE_URL", url.as_str()),
        ("NEURON_PC_CACHE_LOCAL_TIER", "0"),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
    ];
    let run = child(name, &envs);
    let (clean, metrics) = run.ok();
    assert_eq!(metrics.compiles, 1);
    assert_eq!(metrics.cache_unavailable, None);
    let err = run.stderr();
    assert_eq!(
        err.matches("ignores If-None-Match").count(),
        1,
        "one warning: {err}"
    );
    let (again, metrics) = child(name, &envs).ok();
    assert_eq!(
        (metrics.compiles, metrics.remote_hits),
        (0, 1),
        "{metrics:?}"
    );
    assert_eq!(again, clean);
    envs.push(("NEURON_PC_CACHE_STRICT", "1"));
    let strict = child(name, &envs);
    assert!(!strict.out.status.success(), "strict is fatal");
    assert!(
        strict.stderr().contains("ignores If-None-Match"),
        "{}",
        strict.stderr()
    );
    fault_report(
        "job on an S3 server ignoring If-None-Match",
        1,
        "one warning, fallback, remote hit next; strict fatal",
        0,
        0,
    );
}
