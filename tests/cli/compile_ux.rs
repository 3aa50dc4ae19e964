//! What `neuron-pc compile` tells its user: a dry run counts found / cached / would-compile
//! graphs; flags given on the command line come back as the `NEURON_CC_FLAGS` line the real
//! run needs (and a run without it recompiles); the job's stdout stays on stdout.

use crate::support as common;

use common::*;

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn dry_run_counts_found_cached_and_would_compile() {
    let cache = tmp("ux-dry");
    let probe = probe();
    let p = probe.to_str().unwrap();
    // Compile one shard so that the cache holds some of the three graphs but not all.
    let part = npc(
        &cache,
        &[
            "compile", "--json", "--shard", "0/2", "--", p, "--steps", "1",
        ],
        &[],
    );
    assert!(part.status.success(), "{}", stderr(&part));
    let held = entry_keys(&cache).len();
    assert!(
        held < 3,
        "shard 0/2 compiled all 3 graphs; pick another job"
    );

    let dry = npc(
        &cache,
        &["compile", "--dry-run", "--", p, "--steps", "1"],
        &[],
    );
    assert!(dry.status.success(), "{}", stderr(&dry));
    let text = stdout(&dry);
    let want = format!(
        "dry run: 3 found, {held} cached, {} would compile",
        3 - held
    );
    assert!(text.contains(&want), "want {want:?} in\n{text}");
    assert!(!text.contains("nothing to compile"), "{text}");
    assert_eq!(entry_keys(&cache).len(), held, "a dry run compiles nothing");

    let json_run = npc(
        &cache,
        &["compile", "--dry-run", "--json", "--", p, "--steps", "1"],
        &[],
    );
    let v = json(&json_run);
    assert_eq!(v["found"], 3, "{v}");
    assert_eq!(v["cached"].as_u64(), Some(held as u64), "{v}");
    assert_eq!(v["would_compile"].as_u64(), Some(3 - held as u64), "{v}");
    assert_eq!(keys(&v, "cached"), entry_keys(&cache));
}

#[test]
fn command_line_flags_come_back_as_the_flags_the_real_run_needs() {
    let cache = tmp("ux-flags");
    let probe = probe();
    let p = probe.to_str().unwrap();
    let out = npc(
        &cache,
        &["compile", "--optlevel", "O1", "--", p, "--steps", "2"],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("NEURON_CC_FLAGS="))
        .unwrap_or_else(|| panic!("no NEURON_CC_FLAGS= line in\n{text}"));
    let flags = line.trim_matches('\'');
    assert!(flags.contains("--optlevel O1"), "{flags}");
    assert!(
        !flags.contains("cache_dir") && !flags.contains("retry"),
        "{flags}"
    );

    // With those flags the real run compiles nothing; without them it compiles every graph.
    let run = |envs: &[(&str, &str)]| {
        let out = std::process::Command::new(&probe)
            .args(["--steps", "2", "--json"])
            .env("NEURON_COMPILE_CACHE_URL", &cache)
            .env_remove("NEURON_CC_FLAGS")
            .env_remove("NEURON_PC_EXTRACT_DIR")
            .envs(envs.iter().copied())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let m = stdout(&out)
            .lines()
            .find_map(|l| l.strip_prefix("METRICS ").map(str::to_string))
            .unwrap();
        serde_json::from_str::<serde_json::Value>(&m).unwrap()
    };
    let with = run(&[("NEURON_CC_FLAGS", flags)]);
    assert_eq!(with["compiles"], 0, "{with}");
    assert_eq!(with["disk_hits"], 3, "{with}");
    let without = run(&[]);
    assert_eq!(without["compiles"], 3, "{without}");

    // --json: the same flags as a field; the plain-environment compile prints no line.
    let j = npc(
        &cache,
        &[
            "compile",
            "--json",
            "--optlevel",
            "O1",
            "--",
            p,
            "--steps",
            "2",
        ],
        &[],
    );
    assert_eq!(json(&j)["neuron_cc_flags"].as_str(), Some(flags));
    let plain = npc(&cache, &["compile", "--", p, "--steps", "2"], &[]);
    assert!(
        !stdout(&plain).contains("NEURON_CC_FLAGS="),
        "{}",
        stdout(&plain)
    );
}

