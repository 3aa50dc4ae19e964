//! No crate of the workspace (the root crate, `compiler/`, `cache/`, `derive/`,
//! `test-support/`) has cycles between sibling modules: for every module, the "uses" relation
//! among its children (the files of a directory) is acyclic (a child may use its parent, as
//! `super::lock` does, but two siblings never use each other, directly or around a loop). A
//! child that reaches a sibling's item through its parent's re-export (`super::Target` for
//! `pub use target::Target` in `mod.rs`) uses that sibling. Read from the sources, so a new
//! cycle fails here, naming the modules.

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

/// Items a module re-exports from its children (`pub use child::Item;`,
/// `pub(crate) use self::child::{A, B};`, over as many lines as rustfmt gives it): `(item, child)`.
fn reexports(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for statement in text.split(';') {
        // one line per statement, whatever rustfmt wrapped
        let line = statement.split_whitespace().collect::<Vec<_>>().join(" ");
        let Some(rest) = ["pub use ", "pub(crate) use ", "pub(super) use "]
            .iter()
            .find_map(|p| {
                let at = line.rfind(p)?;
                let starts = at == 0 || line[..at].ends_with([' ', ']']);
                starts.then(|| &line[at + p.len()..])
            })
        else {
            continue;
        };
        let rest = rest.strip_prefix("self::").unwrap_or(rest);
        if rest.starts_with("crate::") || rest.starts_with("super::") {
            continue;
        }
        let Some((child, items)) = rest.split_once("::") else {
            continue;
        };
        let items = items
            .strip_prefix('{')
            .map_or(items, |i| i.trim_end_matches('}'));
        for item in items.split(',') {
            // `a::B` re-exports `B`; `B as C` re-exports `C`; `self` re-exports the child.
            let last = item.trim().rsplit("::").next().unwrap_or("");
            let name = last.rsplit(" as ").next().unwrap_or("").trim();
            if !name.is_empty() && name != "self" && name != "*" {
                out.push((name.to_string(), child.to_string()));
            }
        }
    }
    out
}

/// Cycles among siblings, as "a -> b -> a" strings.
fn sibling_cycles(src: &Path, top: &Path) -> Vec<String> {
    let files = modules(src, top);
    let known: BTreeSet<ModPath> = files.iter().map(|(m, _)| m.clone()).collect();
    // (module, item) -> the child of `module` the item comes from.
    let mut reexported: BTreeMap<(ModPath, String), ModPath> = BTreeMap::new();
    for (me, file) in &files {
        for (item, child) in reexports(&std::fs::read_to_string(file).unwrap()) {
            let mut c = me.clone();
            c.push(child);
            if known.contains(&c) {
                reexported.insert((me.clone(), item), c);
            }
        }
    }
    // The longest known module that prefixes a referenced path, followed through re-exports.
    let module_of = |p: &ModPath| -> Option<ModPath> {
        let mut m = (0..=p.len())
            .rev()
            .map(|n| p[..n].to_vec())
            .find(|m| known.contains(m))?;
        while let Some(c) = p
            .get(m.len())
            .and_then(|item| reexported.get(&(m.clone(), item.clone())))
        {
            m = c.clone();
        }
        Some(m)
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

/// Cycles known and accepted for now, by crate: `(crate directory, cycle)`. None: a new cycle
/// is a failure, and so is listing one here again without a reason.
const KNOWN_CYCLES: &[(&str, &str)] = &[];

fn cycles_in(krate: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(krate)
        .join("src");
    sibling_cycles(&src, Path::new(""))
        .into_iter()
        .filter(|c| !KNOWN_CYCLES.contains(&(krate, c.as_str())))
        .collect()
}

#[test]
fn no_import_cycles_between_sibling_modules() {
    for krate in ["", "compiler", "cache", "derive", "test-support"] {
        let cycles = cycles_in(krate);
        assert!(
            cycles.is_empty(),
            "import cycles in {}/src:\n{}",
            if krate.is_empty() { "." } else { krate },
            cycles.join("\n")
        );
    }
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

    // A loop through the parent's re-export: `c` reaches `d`'s item as `super::D`.
    std::fs::write(dir.join("m/a.rs"), "").unwrap();
    std::fs::write(
        dir.join("m/mod.rs"),
        "mod a; mod b; mod c; mod d;\npub use d::{D, E as F};\npub fn f() {}\n",
    )
    .unwrap();
    std::fs::write(dir.join("m/c.rs"), "use super::{f, F};\npub struct C;\n").unwrap();
    std::fs::write(dir.join("m/d.rs"), "pub struct D(super::c::C);\n").unwrap();
    let cycles = sibling_cycles(&dir, Path::new(""));
    assert_eq!(cycles, vec!["m: c -> d -> c", "m: d -> c -> d"]);

    // The same re-export as rustfmt wraps a long one, behind an attribute.
    std::fs::write(
        dir.join("m/mod.rs"),
        "mod a; mod b; mod c; mod d;\n#[cfg(unix)]\npub use d::{\n    D,\n    E as F,\n};\n\
         pub fn f() {}\n",
    )
    .unwrap();
    let cycles = sibling_cycles(&dir, Path::new(""));
    assert_eq!(cycles, vec!["m: c -> d -> c", "m: d -> c -> d"]);
    let _ = std::fs::remove_dir_all(&dir);
}
