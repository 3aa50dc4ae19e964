//! [`PackedCache`]: packed rows kept on disk, so a corpus is tokenized once per machine, not
//! once per process and per run (what `datasets` does with its cache and
//! `main_process_first`).
//!
//! An entry is a safetensors file of the three `[rows, len]` int32 arrays, named by the SHA-256
//! of everything the rows depend on: the data's bytes (every file under a dataset directory),
//! the tokenizer (its serialized form and end token), the row length and document masks. It is
//! written to a temporary name and renamed, under a lock file, so the processes of one machine
//! wait for the first to build it and then map it; each reads only the rows it batches. An
//! entry that does not read back (a truncated or foreign file) is said once and rebuilt.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::{load_packed_with_progress, PackedRows, Tokenizer};
use crate::error::{Error, Result};

/// Where [`PackedCache::from_env`] keeps its entries: this variable, else
/// `$XDG_CACHE_HOME/neuron-pc/packed`, else `~/.cache/neuron-pc/packed`.
pub const DATA_CACHE_ENV: &str = "NEURON_PC_DATA_CACHE";

/// Changes whenever the rows a corpus packs into could change for the same inputs.
const FORMAT: &str = "neuron-pc packed rows 1";

const NAMES: [&str; 3] = ["input_ids", "position_ids", "labels"];

/// A directory of packed rows, keyed by content.
#[derive(Clone, Debug)]
pub struct PackedCache {
    dir: PathBuf,
}

/// How [`PackedCache::load`] got its rows.
#[derive(Clone, Debug, PartialEq)]
pub enum CacheOutcome {
    /// Read from this entry.
    Hit(PathBuf),
    /// Tokenized and packed now, then stored in this entry.
    Built(PathBuf),
}

impl PackedCache {
    /// A cache in `dir` (created when first written).
    pub fn new(dir: impl Into<PathBuf>) -> PackedCache {
        PackedCache { dir: dir.into() }
    }

