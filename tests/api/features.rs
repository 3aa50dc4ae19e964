//! What a user's crate pays for: the library's default features pull in none of the command
//! line's, the S3 client's, the etcd client's or the text readers' crates. Read from
//! `cargo tree` of a crate made here that depends on this checkout (as the guide says) and whose
//! `main.rs` is `examples/own_crate.rs`; resolving is offline, so nothing is downloaded or built.
//! `scripts/own-crate` builds such a crate cold and times it.

use std::path::Path;
use std::process::Command;

/// The crates each opt-in feature brings, none of which a default build may hold.
const OPT_IN: &[(&str, &str)] = &[
    ("clap", "cli"),
    ("signal-hook", "cli"),
    ("indicatif", "cli or monitor"),
    ("plotters", "cli"),
    ("crc32c", "monitor"),
    ("prost", "monitor or etcd"),
    ("tokio", "s3 or etcd"),
    ("object_store", "s3"),
    ("etcd-client", "etcd"),
    ("tonic", "etcd"),
    ("tokenizers", "text"),
    ("arrow-ipc", "text"),
    ("arrow-array", "text"),
    ("parquet", "text"),
    ("zstd-sys", "text"),
    ("neuron-pc-gloo", "gloo"),
];

/// The package names (`name vX.Y.Z`) `cargo tree` lists for a crate depending on this checkout
/// with `features`.
fn tree_of_a_user_crate(tag: &str, dependency: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = neuron_pc_test_support::paths::fresh_dir("npc-user-crate", tag);
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(
        dir.join("Cargo.toml"),
        format!(
            "[package]\nname = \"user-job\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n\
             [dependencies]\nneuron-pc = {{ path = {:?}{dependency} }}\n\n[workspace]\n",
            root.display().to_string()
        ),
    )
    .unwrap();
    std::fs::copy(root.join("examples/own_crate.rs"), dir.join("src/main.rs")).unwrap();
    // the checkout's versions, so that resolving needs no registry
    std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock")).unwrap();
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "--prefix", "none", "--format", "{p}"])
        .current_dir(&dir)
        .env_remove("CARGO_TARGET_DIR")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn a_training_crate_builds_no_command_line_http_grpc_tokenizer_or_columnar_stack() {
    let default = tree_of_a_user_crate("default", "");
    assert!(default.iter().any(|p| p == "neuron-pc"), "{default:?}");
    assert!(
        default.iter().any(|p| p == "neuron-pc-compiler"),
        "{default:?}"
    );
    for (krate, feature) in OPT_IN {
        assert!(
            !default.iter().any(|p| p == krate),
            "a default build of neuron-pc holds {krate} (feature {feature})"
        );
    }

    // The features bring their stacks, one each: the test above is not blind.
    let s3 = tree_of_a_user_crate("s3", ", features = [\"s3\"]");
    assert!(s3.iter().any(|p| p == "object_store") && s3.iter().any(|p| p == "tokio"));
    assert!(!s3
        .iter()
        .any(|p| p == "etcd-client" || p == "tokenizers" || p == "clap"));
    let text = tree_of_a_user_crate("text", ", features = [\"text\"]");
    assert!(text.iter().any(|p| p == "tokenizers") && text.iter().any(|p| p == "parquet"));
    assert!(!text.iter().any(|p| p == "tokio" || p == "clap"));
    // the command line alone (what scripts/demo builds) holds none of the other stacks
    let core = tree_of_a_user_crate("cli-core", ", features = [\"cli-core\"]");
    assert!(core.iter().any(|p| p == "clap"), "{core:?}");
    for (krate, feature) in OPT_IN.iter().filter(|(_, f)| !f.starts_with("cli")) {
        assert!(
            !core.iter().any(|p| p == krate),
            "cli-core holds {krate} (feature {feature})"
        );
    }
    let cli = tree_of_a_user_crate("cli", ", features = [\"cli\"]");
    for (krate, _) in OPT_IN {
        assert!(
            cli.iter().any(|p| p == krate),
            "the cli feature lacks {krate}"
        );
    }
}
