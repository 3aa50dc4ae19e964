//! The step debug mode as a user meets it: a program run with `NEURON_PC_DEBUG_STEPS=1` and no
//! other logging variable prints, on stderr, one warning per source line that read a pending
//! value before `mark_step`, and one line per step cut with its site, graph key, op count and
//! where the executable came from (compiled, memory, disk).
//!
//! The program is this test binary itself, re-run with `NPC_DEBUG_STEPS_CHILD` set so that it
//! runs [`child_program`] alone (its source lines are what the log must name).

use neuron_pc_test_support::process::child_test;
use std::path::Path;

use neuron_pc::{HostTensor, LazyDevice};

const CHILD: &str = "NPC_DEBUG_STEPS_CHILD";

/// Three steps of `y = tanh(x * w)`; each reads `y` before `mark_step` (an implicit sync at the
/// same line every time), then `mark_step` runs the rest. Prints the two source lines.
#[test]
fn child_program() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let dev = LazyDevice::from_env().unwrap();
    let x = dev
        .tensor(&HostTensor::from_slice(&[0.5f32, -1.0, 2.0], &[3]).unwrap())
        .unwrap();
    let w = dev
        .tensor(&HostTensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap())
        .unwrap();
    let mut lines = (0, 0);
    for _ in 0..3 {
        let y = x.mul(&w).unwrap().tanh().unwrap();
        let z = y.neg().unwrap();
        lines.0 = line!() + 1;
        let v = y.to_vec::<f32>().unwrap();
        assert!((v[0] - 0.5f32.tanh()).abs() < 1e-6);
        lines.1 = line!() + 1;
        dev.mark_step().unwrap();
        assert!(!z.is_pending());
    }
    println!("LINES {} {}", lines.0, lines.1);
}

struct Run {
    stderr: String,
    read_line: u32,
    step_line: u32,
}

fn run_child(cache: &Path) -> Run {
    let out = child_test(module_path!(), "child_program")
        .env(CHILD, "1")
        .env("NEURON_PC_DEBUG_STEPS", "1")
        .env("NEURON_COMPILE_CACHE_URL", cache)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let nums: Vec<u32> = stdout
        .lines()
        .find_map(|l| l.split("LINES ").nth(1))
        .unwrap_or_else(|| panic!("no LINES in\n{stdout}"))
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    Run {
        stderr,
        read_line: nums[0],
        step_line: nums[1],
    }
}

fn lines_with<'a>(stderr: &'a str, needle: &str) -> Vec<&'a str> {
    stderr.lines().filter(|l| l.contains(needle)).collect()
}

#[test]
fn debug_steps_names_implicit_syncs_once_and_logs_every_step_cut() {
    let cache = std::env::temp_dir().join(format!("npc-debug-steps-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    let first = run_child(&cache);
    let file = "tests/training/debug_steps.rs";
    let read_site = format!("{file}:{}:", first.read_line);
    let step_site = format!("{file}:{}:", first.step_line);
    let e = &first.stderr;

    // The implicit sync: named once (three reads at the same line), with the reason.
    let warnings = lines_with(e, "implicit sync at");
    assert_eq!(warnings.len(), 1, "one warning per line:\n{e}");
    assert!(warnings[0].contains("WARN"), "{e}");
    assert!(warnings[0].contains(&read_site), "names the line:\n{e}");
    assert!(warnings[0].contains("before mark_step"), "says why:\n{e}");

    // Every step cut: three implicit syncs at the read, three mark_steps.
    let reads = lines_with(e, &format!("step cut at {read_site}"));
    let steps = lines_with(e, &format!("step cut at {step_site}"));
    assert_eq!(reads.len(), 3, "{e}");
    assert_eq!(steps.len(), 3, "{e}");
    assert!(reads.iter().all(|l| l.contains("(implicit sync)")), "{e}");
    assert!(steps.iter().all(|l| l.contains("(mark_step)")), "{e}");
    // The read graph computes `tanh(x*w)`, the mark_step graph `neg` of it: two graphs, each
    // the same on every step.
    let graph_of = |l: &str| {
        let g = l.split("graph ").nth(1).unwrap();
        g.split(',').next().unwrap().to_string()
    };
    assert_eq!(graph_of(reads[0]).len(), 12, "{e}");
    assert_ne!(graph_of(reads[0]), graph_of(steps[0]), "{e}");
    assert!(
        reads.iter().all(|l| graph_of(l) == graph_of(reads[0])),
        "{e}"
    );
    let ops_of = |l: &str| -> usize {
        let o = l.split(", ").find(|p| p.ends_with(" ops")).unwrap();
        o.trim_end_matches(" ops").parse().unwrap()
    };
    assert!(ops_of(reads[0]) >= 2 && ops_of(steps[0]) >= 1, "{e}");
    assert!(reads.iter().all(|l| ops_of(l) == ops_of(reads[0])), "{e}");
    // First time compiled, then found in memory.
    assert!(
        reads[0].contains("compiled") && steps[0].contains("compiled"),
        "{e}"
    );
    for l in reads[1..].iter().chain(&steps[1..]) {
        assert!(l.contains("memory hit"), "{e}");
    }

    // A second process finds both graphs on disk.
    let second = run_child(&cache);
    let e2 = &second.stderr;
    let reads2 = lines_with(e2, &format!("step cut at {read_site}"));
    let steps2 = lines_with(e2, &format!("step cut at {step_site}"));
    assert!(reads2[0].contains("disk hit"), "{e2}");
    assert!(steps2[0].contains("disk hit"), "{e2}");
    assert_eq!(graph_of(reads2[0]), graph_of(reads[0]));
    let _ = std::fs::remove_dir_all(&cache);
}

#[test]
fn without_debug_steps_nothing_is_logged() {
    let cache = std::env::temp_dir().join(format!("npc-debug-quiet-{}", std::process::id()));
    let out = child_test(module_path!(), "child_program")
        .env(CHILD, "1")
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("step cut"), "{stderr}");
    assert!(!stderr.contains("implicit sync"), "{stderr}");
    let _ = std::fs::remove_dir_all(&cache);
}
