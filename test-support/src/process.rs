//! The test process's own figures, read from `/proc`, and tests of this binary run as child
//! processes.

/// Resident memory of this process (`VmRSS`), in KiB.
pub fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Set in a test process that [`run_alone`] started: there the test runs its body.
const ALONE_ENV: &str = "NEURON_PC_TEST_ALONE";

/// Runs the calling test again, alone, in a process of its own, and tells the caller whether it
/// is that process. For the few tests that change process-wide state other tests read (an
/// environment variable, `XLA_FLAGS` before the plugin loads) now that a test program holds
/// many subjects' tests, which cargo runs side by side on threads of one process:
///
/// ```ignore
/// #[test]
/// fn reads_neuron_cc_flags() {
///     if !run_alone(module_path!(), "reads_neuron_cc_flags") {
///         return; // the child ran it, and passed
///     }
///     std::env::set_var("NEURON_CC_FLAGS", "-O1");
///     // ...
/// }
/// ```
///
/// In the parent it starts this test binary with `--exact <test> --test-threads 1`, fails the
/// test with the child's output when the child fails (or ran no test), and returns `false`.
/// `module` is the caller's `module_path!()`; its first segment (the test program) is dropped.
pub fn run_alone(module: &str, test: &str) -> bool {
    if std::env::var_os(ALONE_ENV).is_some() {
        return true;
    }
    let path = test_path(module, test);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            path.as_str(),
            "--exact",
            "--test-threads",
            "1",
            "--nocapture",
        ])
        .env(ALONE_ENV, "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{path}, run alone, failed ({}):\n{text}",
        out.status
    );
    false
}

/// The name the test harness knows test `test` of module `module` (the caller's
/// `module_path!()`) by, as `--exact` wants it: the module path without the test program's own
/// name, then the test (`ops::grad_ops` and `child` give `grad_ops::child`).
pub fn test_path(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, inner)) => format!("{inner}::{test}"),
        None => test.to_string(),
    }
}

/// A command that runs test `test` of module `module` (the caller's `module_path!()`) of this
/// test binary alone, in a process of its own, printing its output: for tests whose subject is
/// what a program prints. The variables that change what the device logs, compiles or writes
/// (`NEURON_PC_LOG`, `RUST_LOG`, `NEURON_PC_DEBUG_STEPS`, `NEURON_CC_FLAGS`,
/// `NEURON_PC_EXTRACT_DIR`) are removed; the caller sets its own after.
pub fn child_test(module: &str, test: &str) -> std::process::Command {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args([
        "--exact",
        &test_path(module, test),
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    for v in [
        "NEURON_PC_LOG",
        "RUST_LOG",
        "NEURON_PC_DEBUG_STEPS",
        "NEURON_CC_FLAGS",
        "NEURON_PC_EXTRACT_DIR",
    ] {
        c.env_remove(v);
    }
    c
}
