//! The `neuron-pc cache` command module (which lives in the root crate's `src/cache_cmd.rs`),
//! compiled here against a minimal parser so its parsing and exit codes are tested with the
//! crate it drives.

#[path = "../../src/cache_cmd.rs"]
mod cache_cmd;
mod common;

use clap::Parser;
use common::*;
use neuron_pc_cache::PutMode;

#[derive(clap::Parser, Debug)]
struct Cli {
    #[command(subcommand)]
    top: Top,
}

#[derive(clap::Subcommand, Debug)]
enum Top {
    Cache(cache_cmd::CacheArgs),
}

fn run(args: &[&str]) -> anyhow::Result<i32> {
    let cli = Cli::try_parse_from(std::iter::once("neuron-pc").chain(args.iter().copied()))?;
    let Top::Cache(a) = cli.top;
    cache_cmd::run_with(a, None)
}

#[test]
fn parsing() {
    for ok in [
        &["cache", "ls"][..],
        &["cache", "ls", "--json", "--cache", "/tmp/x"],
        &["cache", "stats", "--json"],
        &["cache", "show", "ab"],
        &["cache", "show", "ab", "cd", "--json"],
        &["cache", "verify", "--fix"],
        &["cache", "prune", "--max-size", "10G"],
        &["cache", "rm", "ab", "--cache", "s3://b/p"],
        &["cache", "clear", "--failed"],
    ] {
        assert!(
            Cli::try_parse_from(std::iter::once("neuron-pc").chain(ok.iter().copied())).is_ok(),
            "{ok:?}"
        );
    }
    for bad in [
        &["cache"][..],
        &["cache", "prune"],
        &["cache", "show"],
        &["cache", "frobnicate"],
        &["cache", "verify", "--fixx"],
    ] {
        assert!(
            Cli::try_parse_from(std::iter::once("neuron-pc").chain(bad.iter().copied())).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn commands_against_a_local_cache() {
    let f = Fixture::new(Backend::Local);
    let root = f.local_root().display().to_string();
    let c = f.cache(opts());
    let (a, b) = (key("cli a"), key("cli b"));
    c.put(&a, &exe_for(&a, 100), "", &inputs("one"), 1.0);
    c.put(&b, &exe_for(&b, 100), "", &inputs("two"), 1.0);
    let r = &root;
    assert_eq!(run(&["cache", "ls", "--json", "--cache", r]).unwrap(), 0);
    assert_eq!(run(&["cache", "stats", "--cache", r]).unwrap(), 0);
    assert_eq!(
        run(&["cache", "show", a.as_str(), b.as_str(), "--cache", r]).unwrap(),
        0
    );
    assert_eq!(
        run(&["cache", "show", &"0".repeat(64), "--cache", r]).unwrap(),
        1,
        "unknown key"
    );
    assert!(
        run(&["cache", "show", "../etc/passwd", "--cache", r]).is_err(),
        "invalid key"
    );
    assert_eq!(run(&["cache", "verify", "--cache", r]).unwrap(), 0);
    // Damage one entry: verify exits 1, --fix removes it, then verify is clean.
    f.stores[0]
        .put(&exe_obj(&a, &exe_for(&a, 100)), b"bad", PutMode::Overwrite)
        .unwrap();
    assert_eq!(
        run(&["cache", "verify", "--json", "--cache", r]).unwrap(),
        1
    );
    // Issue 14 F / 13.4: --fix that removed every bad entry leaves a sound cache: exit 0.
    assert_eq!(
        run(&["cache", "verify", "--fix", "--cache", r]).unwrap(),
        0,
        "found bad ones and removed them all"
    );
    assert_eq!(run(&["cache", "verify", "--cache", r]).unwrap(), 0);
    assert_eq!(c.list().unwrap().len(), 1);
    assert!(run(&["cache", "prune", "--max-size", "lots", "--cache", r]).is_err());
    assert_eq!(
        run(&["cache", "prune", "--max-size", "0", "--cache", r]).unwrap(),
        0
    );
    assert!(
        c.list().unwrap().is_empty(),
        "prune to 0 removes everything"
    );
    c.put(&a, &exe_for(&a, 100), "", &inputs("one"), 1.0);
    c.put_failure(&b, "boom");
    assert_eq!(
        run(&["cache", "clear", "--failed", "--cache", r]).unwrap(),
        0
    );
    assert!(c.failure(&b).is_none() && c.list().unwrap().len() == 1);
    assert_eq!(run(&["cache", "rm", a.as_str(), "--cache", r]).unwrap(), 0);
    assert!(c.list().unwrap().is_empty());
    assert!(
        run(&["cache", "ls", "--cache", "ftp://nope"]).is_err(),
        "unknown scheme"
    );
}
