//! Storage backends: named objects (`entries/ab/<key>.json`, `locks/<key>.lock`, ...) with a
//! create-only put that is the basis of locks and of "first complete entry wins".

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::error::{Error, Result};

/// Which tier served a read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// A local directory.
    Local,
    /// The shared object store (S3).
    Remote,
}

/// How a put treats an existing object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutMode {
    /// Replace whatever is there (atomically).
    Overwrite,
    /// Only if no object of that name exists (`O_EXCL` locally, `If-None-Match: *` on S3).
    CreateOnly,
}

/// One listed object.
#[derive(Clone, Debug)]
pub struct ObjectMeta {
    /// Name relative to the store root, like `entries/ab/<key>.json`.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// Last modification (local: refreshed by hits).
    pub modified: SystemTime,
}

/// A place to keep named byte objects.
pub trait Store: Send + Sync {
    /// For messages: `/path/to/cache` or `s3://bucket/prefix`.
    fn describe(&self) -> String;
    /// Which tier this store is.
    fn tier(&self) -> Tier;
    /// `Ok(None)` when the object does not exist.
    fn get(&self, name: &str) -> Result<Option<Vec<u8>>>;
    /// Like [`Store::get`], but an object larger than `max` bytes is [`Error::Corrupt`] and,
    /// where the store can tell before reading, is not read (a planted huge file must not
    /// exhaust memory).
    fn get_max(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        match self.get(name)? {
            Some(b) if b.len() as u64 > max => Err(too_large(name, b.len() as u64, max)),
            other => Ok(other),
        }
    }
    /// `Ok(false)` when `CreateOnly` found the object already there.
    fn put(&self, name: &str, bytes: &[u8], mode: PutMode) -> Result<bool>;
    /// Whether [`PutMode::CreateOnly`] is atomic on the server (S3: `If-None-Match: *` is
    /// honoured); `false` means it is emulated by compare-after-write. May ask the server once.
    fn conditional_put(&self) -> Result<bool> {
        Ok(true)
    }
    /// Deleting a missing object is not an error.
    fn delete(&self, name: &str) -> Result<()>;
    /// Objects whose names start with `prefix`.
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>>;
    /// Marks an object as recently used (for eviction); best effort.
    fn touch(&self, _name: &str) {}
    /// Objects in the store's namespace that are not plain objects (local: symlinks, FIFOs,
    /// sockets, devices, directories where a file belongs), each with what it is. They are
    /// damage: `verify` reports them and `--fix` deletes them.
    fn foreign_objects(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// Removes what writers that died mid-write left behind (never a committed object);
    /// returns how many objects went.
    fn clean_leftovers(&self) -> usize {
        0
    }
}

/// A local directory. Writes go to a temporary file in the target's directory, are fsynced and
/// renamed into place, so a reader sees the old object, the whole new one, or none.
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    /// Opens (and creates) `root`. A symlink as the root or inside it is refused.
    pub fn open(root: &Path) -> Result<LocalStore> {
        LocalStore::open_with(root, true)
    }

    /// Opens `root` without creating it (read-only clients make no directory; a missing root
    /// is an empty cache).
    pub fn open_existing(root: &Path) -> Result<LocalStore> {
        LocalStore::open_with(root, false)
    }

    fn open_with(root: &Path, create: bool) -> Result<LocalStore> {
        if std::fs::metadata(root).is_ok_and(|m| !m.is_dir()) {
            return Err(Error::InvalidUrl {
                url: root.display().to_string(),
                message: "it is a file, not a directory; name a directory (created if missing)"
                    .into(),
            });
        }
        if create {
            std::fs::create_dir_all(root).map_err(|source| Error::Io {
                path: root.display().to_string(),
                source,
            })?;
        }
        if std::fs::symlink_metadata(root)
            .map(|m| m.file_type().is_symlink())
            .unwrap_or(false)
        {
            return Err(Error::InvalidUrl {
                url: root.display().to_string(),
                message: "the cache root is a symlink".into(),
            });
        }
        Ok(LocalStore {
            root: root.to_path_buf(),
        })
    }

