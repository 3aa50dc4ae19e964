//! A device loader: takes host batches from any iterator, makes every batch the same shape (so
//! training never compiles a second step graph), and copies the next batches to the device on a
//! background thread while the current step runs.
//!
//! On a data-parallel device (several replicas) the batch size is the global batch: each batch
//! is padded or dropped as a whole, then split along its first dimension so that every replica
//! gets its own shard (PyTorch/XLA's `MpDeviceLoader` over a `DistributedSampler`, in one
//! process).
//!
//! Variable-length token data goes through [`LengthBuckets`] ([`DeviceLoader::for_tokens`]).
//!
//! For a language model, [`read_documents`] reads a corpus, [`tokenize`] runs the model's
//! [`Tokenizer`] over it and [`pack`] cuts rows of one length; [`PackedCache`] does all three
//! once per machine and maps the result after. Each process then builds only its rows of each
//! global batch, and [`DeviceLoader::for_local_rows`] puts them on the device:
//!
//! ```no_run
//! use std::path::Path;
//! use neuron_pc::data::{pack, read_documents, tokenize, DeviceLoader, PackedCache, Tokenizer};
//! use neuron_pc::data::TokenShard;
//! use neuron_pc::LazyDevice;
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! let (batch, len) = (8, 512); // global batch size, tokens per row
//! let tokenizer = Tokenizer::from_dir(Path::new("models/llama"))?;
//! let data = Path::new("data/train.jsonl");
//! let rows = pack(&tokenize(&tokenizer, &read_documents(data)?)?, len, true)?;
//! let (cached, _) = PackedCache::from_env().load(data, &tokenizer, len, true)?;
//! assert_eq!(rows, cached); // the same rows, tokenized once per machine
//!
//! let mine = device.local_rows(batch)?; // every row in a one-process run
//! let batches = (0..1000).map(move |i| cached.batch(i * batch + mine.start, mine.len()));
//! for b in DeviceLoader::for_local_rows(&device, batches, batch, 2) {
//!     let b = b?;
//!     let (input_ids, position_ids, labels) = (&b.tensors[0], &b.tensors[1], &b.tensors[2]);
//!     // ... the step: forward, loss, grad, optimizer, `device.mark_step()?`
//! }
//!
//! // Pre-tokenized llm.c shards give the same three tensors.
//! let shard = TokenShard::open(Path::new("data/fineweb_train_000001.bin"))?;
//! let first = shard.batch(0, batch, len)?; // [input_ids, position_ids, labels], i32 [8, 512]
//! # Ok(()) }
//! ```

mod buckets;
mod rows;
// Text data (the `text` feature): Hugging Face's tokenizer, JSONL/Arrow/Parquet documents,
// packing, the packed-rows cache and llm.c's token shards.
#[cfg(feature = "text")]
mod datasets;
#[cfg(feature = "text")]
mod document;
#[cfg(feature = "text")]
mod packed_cache;
#[cfg(feature = "text")]
mod shards;
#[cfg(feature = "text")]
mod text;
#[cfg(feature = "text")]
mod tokenizer;

pub use buckets::{BucketedBatches, LengthBuckets, PaddedTokens, TokenRow};
#[cfg(feature = "text")]
pub use document::Document;
#[cfg(feature = "text")]
pub use packed_cache::{CacheOutcome, PackedCache, DATA_CACHE_ENV};
pub use rows::PackedRows;
#[cfg(feature = "text")]
pub use shards::TokenShard;
#[cfg(feature = "text")]
pub use text::{
    load_packed, load_packed_with_progress, pack, read_documents, tokenize, tokenize_with_progress,
    TokenizedDocument,
};
#[cfg(feature = "text")]
pub use tokenizer::Tokenizer;

use std::sync::mpsc::{sync_channel, Receiver};
use std::thread::JoinHandle;

use neuron_pc_compiler::HostTensor;

use crate::device::LazyDevice;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// What to do with a last batch smaller than the batch size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastBatch {
    /// Skip it (the usual choice for training).
    Drop,
    /// Pad it with zero rows to the full size; [`DeviceBatch::valid`] tells how many rows are real
    /// (the usual choice for evaluation, with a mask built from it).
    Pad,
}

