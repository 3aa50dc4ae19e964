//! A plugin library is refused by its SHA-256 before it is loaded; the intact one loads.
//! Its own test binary: it sets XDG_CACHE_HOME (where verification markers go).

use neuron_pc_test_support::process::run_alone;
use std::path::{Path, PathBuf};

use neuron_pc_compiler::pjrt::pins::pin_for_library;
use neuron_pc_compiler::pjrt::{find_plugin, Client, ClientOptions, Plugin, Target};

/// A fake site-packages holding `bytes` where the pinned package keeps its library.
fn plant(root: &Path, name: &str, rel: &str, bytes: &[u8]) -> PathBuf {
    let lib = root.join(name).join("site-packages").join(rel);
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    std::fs::write(&lib, bytes).unwrap();
    lib
}

#[test]
fn a_corrupted_or_substituted_library_is_refused_and_the_intact_one_loads() {
    // alone in a process of its own: it sets XDG_CACHE_HOME and NEURON_PC_PLUGIN_SHA256, which
    // every plugin load reads
    if !run_alone(
        module_path!(),
        "a_corrupted_or_substituted_library_is_refused_and_the_intact_one_loads",
    ) {
        return;
    }
    let root = std::env::temp_dir().join(format!("npc-plugin-integrity-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::env::set_var("XDG_CACHE_HOME", root.join("cache"));
    std::env::remove_var("NEURON_PC_PLUGIN_SHA256");

    let real = find_plugin(Target::Cpu)
        .expect("cpu plugin: run scripts/setup")
        .canonicalize()
        .unwrap();
    let pin = pin_for_library(&real).expect("a pinned plugin");

    // Another file in the pinned library's place.
    let other = plant(&root, "other", pin.library, b"\x7fELF not this plugin");
    let err = Plugin::load(&other).unwrap_err().to_string();
    assert!(
        err.contains("corrupted or was replaced") && err.contains(pin.package),
        "{err}"
    );
    assert!(!err.contains('\n'), "one line: {err}");

    // One byte changed (same size: only the digest can tell), checked against a given digest.
    // (A full-size corrupted copy is checked the same way; the unit tests of `integrity`
    // cover the marker and the pinned size.)
    let head = {
        use std::io::Read;
        let mut b = Vec::new();
        std::fs::File::open(&real)
            .unwrap()
            .take(4 << 20)
            .read_to_end(&mut b)
            .unwrap();
        b
    };
    let good = neuron_pc_compiler::key::sha256_hex(&head);
    let mut bad = head.clone();
    bad[2 << 20] ^= 0x40;
    let corrupt = plant(&root, "corrupt", "somewhere/libother.so", &bad);
    std::env::set_var("NEURON_PC_PLUGIN_SHA256", &good);
    let err = Plugin::load(&corrupt).unwrap_err().to_string();
    assert!(
        err.contains("NEURON_PC_PLUGIN_SHA256") && err.contains(&good),
        "{err}"
    );
    std::env::remove_var("NEURON_PC_PLUGIN_SHA256");

    // The intact library (a hard link: same bytes, another path) loads and works.
    let intact = root.join("intact/site-packages").join(pin.library);
    std::fs::create_dir_all(intact.parent().unwrap()).unwrap();
    std::fs::hard_link(&real, &intact).unwrap();
    let plugin = Plugin::load(&intact).expect("the intact library loads");
    let client = Client::new(&plugin, &ClientOptions::default()).unwrap();
    assert!(client.device_count() >= 1);
    std::fs::remove_dir_all(&root).unwrap();
}