    /// The cache directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The path of `name`, refusing names that could leave the root or pass through a
    /// symlink inside it.
    fn path(&self, name: &str) -> Result<PathBuf> {
        let bad = || Error::InvalidKey {
            key: name.chars().take(80).collect(),
        };
        if name.is_empty()
            || name.starts_with('/')
            || name.contains('\0')
            || name
                .split('/')
                .any(|c| c.is_empty() || c == "." || c == "..")
        {
            return Err(bad());
        }
        let path = self.root.join(name);
        let mut p = self.root.clone();
        // Directories on the way must not be symlinks (that would leave the root). The last
        // component may be one: reads refuse anything but a regular file, and writes replace
        // the link itself, never what it points to.
        let dirs = name.rsplit_once('/').map_or("", |(d, _)| d);
        for comp in dirs.split('/').filter(|c| !c.is_empty()) {
            p.push(comp);
            if let Ok(m) = std::fs::symlink_metadata(&p) {
                if m.file_type().is_symlink() {
                    return Err(Error::Corrupt {
                        key: name.to_string(),
                        message: format!(
                            "{} is a symlink; links inside the cache are refused, never \
                             followed (`neuron-pc cache verify --fix` removes it)",
                            p.display()
                        ),
                    });
                }
            }
        }
        Ok(path)
    }

    fn io(path: &Path, source: std::io::Error) -> Error {
        Error::Io {
            path: path.display().to_string(),
            source,
        }
    }
}

impl Store for LocalStore {
    fn describe(&self) -> String {
        self.root.display().to_string()
    }

    fn tier(&self) -> Tier {
        Tier::Local
    }

    fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.get_max(name, u64::MAX)
    }

    fn get_max(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        let path = self.path(name)?;
        let Some(mut file) = open_regular(name, &path)? else {
            return Ok(None);
        };
        let len = file.metadata().map_err(|e| Self::io(&path, e))?.len();
        if len > max {
            return Err(too_large(name, len, max));
        }
        let mut bytes = Vec::with_capacity(len as usize);
        std::io::Read::read_to_end(&mut file, &mut bytes).map_err(|e| Self::io(&path, e))?;
        Ok(Some(bytes))
    }

    fn put(&self, name: &str, bytes: &[u8], mode: PutMode) -> Result<bool> {
        let path = self.path(name)?;
        // `path` is the root joined with a validated, non-empty name, so it has a parent.
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        std::fs::create_dir_all(&dir).map_err(|e| Self::io(&dir, e))?;
        let file_name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = dir.join(format!(
            ".tmp.{file_name}.{}.{}",
            std::process::id(),
            unique()
        ));
        let result = (|| -> std::io::Result<bool> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            if mode == PutMode::CreateOnly {
                // A hard link to the final name fails if it exists: an atomic "first one
                // wins" that never shows a half-written object.
                let linked = std::fs::hard_link(&tmp, &path);
                std::fs::remove_file(&tmp)?;
                match linked {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
                    Err(e) => return Err(e),
                }
            } else {
                // A directory where the object belongs (damage) would make every write fail.
                if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
                    std::fs::remove_dir_all(&path)?;
                }
                std::fs::rename(&tmp, &path)?;
            }
            std::fs::File::open(&dir)?.sync_all()?;
            Ok(true)
        })();
        match result {
            Ok(created) => Ok(created),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(Self::io(&path, e))
            }
        }
    }

    fn delete(&self, name: &str) -> Result<()> {
        // A symlink as the last component is removed itself (never what it points to); a
        // directory on the way that is a link (`failures/` pointing outside, say) is refused
        // like any path through a symlink: deleting `<link>/<key>.json` would delete a file
        // outside the cache.
        let path = self.path(name)?;
        let removed = match std::fs::symlink_metadata(&path) {
            // A directory where an object belongs is damage; `remove_dir_all` does not follow
            // symlinks inside it.
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        match removed {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Self::io(&path, e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(Self::io(&dir, e)),
            };
            for entry in entries.flatten() {
                // A file removed between listing and stat is simply skipped.
                let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                    continue;
                };
                if meta.file_type().is_symlink() {
                    continue;
                }
                let Ok(rel) = entry
                    .path()
                    .strip_prefix(&self.root)
                    .map(|r| r.to_string_lossy().into_owned())
                else {
                    continue;
                };
                if meta.is_dir() {
                    if prefix.starts_with(&rel)
                        || rel.starts_with(prefix.trim_end_matches('/'))
                        || prefix.is_empty()
                    {
                        stack.push(entry.path());
                    }
                } else if rel.starts_with(prefix)
                    && !rel.rsplit('/').next().unwrap_or("").starts_with(".tmp.")
                {
                    out.push(ObjectMeta {
                        name: rel,
                        size: meta.len(),
                        modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    });
                }
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn clean_leftovers(&self) -> usize {
        self.clean_temporaries(std::time::Duration::from_secs(3600))
    }

    fn touch(&self, name: &str) {
        use std::os::unix::fs::MetadataExt;
        let Ok(path) = self.path(name) else { return };
        // A file with other names may live outside the cache: never change it.
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_file() && m.nlink() == 1 => {}
            _ => return,
        }
        if let Ok(f) = nonblocking().write(true).open(&path) {
            if f.metadata().is_ok_and(|m| m.is_file() && m.nlink() == 1) {
                let _ = f.set_modified(SystemTime::now());
            }
        }
    }

    fn foreign_objects(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                    continue;
                };
                let Ok(rel) = entry
                    .path()
                    .strip_prefix(&self.root)
                    .map(|r| r.to_string_lossy().into_owned())
                else {
                    continue;
                };
                let object_like = [".json", ".exe", ".mlir", ".lock"]
                    .iter()
                    .any(|x| rel.ends_with(x));
                if meta.is_dir() && object_like {
                    out.push((rel, "a directory where a file belongs".into()));
                } else if meta.is_dir() {
                    stack.push(entry.path());
                } else if !meta.is_file() {
                    out.push((rel, format!("{}, not a regular file", kind(&meta))));
                }
            }
        }
        out.sort();
        out
    }
}