#[test]
fn the_jobs_stdout_stays_on_stdout() {
    let cache = tmp("ux-stdout");
    let probe = probe();
    let out = npc(
        &cache,
        &["compile", "--", probe.to_str().unwrap(), "--steps", "2"],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let (o, e) = (stdout(&out), stderr(&out));
    // The probe prints one `{"step": N, ...}` line per step.
    assert_eq!(
        o.matches("{\"step\"").count(),
        2,
        "stdout:\n{o}\nstderr:\n{e}"
    );
    assert!(!e.contains("{\"step\""), "{e}");
    // The report follows the job's output.
    let job_at = o.find("{\"step\"").unwrap();
    let table_at = o.find("GRAPH").unwrap();
    assert!(job_at < table_at, "{o}");

    // With --json, stdout holds the JSON object alone and the job's lines go to stderr.
    let j = npc(
        &cache,
        &[
            "compile",
            "--json",
            "--",
            probe.to_str().unwrap(),
            "--steps",
            "2",
        ],
        &[],
    );
    assert_eq!(json(&j)["found"], 3);
    assert_eq!(stderr(&j).matches("{\"step\"").count(), 2);
}

/// A Neuron training environment's `NEURON_CC_FLAGS` works on cpu: the job runs, one warning
/// names the flags that mean nothing here, and the keys are the plain cpu keys (executables
/// compiled without those flags are found).
#[test]
fn neuronx_cc_flags_on_cpu_warn_once_and_keep_the_keys() {
    let cache = tmp("ux-neuron-flags");
    let probe = probe();
    let p = probe.to_str().unwrap();
    let plain = npc(&cache, &["compile", "--json", "--", p, "--steps", "2"], &[]);
    assert_eq!(json(&plain)["compiled"], 3);
    let flags =
        "--distribution-strategy llm-training --enable-saturate-infinity --logfile /tmp/n.log";
    let out = std::process::Command::new(&probe)
        .args(["--steps", "3", "--json"])
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .env("NEURON_CC_FLAGS", flags)
        .env_remove("NEURON_PC_EXTRACT_DIR")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let warnings: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("no meaning on target cpu"))
        .collect();
    assert_eq!(warnings.len(), 1, "{err}");
    for name in [
        "--distribution-strategy",
        "--enable-saturate-infinity",
        "--logfile",
    ] {
        assert!(warnings[0].contains(name), "{err}");
    }
    let m: serde_json::Value = serde_json::from_str(
        stdout(&out)
            .lines()
            .find_map(|l| l.strip_prefix("METRICS "))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(m["compiles"], 0, "{m}");
    assert_eq!(m["disk_hits"], 3, "{m}");
    // An unknown word still fails, with one line.
    let bad = std::process::Command::new(&probe)
        .args(["--steps", "1"])
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .env("NEURON_CC_FLAGS", "--enable-saturate-infinities")
        .env_remove("NEURON_PC_EXTRACT_DIR")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("unknown flag \"--enable-saturate-infinities\""),
        "{}",
        stderr(&bad)
    );
}

/// After `compile --optlevel O1`, `analyze` of the job run without flags says the cache holds
/// its graphs under other flags, names the flag and prints the flags to use; once the job's
/// graphs are cached under its own flags it says nothing.
#[test]
fn analyze_flags_a_run_whose_flags_differ_from_the_cache() {
    let cache = tmp("ux-analyze-flags");
    let probe = probe();
    let p = probe.to_str().unwrap();
    let c = cache.to_str().unwrap();
    let out = npc(
        &cache,
        &["compile", "--optlevel", "O1", "--", p, "--steps", "1"],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));

    let a = npc(
        &cache,
        &["analyze", "--cache", c, "--", p, "--steps", "1"],
        &[],
    );
    assert!(a.status.success(), "{}", stderr(&a));
    let text = stdout(&a);
    assert!(text.contains("flags differ from the cache's"), "{text}");
    assert!(text.contains("--optlevel 1 (this run: 2)"), "{text}");
    assert!(
        text.contains("NEURON_CC_FLAGS='--target cpu --optlevel 1"),
        "{text}"
    );

    let j = npc(
        &cache,
        &["analyze", "--json", "--cache", c, "--", p, "--steps", "1"],
        &[],
    );
    let v = json(&j);
    let m = &v["flag_mismatches"][0];
    assert_eq!(m["missing"], 3, "{v}");
    assert_eq!(m["cached"], 3, "{v}");
    assert_eq!(m["graphs"], 3, "{v}");

    // Under the cached flags there is nothing to flag.
    let flags = m["cached_flags"].as_str().unwrap().to_string();
    let same = npc(
        &cache,
        &["analyze", "--json", "--cache", c, "--", p, "--steps", "1"],
        &[("NEURON_CC_FLAGS", &flags)],
    );
    let v = json(&same);
    assert_eq!(
        v["flag_mismatches"].as_array().map(Vec::len),
        Some(0),
        "{v}"
    );
    assert_eq!(v["cached"].as_array().map(Vec::len), Some(3), "{v}");
}
