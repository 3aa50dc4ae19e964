//! `compile-graphs` and `run-graph` on StableHLO written by JAX (tests/data/jax, made by
//! scripts/fixtures/jax_export.py; expected outputs computed there with NumPy, not JAX), and
//! on a program the compiler rejects.

use crate::support as common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/jax")
}

/// (descr, dims, data bytes) of a .npy file, read independently of neuron-pc's reader.
fn npy(path: &Path) -> (String, String, Vec<u8>) {
    let b = std::fs::read(path).unwrap();
    assert_eq!(&b[..6], b"\x93NUMPY");
    let hlen = u16::from_le_bytes([b[8], b[9]]) as usize;
    let header = String::from_utf8(b[10..10 + hlen].to_vec()).unwrap();
    let field = |name: &str| {
        let i = header.find(name).unwrap() + name.len();
        header[i..]
            .split(['\'', ')'])
            .nth(if name == "'descr': " { 1 } else { 0 })
            .unwrap()
            .to_string()
    };
    (
        field("'descr': "),
        field("'shape': "),
        b[10 + hlen..].to_vec(),
    )
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn run_graph(cache: &Path, name: &str, inputs: usize, out: &Path) -> std::process::Output {
    let d = data();
    let mut args = vec![
        "run-graph".to_string(),
        d.join(format!("{name}.mlir")).display().to_string(),
        "--json".into(),
        "--inputs".into(),
    ];
    args.extend((0..inputs).map(|i| d.join(format!("{name}.in{i}.npy")).display().to_string()));
    args.extend(["--output-dir".to_string(), out.display().to_string()]);
    npc(
        cache,
        &args.iter().map(String::as_str).collect::<Vec<_>>(),
        &[],
    )
}

#[test]
fn jax_programs_compile_into_the_cache_and_run_like_numpy() {
    let cache = tmp("jax");
    let out = npc(
        &cache,
        &["compile-graphs", "--json", data().to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(
        (
            v["found"].as_u64(),
            v["compiled"].as_u64(),
            v["cached"].as_u64(),
            v["failed"].as_u64()
        ),
        (Some(2), Some(2), Some(0), Some(0)),
        "{v}"
    );
    assert_eq!(entry_keys(&cache), keys(&v, "compiled"));
    // Again: everything is cached.
    let again = json(&npc(
        &cache,
        &["compile-graphs", "--json", data().to_str().unwrap()],
        &[],
    ));
    assert_eq!(
        (again["cached"].as_u64(), again["compiled"].as_u64()),
        (Some(2), Some(0))
    );

    let o = tmp("jax-mlp-out");
    let r = run_graph(&cache, "mlp", 4, &o);
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(
        json(&r)["executable"],
        "cached",
        "run-graph must load what compile-graphs stored"
    );
    for i in 0..2 {
        let (descr, shape, got) = npy(&o.join(format!("out{i}.npy")));
        let (edescr, eshape, want) = npy(&data().join(format!("mlp.expected{i}.npy")));
        assert_eq!((descr, shape), (edescr, eshape));
        for (g, w) in f32s(&got).iter().zip(f32s(&want)) {
            assert!((g - w).abs() <= 1e-5 + 1e-5 * w.abs(), "out{i}: {g} vs {w}");
        }
    }

    let o = tmp("jax-mixed-out");
    let r = run_graph(&cache, "mixed", 2, &o);
    assert!(r.status.success(), "{}", stderr(&r));
    // i32, bf16 (stored as <V2) and bool results: exact.
    for (i, want_descr) in [(0, "<i4"), (1, "|V2"), (2, "|b1")] {
        let got = npy(&o.join(format!("out{i}.npy")));
        let want = npy(&data().join(format!("mixed.expected{i}.npy")));
        assert!(
            got.0 == want.0 || (i == 1 && got.0 == "<V2"),
            "{} vs {}",
            got.0,
            want_descr
        );
        assert_eq!((got.1, got.2), (want.1, want.2), "out{i}");
    }
}

#[test]
fn run_graph_names_the_argument_that_does_not_match() {
    let cache = tmp("jax-mismatch");
    let d = data();
    let p = |n: &str| d.join(n).display().to_string();
    let out = npc(
        &cache,
        &[
            "run-graph",
            &p("mixed.mlir"),
            "--inputs",
            &p("mixed.in1.npy"),
            &p("mixed.in0.npy"),
            "--output-dir",
            cache.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("input 0") && err.contains("i32[6]"), "{err}");
    let few = npc(
        &cache,
        &[
            "run-graph",
            &p("mlp.mlir"),
            "--inputs",
            &p("mlp.in0.npy"),
            "--output-dir",
            cache.to_str().unwrap(),
        ],
        &[],
    );
    assert!(
        stderr(&few).contains("takes 4 input(s) but 1"),
        "{}",
        stderr(&few)
    );
}

#[test]
fn a_program_the_compiler_rejects_fails_alone_and_is_recorded() {
    let cache = tmp("bad");
    let dir = tmp("bad-src");
    std::fs::copy(data().join("mlp.mlir"), dir.join("good.mlir")).unwrap();
    // Parses as MLIR but is ill-typed: the compiler rejects it.
    std::fs::write(
        dir.join("bad.mlir"),
        "func.func @main(%a: tensor<2xf32>) -> tensor<3xf32> {\n  \
         %0 = stablehlo.add %a, %a : tensor<3xf32>\n  return %0 : tensor<3xf32>\n}\n",
    )
    .unwrap();
    let out = npc(
        &cache,
        &["compile-graphs", "--json", dir.to_str().unwrap()],
        &[],
    );
    assert_eq!(out.status.code(), Some(1));
    let v = json(&out);
    assert_eq!(
        (v["compiled"].as_u64(), v["failed"].as_u64()),
        (Some(1), Some(1)),
        "{v}"
    );
    let bad = v["graphs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["outcome"] == "failed")
        .unwrap();
    assert!(bad["origin"].as_str().unwrap().ends_with("bad.mlir"));
    assert!(!bad["message"].as_str().unwrap().is_empty());
    assert!(last_line(&stderr(&out)).contains("1 graph(s) failed"));
    // Recorded: the next run does not compile it again unless asked to.
    let v2 = json(&npc(
        &cache,
        &["compile-graphs", "--json", dir.to_str().unwrap()],
        &[],
    ));
    let bad2 = v2["graphs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["outcome"] == "failed")
        .unwrap();
    assert!(
        bad2["message"]
            .as_str()
            .unwrap()
            .contains("recorded failure"),
        "{v2}"
    );
    assert_eq!(v2["cached"], 1);
}

/// Keys `compile-graphs --dry-run` computes for `dir` with `NEURON_CC_FLAGS=env_flags`.
fn dry_keys(dir: &Path, env_flags: &str, args: &[&str]) -> Vec<String> {
    let cache = tmp("flags-cache");
    let out = Command::new(bin())
        .args(
            [
                &["compile-graphs", "--dry-run", "--json"][..],
                args,
                &[dir.to_str().unwrap()],
            ]
            .concat(),
        )
        .env("NEURON_COMPILE_CACHE_URL", &cache)
        .env("NEURON_CC_FLAGS", env_flags)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    keys(&json(&out), "would-compile")
}

#[test]
fn command_line_flags_win_over_neuron_cc_flags() {
    let dir = tmp("flags-src");
    std::fs::copy(data().join("mlp.mlir"), dir.join("mlp.mlir")).unwrap();
    let o3 = dry_keys(&dir, "--optlevel 3", &[]);
    let o1 = dry_keys(&dir, "--optlevel 1", &[]);
    assert_ne!(o1, o3, "the opt level is part of the key");
    assert_eq!(dry_keys(&dir, "--optlevel 1", &["--optlevel", "3"]), o3);
    assert_eq!(dry_keys(&dir, "-O3", &["--optlevel", "O1"]), o1);
}

/// `n` distinct small programs in a fresh directory.
fn small_programs(tag: &str, n: usize) -> PathBuf {
    let dir = tmp(tag);
    for i in 1..=n {
        let t = format!("tensor<{i}x3xf32>");
        std::fs::write(
            dir.join(format!("p{i}.mlir")),
            format!(
                "func.func @main(%a: {t}) -> {t} {{\n  \
                 %0 = stablehlo.multiply %a, %a : {t}\n  \
                 %1 = stablehlo.add %0, %a : {t}\n  return %1 : {t}\n}}\n"
            ),
        )
        .unwrap();
    }
    dir
}

#[test]
fn workers_serve_several_graphs_each() {
    let dir = small_programs("reuse-src", 5);
    let cache = tmp("reuse");
    let out = npc(
        &cache,
        &[
            "compile-graphs",
            "--json",
            "--jobs",
            "2",
            dir.to_str().unwrap(),
        ],
        &[],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let v = json(&out);
    assert_eq!(v["compiled"], 5, "{v}");
    // Two processes (one plugin load each) did all five.
    assert_eq!(v["workers_started"], 2, "{v}");
    assert_eq!(entry_keys(&cache), keys(&v, "compiled"));
    // Each executable was stored under its own program's key: run one and check it.
    let x = [1.5f32, -2.0, 0.25];
    let mut npy_bytes = b"\x93NUMPY\x01\x00".to_vec();
    let mut header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 3), }".to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    npy_bytes.extend((header.len() as u16).to_le_bytes());
    npy_bytes.extend(header.as_bytes());
    for v in x {
        npy_bytes.extend(v.to_le_bytes());
    }
    let input = dir.join("x.npy");
    std::fs::write(&input, npy_bytes).unwrap();
    let o = tmp("reuse-out");
    let r = npc(
        &cache,
        &[
            "run-graph",
            dir.join("p1.mlir").to_str().unwrap(),
            "--json",
            "--inputs",
            input.to_str().unwrap(),
            "--output-dir",
            o.to_str().unwrap(),
        ],
        &[],
    );
    assert!(r.status.success(), "{}", stderr(&r));
    assert_eq!(json(&r)["executable"], "cached");
    let (_, shape, got) = npy(&o.join("out0.npy"));
    assert_eq!(shape, "(1, 3");
    let want: Vec<f32> = x.iter().map(|v| v * v + v).collect();
    assert_eq!(f32s(&got), want);
}
