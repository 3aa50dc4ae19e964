//! The plugin packages neuron-pc knows, pinned to a version and to their library's SHA-256.
//!
//! The table is `compiler/plugins.tsv`, shared with `scripts/setup`: setup installs the pinned
//! versions and checks the installed library against the table; the library checks it again
//! (cheaply, see [`super::integrity`]) before loading the library.

use std::path::Path;
use std::sync::OnceLock;

use super::target::Target;

const TABLE: &str = include_str!("../../plugins.tsv");

/// One pinned plugin package.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pin {
    /// The target whose plugin the package provides.
    pub target: Target,
    /// The PyPI package name.
    pub package: &'static str,
    /// The exact version setup installs.
    pub version: &'static str,
    /// Where the library sits inside site-packages.
    pub library: &'static str,
    /// The library's size in bytes.
    pub size: u64,
    /// The library's SHA-256, lowercase hex.
    pub sha256: &'static str,
    /// Where the package's `pjrt_c_api.h` sits inside site-packages, if it ships one.
    pub header: Option<&'static str>,
}

impl Pin {
    /// "package==version".
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

/// Every pinned package, in the table's order (a target's default first).
pub fn pins() -> &'static [Pin] {
    static PINS: OnceLock<Vec<Pin>> = OnceLock::new();
    PINS.get_or_init(|| parse(TABLE).unwrap_or_else(|e| panic!("compiler/plugins.tsv: {e}")))
}

/// The pinned packages of `target`, its default first.
pub fn pins_for(target: Target) -> impl Iterator<Item = &'static Pin> {
    pins().iter().filter(move |p| p.target == target)
}

/// The pin whose library path inside site-packages is a suffix of `path`. Versions of one
/// package share a path (`jax_plugins/xla_cuda13/...` for 0.11.2 and 0.12.0.1): the file's size
/// picks among them, else the first is taken (and its digest check then refuses the file).
pub fn pin_for_library(path: &Path) -> Option<&'static Pin> {
    let size = std::fs::metadata(path).ok().map(|m| m.len());
    let mut same_path = pins().iter().filter(|p| path.ends_with(p.library));
    let first = same_path.clone().next();
    same_path.find(|p| Some(p.size) == size).or(first)
}

fn parse(table: &'static str) -> Result<Vec<Pin>, String> {
    let mut pins = Vec::new();
    for (n, line) in table.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |what: &str| format!("line {}: {what}: {line:?}", n + 1);
        let f: Vec<&'static str> = line.split('\t').collect();
        let [target, package, version, library, size, sha256, header] = f[..] else {
            return Err(bad("expected 7 tab-separated columns"));
        };
        let pin = Pin {
            target: Target::from_name(target).ok_or_else(|| bad("unknown target"))?,
            package,
            version,
            library,
            size: size.parse().map_err(|_| bad("size is not a number"))?,
            sha256,
            header: (header != "-").then_some(header),
        };
        if sha256.len() != 64
            || !sha256
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(bad("sha256 is not 64 lowercase hex digits"));
        }
        pins.push(pin);
    }
    Ok(pins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_table_parses_and_every_target_row_is_unique() {
        let all = pins();
        assert!(pins_for(Target::Cpu).count() >= 2);
        assert!(pins_for(Target::Cuda).count() >= 2);
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!((a.package, a.version), (b.package, b.version));
                assert_ne!(a.sha256, b.sha256);
                // one path, several builds: only versions of one package, told apart by size
                if a.library == b.library {
                    assert_eq!(a.package, b.package);
                    assert_ne!(a.size, b.size);
                }
            }
        }
        // The bindings are generated from a pinned package's header.
        assert!(all.iter().any(|p| p.header.is_some()));
    }

    #[test]
    fn a_library_is_matched_by_its_path_inside_site_packages() {
        let first = &pins()[0];
        let path = Path::new("/any/venv/lib/python3.11/site-packages").join(first.library);
        assert_eq!(pin_for_library(&path), Some(first));
        assert_eq!(pin_for_library(Path::new("/tmp/libpjrt_other.so")), None);
    }

    #[test]
    fn versions_sharing_a_library_path_are_told_apart_by_the_file_size() {
        let cuda13: Vec<&Pin> = pins_for(Target::Cuda)
            .filter(|p| p.package == "jax-cuda13-pjrt")
            .collect();
        assert!(cuda13.len() >= 2);
        let dir = std::env::temp_dir().join(format!("npc-pins-{}", std::process::id()));
        let lib = dir.join("site-packages").join(cuda13[0].library);
        std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
        for pin in &cuda13 {
            // a sparse file of the pinned size: no bytes written
            let f = std::fs::File::create(&lib).unwrap();
            f.set_len(pin.size).unwrap();
            assert_eq!(pin_for_library(&lib), Some(*pin));
        }
        std::fs::write(&lib, b"other size").unwrap();
        assert_eq!(pin_for_library(&lib), Some(cuda13[0]));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn malformed_rows_are_refused_with_the_line() {
        for (row, what) in [
            ("cpu\tp\t1\ta.so\t10\tab\t-", "sha256"),
            ("gpu\tp\t1\ta.so\t10\t{}\t-", "unknown target"),
            ("cpu\tp\t1\ta.so\tten\t{}\t-", "size"),
            ("cpu\tp\t1", "7 tab-separated"),
        ] {
            let row: &'static str = Box::leak(row.replace("{}", &"a".repeat(64)).into_boxed_str());
            let err = parse(row).unwrap_err();
            assert!(err.contains(what) && err.contains("line 1"), "{err}");
        }
    }
}
