//! Builds the C++ shim over gloo (`src/shim.cc`) and links the system's libgloo (Debian's
//! `libgloo-dev`, which `scripts/setup` installs).

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-changed=src/shim.cc");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=NEURON_PC_GLOO_INCLUDE");
    let include = std::env::var("NEURON_PC_GLOO_INCLUDE").unwrap_or_else(|_| "/usr/include".into());
    if !Path::new(&include).join("gloo/allreduce.h").is_file() {
        panic!(
            "gloo's headers are not in {include}/gloo: install Debian's libgloo-dev \
             (scripts/setup does), or set NEURON_PC_GLOO_INCLUDE to the folder holding gloo/"
        );
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .include(&include)
        .file("src/shim.cc")
        .flag_if_supported("-Wno-unused-parameter")
        .compile("neuron_pc_gloo_shim");
    println!("cargo:rustc-link-lib=dylib=gloo");
}
