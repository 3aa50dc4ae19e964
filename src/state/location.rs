//! Where checkpoints live: a local directory, or an S3 prefix (`s3://bucket/prefix`) through
//! the compile cache's S3 client, so credentials, region, `AWS_ENDPOINT_URL` and its rules are
//! the cache's. Objects are named by paths relative to the root (`step-00000100/manifest.json`).
//!
//! A write is whole or absent: locally a temporary file, fsynced and renamed (then the
//! directory fsynced); on S3 one PUT, or a multipart upload that shows only when completed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use neuron_pc_cache::{PartOptions, S3Options};
#[cfg(feature = "s3")]
use neuron_pc_cache::{S3Store, Store};

use crate::state_dict::{write_atomic, CheckpointError, Result};

/// Seconds (fractions allowed) bounding one S3 request of a checkpoint (a part of a large file,
/// a small file, a listing); default 120. A request that takes longer is retried.
pub const CKPT_S3_TIMEOUT_ENV: &str = "NEURON_PC_CKPT_S3_TIMEOUT";

/// How long a checkpoint's S3 request waits for the server's answer beyond the time its bytes
/// take at 1 MiB/s ([`S3Options::answer_timeout`]): a server that accepts requests and never
/// answers fails a small request in these seconds, not in [`CKPT_S3_TIMEOUT_ENV`]'s 120.
pub const CKPT_S3_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The storage of one checkpoint directory.
pub(crate) enum Location {
    /// A local (or mounted: FSx, EFS) directory.
    Local(PathBuf),
    /// An S3 prefix.
    #[cfg(feature = "s3")]
    S3 {
        /// The client, opened without retries of its own: [`PartOptions::attempts`] retries
        /// each request, with a warning each.
        store: Box<S3Store>,
        /// Part size, concurrency and retries.
        parts: PartOptions,
    },
}

impl Location {
    /// `s3://bucket/prefix` or a local directory (created at the first save). An S3 location
    /// is probed once: a missing bucket or refused credentials are an error here, before
    /// training starts.
    pub(crate) fn open(
        spec: &str,
        parts: &PartOptions,
        s3: Option<&S3Options>,
    ) -> Result<Location> {
        if !spec.starts_with("s3://") {
            let path = PathBuf::from(spec);
            if path.is_file() {
                return Err(storage(
                    spec,
                    "it is a file; name a directory for checkpoints",
                ));
            }
            return Ok(Location::Local(path));
        }
        Location::open_s3(spec, parts, s3)
    }

