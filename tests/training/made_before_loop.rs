//! A value made before a training loop and left pending makes step 0 a graph of its own (it
//! computes the value too), so the loop compiles twice; the device says so at step 1, naming
//! the lines that made the value. A `mark_step` before the loop computes it apart, and nothing
//! is said.
//!
//! The program is this test binary itself, re-run with `NPC_MADE_BEFORE_LOOP_CHILD` set to
//! `pending` or `cut` so that it runs [`child_program`] alone (its source lines are what the
//! warning must name).

use neuron_pc::{DType, HostTensor, LazyDevice};
use neuron_pc_test_support::process::child_test;

const CHILD: &str = "NPC_MADE_BEFORE_LOOP_CHILD";

/// Three steps of `w <- w - 0.1 * x * pos`, `pos = 0.5 * arange(3)` made before the loop;
/// `cut`: a `mark_step` between the two. Prints the lines that made `pos`, the loop's
/// `mark_step` line (its ops are on the two lines above), the number of graphs that
/// `mark_step` compiled, and `w`.
#[test]
fn child_program() {
    let Ok(mode) = std::env::var(CHILD) else {
        return;
    };
    let dev = LazyDevice::from_env().unwrap();
    let x = dev
        .tensor(&HostTensor::from_slice(&[0.5f32, -1.0, 2.0], &[3]).unwrap())
        .unwrap();
    let mut w = dev
        .tensor(&HostTensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap())
        .unwrap();
    if mode == "prefill" {
        // a state made before the loop, then steps that differ in shape on their own (a
        // prompt, then one token at a time): not a value left pending by mistake
        let mut total = dev.zeros(&[], DType::F32).unwrap();
        for n in [3, 1, 1] {
            let t = dev.from_slice(&vec![1.5f32; n], &[n]).unwrap();
            total = total.add(&t.sum(&[0], false).unwrap()).unwrap();
            dev.mark_step().unwrap();
        }
        println!("RESULT 0 0 0 0 {} 0 0", total.item().unwrap());
        return;
    }
    let made = line!() + 1;
    let pos = dev.arange(3, DType::F32).unwrap();
    let pos = pos.mul_scalar(0.5).unwrap();
    if mode == "cut" {
        dev.mark_step().unwrap();
    }
    let before = dev.metrics().compiles;
    let mut step_line = 0;
    for _ in 0..3 {
        let update = x.mul(&pos).unwrap().mul_scalar(0.1).unwrap();
        w = w.sub(&update).unwrap();
        step_line = line!() + 1;
        dev.mark_step().unwrap();
    }
    let loop_graphs = dev.metrics().compiles - before;
    let w = w.to_vec::<f32>().unwrap();
    println!(
        "RESULT {made} {} {step_line} {loop_graphs} {} {} {}",
        made + 1,
        w[0],
        w[1],
        w[2]
    );
}

struct Run {
    stderr: String,
    made: [u32; 2],
    step_line: u32,
    loop_graphs: u64,
    w: [f32; 3],
}

fn run_child(mode: &str) -> Run {
    let cache = std::env::temp_dir().join(format!(
        "npc-made-before-loop-{mode}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&cache);
    let out = child_test(module_path!(), "child_program")
        .env(CHILD, mode)
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&cache);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let f: Vec<&str> = stdout
        .lines()
        .find_map(|l| l.split("RESULT ").nth(1))
        .unwrap_or_else(|| panic!("no RESULT in\n{stdout}"))
        .split_whitespace()
        .collect();
    Run {
        stderr,
        made: [f[0].parse().unwrap(), f[1].parse().unwrap()],
        step_line: f[2].parse().unwrap(),
        loop_graphs: f[3].parse().unwrap(),
        w: [
            f[4].parse().unwrap(),
            f[5].parse().unwrap(),
            f[6].parse().unwrap(),
        ],
    }
}

/// `w` after three steps, computed here.
fn expected_w() -> [f32; 3] {
    let x = [0.5f32, -1.0, 2.0];
    let mut w = [1.0f32, 2.0, 3.0];
    for _ in 0..3 {
        for i in 0..3 {
            w[i] -= 0.1 * (x[i] * (0.5 * i as f32));
        }
    }
    w
}

/// `w` after the child's three steps is what the host computes.
fn assert_trained(run: &Run) {
    let want = expected_w();
    for (got, want) in run.w.iter().zip(want) {
        assert!((got - want).abs() < 1e-6, "{:?} vs {want}", run.w);
    }
}

#[test]
fn a_value_left_pending_before_the_loop_is_named_at_step_1() {
    let file = "tests/training/made_before_loop.rs";
    let run = run_child("pending");
    let e = &run.stderr;
    let warnings: Vec<&str> = e.lines().filter(|l| l.contains("step 1 at")).collect();
    assert_eq!(warnings.len(), 1, "one warning:\n{e}");
    let w = warnings[0];
    assert!(w.contains("WARN"), "{e}");
    // both lines that made `pos`, in order, and the loop's mark_step as the site
    let (a, b) = (
        format!("{file}:{}:", run.made[0]),
        format!("{file}:{}:", run.made[1]),
    );
    let (at_a, at_b) = (w.find(&a), w.find(&b));
    assert!(at_a.is_some() && at_b.is_some(), "names both lines:\n{w}");
    assert!(at_a < at_b, "{w}");
    assert!(
        w.contains(&format!("mark_step {file}:{}:", run.step_line)),
        "{w}"
    );
    // the loop's own lines are in both graphs: not named
    for body in [run.step_line - 2, run.step_line - 1] {
        assert!(!w.contains(&format!("{file}:{body}:")), "{w}");
    }
    assert!(w.contains("device.mark_step()"), "says what to do:\n{w}");
    // what it warns about: the loop compiled two graphs
    assert_eq!(run.loop_graphs, 2, "{e}");
    assert_trained(&run);
}

#[test]
fn a_mark_step_before_the_loop_makes_one_loop_graph_and_no_warning() {
    let run = run_child("cut");
    let e = &run.stderr;
    assert!(!e.contains("step 1 at"), "{e}");
    assert!(!e.contains("WARN"), "{e}");
    assert_eq!(run.loop_graphs, 1, "{e}");
    assert_trained(&run);
}

#[test]
fn steps_that_differ_in_shape_on_their_own_are_not_taken_for_it() {
    let run = run_child("prefill");
    let e = &run.stderr;
    assert!(!e.contains("step 1 at"), "{e}");
    assert_eq!(run.w[0], 1.5 * 5.0, "{e}");
}
