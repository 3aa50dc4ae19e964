//! Large objects on S3 (checkpoint shards of gigabytes): written as multipart uploads and read
//! as ranged GETs, several parts at once, each part a request of its own bounded by the store's
//! per-request budget and retried on its own. One retried part costs one part's time, not the
//! whole object's, and every retry is said in one warning line.
//!
//! An object written here appears whole or not at all: S3 shows a multipart upload only when it
//! is completed, and a failed upload is aborted (best effort; a killed writer leaves an
//! incomplete upload that the bucket's lifecycle rule `AbortIncompleteMultipartUpload` removes).

use std::future::Future;

use futures::{StreamExt, TryStreamExt};
use object_store::multipart::{MultipartStore, PartId};
use object_store::{ObjectStore, PutPayload};

use super::{PartOptions, S3Store};
use crate::error::{Error, Result};

impl S3Store {
    /// Writes `bytes` as object `name`: one PUT up to [`PartOptions::part_size`], a multipart
    /// upload above it. Transient failures (5xx, throttling, dropped connections, timeouts) are
    /// retried per request with a warning each; refused credentials are not retried.
    pub fn put_large(&self, name: &str, bytes: &[u8], o: &PartOptions) -> Result<()> {
        let path = self.path(name);
        let part = o.part_size.max(1);
        if bytes.len() <= part {
            let what = format!("PUT {name}");
            let payload = PutPayload::from(bytes::Bytes::copy_from_slice(bytes));
            let put = || self.store.put(&path, payload.clone());
            let n = bytes.len() as u64;
            return self
                .runtime
                .block_on(self.retried(&what, o, n, put))
                .map(drop);
        }
        self.runtime.block_on(async {
            let what = format!("start upload of {name}");
            let id = self
                .retried(&what, o, 0, || self.store.create_multipart(&path))
                .await?;
            let parts = bytes.chunks(part).enumerate().map(|(i, chunk)| {
                let payload = PutPayload::from(bytes::Bytes::copy_from_slice(chunk));
                let (path, id) = (&path, &id);
                async move {
                    let what = format!("part {} of {name}", i + 1);
                    let put = || self.store.put_part(path, id, i, payload.clone());
                    let n = chunk.len() as u64;
                    self.retried(&what, o, n, put).await.map(|p| (i, p))
                }
            });
            let sent: Result<Vec<(usize, PartId)>> = futures::stream::iter(parts)
                .buffer_unordered(o.concurrency.max(1))
                .try_collect()
                .await;
            let done = match sent {
                Ok(mut sent) => {
                    sent.sort_by_key(|(i, _)| *i);
                    let ids: Vec<PartId> = sent.into_iter().map(|(_, p)| p).collect();
                    let what = format!("completion of {name}");
                    let complete = || self.store.complete_multipart(&path, &id, ids.clone());
                    // a server may take a while to assemble a large object
                    let n = bytes.len() as u64;
                    self.retried(&what, o, n, complete).await.map(drop)
                }
                Err(e) => Err(e),
            };
            if done.is_err() {
                let abort = self.store.abort_multipart(&path, &id);
                let _ = tokio::time::timeout(self.budget(), abort).await;
            }
            done
        })
    }

    /// Reads object `name` whole: one GET up to [`PartOptions::part_size`], ranged GETs of that
    /// size above it; `Ok(None)` when there is no such object. Retried as [`S3Store::put_large`].
    pub fn get_large(&self, name: &str, o: &PartOptions) -> Result<Option<Vec<u8>>> {
        let path = self.path(name);
        let part = o.part_size.max(1) as u64;
        self.runtime.block_on(async {
            let what = format!("HEAD {name}");
            let size = match self.retried(&what, o, 0, || self.store.head(&path)).await {
                Ok(meta) => meta.size,
                Err(Error::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            self.read_range(name, 0..size, part, o).await.map(Some)
        })
    }

    /// Bytes `range` of object `name` (a checkpoint chunk): ranged GETs of at most
    /// [`PartOptions::part_size`], several at once, each retried as [`S3Store::put_large`]
    /// retries. A missing object, or one shorter than the range, is an error.
    pub fn get_range_large(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
        o: &PartOptions,
    ) -> Result<Vec<u8>> {
        let part = o.part_size.max(1) as u64;
        self.runtime.block_on(self.read_range(name, range, part, o))
    }

    /// `range` of `name` in GETs of `part` bytes at most, in order.
    async fn read_range(
        &self,
        name: &str,
        range: std::ops::Range<u64>,
        part: u64,
        o: &PartOptions,
    ) -> Result<Vec<u8>> {
        let path = self.path(name);
        let size = range.end.saturating_sub(range.start);
        let ranges: Vec<std::ops::Range<u64>> = (0..size.div_ceil(part))
            .map(|i| range.start + i * part..range.start + ((i + 1) * part).min(size))
            .collect();
        let reads = ranges.iter().enumerate().map(|(i, r)| {
            let path = &path;
            async move {
                let what = format!("range {} of {name}", i + 1);
                let get = || self.store.get_range(path, r.clone());
                self.retried(&what, o, r.end - r.start, get).await
            }
        });
        let chunks: Vec<bytes::Bytes> = futures::stream::iter(reads)
            .buffered(o.concurrency.max(1))
            .try_collect()
            .await?;
        let mut out = Vec::with_capacity(size as usize);
        for c in chunks {
            out.extend_from_slice(&c);
        }
        if out.len() as u64 != size {
            return Err(Error::Unavailable {
                store: self.url.clone(),
                message: format!("{name}: read {} of {size} bytes", out.len()),
                timed_out: false,
                throttled: false,
            });
        }
        Ok(out)
    }

    /// Runs one request, moving `bytes`, up to `o.attempts` times, each within its bound
    /// ([`super::S3Options::request_bound`]), waiting (doubling) between tries and saying so in
    /// a warning. A missing object is [`Error::NotFound`] at once; refused credentials are not
    /// retried.
    async fn retried<T, F, Fut>(
        &self,
        what: &str,
        o: &PartOptions,
        bytes: u64,
        mut request: F,
    ) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = object_store::Result<T>>,
    {
        let bound = self.opts.request_bound(bytes);
        let mut attempt = 1;
        loop {
            let err = match tokio::time::timeout(bound, request()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(object_store::Error::NotFound { .. })) => {
                    return Err(Error::NotFound {
                        key: what.to_string(),
                        store: self.url.clone(),
                    })
                }
                Ok(Err(e)) => self.map(e),
                Err(_) => Error::Unavailable {
                    store: self.url.clone(),
                    message: format!("no answer within {:.1} s", bound.as_secs_f64()),
                    timed_out: true,
                    throttled: false,
                },
            };
            let Some(wait) = o.retry_after(what, &err, attempt) else {
                return Err(err);
            };
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}
