//! `neuron-pc analyze`: shape-only variants and graphs a real run needed that the trial missed.

use crate::support as common;

use common::*;

#[test]
fn analyze_finds_shape_variants_and_graphs_the_trial_missed() {
    let dir = tmp("analyze");
    let log = dir.join("graphs.jsonl");
    let probe = probe();
    let p = probe.to_str().unwrap();
    // The real run: one more probe variant (batch 7) than the trial run will make.
    let real = std::process::Command::new(p)
        .args(["--steps", "3", "--variants", "3", "--width", "4"])
        .env("NEURON_COMPILE_CACHE_URL", dir.join("cache"))
        .env("NEURON_PC_GRAPH_LOG", &log)
        .env_remove("NEURON_CC_FLAGS")
        .output()
        .unwrap();
    assert!(real.status.success(), "{}", stderr(&real));
    // The environment names an empty cache; --cache the one the real run filled.
    let real_cache = dir.join("cache");
    let out = npc(
        &dir.join("empty-cache"),
        &[
            "analyze",
            "--cache",
            real_cache.to_str().unwrap(),
            "--json",
            "--graph-log",
            log.to_str().unwrap(),
            "--",
            p,
            "--steps",
            "1",
            "--variants",
            "2",
            "--width",
            "4",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["distinct"], 3, "{v}");
    assert_eq!(v["log_graphs"], 4);
    // The real run compiled every graph of the trial into its cache.
    assert_eq!(v["cached"].as_array().unwrap().len(), 3, "{v}");
    let groups = v["shape_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{v}");
    assert_eq!(
        groups[0]["differing"],
        serde_json::json!([[0, ["f32[5,4]", "f32[6,4]"]]])
    );
    let missing = v["missing_from_trial"].as_array().unwrap();
    assert_eq!(missing.len(), 1, "{v}");
    assert_eq!(
        missing[0]["params"],
        serde_json::json!(["f32[7,4]", "f32[4,4]"])
    );
    // It first appeared at the fourth mark_step of the real run (step 1's last probe).
    assert_eq!(missing[0]["step"], 4);

    // The same analysis from an extraction directory, as text.
    let x = dir.join("extract");
    let trial = std::process::Command::new(p)
        .args(["--steps", "1", "--variants", "2", "--width", "4"])
        .env("NEURON_PC_EXTRACT_DIR", &x)
        .env("NEURON_PC_CACHE", "0")
        .env_remove("NEURON_CC_FLAGS")
        .output()
        .unwrap();
    assert!(trial.status.success());
    let text = npc(&dir.join("cache"), &["analyze", x.to_str().unwrap()], &[]);
    let s = String::from_utf8_lossy(&text.stdout);
    assert!(s.contains("3 graphs, 3 distinct"), "{s}");
    assert!(s.contains("3 already in the cache"), "{s}");
    let none = npc(
        &dir.join("cache"),
        &[
            "analyze",
            "--cache",
            dir.join("empty-cache").to_str().unwrap(),
            x.to_str().unwrap(),
        ],
        &[],
    );
    let s2 = String::from_utf8_lossy(&none.stdout);
    assert!(s2.contains("0 already in the cache"), "{s2}");
    assert!(
        s.contains("parameter 0: f32[5,4] vs f32[6,4]") && s.contains("fixed-size batches"),
        "{s}"
    );
}