/// What kind of special file `meta` describes, for messages.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_symlink() {
        "a symlink"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else if t.is_dir() {
        "a directory"
    } else {
        "a special file"
    }
}

/// Open options that never block on a FIFO or device (Linux `O_NONBLOCK`).
fn nonblocking() -> std::fs::OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    const O_NONBLOCK: i32 = 0o4000;
    let mut o = std::fs::OpenOptions::new();
    o.custom_flags(O_NONBLOCK);
    o
}

/// Opens `path` for reading only if it is a regular file: a FIFO, device, socket or directory
/// in its place is damage ([`Error::Corrupt`]), never something to wait on. The type is checked
/// before opening, and again on the opened file (the name may have been replaced meanwhile).
fn open_regular(name: &str, path: &Path) -> Result<Option<std::fs::File>> {
    let refuse = |meta: &std::fs::Metadata| Error::Corrupt {
        key: name.to_string(),
        message: format!("{} is {}, not a regular file", path.display(), kind(meta)),
    };
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => {}
        Ok(m) => return Err(refuse(&m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LocalStore::io(path, e)),
    }
    let file = match nonblocking().read(true).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LocalStore::io(path, e)),
    };
    match file.metadata() {
        Ok(m) if m.is_file() => Ok(Some(file)),
        Ok(m) => Err(refuse(&m)),
        Err(e) => Err(LocalStore::io(path, e)),
    }
}

fn too_large(name: &str, size: u64, max: u64) -> Error {
    Error::Corrupt {
        key: name.to_string(),
        message: format!("{size} bytes where at most {max} were expected"),
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

impl LocalStore {
    /// Removes temporary files left by writers that died mid-write: those whose writer (the
    /// pid in the name) is gone, and any older than `age`.
    pub fn clean_temporaries(&self, age: std::time::Duration) -> usize {
        let mut removed = 0;
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
                    continue;
                };
                if meta.is_dir() {
                    stack.push(entry.path());
                } else if entry.file_name().to_string_lossy().starts_with(".tmp.")
                    && (meta
                        .modified()
                        .ok()
                        .and_then(|m| m.elapsed().ok())
                        .is_some_and(|e| e >= age)
                        || writer_gone(&entry.file_name().to_string_lossy()))
                    && std::fs::remove_file(entry.path()).is_ok()
                {
                    removed += 1;
                }
            }
        }
        removed
    }
}

/// True when the pid in a `.tmp.<name>.<pid>.<n>` file name is not a live process.
fn writer_gone(tmp_name: &str) -> bool {
    let mut parts = tmp_name.rsplitn(3, '.');
    let _n = parts.next();
    match parts.next().and_then(|p| p.parse::<u32>().ok()) {
        Some(pid) => pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists(),
        None => false,
    }
}
