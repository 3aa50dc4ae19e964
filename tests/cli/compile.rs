//! `neuron-pc compile` end to end with the tiny `aot_probe` job: precompiled runs compile
//! nothing and match just-in-time runs bit for bit; re-runs and shards; faults.

use crate::support as common;

use common::*;

#[test]
fn precompiled_run_compiles_nothing_and_matches_jit() {
    let cache = tmp("e2e");
    let probe = probe();
    let p = probe.to_str().unwrap();
    let out = npc(
        &cache,
        &["compile", "--json", "--jobs", "2", "--", p, "--steps", "2"],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    // One training-step graph and two probe graphs.
    assert_eq!(v["found"], 3, "{v}");
    assert_eq!(v["compiled"], 3, "{v}");
    assert_eq!(v["failed"], 0);
    assert_eq!(entry_keys(&cache), keys(&v, "compiled"));

    // The real job, more steps: every graph comes from the cache.
    let (losses, m) = run_probe(&cache, &["--steps", "5"]);
    assert_eq!(m["compiles"], 0, "{m}");
    assert_eq!(m["disk_hits"], 3, "{m}");
    // The same job compiled just in time (fresh cache) gives the same losses, bit for bit.
    let jit_cache = tmp("e2e-jit");
    let (jit_losses, mj) = run_probe(&jit_cache, &["--steps", "5"]);
    assert_eq!(mj["compiles"], 3, "{mj}");
    assert_eq!(losses.len(), 5);
    assert_eq!(losses, jit_losses);

    // A second compile finds the same graphs, all cached.
    let again = npc(&cache, &["compile", "--json", "--", p, "--steps", "2"], &[]);
    assert!(again.status.success(), "{}", stderr(&again));
    let v2 = json(&again);
    assert_eq!(v2["compiled"], 0, "{v2}");
    assert_eq!(v2["cached"], 3, "{v2}");
    assert_eq!(keys(&v2, "cached"), keys(&v, "compiled"));
}

#[test]
fn two_shards_compile_exactly_the_unsharded_set() {
    let probe = probe();
    let p = probe.to_str().unwrap();
    let job = ["--", p, "--steps", "1", "--variants", "5", "--width", "6"];
    let whole_cache = tmp("shard-whole");
    let whole = npc(
        &whole_cache,
        &[&["compile", "--json"][..], &job[..]].concat(),
        &[],
    );
    assert!(whole.status.success(), "{}", stderr(&whole));
    let all = keys(&json(&whole), "compiled");
    assert_eq!(all.len(), 6);

    let shard_cache = tmp("shard-parts");
    let mut parts = Vec::new();
    for s in ["0/2", "1/2"] {
        let out = npc(
            &shard_cache,
            &[&["compile", "--json", "--shard", s][..], &job[..]].concat(),
            &[],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let v = json(&out);
        assert_eq!(v["found"], 6);
        parts.push(keys(&v, "compiled"));
    }
    assert!(
        parts[0].iter().all(|k| !parts[1].contains(k)),
        "overlap: {parts:?}"
    );
    let mut union = [parts[0].clone(), parts[1].clone()].concat();
    union.sort();
    assert_eq!(union, all);
    assert_eq!(entry_keys(&shard_cache), all);
}

#[test]
fn dry_run_reports_without_compiling() {
    let cache = tmp("dry");
    let probe = probe();
    let out = npc(
        &cache,
        &[
            "compile",
            "--dry-run",
            "--json",
            "--",
            probe.to_str().unwrap(),
            "--steps",
            "1",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["found"], 3);
    assert_eq!(keys(&v, "would-compile").len(), 3);
    assert_eq!(v["would_compile"], 3);
    assert_eq!(v["cached"], 0);
    assert_eq!(v["compiled"], 0);
    assert!(entry_keys(&cache).is_empty());
}

#[test]
fn a_trial_run_that_fails_half_way_keeps_what_was_compiled() {
    let cache = tmp("trialfail");
    let probe = probe();
    let out = npc(
        &cache,
        &[
            "compile",
            "--json",
            "--",
            probe.to_str().unwrap(),
            "--steps",
            "3",
            "--fail-at",
            "1",
            "--width",
            "5",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let v = json(&out);
    assert_eq!(v["compiled"], 3, "{v}");
    assert_eq!(v["trial_exit"], 3);
    let err = stderr(&out);
    assert!(
        last_line(&err).contains("trial run exited with status 3"),
        "{err}"
    );
    assert_eq!(entry_keys(&cache).len(), 3);
}

#[test]
fn compile_writes_one_timeline_of_the_trial_run_and_every_workers_compiles() {
    let cache = tmp("trace");
    let trace = cache.with_extension("trace.json");
    let probe = probe();
    let out = npc(
        &cache,
        &[
            "compile",
            "--json",
            "--jobs",
            "2",
            "--trace",
            trace.to_str().unwrap(),
            "--",
            probe.to_str().unwrap(),
            "--steps",
            "2",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    let compiled: Vec<String> = keys(&v, "compiled")
        .iter()
        .map(|k| k[..12].to_string())
        .collect();
    assert_eq!(compiled.len(), 3, "{v}");
    let events = neuron_pc::timeline::read(&trace).expect("the timeline parses");
    // One compile event per compiled graph, on worker tracks, naming the graph.
    let mut traced: Vec<String> = events
        .iter()
        .filter(|e| e.name == "compile" && e.tid >= 100)
        .map(|e| e.args["graph"].as_str().unwrap().to_string())
        .collect();
    traced.sort();
    let mut want = compiled.clone();
    want.sort();
    assert_eq!(traced, want);
    // The trial run as a whole, and the trial job's own device phases (another process).
    let trial = events
        .iter()
        .find(|e| e.name == "trial run")
        .expect("trial run event");
    let job_lowered: Vec<&neuron_pc::timeline::TraceEvent> = events
        .iter()
        .filter(|e| e.name == "lower" && e.pid != trial.pid)
        .collect();
    assert_eq!(job_lowered.len(), 3, "the job lowers each graph once");
    for e in &job_lowered {
        assert!(compiled.contains(&e.args["graph"].as_str().unwrap().to_string()));
        // The job's phases fall inside the trial run's span (one clock for both processes).
        assert!(e.ts + 1e3 >= trial.ts && e.ts <= trial.ts + trial.dur.unwrap() + 1e3);
    }
    // JSON has the compile efficiency figure.
    assert!(v["compile_efficiency"].as_f64().unwrap() > 0.0, "{v}");
    let _ = std::fs::remove_file(&trace);
}

#[test]
fn a_data_parallel_job_precompiles_its_replicated_graphs() {
    let cache = tmp("e2e-dp");
    let probe = probe();
    let p = probe.to_str().unwrap();
    let two = [("NEURON_PC_DEVICES", "2")];
    let out = npc(
        &cache,
        &["compile", "--json", "--", p, "--steps", "2"],
        &two,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(
        (v["found"].as_u64(), v["compiled"].as_u64()),
        (Some(3), Some(3)),
        "{v}"
    );
    // The workers compiled with the two-replica assignment (a key mismatch would fail them).
    assert_eq!(entry_keys(&cache), keys(&v, "compiled"));

    // The real run on two replicas compiles nothing and follows the one-device run.
    let (dp, m) = run_probe_with(&cache, &["--steps", "4"], &two);
    assert_eq!(
        (m["compiles"].as_u64(), m["disk_hits"].as_u64()),
        (Some(0), Some(3)),
        "{m}"
    );
    let one_cache = tmp("e2e-dp-one");
    let (single, m1) = run_probe(&one_cache, &["--steps", "4"]);
    assert_eq!(m1["compiles"], 3, "{m1}");
    for (a, b) in dp.iter().zip(&single) {
        let (a, b) = (f32::from_bits(*a as u32), f32::from_bits(*b as u32));
        assert!((a - b).abs() <= 1e-5 * b.abs().max(1e-3), "{a} vs {b}");
    }
    // Four replicas are another program: compiled, not found.
    let (_, m4) = run_probe_with(&cache, &["--steps", "1"], &[("NEURON_PC_DEVICES", "4")]);
    assert_eq!(
        (m4["compiles"].as_u64(), m4["disk_hits"].as_u64()),
        (Some(3), Some(0)),
        "{m4}"
    );
}