    /// The cache [`DATA_CACHE_ENV`] names, or the user's cache directory's.
    pub fn from_env() -> PackedCache {
        if let Some(dir) = std::env::var_os(DATA_CACHE_ENV).filter(|d| !d.is_empty()) {
            return PackedCache::new(dir);
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        PackedCache::new(base.join("neuron-pc").join("packed"))
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// [`super::load_packed`] through the cache: the entry for these inputs if there is one, else
    /// the rows built now and stored (a cache that cannot be written is said once, and the
    /// rows are still returned).
    pub fn load(
        &self,
        path: &Path,
        tokenizer: &Tokenizer,
        len: usize,
        document_masks: bool,
    ) -> Result<(PackedRows, CacheOutcome)> {
        self.load_with_progress(path, tokenizer, len, document_masks, &mut |_, _| {})
    }

    /// [`PackedCache::load`], reporting the tokenizing's progress (when it tokenizes) as
    /// [`super::tokenize_with_progress`] does.
    pub fn load_with_progress(
        &self,
        path: &Path,
        tokenizer: &Tokenizer,
        len: usize,
        document_masks: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(PackedRows, CacheOutcome)> {
        let mut key = Sha256::new();
        key.update(FORMAT.as_bytes());
        key.update(tokenizer.fingerprint().as_bytes());
        key.update(format!("len {len} masks {document_masks}\n").as_bytes());
        hash_data(path, &mut key)?;
        let entry = self
            .dir
            .join(format!("{}.safetensors", hex::encode(key.finalize())));
        if let Ok(Some(rows)) = read(&entry, len) {
            return Ok((rows, CacheOutcome::Hit(entry)));
        }
        let lock = match std::fs::create_dir_all(&self.dir)
            .and_then(|()| std::fs::File::create(entry.with_extension("lock")))
        {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(
                    "packed-rows cache {}: cannot write ({e}); tokenizing without it",
                    self.dir.display()
                );
                let rows =
                    load_packed_with_progress(path, tokenizer, len, document_masks, progress)?;
                return Ok((rows, CacheOutcome::Built(entry)));
            }
        };
        // Another process of this machine may be building it: wait for it, then look again.
        lock.lock()
            .map_err(|e| Error::Config(format!("{}: cannot lock: {e}", entry.display())))?;
        match read(&entry, len) {
            Ok(Some(rows)) => return Ok((rows, CacheOutcome::Hit(entry))),
            Ok(None) => {}
            Err(e) => tracing::warn!(
                "packed-rows cache {}: unreadable ({e}); building it again",
                entry.display()
            ),
        }
        let rows = load_packed_with_progress(path, tokenizer, len, document_masks, progress)?;
        if let Err(e) = write(&entry, &rows) {
            tracing::warn!("packed-rows cache {}: cannot write: {e}", entry.display());
        }
        Ok((rows, CacheOutcome::Built(entry)))
    }
}

/// The entry's rows, mapped: `None` when there is no entry, an error when it does not read back.
fn read(entry: &Path, len: usize) -> std::result::Result<Option<PackedRows>, String> {
    let Ok(file) = std::fs::File::open(entry) else {
        return Ok(None);
    };
    // SAFETY: entries are written once, to a temporary name, then renamed; none is changed in
    // place while mapped (a rebuilt entry replaces the name, not the bytes).
    let map = Arc::new(unsafe { memmap2::Mmap::map(&file) }.map_err(|e| e.to_string())?);
    let (header, meta) =
        safetensors::SafeTensors::read_metadata(&map[..]).map_err(|e| e.to_string())?;
    let start = 8 + header;
    let mut ranges: [std::ops::Range<usize>; 3] = Default::default();
    for (range, name) in ranges.iter_mut().zip(NAMES) {
        let info = meta.info(name).ok_or(format!("no {name}"))?;
        if info.dtype != safetensors::Dtype::I32 || info.shape.get(1) != Some(&len) {
            return Err(format!("{name} is {:?} {:?}", info.dtype, info.shape));
        }
        *range = start + info.data_offsets.0..start + info.data_offsets.1;
    }
    let rows = PackedRows::mapped(len, map, ranges).map_err(|e| e.to_string())?;
    // bytes not aligned for int32 read as no tokens
    if rows.rows() == 0 {
        return Err("no rows".into());
    }
    Ok(Some(rows))
}

/// Writes `rows` to `entry` through a temporary file in the same directory.
fn write(entry: &Path, rows: &PackedRows) -> std::io::Result<()> {
    let len = rows.row_len();
    let arrays = [rows.input_ids(), rows.position_ids(), rows.labels()];
    let bytes: Vec<Vec<u8>> = arrays
        .iter()
        .map(|a| a.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views = NAMES
        .iter()
        .zip(&bytes)
        .map(|(name, b)| {
            let view = safetensors::tensor::TensorView::new(
                safetensors::Dtype::I32,
                vec![rows.rows(), len],
                b,
            )
            .map_err(std::io::Error::other)?;
            Ok((*name, view))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let tmp = entry.with_extension(format!("tmp{}", std::process::id()));
    safetensors::serialize_to_file(views, None, &tmp).map_err(std::io::Error::other)?;
    std::fs::rename(&tmp, entry).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Hashes the bytes of `path`, or of every file under it (sorted, with their relative paths).
fn hash_data(path: &Path, key: &mut Sha256) -> Result<()> {
    let cannot =
        |p: &Path, e: std::io::Error| Error::Config(format!("{}: cannot read: {e}", p.display()));
    let mut files = Vec::new();
    if path.is_dir() {
        let mut stack = vec![path.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).map_err(|e| cannot(&dir, e))? {
                let p = entry.map_err(|e| cannot(&dir, e))?.path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    files.push(p);
                }
            }
        }
        files.sort();
    } else {
        files.push(path.to_path_buf());
    }
    let mut buf = vec![0u8; 1 << 20];
    for file in files {
        let name = file.strip_prefix(path).unwrap_or(&file);
        key.update(format!("file {}\n", name.display()).as_bytes());
        let mut f = std::fs::File::open(&file).map_err(|e| cannot(&file, e))?;
        loop {
            let n = f.read(&mut buf).map_err(|e| cannot(&file, e))?;
            if n == 0 {
                break;
            }
            key.update(&buf[..n]);
        }
    }
    Ok(())
}
