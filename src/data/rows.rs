//! Packed token rows, the form in which a language model's training data reaches its loss
//! ([`crate::models::llama::LlamaForCausalLM::loss_packed`] among others): made by
//! [`super::pack`] and [`super::PackedCache`] (the `text` feature), or by a user's own code.

#[cfg(feature = "text")]
use std::sync::Arc;

use neuron_pc_compiler::HostTensor;

use crate::error::{Error, Result};

/// Rows of one length cut from documents laid end to end: `input_ids`, `position_ids` and
/// `labels`, each `rows x len` int32 in row order, held in memory or memory-mapped from a
/// [`super::PackedCache`] file (where a batch reads only its rows).
#[derive(Clone, Debug)]
pub struct PackedRows {
    len: usize,
    data: Rows,
}

#[derive(Clone, Debug)]
enum Rows {
    Owned([Vec<i32>; 3]),
    /// The three arrays' byte ranges in a mapped file.
    #[cfg(feature = "text")]
    Mapped(Arc<memmap2::Mmap>, [std::ops::Range<usize>; 3]),
}

impl PartialEq for PackedRows {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && (0..3).all(|i| self.array(i) == other.array(i))
    }
}

impl PackedRows {
    /// Rows of `len` from the three arrays (`input_ids`, `position_ids`, `labels`), each
    /// `rows x len`; arrays of other lengths are an error.
    pub fn new(
        len: usize,
        input_ids: Vec<i32>,
        position_ids: Vec<i32>,
        labels: Vec<i32>,
    ) -> Result<PackedRows> {
        let n = input_ids.len();
        if len == 0 || !n.is_multiple_of(len) || position_ids.len() != n || labels.len() != n {
            return Err(Error::Config(format!(
                "packed rows of {len}: arrays of {n}, {} and {} tokens",
                position_ids.len(),
                labels.len()
            )));
        }
        Ok(PackedRows {
            len,
            data: Rows::Owned([input_ids, position_ids, labels]),
        })
    }

    /// Rows over the three byte ranges of a mapped file (checked by the caller: whole rows of
    /// aligned little-endian int32).
    #[cfg(feature = "text")]
    pub(super) fn mapped(
        len: usize,
        map: Arc<memmap2::Mmap>,
        ranges: [std::ops::Range<usize>; 3],
    ) -> Result<PackedRows> {
        let rows = PackedRows {
            len,
            data: Rows::Mapped(map, ranges),
        };
        let n = rows.array(0).len();
        if len == 0 || !n.is_multiple_of(len) || (1..3).any(|i| rows.array(i).len() != n) {
            return Err(Error::Config("packed rows of unequal arrays".into()));
        }
        Ok(rows)
    }

    fn array(&self, i: usize) -> &[i32] {
        match &self.data {
            Rows::Owned(arrays) => &arrays[i],
            #[cfg(feature = "text")]
            Rows::Mapped(map, ranges) => {
                use zerocopy::FromBytes;
                <[i32]>::ref_from_bytes(&map[ranges[i].clone()]).unwrap_or(&[])
            }
        }
    }

    /// Tokens per row.
    pub fn row_len(&self) -> usize {
        self.len
    }

    /// Every row's token ids, row after row.
    pub fn input_ids(&self) -> &[i32] {
        self.array(0)
    }

    /// Every row's position ids.
    pub fn position_ids(&self) -> &[i32] {
        self.array(1)
    }

    /// Every row's labels (-100: not predicted).
    pub fn labels(&self) -> &[i32] {
        self.array(2)
    }

    /// The number of rows.
    pub fn rows(&self) -> usize {
        self.input_ids().len() / self.len.max(1)
    }

    /// Rows `start..start + n` (wrapping around the end) as `[input_ids, position_ids,
    /// labels]`, int32 `[n, len]`.
    pub fn batch(&self, start: usize, n: usize) -> Vec<HostTensor> {
        let rows = self.rows();
        let take = |v: &[i32]| {
            let mut out = Vec::with_capacity(n * self.len);
            for r in 0..n {
                let at = (start + r) % rows * self.len;
                out.extend_from_slice(&v[at..at + self.len]);
            }
            HostTensor::from_slice(&out, &[n, self.len]).expect("sizes agree")
        };
        (0..3).map(|i| take(self.array(i))).collect()
    }
}
