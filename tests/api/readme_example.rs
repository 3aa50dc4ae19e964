//! The README and the user guide (`docs/guide/`) stay true to the code: the "Use it in your
//! own crate" program is `examples/own_crate.rs` verbatim and trains; every other Rust block is
//! an excerpt of code CI compiles; the environment-variable table lists exactly the variables
//! the code reads; every link stays inside the repository and resolves.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and the guide's chapters, with their text.
fn user_docs() -> Vec<(PathBuf, String)> {
    let mut paths = vec![root().join("README.md")];
    let guide = root().join("docs/guide");
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(&guide)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    chapters.retain(|p| p.extension().is_some_and(|e| e == "md"));
    chapters.sort();
    paths.extend(chapters);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// The ```rust blocks of a Markdown text, each as its lines.
fn rust_blocks(text: &str) -> Vec<Vec<&str>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines() {
        let fence = line.trim_start();
        match &mut current {
            None if fence.starts_with("```rust") => current = Some(Vec::new()),
            Some(block) if fence.starts_with("```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => block.push(line),
            None => {}
        }
    }
    blocks
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn readme_quotes_the_example_verbatim() {
    let readme: String = user_docs().into_iter().map(|(_, text)| text).collect();
    let example = std::fs::read_to_string(root().join("examples/own_crate.rs")).unwrap();
    let block = format!("```rust\n{example}```\n");
    assert!(
        readme.contains(&block),
        "the README or the guide must quote examples/own_crate.rs verbatim in a rust block"
    );
    let toml = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    // the profile the README tells users to copy is the one this repository uses
    for line in [
        "[profile.dev.package.tikv-jemalloc-sys]\nopt-level = 2",
        "[profile.dev.package.sha2]\nopt-level = 2",
        "[profile.release]\ndebug = \"line-tables-only\"",
    ] {
        assert!(toml.contains(line) && readme.contains(line), "{line}");
    }
}

#[test]
fn readme_links_stay_inside_the_repository() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    for bad in ["](http", "../shared/", "DESIGN.md"] {
        assert!(
            !readme.contains(bad),
            "README.md refers outside the repository: {bad}"
        );
    }
    assert!(readme.contains("`docs/design.md`"));
    assert!(root().join("docs/design.md").is_file());
}

#[test]
fn the_example_trains() {
    let job = Path::new(env!("CARGO_BIN_EXE_neuron-pc"))
        .parent()
        .unwrap()
        .join("examples")
        .join("own_crate");
    assert!(
        job.exists(),
        "{} is missing: run `cargo build --example own_crate` (scripts/test builds it)",
        job.display()
    );
    let out = Command::new(&job)
        .current_dir(root())
        .env("NEURON_PC_CACHE", "0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let losses: Vec<f64> = stdout
        .lines()
        .filter_map(|l| l.split("loss ").nth(1))
        .map(|v| v.trim().parse().unwrap())
        .collect();
    assert_eq!(losses.len(), 4, "{stdout}");
    assert!(losses[3] < 0.5 * losses[0], "{losses:?}");
    assert!(stdout.contains("graphs seen                1"), "{stdout}");
}

/// Each Rust block of the README and the guide is a run of lines (indentation aside) of a file
/// CI compiles: an example, a test or the library, not code that only lives in the docs.
#[test]
fn every_rust_block_is_an_excerpt_of_compiled_code() {
    let mut files = Vec::new();
    for dir in ["src", "examples", "tests", "compiler/src", "cache/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    let sources: Vec<Vec<String>> = files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines().map(|l| l.trim().to_string()).collect()
        })
        .collect();
    let mut blocks = 0;
    let mut stale = Vec::new();
    for (doc, text) in user_docs() {
        for block in rust_blocks(&text) {
            blocks += 1;
            let lines: Vec<&str> = block.iter().map(|l| l.trim()).collect();
            let found = sources
                .iter()
                .any(|src| src.windows(lines.len()).any(|w| w.iter().eq(lines.iter())));
            if !found {
                let first = lines.iter().find(|l| !l.is_empty()).unwrap_or(&"");
                stale.push(format!("{}: the block starting `{first}`", doc.display()));
            }
        }
    }
    assert!(blocks >= 5, "{blocks} Rust blocks found");
    assert!(
        stale.is_empty(),
        "Rust blocks that no compiled file contains (quote the example or test they come \
         from, or add them to one):\n{}",
        stale.join("\n")
    );
}

/// Variables neuron-pc sets (for the Neuron runtime) rather than reads, and test hooks.
const NOT_USER_FACING: [&str; 7] = [
    "NEURON_PJRT_PROCESSES_NUM_DEVICES",
    "NEURON_PJRT_PROCESS_INDEX",
    "NEURON_RT_VISIBLE_CORES",
    "NEURON_PC_TEST_WORKER_CRASH",
    "NEURON_PC_TEST_WORKER_HANG",
    "NEURON_PC_TEST_CKPT_DELAY_MS",
    "NEURON_PC_TEST_SKIP_PROCESS_COLLECTIVES",
];

/// The `NEURON_*` names in `text`.
fn env_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("NEURON_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].trim_end_matches('_');
        if name.len() > "NEURON_".len() {
            names.insert(name.to_string());
        }
        rest = &tail[end.max(1)..];
    }
    names
}

