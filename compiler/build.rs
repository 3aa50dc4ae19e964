//! Generates Rust bindings for the PJRT C API from the header that ships with the plugin
//! package, so the bindings always match the plugin the project installs (the `pjrt` crate's
//! bindings are for an older API version and the plugin refuses them).

use std::env;
use std::path::{Path, PathBuf};

const HEADER_ENV: &str = "NEURON_PC_PJRT_HEADER";
const HEADER_IN_PACKAGE: &str = "xla_plugins/xla_cpu_pjrt/include/pjrt_c_api.h";

fn main() {
    println!("cargo:rerun-if-env-changed={HEADER_ENV}");
    println!("cargo:rerun-if-env-changed=VIRTUAL_ENV");
    println!("cargo:rerun-if-env-changed=NEURON_PC_VENV");
    println!("cargo:rerun-if-changed=build.rs");

    let header = find_header().unwrap_or_else(|| {
        panic!(
            "pjrt_c_api.h not found: run scripts/setup (it installs xla-cpu-pjrt into .venv) \
             or set {HEADER_ENV}=/path/to/pjrt_c_api.h"
        )
    });
    println!("cargo:rerun-if-changed={}", header.display());

    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_type("PJRT_.*")
        .allowlist_var("PJRT_.*")
        .derive_default(true)
        .layout_tests(false)
        .generate_comments(false)
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .generate()
        .unwrap_or_else(|e| panic!("bindgen failed on {}: {e}", header.display()));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("pjrt_c_api.rs");
    let mut code = bindings.to_string();
    code.push_str(&struct_size_impls(&code));
    std::fs::write(&out, code).unwrap_or_else(|e| panic!("cannot write {}: {e}", out.display()));
}

/// Every `PJRT_X_STRUCT_SIZE` constant the header defines becomes an `Args::new()` for `PJRT_X`
/// that fills in `struct_size`, so no call site can forget it or use the wrong one.
fn struct_size_impls(code: &str) -> String {
    let mut out = String::from("\n");
    for line in code.lines() {
        let Some(rest) = line.trim().strip_prefix("pub const ") else {
            continue;
        };
        let Some((name, _)) = rest.split_once("_STRUCT_SIZE:") else {
            continue;
        };
        if !code.contains(&format!(
            "pub struct {name} {{\n    pub struct_size: usize,"
        )) {
            continue;
        }
        out.push_str(&format!(
            "impl Args for {name} {{ fn new() -> Self {{ {name} {{ \
             struct_size: {name}_STRUCT_SIZE as usize, ..Default::default() }} }} }}\n"
        ));
    }
    out
}

/// The explicit variable wins; then `NEURON_PC_VENV`, the project's `.venv`, the active
/// virtualenv. In each, the header `scripts/setup` extracted from the pinned header package
/// (when the default plugin's package ships none), then the one inside that package.
fn find_header() -> Option<PathBuf> {
    if let Ok(p) = env::var(HEADER_ENV) {
        return Some(PathBuf::from(p));
    }
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").ok()?);
    let mut venvs = Vec::new();
    if let Ok(v) = env::var("NEURON_PC_VENV") {
        venvs.push(PathBuf::from(v));
    }
    venvs.push(manifest.join("../.venv"));
    if let Ok(v) = env::var("VIRTUAL_ENV") {
        venvs.push(PathBuf::from(v));
    }
    venvs.iter().find_map(|v| header_in_venv(v))
}

fn header_in_venv(venv: &Path) -> Option<PathBuf> {
    let extracted = venv.join("include/neuron-pc/pjrt_c_api.h");
    if extracted.is_file() {
        return Some(extracted);
    }
    let lib = venv.join("lib");
    let mut pythons: Vec<PathBuf> = std::fs::read_dir(&lib)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("python"))
        })
        .collect();
    pythons.sort();
    pythons
        .into_iter()
        .map(|p| p.join("site-packages").join(HEADER_IN_PACKAGE))
        .find(|h| h.is_file())
}
