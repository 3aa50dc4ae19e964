//! `neuron-pc compile` under injected faults: a worker that crashes, one that hangs, and
//! Ctrl-C while a worker hangs. The faults come from switches compiled in only with the
//! `test-hooks` feature (`scripts/test` enables it), so the release binary has none.

use crate::support as common;

use common::*;

/// The keys of the probe's graphs, from a dry run.
fn probe_keys(args: &[&str]) -> Vec<String> {
    let cache = tmp("keys");
    let probe = probe();
    let out = npc(
        &cache,
        &[
            &[
                "compile",
                "--dry-run",
                "--json",
                "--",
                probe.to_str().unwrap(),
            ][..],
            args,
        ]
        .concat(),
        &[],
    );
    keys(&json(&out), "would-compile")
}

#[test]
fn a_crashing_worker_and_a_hanging_one_fail_only_their_graph() {
    let job_args = ["--steps", "1", "--variants", "2", "--width", "7"];
    let k = probe_keys(&job_args);
    assert_eq!(k.len(), 3);
    let cache = tmp("crash");
    let probe = probe();
    let args = [
        &[
            "compile",
            "--json",
            "--jobs",
            "2",
            "--timeout",
            "3",
            "--",
            probe.to_str().unwrap(),
        ][..],
        &job_args[..],
    ]
    .concat();
    let out = npc(
        &cache,
        &args,
        &[
            ("NEURON_PC_TEST_WORKER_CRASH", &k[0][..16]),
            ("NEURON_PC_TEST_WORKER_HANG", &k[1][..16]),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(keys(&v, "compiled"), vec![k[2].clone()]);
    assert_eq!(keys(&v, "failed"), vec![k[0].clone(), k[1].clone()]);
    // The crash was retried once, with one worker fewer, before it counted.
    assert_eq!(v["retries"], 1);
    assert!(
        stderr(&out).contains("retrying with 1 worker(s)"),
        "{}",
        stderr(&out)
    );
    let msg = |key: &str| {
        v["graphs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["key"] == key)
            .unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // The crash is recorded with what the compiler process said before it died.
    assert!(
        msg(&k[0]).contains("signal 6") && msg(&k[0]).contains("injected compiler crash"),
        "{}",
        msg(&k[0])
    );
    assert!(msg(&k[1]).contains("timed out"), "{}", msg(&k[1]));
    assert!(
        last_line(&stderr(&out)).contains("2 graph(s) failed"),
        "{}",
        stderr(&out)
    );
    assert_eq!(entry_keys(&cache), vec![k[2].clone()]);
    assert!(
        processes_with(cache.to_str().unwrap()).is_empty(),
        "a worker outlived the command"
    );

    // The failures are recorded: a plain re-run does not retry them, --retry-failed does.
    let again = npc(&cache, &args, &[]);
    let v2 = json(&again);
    assert_eq!(v2["failed"], 2);
    assert_eq!(keys(&v2, "failed"), vec![k[0].clone(), k[1].clone()]);
    assert_eq!(v2["compiled"], 0, "{v2}");
    let retry = npc(
        &cache,
        &[&args[..2], &["--retry-failed"][..], &args[2..]].concat(),
        &[],
    );
    assert!(retry.status.success(), "{}", stderr(&retry));
    assert_eq!(
        keys(&json(&retry), "compiled"),
        vec![k[0].clone(), k[1].clone()]
    );
}

#[test]
fn ctrl_c_stops_job_and_workers_and_keeps_finished_entries() {
    let job_args = [
        "--steps",
        "40",
        "--variants",
        "2",
        "--width",
        "11",
        "--sleep-ms",
        "250",
    ];
    let k = probe_keys(&["--steps", "1", "--variants", "2", "--width", "11"]);
    let cache = tmp("sigint");
    let probe = probe();
    let child = std::process::Command::new(bin())
        .args(
            [
                &[
                    "compile",
                    "--json",
                    "--jobs",
                    "2",
                    "--",
                    probe.to_str().unwrap(),
                ][..],
                &job_args[..],
            ]
            .concat(),
        )
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .env_remove("NEURON_CC_FLAGS")
        .env("NEURON_PC_TEST_WORKER_HANG", &k[0][..16])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while entry_keys(&cache).len() < 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        entry_keys(&cache).len(),
        2,
        "the two other graphs should compile first"
    );
    // The hanging worker and the trial job are still running now.
    assert!(!processes_with(cache.to_str().unwrap()).is_empty());
    let kill = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["compiled"], 2);
    assert_eq!(keys(&v, "interrupted"), vec![k[0].clone()]);
    assert!(last_line(&stderr(&out)).contains("interrupted"));
    assert!(
        processes_with(cache.to_str().unwrap()).is_empty(),
        "workers survived Ctrl-C"
    );
    assert!(
        processes_with("--sleep-ms 250").is_empty(),
        "the trial job survived Ctrl-C"
    );
    // Every entry in the cache is complete and verifies.
    let mut opts = neuron_pc_cache::CacheOptions::from_env().unwrap();
    opts.compiler_version = String::new();
    let c = neuron_pc_cache::Cache::open(cache.to_str().unwrap(), opts).unwrap();
    for key in entry_keys(&cache) {
        assert!(
            c.contains(&neuron_pc_cache::EntryKey::parse(&key).unwrap()),
            "{key} does not verify"
        );
    }
}
