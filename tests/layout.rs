//! The root crate's module graph has no cycles between sibling modules: for every module, the
//! "uses" relation among its children is acyclic (a child may use its parent, as `super::lock`
//! does, but two siblings never use each other, directly or around a loop). Read from the
//! sources, so a new cycle fails here, naming the modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type ModPath = Vec<String>;

/// Every `.rs` file under `src/rel` with its module path (`lib.rs`, `main.rs` and `mod.rs` are
/// their directory's module).
fn modules(src: &Path, rel: &Path) -> Vec<(ModPath, PathBuf)> {
    let mut out = Vec::new();
    let dir = src.join(rel);
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if p.is_dir() {
            out.extend(modules(src, &rel.join(&name)));
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let mut path: ModPath = rel
                .components()
                .map(|c| c.as_os_str().to_str().unwrap().to_string())
                .collect();
            if stem != "mod" && stem != "lib" && stem != "main" {
                path.push(stem.to_string());
            }
            out.push((path, p));
        }
    }
    out
}

/// Paths named after `crate::` or `super::` in `text`, resolved against the module `me`.
fn references(text: &str, me: &ModPath) -> Vec<ModPath> {
    // `super` is the parent module, whether the module is a plain file or a `mod.rs`.
    let parent: ModPath = me[..me.len().saturating_sub(1)].to_vec();
    let mut out = Vec::new();
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    for start in ["crate::", "super::"] {
        let mut rest = code.as_str();
        while let Some(i) = rest.find(start) {
            let before = rest[..i].chars().last();
            rest = &rest[i..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                rest = &rest[start.len()..];
                continue;
            }
            // Resolve leading `super::super::...` and `crate::`.
            let mut path: ModPath = if start == "crate::" {
                Vec::new()
            } else {
                parent.clone()
            };
            rest = &rest[start.len()..];
            while let Some(r) = rest.strip_prefix("super::") {
                path.pop();
                rest = r;
            }
            // Either a braced group or a path of identifiers.
            if let Some(r) = rest.strip_prefix('{') {
                let end = r.find('}').unwrap_or(r.len());
                for item in r[..end].split(',') {
                    let first = item.trim().split("::").next().unwrap_or("").trim();
                    if !first.is_empty() {
                        let mut p = path.clone();
                        p.push(first.to_string());
                        out.push(p);
                    }
                }
                continue;
            }
            let mut p = path.clone();
            for seg in rest.split("::") {
                let ident: String = seg
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if ident.is_empty() {
                    break;
                }
                p.push(ident.clone());
                if ident.len() != seg.len() {
                    break;
                }
            }
            out.push(p);
        }
    }
    out
}

/// Cycles among siblings, as "a -> b -> a" strings.
fn sibling_cycles(src: &Path, top: &Path) -> Vec<String> {
    let files = modules(src, top);
    let known: BTreeSet<ModPath> = files.iter().map(|(m, _)| m.clone()).collect();
    // The longest known module that prefixes a referenced path.
    let module_of = |p: &ModPath| -> Option<ModPath> {
        (0..=p.len())
            .rev()
            .map(|n| p[..n].to_vec())
            .find(|m| known.contains(m))
    };
    let mut edges: BTreeMap<ModPath, BTreeSet<(String, String)>> = BTreeMap::new();
    for (me, file) in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for r in references(&text, me) {
            let Some(target) = module_of(&r) else {
                continue;
            };
            let common = me.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == me.len() || common == target.len() {
                continue; // a use of an ancestor or a descendant
            }
            edges
                .entry(me[..common].to_vec())
                .or_default()
                .insert((me[common].clone(), target[common].clone()));
        }
    }
    let mut cycles = Vec::new();
    for (parent, es) in &edges {
        let nodes: BTreeSet<&String> = es.iter().flat_map(|(a, b)| [a, b]).collect();
        for start in &nodes {
            // Depth-first search for a path back to `start`.
            let mut stack = vec![(vec![(*start).clone()], (*start).clone())];
            while let Some((path, at)) = stack.pop() {
                for (a, b) in es {
                    if a != &at {
                        continue;
                    }
                    if b == *start {
                        let mut p = path.clone();
                        p.push(b.clone());
                        cycles.push(format!("{}: {}", parent.join("::"), p.join(" -> ")));
                    } else if !path.contains(b) {
                        let mut p = path.clone();
                        p.push(b.clone());
                        stack.push((p, b.clone()));
                    }
                }
            }
        }
    }
    cycles.sort();
    cycles.dedup();
    cycles
}

#[test]
fn no_import_cycles_between_sibling_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let cycles = sibling_cycles(&src, Path::new(""));
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn the_checker_finds_a_cycle_it_is_shown() {
    // Two sibling files that use each other, and a third that only uses its parent.
    let dir = std::env::temp_dir().join(format!("npc-layout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("m")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod m;\n").unwrap();
    std::fs::write(
        dir.join("m/mod.rs"),
        "mod a; mod b; mod c;\npub fn f() {}\n",
    )
    .unwrap();
    std::fs::write(dir.join("m/a.rs"), "use super::b::g;\n").unwrap();
    std::fs::write(dir.join("m/b.rs"), "use crate::m::a;\npub fn g() {}\n").unwrap();
    std::fs::write(dir.join("m/c.rs"), "use super::f;\n").unwrap();
    let cycles = sibling_cycles(&dir, Path::new(""));
    assert_eq!(cycles, vec!["m: a -> b -> a", "m: b -> a -> b"]);
    let _ = std::fs::remove_dir_all(&dir);
}
