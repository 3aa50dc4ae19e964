//! Checking a plugin library's SHA-256 before it is loaded, without hashing it at every start.
//!
//! Loading a library runs its code, so a corrupted or substituted plugin must be refused before
//! `dlopen`. The expected digest is the one pinned in `compiler/plugins.tsv` for the package the
//! library belongs to (matched by its path inside site-packages), or the one the user gives in
//! `NEURON_PC_PLUGIN_SHA256` for any other library.
//!
//! Hashing a 200-270 MB library costs 0.2-1 s, far more than a process start should. So the
//! first check hashes the whole file and records a marker in the user's cache directory: the
//! file's identity (device, inode, size, modification and status-change times in nanoseconds)
//! and the digest it had. Later checks compare a `stat` with the marker and hash again only when
//! anything differs. Writing to the file or replacing it changes its inode or its status-change
//! time, which unprivileged code cannot set back, so a stale marker can never vouch for changed
//! bytes. (Someone who can write the user's files can also write the marker: this guards against
//! corruption and swapped libraries, not against the user's own account.)

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::pins::{pin_for_library, Pin};
use crate::error::{Error, Result};

/// The SHA-256 a library that neuron-pc has no pin for must have (lowercase hex).
pub const PLUGIN_SHA256_ENV: &str = "NEURON_PC_PLUGIN_SHA256";

/// What the library must hash to, and who said so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Pinned in `compiler/plugins.tsv`.
    Pinned(&'static Pin),
    /// Given by the user in [`PLUGIN_SHA256_ENV`].
    Given(String),
    /// Nothing to check against: a library neuron-pc does not know, with no digest given.
    Unknown,
}

impl Expected {
    /// The expectation for the library at `path` (canonical): the user's digest wins.
    pub fn for_library(path: &Path) -> Expected {
        match std::env::var(PLUGIN_SHA256_ENV) {
            Ok(v) if !v.trim().is_empty() => Expected::Given(v.trim().to_ascii_lowercase()),
            _ => pin_for_library(path).map_or(Expected::Unknown, Expected::Pinned),
        }
    }

    fn digest(&self) -> Option<&str> {
        match self {
            Expected::Pinned(p) => Some(p.sha256),
            Expected::Given(d) => Some(d),
            Expected::Unknown => None,
        }
    }

    fn source(&self) -> String {
        match self {
            Expected::Pinned(p) => format!("pinned for {} {}", p.package, p.version),
            Expected::Given(_) => format!("given in {PLUGIN_SHA256_ENV}"),
            Expected::Unknown => String::new(),
        }
    }
}

/// How a check ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verified {
    /// The file is unchanged since a full hash that matched (the cheap path).
    Marker,
    /// The whole file was hashed now and matched.
    Hashed,
    /// Nothing to check against; the library is loaded unverified.
    Unchecked,
}

/// Refuses the library at `path` unless its SHA-256 is the expected one. `path` is canonical.
pub fn verify(path: &Path, expected: &Expected) -> Result<Verified> {
    verify_with_markers(path, expected, default_marker_dir().as_deref())
}

/// [`verify`] with markers kept in `markers` (none: hash every time).
pub fn verify_with_markers(
    path: &Path,
    expected: &Expected,
    markers: Option<&Path>,
) -> Result<Verified> {
    let Some(want) = expected.digest() else {
        tracing::info!(
            "plugin {} is not pinned and {PLUGIN_SHA256_ENV} is unset: loaded without a \
             digest check",
            path.display()
        );
        return Ok(Verified::Unchecked);
    };
    let refuse = |message: String| Error::PluginLoad {
        path: path.display().to_string(),
        message,
    };
    let io = |e: std::io::Error| refuse(e.to_string());
    let meta = std::fs::metadata(path).map_err(io)?;
    let id = FileId::of(path, &meta);
    if let Expected::Pinned(pin) = expected {
        // A size that differs needs no hashing to be refused.
        if meta.len() != pin.size {
            return Err(refuse(format!(
                "{} bytes, but the library {} is {} bytes: it is corrupted or was replaced; \
                 reinstall it with scripts/setup",
                meta.len(),
                expected.source(),
                pin.size
            )));
        }
    }
    let marker = markers.map(|dir| marker_path(dir, path));
    if let Some(m) = &marker {
        if read_marker(m).is_some_and(|seen| seen.id == id && seen.sha256 == want) {
            return Ok(Verified::Marker);
        }
    }
    let got = sha256_file(path).map_err(io)?;
    if got != want {
        return Err(refuse(format!(
            "SHA-256 {got} differs from the {want} {}: the library is corrupted or was replaced{}",
            expected.source(),
            match expected {
                Expected::Pinned(_) => "; reinstall it with scripts/setup",
                Expected::Given(_) | Expected::Unknown => "",
            }
        )));
    }
    if let Some(m) = &marker {
        let unchanged = std::fs::metadata(path).is_ok_and(|after| FileId::of(path, &after) == id);
        if unchanged && !id.racy() {
            // A marker that cannot be written only costs a full hash next time.
            if let Err(e) = write_marker(m, &Marker { id, sha256: got }) {
                tracing::debug!("cannot record plugin check in {}: {e}", m.display());
            }
        }
    }
    Ok(Verified::Hashed)
}