/// One batch on the device. It may gain fields: build one with [`DeviceBatch::new`].
#[non_exhaustive]
pub struct DeviceBatch {
    /// The batch's tensors, each with the batch dimension first: per-replica shards of
    /// `batch_size / replicas` rows (the whole batch on one device).
    pub tensors: Vec<Tensor>,
    /// Rows of the global batch that hold real examples (the rest is padding).
    pub valid: usize,
    /// Real rows of each replica's shard (shard `r` holds global rows `r * b .. (r + 1) * b`).
    pub valid_per_replica: Vec<usize>,
    /// Position of this batch in the stream.
    pub index: usize,
    /// Real tokens in the global batch (padding excluded), for token batches from
    /// [`DeviceLoader::for_tokens`]; `None` for other batches.
    pub tokens: Option<usize>,
}

impl DeviceBatch {
    /// A batch of `tensors` (on one device, or this process's shards) whose first `valid` rows
    /// are real, at position `index` of its stream.
    pub fn new(tensors: Vec<Tensor>, valid: usize, index: usize) -> DeviceBatch {
        DeviceBatch {
            tensors,
            valid,
            valid_per_replica: vec![valid],
            index,
            tokens: None,
        }
    }
}

/// Iterates over fixed-shape device batches prepared ahead on a background thread.
pub struct DeviceLoader {
    rx: Receiver<Result<DeviceBatch>>,
    worker: Option<JoinHandle<()>>,
    /// Where the time waited for each batch is counted ([`crate::Metrics::batch_wait_ms`]).
    device: LazyDevice,
}

impl DeviceLoader {
    /// Starts loading `batches` (each a list of host tensors sharing a leading batch dimension
    /// no larger than `batch_size`), keeping up to `prefetch` batches ready on `device`.
    pub fn new<I>(
        device: &LazyDevice,
        batches: I,
        batch_size: usize,
        last: LastBatch,
        prefetch: usize,
    ) -> DeviceLoader
    where
        I: IntoIterator<Item = Vec<HostTensor>>,
        I::IntoIter: Send + 'static,
    {
        let items = batches.into_iter().map(|b| Ok((b, None, None)));
        DeviceLoader::start(device, items, batch_size, last, prefetch, false)
    }

    /// Starts loading batches of which this process builds and reads only its share: for each
    /// global batch of `batch_size` rows, `batches` yields the rows
    /// [`LazyDevice::local_rows`]`(batch_size)` names (every row in a one-process run), placed
    /// as [`DeviceLoader::new`] places the whole batch. Every batch is full: a source whose rows
    /// wrap around (packed text, token shards) never runs short.
    pub fn for_local_rows<I>(
        device: &LazyDevice,
        batches: I,
        batch_size: usize,
        prefetch: usize,
    ) -> DeviceLoader
    where
        I: IntoIterator<Item = Vec<HostTensor>>,
        I::IntoIter: Send + 'static,
    {
        let items = batches.into_iter().map(|b| Ok((b, None, None)));
        DeviceLoader::start(device, items, batch_size, LastBatch::Drop, prefetch, true)
    }

    /// Starts loading token batches padded to length buckets ([`LengthBuckets::batches`]):
    /// each device batch is `[input_ids, attention_mask, labels]` with
    /// [`DeviceBatch::tokens`] set. A partial last batch is dropped or padded with rows of no
    /// tokens (mask 0, labels -100), so padding never counts in the loss.
    pub fn for_tokens<I>(
        device: &LazyDevice,
        batches: I,
        batch_size: usize,
        last: LastBatch,
        prefetch: usize,
    ) -> DeviceLoader
    where
        I: IntoIterator<Item = Result<PaddedTokens>>,
        I::IntoIter: Send + 'static,
    {
        let items = batches.into_iter().map(move |b| {
            let b = b?;
            let tokens = Some(b.tokens);
            let rows = b.input_ids.dims()[0];
            let b = match last {
                LastBatch::Pad if rows < batch_size => b.with_rows(batch_size),
                _ => b,
            };
            Ok((b.into_tensors(), tokens, Some(rows)))
        });
        DeviceLoader::start(device, items, batch_size, last, prefetch, false)
    }

