//! The README's "Use it in your own crate" program is `examples/own_crate.rs` verbatim, and
//! that program trains: it runs to completion on the cpu plugin and its loss falls.

use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn readme_quotes_the_example_verbatim() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let example = std::fs::read_to_string(root().join("examples/own_crate.rs")).unwrap();
    let block = format!("```rust\n{example}```\n");
    assert!(
        readme.contains(&block),
        "README.md must quote examples/own_crate.rs verbatim in a rust block"
    );
    let toml = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    // the profile the README tells users to copy is the one this repository uses
    for line in [
        "[profile.dev.package.\"*\"]\nopt-level = 2",
        "[profile.release]\ndebug = \"line-tables-only\"",
    ] {
        assert!(toml.contains(line) && readme.contains(line), "{line}");
    }
}

#[test]
fn readme_links_stay_inside_the_repository() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for bad in ["](http", "../shared/", "DESIGN.md"] {
        assert!(
            !readme.contains(bad),
            "README.md refers outside the repository: {bad}"
        );
    }
    assert!(readme.contains("`docs/design.md`"));
    assert!(root().join("docs/design.md").is_file());
}

#[test]
fn the_example_trains() {
    let job = Path::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .parent()
        .unwrap()
        .join("examples")
        .join("own_crate");
    assert!(
        job.exists(),
        "{} is missing: run `cargo build --example own_crate` (scripts/test builds it)",
        job.display()
    );
    let out = Command::new(&job)
        .current_dir(root())
        .env("NEURON_PC_CACHE", "0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let losses: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.split("loss ").nth(1))
        .map(|v| v.trim().parse().unwrap())
        .collect();
    assert_eq!(losses.len(), 4, "{stdout}");
    assert!(losses[3] < 0.5 * losses[0], "{losses:?}");
    assert!(stdout.contains("graphs seen                1"), "{stdout}");
}