    /// [`Location::open`] of an `s3://` URL.
    #[cfg(feature = "s3")]
    fn open_s3(spec: &str, parts: &PartOptions, s3: Option<&S3Options>) -> Result<Location> {
        let timeout = match std::env::var(CKPT_S3_TIMEOUT_ENV) {
            Err(_) => Duration::from_secs(120),
            Ok(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s > 0.0 && *s < 86_400.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    storage(
                        spec,
                        &format!("{CKPT_S3_TIMEOUT_ENV}={v:?} is not a number of seconds"),
                    )
                })?,
        };
        let options = match s3 {
            Some(given) => S3Options {
                max_retries: 0,
                ..given.clone()
            },
            None => S3Options {
                timeout,
                connect_timeout: Duration::from_secs(5).min(timeout),
                max_retries: 0,
                retry_timeout: Duration::ZERO,
                answer_timeout: Some(CKPT_S3_ANSWER_TIMEOUT.min(timeout)),
                ..S3Options::default()
            },
        };
        let store = S3Store::open(spec, &options)
            .map_err(|e| s3_error(spec, e))?
            .bounds_from(match options.answer_timeout {
                Some(a) => format!(
                    "{CKPT_S3_TIMEOUT_ENV}, with {:.1} s for an answer",
                    a.as_secs_f64()
                ),
                None => CKPT_S3_TIMEOUT_ENV.to_string(),
            });
        store.probe().map_err(|e| s3_error(spec, e))?;
        Ok(Location::S3 {
            store: Box::new(store),
            parts: parts.clone(),
        })
    }

    /// Built without the `s3` feature: an `s3://` location is one error naming it.
    #[cfg(not(feature = "s3"))]
    fn open_s3(spec: &str, _parts: &PartOptions, _s3: Option<&S3Options>) -> Result<Location> {
        Err(storage(
            spec,
            "this build has no S3 support: build neuron-pc with its `s3` feature (the \
             neuron-pc binary has it)",
        ))
    }

    /// Whether it is a remote store (S3), whose requests can hang on the network.
    pub(crate) fn is_remote(&self) -> bool {
        !matches!(self, Location::Local(_))
    }

    /// The directory or URL, for messages.
    pub(crate) fn describe(&self) -> String {
        match self {
            Location::Local(p) => p.display().to_string(),
            #[cfg(feature = "s3")]
            Location::S3 { store, .. } => store.describe(),
        }
    }

    /// The local path of `name`, for messages and the trial-run check.
    pub(crate) fn display_path(&self, name: &str) -> PathBuf {
        match (self, name) {
            (Location::Local(p), "") => p.clone(),
            (Location::Local(p), _) => p.join(name),
            #[cfg(feature = "s3")]
            (Location::S3 { store, .. }, "") => PathBuf::from(store.describe()),
            #[cfg(feature = "s3")]
            (Location::S3 { store, .. }, _) => {
                PathBuf::from(format!("{}/{name}", store.describe()))
            }
        }
    }

    /// Writes object `name`, whole or not at all.
    pub(crate) fn put(&self, name: &str, bytes: &[u8]) -> Result<()> {
        match self {
            Location::Local(root) => {
                let path = root.join(name);
                write_atomic(&path, bytes).map_err(|source| CheckpointError::Io { path, source })
            }
            #[cfg(feature = "s3")]
            Location::S3 { store, parts } => store
                .put_large(name, bytes, parts)
                .map_err(|e| self.error(name, e)),
        }
    }

    /// Writes object `name` whole unless it exists: `Ok(false)` when it does (another writer
    /// was first). Locally a hard link of a complete temporary file, which fails if the name
    /// exists; on S3 a conditional PUT (`If-None-Match: *`).
    pub(crate) fn put_new(&self, name: &str, bytes: &[u8]) -> Result<bool> {
        match self {
            Location::Local(root) => {
                let path = root.join(name);
                let tmp = root.join(format!(".{name}.new.{}", std::process::id()));
                let io = |source| CheckpointError::Io {
                    path: path.clone(),
                    source,
                };
                std::fs::create_dir_all(root).map_err(io)?;
                std::fs::write(&tmp, bytes).map_err(io)?;
                let linked = std::fs::hard_link(&tmp, &path);
                let _ = std::fs::remove_file(&tmp);
                match linked {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                    Err(e) => Err(io(e)),
                }
            }
            #[cfg(feature = "s3")]
            Location::S3 { store, .. } => {
                use neuron_pc_cache::{PutMode, Store};
                store
                    .put(name, bytes, PutMode::CreateOnly)
                    .map_err(|e| self.error(name, e))
            }
        }
    }

    /// Reads object `name`; `Ok(None)` when it does not exist.
    pub(crate) fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        match self {
            Location::Local(root) => {
                let path = root.join(name);
                match std::fs::read(&path) {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(source) => Err(CheckpointError::Io { path, source }),
                }
            }
            #[cfg(feature = "s3")]
            Location::S3 { store, parts } => store
                .get_large(name, parts)
                .map_err(|e| self.error(name, e)),
        }
    }

    /// Bytes `from..from + len` of object `name`: what a resume reads of a checkpoint's file
    /// (one chunk). A missing object or one too short is an error.
    pub(crate) fn get_range(&self, name: &str, from: u64, len: usize) -> Result<Vec<u8>> {
        match self {
            Location::Local(root) => {
                use std::io::{Read, Seek, SeekFrom};
                let path = root.join(name);
                let read = || -> std::io::Result<Vec<u8>> {
                    let mut f = std::fs::File::open(&path)?;
                    f.seek(SeekFrom::Start(from))?;
                    let mut out = vec![0u8; len];
                    f.read_exact(&mut out)?;
                    Ok(out)
                };
                read().map_err(|source| CheckpointError::Io { path, source })
            }
            #[cfg(feature = "s3")]
            Location::S3 { store, parts } => store
                .get_range_large(name, from..from + len as u64, parts)
                .map_err(|e| self.error(name, e)),
        }
    }

    /// Every object's name (files below the root, one directory level deep), sorted. Writers'
    /// temporary files are not objects.
    pub(crate) fn list(&self) -> Result<Vec<String>> {
        match self {
            Location::Local(root) => {
                let mut out = Vec::new();
                list_local(root, root, 2, &mut out)?;
                out.sort();
                Ok(out)
            }
            #[cfg(feature = "s3")]
            Location::S3 { store, parts } => Ok(retried("listing", parts, || store.list(""))
                .map_err(|e| self.error("(listing)", e))?
                .into_iter()
                .map(|m| m.name)
                .collect()),
        }
    }

    /// What unfinished saves leave locally that is not an object: writers' temporary files in
    /// step directories (`step-…/.name.tmp.pid`) and empty step directories (`step-…/`, with
    /// the slash). Nothing on S3, where an upload is whole or absent.
    pub(crate) fn stray(&self) -> Result<Vec<String>> {
        match self {
            Location::Local(root) => stray_local(root),
            #[cfg(feature = "s3")]
            Location::S3 { .. } => Ok(Vec::new()),
        }
    }

    /// Deletes one of [`Location::stray`]'s names (a missing one is not an error).
    pub(crate) fn remove_stray(&self, name: &str) -> Result<()> {
        match self {
            Location::Local(root) => {
                let path = root.join(name);
                let removed = match name.strip_suffix('/') {
                    Some(_) => std::fs::remove_dir(&path),
                    None => std::fs::remove_file(&path),
                };
                match removed {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        Err(CheckpointError::Io { path, source: e })
                    }
                    _ => Ok(()),
                }
            }
            #[cfg(feature = "s3")]
            Location::S3 { .. } => Ok(()),
        }
    }

    /// Deletes object `name` (a missing one is not an error); locally, with `tidy`, its
    /// directory too once it is empty. Not while a save may be writing into that directory:
    /// another rank's `create_dir_all` and its file's creation would have the directory removed
    /// between them.
    pub(crate) fn delete(&self, name: &str, tidy: bool) -> Result<()> {
        match self {
            Location::Local(root) => {
                let path = root.join(name);
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => return Err(CheckpointError::Io { path, source }),
                }
                if let Some(dir) = path.parent().filter(|d| tidy && *d != root.as_path()) {
                    // Fails while other files remain: that is the point.
                    let _ = std::fs::remove_dir(dir);
                }
                Ok(())
            }
            #[cfg(feature = "s3")]
            Location::S3 { store, parts } => {
                let _ = tidy; // S3 has no directories
                retried(&format!("DELETE {name}"), parts, || store.delete(name))
                    .map_err(|e| self.error(name, e))
            }
        }
    }

    #[cfg(feature = "s3")]
    fn error(&self, name: &str, e: neuron_pc_cache::Error) -> CheckpointError {
        storage(&format!("{}/{name}", self.describe()), &e.to_string())
    }
}