    fn start<I>(
        device: &LazyDevice,
        batches: I,
        batch_size: usize,
        last: LastBatch,
        prefetch: usize,
        // the items hold this process's rows only (`for_local_rows`)
        local: bool,
    ) -> DeviceLoader
    where
        // (host tensors, real tokens, real rows when the rows were padded already)
        I: Iterator<Item = Result<(Vec<HostTensor>, Option<usize>, Option<usize>)>>
            + Send
            + 'static,
    {
        let (tx, rx) = sync_channel(prefetch.max(1));
        let device_for_metrics = device.clone();
        let device = device.clone();
        let replicas = device.replicas();
        // In a multi-process run this process's replicas take their rows of the global batch.
        let (global, offset) = (device.global_replicas(), device.replica_offset());
        let worker = std::thread::Builder::new()
            .name("neuron-pc-loader".into())
            .spawn(move || {
                if !batch_size.is_multiple_of(global) || batch_size == 0 {
                    let _ = tx.send(Err(Error::Config(format!(
                        "a global batch of {batch_size} rows does not split over {global} \
                         replicas: make the batch size a multiple of the replica count"
                    ))));
                    return;
                }
                let shard = batch_size / global;
                let mine = device.local_rows(batch_size).map_or(0, |r| r.len()); // checked above
                for (index, item) in batches.enumerate() {
                    let prepared = match item.and_then(|(b, tokens, rows)| {
                        if local {
                            return local_batch(b, mine).map(|b| Some(((b, batch_size), tokens)));
                        }
                        Ok(fix_shape(b, batch_size, last)?
                            .map(|(host, valid)| ((host, rows.unwrap_or(valid)), tokens)))
                    }) {
                        Ok(Some(((host, valid), tokens))) => host
                            .iter()
                            .map(|h| {
                                if local {
                                    device.shard_local(h)
                                } else {
                                    device.shard(h)
                                }
                            })
                            .collect::<Result<Vec<_>>>()
                            .map(|tensors| DeviceBatch {
                                tensors,
                                valid,
                                valid_per_replica: (offset..offset + replicas)
                                    .map(|r| valid.saturating_sub(r * shard).min(shard))
                                    .collect(),
                                index,
                                tokens,
                            }),
                        Ok(None) => continue,
                        Err(e) => Err(e),
                    };
                    let failed = prepared.is_err();
                    if tx.send(prepared).is_err() || failed {
                        return; // the consumer is gone, or the stream is broken
                    }
                }
            })
            .expect("spawning a thread");
        DeviceLoader {
            rx,
            worker: Some(worker),
            device: device_for_metrics,
        }
    }
}

impl Iterator for DeviceLoader {
    type Item = Result<DeviceBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        let waiting = std::time::Instant::now();
        match self.rx.recv() {
            Ok(batch) => {
                self.device.record_batch_wait(waiting);
                Some(batch)
            }
            // The stream ended, or the batch iterator panicked on the loader thread: say so
            // instead of ending the epoch early without a word.
            Err(_) => match self.worker.take().map(JoinHandle::join) {
                Some(Err(panic)) => {
                    let message = panic
                        .downcast_ref::<String>()
                        .map(String::as_str)
                        .or_else(|| panic.downcast_ref::<&str>().copied())
                        .unwrap_or("no message");
                    Some(Err(Error::Config(format!(
                        "the batch iterator panicked on the loader thread: {message}"
                    ))))
                }
                _ => None,
            },
        }
    }
}

