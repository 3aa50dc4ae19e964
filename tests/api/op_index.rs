//! The op index (`src/tensor/op_index.md`, the `tensor` module's documentation) names every
//! public method of `Tensor`: read from the sources (each `pub fn` of an `impl Tensor` block in
//! `src/tensor/`, and each row of the method-generating macros there), so a new op without its
//! line fails here, naming it. Rustdoc (`-D warnings` in `scripts/test`) checks the links.

use std::collections::BTreeSet;
use std::path::Path;

/// Every public method name of `Tensor` defined in `src/tensor/`.
fn tensor_methods(dir: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let (mut in_tensor, mut in_macro) = (false, false);
        for line in text.lines() {
            if line.starts_with("impl") {
                // `impl Tensor {` or `impl<..> Tensor {`, not `impl Trait for Tensor`
                let head = line.trim_end_matches('{').trim();
                in_tensor = head.ends_with(" Tensor") && !head.contains(" for ");
            }
            if line.ends_with("_methods! {") && !line.starts_with("macro_rules!") {
                in_macro = true;
                continue;
            }
            if in_macro && line.starts_with('}') {
                in_macro = false;
            }
            let trimmed = line.trim_start();
            let row = in_macro.then(|| trimmed.split_once(" => ")).flatten();
            let method = in_tensor
                .then(|| trimmed.strip_prefix("pub fn "))
                .flatten()
                .map(|rest| rest.split(['(', '<']).next().unwrap_or(""));
            if let Some(name) = row.map(|(name, _)| name).or(method) {
                if name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                {
                    names.insert(name.to_string());
                }
            }
        }
    }
    names
}

#[test]
fn the_op_index_names_every_public_tensor_method() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let methods = tensor_methods(&root.join("src/tensor"));
    // the reader must have found the ops it is meant to check
    for known in [
        "add", "exp", "erfc", "matmul", "argsort", "topk", "cumsum", "to_host",
    ] {
        assert!(methods.contains(known), "the reader missed Tensor::{known}");
    }
    let index = std::fs::read_to_string(root.join("src/tensor/op_index.md")).unwrap();
    let missing: Vec<&String> = methods
        .iter()
        .filter(|m| !index.contains(&format!("Tensor::{m}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "src/tensor/op_index.md lacks a line for: {}",
        missing
            .iter()
            .map(|m| format!("Tensor::{m}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