/// `request` retried as [`S3Store::put_large`] retries its requests
/// ([`PartOptions::retry_after`]).
#[cfg(feature = "s3")]
fn retried<T>(
    what: &str,
    parts: &PartOptions,
    request: impl Fn() -> neuron_pc_cache::Result<T>,
) -> neuron_pc_cache::Result<T> {
    let mut attempt = 1;
    loop {
        match request() {
            Err(e) => match parts.retry_after(what, &e, attempt) {
                Some(wait) => std::thread::sleep(wait),
                None => return Err(e),
            },
            ok => return ok,
        }
        attempt += 1;
    }
}

fn storage(location: &str, message: &str) -> CheckpointError {
    CheckpointError::Storage {
        location: location.to_string(),
        message: message.to_string(),
    }
}

/// An error of the S3 client opening checkpoint location `spec`, said as a checkpoint
/// location's (the client is the compile cache's, whose words are about a cache).
#[cfg(feature = "s3")]
fn s3_error(spec: &str, e: neuron_pc_cache::Error) -> CheckpointError {
    match e {
        neuron_pc_cache::Error::InvalidUrl { url, message } => storage(
            spec,
            &format!("invalid checkpoint location {url:?}: {message}"),
        ),
        e => storage(spec, &e.to_string()),
    }
}

/// [`Location::stray`] of local directory `root`.
fn stray_local(root: &Path) -> Result<Vec<String>> {
    let io = |path: &Path, source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(root, e)),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let dir = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || super::manifest::step_of(&dir).is_none() {
            continue;
        }
        let path = entry.path();
        let mut empty = true;
        for file in std::fs::read_dir(&path)
            .map_err(|e| io(&path, e))?
            .flatten()
        {
            empty = false;
            let name = file.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.contains(".tmp.") {
                out.push(format!("{dir}/{name}"));
            }
        }
        if empty {
            out.push(format!("{dir}/"));
        }
    }
    out.sort();
    Ok(out)
}

/// Files below `dir`, `depth` levels deep at most, as paths relative to `root`; temporary files
/// (`.name.tmp.pid`) and a missing root are skipped.
fn list_local(root: &Path, dir: &Path, depth: usize, out: &mut Vec<String>) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CheckpointError::Io {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        match entry.file_type() {
            Ok(t) if t.is_dir() && depth > 1 => list_local(root, &path, depth - 1, out)?,
            Ok(t) if t.is_file() => {
                if let Ok(rel) = path.strip_prefix(root) {
                    out.push(rel.to_string_lossy().into_owned());
                }
            }
            _ => {}
        }
    }
    Ok(())
}