impl Drop for DeviceLoader {
    fn drop(&mut self) {
        // Dropping the receiver makes the worker's next send fail, so it ends; drain nothing.
        let (_, dead) = sync_channel(0);
        drop(std::mem::replace(&mut self.rx, dead));
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// A batch of this process's rows ([`DeviceLoader::for_local_rows`]), checked to hold `rows`.
fn local_batch(batch: Vec<HostTensor>, rows: usize) -> Result<Vec<HostTensor>> {
    match fix_shape(batch, rows, LastBatch::Drop)? {
        Some((batch, _)) => Ok(batch),
        None => Err(Error::Config(format!(
            "a batch short of this process's {rows} rows: a source for local rows must fill \
             every batch"
        ))),
    }
}

/// Checks and pads (or drops) one batch of host tensors to `batch_size` rows: `Some((batch,
/// real rows))`, or `None` for "skip this batch" (a short batch under [`LastBatch::Drop`];
/// [`LastBatch::Pad`] appends zero rows). Tensors that disagree on their first dimension, or
/// more rows than `batch_size`, are an error.
pub fn fix_shape(
    batch: Vec<HostTensor>,
    batch_size: usize,
    last: LastBatch,
) -> Result<Option<(Vec<HostTensor>, usize)>> {
    let Some(first) = batch.first() else {
        return Err(Error::Config("a batch with no tensors".into()));
    };
    let rows = *first
        .dims()
        .first()
        .ok_or_else(|| Error::Config("batch tensors need a batch dimension".into()))?;
    if batch.iter().any(|t| t.dims().first() != Some(&rows)) {
        let shapes: Vec<String> = batch.iter().map(|t| format!("{:?}", t.dims())).collect();
        return Err(Error::Config(format!(
            "batch tensors disagree on the batch dimension: {}",
            shapes.join(", ")
        )));
    }
    if rows > batch_size {
        return Err(Error::Config(format!(
            "a batch of {rows} rows is larger than the batch size {batch_size}"
        )));
    }
    if rows == batch_size {
        return Ok(Some((batch, rows)));
    }
    match last {
        LastBatch::Drop => Ok(None),
        LastBatch::Pad => {
            let padded = batch
                .into_iter()
                .map(|t| {
                    let row_bytes = t.bytes().len() / rows.max(1);
                    let mut bytes = t.bytes().to_vec();
                    bytes.resize(row_bytes * batch_size, 0);
                    let mut dims = t.dims().to_vec();
                    dims[0] = batch_size;
                    HostTensor::from_bytes(t.dtype(), &dims, bytes).map_err(Error::from)
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Some((padded, rows)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize) -> Vec<HostTensor> {
        let x: Vec<f32> = (0..n * 3).map(|i| i as f32).collect();
        let y: Vec<i32> = (0..n as i32).collect();
        vec![
            HostTensor::from_slice(&x, &[n, 3]).unwrap(),
            HostTensor::from_slice(&y, &[n]).unwrap(),
        ]
    }

    #[test]
    fn full_batches_pass_partial_ones_drop_or_pad() {
        assert_eq!(
            fix_shape(rows(4), 4, LastBatch::Drop).unwrap().unwrap().1,
            4
        );
        assert!(fix_shape(rows(3), 4, LastBatch::Drop).unwrap().is_none());
        let (padded, valid) = fix_shape(rows(3), 4, LastBatch::Pad).unwrap().unwrap();
        assert_eq!(valid, 3);
        assert_eq!(padded[0].dims(), &[4, 3]);
        assert_eq!(padded[1].dims(), &[4]);
        let x = padded[0].to_vec::<f32>().unwrap();
        assert_eq!(&x[..9], &(0..9).map(|i| i as f32).collect::<Vec<_>>()[..]);
        assert_eq!(&x[9..], &[0.0, 0.0, 0.0]);
        assert_eq!(padded[1].to_vec::<i32>().unwrap(), vec![0, 1, 2, 0]);
    }

    #[test]
    fn inconsistent_batches_are_errors() {
        let mut b = rows(4);
        b[1] = HostTensor::from_slice(&[1i32, 2], &[2]).unwrap();
        assert!(fix_shape(b, 4, LastBatch::Pad).is_err());
        assert!(fix_shape(rows(5), 4, LastBatch::Pad).is_err());
    }
}
