//! Scratch directories and the example binaries, as the integration tests use them.

use std::path::{Path, PathBuf};

/// `<temp>/<prefix>-<tag>-<pid>`, removed if an earlier run left it: a path no other test
/// process shares, which does not exist yet.
pub fn fresh_path(prefix: &str, tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// [`fresh_path`], created: an empty directory.
pub fn fresh_dir(prefix: &str, tag: &str) -> PathBuf {
    let d = fresh_path(prefix, tag);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The example `name`, built by `cargo test` next to the crate's binary `bin` (pass
/// `env!("CARGO_BIN_EXE_<bin>")`); a missing one fails the test with the command that builds it.
pub fn example_binary(bin: &str, name: &str) -> PathBuf {
    let p = Path::new(bin)
        .parent()
        .expect("a binary's path has a directory")
        .join("examples")
        .join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --example {name}` (cargo test builds it)",
        p.display()
    );
    p
}