/// The table in `docs/guide/environment.md` names every variable the library, its tools and
/// `scripts/setup` read (string literals in their code), and nothing else.
#[test]
fn the_environment_table_lists_the_variables_the_code_reads() {
    let mut files = Vec::new();
    for dir in ["src", "examples", "compiler/src", "cache/src", "derive/src"] {
        rust_files(&root().join(dir), &mut files);
    }
    files.push(root().join("compiler/build.rs"));
    let mut code = std::collections::BTreeSet::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        // only quoted names: a name in a comment or message is not a variable read
        for piece in text.split('"').skip(1).step_by(2) {
            if piece.starts_with("NEURON_") {
                code.extend(env_names(piece));
            }
        }
    }
    for script in ["scripts/setup", "scripts/test"] {
        let text = std::fs::read_to_string(root().join(script)).unwrap();
        code.extend(
            env_names(&text)
                .into_iter()
                .filter(|n| n.starts_with("NEURON_PC_")),
        );
    }
    for name in NOT_USER_FACING {
        code.remove(name);
    }
    let table = std::fs::read_to_string(root().join("docs/guide/environment.md")).unwrap();
    let documented: std::collections::BTreeSet<String> = table
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| env_names(l.split(" | ").next().unwrap_or("")))
        .collect();
    let missing: Vec<_> = code.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&code).collect();
    assert!(
        missing.is_empty(),
        "read by the code, not in docs/guide/environment.md's table: {missing:?}"
    );
    assert!(
        extra.is_empty(),
        "in docs/guide/environment.md's table, read nowhere: {extra:?}"
    );
    assert!(code.len() > 30, "{code:?}");
}

/// A heading's anchor as GitHub makes it: lower case, spaces to hyphens, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every relative link of the README, the guide and `docs/*.md` names a file that exists (and a
/// heading of it, for `#anchor` links).
#[test]
fn every_link_in_the_docs_resolves() {
    let mut docs = user_docs();
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "md") {
            let text = std::fs::read_to_string(&p).unwrap();
            docs.push((p, text));
        }
    }
    let anchors_of = |path: &Path| -> Vec<String> {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with('#'))
            .map(|l| anchor(l.trim_start_matches('#')))
            .collect()
    };
    let mut broken = Vec::new();
    let mut links = 0;
    for (doc, text) in &docs {
        let mut rest = text.as_str();
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let Some(end) = rest.find(')') else { break };
            let target = &rest[..end];
            if target.starts_with("http") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            links += 1;
            let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() {
                doc.clone()
            } else {
                doc.parent().unwrap().join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: {target} (no such file)", doc.display()));
            } else if !fragment.is_empty()
                && path.extension().is_some_and(|e| e == "md")
                && !anchors_of(&path).iter().any(|a| a == fragment)
            {
                broken.push(format!("{}: {target} (no such heading)", doc.display()));
            }
        }
    }
    assert!(links > 10, "{links} links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
