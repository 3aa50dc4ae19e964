//! [`TokenShard`]: pre-tokenized data for pretraining in llm.c's shard format, memory-mapped:
//! a header of 256 little-endian int32 (`magic`, `version`, token count), then the tokens,
//! uint16 (`20240520`, version 1, GPT-2's vocabulary) or uint32 (`20240801`, version 7, Llama
//! 3's). Nothing is read until a batch needs its rows, so a shard of billions of tokens opens
//! at once and costs only the pages touched.

use std::path::{Path, PathBuf};

use neuron_pc_compiler::HostTensor;

use super::PackedRows;
use crate::error::{Error, Result};

const HEADER_BYTES: usize = 256 * 4;

/// One memory-mapped shard of tokens.
pub struct TokenShard {
    map: memmap2::Mmap,
    /// Bytes per token: 2 or 4.
    width: usize,
    tokens: usize,
    path: PathBuf,
}

impl TokenShard {
    /// Opens `path`, checking its header against its size; a bad file is one error naming it.
    pub fn open(path: &Path) -> Result<TokenShard> {
        let err = |m: String| Error::Config(format!("{}: {m}", path.display()));
        let file = std::fs::File::open(path).map_err(|e| err(format!("cannot open: {e}")))?;
        // SAFETY: the map is read-only and private to this process; like every reader of
        // memory-mapped data, it assumes no other process truncates the file while it is open
        // (which would fault on access, not corrupt memory of this process).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(format!("mmap: {e}")))?;
        if map.len() < HEADER_BYTES {
            return Err(err(format!(
                "{} bytes, shorter than the 1024-byte header of an llm.c shard",
                map.len()
            )));
        }
        let word = |i: usize| i32::from_le_bytes(map[4 * i..4 * i + 4].try_into().expect("4"));
        let width = match (word(0), word(1)) {
            (20240520, 1) => 2,
            (20240801, 7) => 4,
            (magic, version) => {
                return Err(err(format!(
                    "magic {magic} version {version}: not an llm.c shard (20240520 v1 for \
                     uint16 tokens, 20240801 v7 for uint32)"
                )))
            }
        };
        let tokens = usize::try_from(word(2)).map_err(|_| err("a negative token count".into()))?;
        let want = HEADER_BYTES + tokens * width;
        if map.len() != want {
            return Err(err(format!(
                "the header counts {tokens} tokens ({want} bytes), the file has {} bytes",
                map.len()
            )));
        }
        Ok(TokenShard {
            map,
            width,
            tokens,
            path: path.to_path_buf(),
        })
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.tokens
    }

    /// True when the shard holds no tokens.
    pub fn is_empty(&self) -> bool {
        self.tokens == 0
    }

    /// The file it maps.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tokens `start..start + n`, in order, read from the map as they are iterated.
    fn iter(&self, start: usize, n: usize) -> impl Iterator<Item = i32> + '_ {
        let bytes = &self.map[HEADER_BYTES + start * self.width..][..n * self.width];
        bytes.chunks_exact(self.width).map(|b| match b {
            [lo, hi] => i32::from(u16::from_le_bytes([*lo, *hi])),
            _ => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i32,
        })
    }

    /// Tokens `start..start + n`.
    pub fn tokens(&self, start: usize, n: usize) -> Vec<i32> {
        self.iter(start, n).collect()
    }

    /// The largest token of the shard (to check it against a vocabulary), one pass over the
    /// map with nothing copied.
    pub fn max_token(&self) -> Option<i32> {
        self.iter(0, self.tokens).max()
    }

    /// Rows of `len` tokens the shard holds (the stream cut in order; the rest dropped).
    pub fn rows(&self, len: usize) -> usize {
        self.tokens / len.max(1)
    }

    /// Every row of `len` tokens, read into memory (a validation shard) as the stream
    /// [`TokenShard::batch`] reads.
    pub fn to_rows(&self, len: usize) -> PackedRows {
        let rows = self.rows(len);
        let ids = self.tokens(0, rows * len);
        let positions = (0..rows).flat_map(|_| 0..len as i32).collect();
        PackedRows::new(len, ids.clone(), positions, ids).expect("whole rows")
    }

    /// Rows `start..start + n` (wrapping) of `len` tokens as `[input_ids, position_ids,
    /// labels]`, int32 `[n, len]`: a stream, so positions run `0..len` and every token is
    /// predicted (the end token between documents is data, as llm.c trains).
    pub fn batch(&self, start: usize, n: usize, len: usize) -> Result<Vec<HostTensor>> {
        let rows = self.rows(len);
        if rows == 0 {
            return Err(Error::Config(format!(
                "{}: {} tokens, fewer than one row of {len}",
                self.path.display(),
                self.tokens
            )));
        }
        let mut ids = Vec::with_capacity(n * len);
        for r in 0..n {
            ids.extend(self.tokens((start + r) % rows * len, len));
        }
        let positions: Vec<i32> = (0..n).flat_map(|_| 0..len as i32).collect();
        Ok(vec![
            HostTensor::from_slice(&ids, &[n, len])?,
            HostTensor::from_slice(&positions, &[n, len])?,
            HostTensor::from_slice(&ids, &[n, len])?,
        ])
    }
}