/// What identifies one version of a file's bytes without reading them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct FileId {
    path: PathBuf,
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

/// A file changed less than this before it was checked gets no marker: file times tick in
/// coarse steps, so a write landing in the same step as the check could leave them unchanged.
const RACY_MARGIN_NS: i128 = 1_000_000_000;

impl FileId {
    /// True when the file changed too recently for its times to tell a later write apart.
    fn racy(&self) -> bool {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        now - self.ctime_ns.max(self.mtime_ns) < RACY_MARGIN_NS
    }

    fn of(path: &Path, m: &std::fs::Metadata) -> FileId {
        let ns = |s: i64, n: i64| s as i128 * 1_000_000_000 + n as i128;
        FileId {
            path: path.to_path_buf(),
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Marker {
    id: FileId,
    sha256: String,
}

/// `$XDG_CACHE_HOME/neuron-pc-plugins` (or `~/.cache/neuron-pc-plugins`).
pub fn default_marker_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("neuron-pc-plugins"))
}

/// One marker per library path: `<dir>/<hash of the path>.json`.
fn marker_path(dir: &Path, library: &Path) -> PathBuf {
    let name = hex::encode(&Sha256::digest(library.as_os_str().as_encoded_bytes())[..16]);
    dir.join(format!("{name}.json"))
}

fn read_marker(path: &Path) -> Option<Marker> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn write_marker(path: &Path, marker: &Marker) -> std::io::Result<()> {
    let dir = path.parent().expect("a marker path has a directory");
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec(marker)?)?;
    std::fs::rename(&tmp, path)
}

/// SHA-256 of the whole file, lowercase hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Scratch(PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("npc-integrity-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    #[test]
    fn the_first_check_hashes_later_ones_use_the_marker_until_the_file_changes() {
        let s = scratch("marker");
        let lib = s.0.join("lib.so");
        let markers = s.0.join("markers");
        let mut bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&lib, &bytes).unwrap();
        let good = Expected::Given(sha256_file(&lib).unwrap());
        let check = || verify_with_markers(&lib, &good, Some(&markers));
        // Just written: too recent for a marker, so every check hashes.
        assert_eq!(check().unwrap(), Verified::Hashed);
        assert_eq!(check().unwrap(), Verified::Hashed);
        std::thread::sleep(std::time::Duration::from_millis(1100));
        assert_eq!(check().unwrap(), Verified::Hashed);
        assert_eq!(check().unwrap(), Verified::Marker);

        // One byte changed in place, same size: the marker no longer vouches for it.
        bytes[1_500_000] ^= 1;
        std::fs::write(&lib, &bytes).unwrap();
        let err = check().unwrap_err().to_string();
        assert!(
            err.contains("differs from") && err.contains(PLUGIN_SHA256_ENV),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
        assert!(check().is_err(), "a refused file must stay refused");

        // Put back: accepted, by hashing (its times changed).
        bytes[1_500_000] ^= 1;
        std::fs::write(&lib, &bytes).unwrap();
        assert_eq!(check().unwrap(), Verified::Hashed);

        // A marker recorded for another digest vouches for nothing.
        let other = Expected::Given("0".repeat(64));
        assert!(verify_with_markers(&lib, &other, Some(&markers)).is_err());
    }

    #[test]
    fn without_markers_every_check_hashes_and_unknown_libraries_are_unchecked() {
        let s = scratch("nomarker");
        let lib = s.0.join("lib.so");
        std::fs::write(&lib, b"not a library").unwrap();
        let good = Expected::Given(sha256_file(&lib).unwrap());
        for _ in 0..2 {
            assert_eq!(
                verify_with_markers(&lib, &good, None).unwrap(),
                Verified::Hashed
            );
        }
        assert_eq!(
            verify_with_markers(&lib, &Expected::Unknown, None).unwrap(),
            Verified::Unchecked
        );
    }

    #[test]
    fn a_file_of_another_size_than_the_pin_is_refused_without_hashing() {
        let s = scratch("size");
        let pin = &crate::pjrt::pins::pins()[0];
        let lib = s.0.join("lib.so");
        std::fs::write(&lib, b"short").unwrap();
        let err = verify_with_markers(&lib, &Expected::Pinned(pin), None)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("5 bytes") && err.contains(pin.package) && err.contains("scripts/setup"),
            "{err}"
        );
    }

    #[test]
    fn sha256_of_a_file_is_the_digest_of_its_bytes() {
        let s = scratch("digest");
        let f = s.0.join("abc");
        std::fs::write(&f, b"abc").unwrap();
        assert_eq!(
            sha256_file(&f).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
