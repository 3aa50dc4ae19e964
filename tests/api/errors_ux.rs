//! Error messages as a new user meets them: one clear line for a cache URL that is a file, no
//! message repeated under `Caused by`, dtype mismatches naming both dtypes, `matmul` named as
//! the user called it, and wrong-rank inputs to layers returning shape errors, not panics.

use std::process::Command;

use neuron_pc::nn::{cross_entropy, one_hot, HostRng, MultiHeadAttention};
use neuron_pc::{DType, LazyDevice, Tensor};

use crate::common::device;

fn zeros(dev: &LazyDevice, dims: &[usize], dtype: DType) -> Tensor {
    dev.tensor(&neuron_pc::HostTensor::zeros(dtype, dims))
        .unwrap()
}

#[test]
fn a_cache_url_that_is_a_file_gives_one_clear_line() {
    let dir = std::env::temp_dir().join(format!("npc-err-file-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .args(["cache", "ls", "--cache", file.to_str().unwrap()])
        .env_remove("NEURON_COMPILE_CACHE_URL")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].starts_with("error: "), "{err}");
    assert!(lines[0].contains(file.to_str().unwrap()), "{err}");
    assert!(lines[0].contains("is a file, not a directory"), "{err}");
    assert!(!lines[0].contains("os error"), "{err}");
    assert_eq!(
        std::fs::read(&file).unwrap(),
        b"x",
        "the file is left alone"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn error_chains_do_not_repeat_a_message() {
    let dev = device();
    let a = zeros(&dev, &[2, 3], DType::F32);
    let b = zeros(&dev, &[4, 5], DType::F32);
    let e = anyhow::Error::from(a.matmul(&b).unwrap_err());
    let debug = format!("{e:?}");
    assert!(!debug.contains("Caused by"), "{debug}");
    let alternate = format!("{e:#}");
    assert_eq!(alternate, e.to_string(), "the chain is the message alone");
}

#[test]
fn a_dtype_mismatch_names_both_dtypes() {
    let dev = device();
    let a = zeros(&dev, &[2, 3], DType::F32);
    let b = zeros(&dev, &[2, 3], DType::I32);
    // Arithmetic promotes as PyTorch does (f32 + i32 is f32) ...
    assert_eq!(a.add(&b).unwrap().dtype(), DType::F32);
    // ... and where dtypes must match, the error names both and suggests no broadcast.
    let line = line!() + 1;
    let msg = a.assign(&b).unwrap_err().to_string();
    assert!(msg.contains("f32") && msg.contains("i32"), "{msg}");
    assert!(msg.contains("dtype"), "{msg}");
    assert!(!msg.contains("broadcast"), "{msg}");
    assert!(msg.contains(&format!("errors_ux.rs:{line}:")), "{msg}");
    // The IR primitive itself (no promotion): both dtypes, no broadcast hint.
    let m = zeros(&dev, &[3, 4], DType::BF16);
    let msg = a
        .dot_general(&m, &[], &[], &[1], &[0])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("f32") && msg.contains("bf16"), "{msg}");
    assert!(!msg.contains("broadcast"), "{msg}");
}

#[test]
fn matmul_errors_say_matmul() {
    let dev = device();
    let a = zeros(&dev, &[2, 3], DType::F32);
    for rhs in [&[4usize, 5][..], &[2, 4, 5]] {
        let b = zeros(&dev, rhs, DType::F32);
        let msg = a.matmul(&b).unwrap_err().to_string();
        assert!(msg.contains("matmul"), "{msg}");
        assert!(!msg.contains("dot_general"), "{msg}");
    }
    let w = zeros(&dev, &[4, 5], DType::F32);
    let msg = a.linear(&w, None).unwrap_err().to_string();
    assert!(
        msg.contains("linear") && !msg.contains("dot_general"),
        "{msg}"
    );
}

#[test]
fn wrong_rank_inputs_to_layers_are_shape_errors() {
    let dev = device();
    let labels_2d = zeros(&dev, &[4, 2], DType::I32);
    let scalar = zeros(&dev, &[], DType::I32);
    let logits_1d = zeros(&dev, &[8], DType::F32);
    let logits = zeros(&dev, &[4, 8], DType::F32);
    let labels = zeros(&dev, &[4], DType::I32);
    let cases: Vec<(&str, neuron_pc::Result<Tensor>, &str)> = vec![
        (
            "one_hot scalar",
            one_hot(&scalar, 8, DType::F32),
            "labels must have rank 1",
        ),
        (
            "one_hot 2-d",
            one_hot(&labels_2d, 8, DType::F32),
            "labels must have rank 1",
        ),
        (
            "cross_entropy 1-d logits",
            cross_entropy(&logits_1d, &labels),
            "labels must have the logits' leading dimensions []",
        ),
        (
            "cross_entropy 2-d labels",
            cross_entropy(&logits, &labels_2d),
            "labels must have the logits' leading dimensions [4]",
        ),
    ];
    for (what, result, needle) in cases {
        let msg = result
            .err()
            .unwrap_or_else(|| panic!("{what}: accepted"))
            .to_string();
        assert!(msg.contains(needle), "{what}: {msg}");
        assert!(
            msg.contains("errors_ux.rs:"),
            "{what}: names the caller: {msg}"
        );
    }
    // As PyTorch raises at construction, not at the first forward's reshape.
    for heads in [0, 3] {
        let msg = MultiHeadAttention::new(&dev, &mut HostRng::new(1), 8, heads)
            .err()
            .unwrap()
            .to_string();
        assert!(
            msg.contains(&format!(
                "embed_dim 8 must be divisible by num_heads {heads}"
            )),
            "{msg}"
        );
    }
    let mha = MultiHeadAttention::new(&dev, &mut HostRng::new(1), 8, 2).unwrap();
    let x2 = zeros(&dev, &[4, 8], DType::F32);
    let msg = mha.forward(&x2, None).unwrap_err().to_string();
    assert!(msg.contains("MultiHeadAttention::forward"), "{msg}");
    assert!(
        msg.contains("x must have rank 3") && msg.contains("f32[4,8]"),
        "{msg}"
    );
    let x3 = zeros(&dev, &[2, 4, 8], DType::F32);
    let mask_3d = zeros(&dev, &[2, 4, 1], DType::F32);
    let msg = mha.forward(&x3, Some(&mask_3d)).unwrap_err().to_string();
    assert!(msg.contains("mask must have rank 2"), "{msg}");
    // Right ranks still work.
    let mask = zeros(&dev, &[2, 4], DType::F32);
    assert_eq!(mha.forward(&x3, Some(&mask)).unwrap().dims(), &[2, 4, 8]);
    assert_eq!(
        cross_entropy(&logits, &labels).unwrap().dims(),
        &[] as &[usize]
    );
}

#[test]
fn compile_with_a_cache_path_that_is_a_file_stops_before_the_job() {
    let dir = std::env::temp_dir().join(format!("npc-err-compile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("cache-file");
    std::fs::write(&file, b"x").unwrap();
    let probe = std::path::Path::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .parent()
        .unwrap()
        .join("examples")
        .join("aot_probe");
    let out = Command::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .args(["compile", "--cache", file.to_str().unwrap(), "--"])
        .arg(&probe)
        .args(["--steps", "1"])
        .env_remove("NEURON_CC_FLAGS")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("is a file, not a directory"), "{err}");
    assert!(out.stdout.is_empty(), "the job did not run");
    let _ = std::fs::remove_dir_all(&dir);
}
