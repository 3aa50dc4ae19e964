//! S3 (or any S3-compatible server) as a [`Store`](crate::Store): the options and bounds here
//! always; the client itself (`object_store` on a private tokio runtime, in `store.rs` and
//! `large.rs`) only with the crate's `s3` feature, so a user who caches on a local disk never
//! builds an HTTP stack. Without the feature an `s3://` URL is one error naming the feature.

use std::time::Duration;

use crate::error::{Error, Result};

#[cfg(feature = "s3")]
mod large;
#[cfg(feature = "s3")]
mod store;

#[cfg(feature = "s3")]
pub use store::S3Store;

/// Seconds (fractions allowed) bounding one S3 request, retries included; default 6. Half of
/// it bounds each attempt, the other half the time in which retries may start. A listing is
/// bounded per page (request), so a command over a large cache gets time in proportion.
pub const S3_TIMEOUT_ENV: &str = "NEURON_PC_CACHE_S3_TIMEOUT";

/// The default of [`S3_TIMEOUT_ENV`]: a hung server costs a training job these seconds once
/// (the tier is then off for the rest of the job), not tens of seconds per operation.
pub const DEFAULT_S3_BUDGET: Duration = Duration::from_secs(6);

/// The error of an `s3://` URL in a build without the `s3` feature.
#[cfg(not(feature = "s3"))]
pub(crate) const NO_S3: &str = "this build has no S3 support: build neuron-pc with its `s3` \
                                feature (the neuron-pc binary has it)";

/// Time bounds of S3 requests.
#[derive(Clone, Debug, PartialEq)]
pub struct S3Options {
    /// Whole-request bound (connect, send, receive the body).
    pub timeout: Duration,
    /// Bound on establishing a connection.
    pub connect_timeout: Duration,
    /// Retries of one request (5xx, throttling, dropped connections).
    pub max_retries: usize,
    /// No retry starts after this much time since the first attempt.
    pub retry_timeout: Duration,
    /// First back-off between retries (doubling, with jitter).
    pub initial_backoff: Duration,
    /// Overrides `AWS_ENDPOINT_URL` (for example a server started by a test).
    pub endpoint: Option<String>,
    /// Access key id and secret, overriding the environment and profile.
    pub credentials: Option<(String, String)>,
    /// A tighter bound than [`S3Options::timeout`] on each request, fitted to it: this long
    /// for the server to answer, plus the request's body (or the range it reads) at
    /// [`S3Options::min_rate`]. A server that accepts requests and never answers (a black hole)
    /// then fails a small request in these seconds, while a large part keeps the time its
    /// bytes need. `None`: only the whole-request timeout.
    pub answer_timeout: Option<Duration>,
    /// Bytes per second a transfer is allowed at least (see [`S3Options::answer_timeout`]).
    pub min_rate: u64,
}

impl Default for S3Options {
    fn default() -> Self {
        S3Options {
            timeout: DEFAULT_S3_BUDGET / 2,
            connect_timeout: Duration::from_secs(2),
            max_retries: 3,
            retry_timeout: DEFAULT_S3_BUDGET / 2,
            initial_backoff: Duration::from_millis(100),
            endpoint: None,
            credentials: None,
            answer_timeout: None,
            min_rate: 1 << 20,
        }
    }
}

impl S3Options {
    /// Defaults, with the request timeout from `NEURON_PC_CACHE_S3_TIMEOUT` when set.
    pub fn from_env() -> Result<S3Options> {
        let mut o = S3Options::default();
        if let Ok(v) = std::env::var(S3_TIMEOUT_ENV) {
            let secs: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s < 86_400.0)
                .ok_or_else(|| Error::InvalidUrl {
                    url: v.clone(),
                    message: format!("{S3_TIMEOUT_ENV} must be a number of seconds"),
                })?;
            o.timeout = Duration::from_secs_f64(secs / 2.0);
            o.retry_timeout = o.timeout;
            o.connect_timeout = o.connect_timeout.min(o.timeout);
        }
        Ok(o)
    }

    /// The most one operation may take, retries included: after it the operation fails as
    /// timed out, whatever the server does.
    pub fn budget(&self) -> Duration {
        self.timeout + self.retry_timeout
    }

    /// The bound on one request moving `bytes` ([`S3Options::answer_timeout`]), within the
    /// whole operation's [`S3Options::budget`].
    pub fn request_bound(&self, bytes: u64) -> Duration {
        let budget = self.budget();
        match self.answer_timeout {
            None => budget,
            Some(answer) => {
                let body = Duration::from_secs_f64(bytes as f64 / self.min_rate.max(1) as f64);
                (answer + body).min(budget)
            }
        }
    }
}

thread_local! {
    /// S3 operations this thread has made (for the waiting metrics: a waiter's own requests,
    /// not those of other threads sharing the store).
    pub(super) static THREAD_REQUESTS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// S3 operations the calling thread has made so far.
pub(crate) fn thread_requests() -> u64 {
    THREAD_REQUESTS.with(|n| n.get())
}

thread_local! {
    /// This thread is polling (see [`polling`]).
    static POLLING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` as a poll: a loop that looks again soon anyway, under back-off of its own (a
/// waiter on another process's compile). Its reads are not retried by the S3 client when the
/// server throttles them (503 SlowDown): the poll's own back-off slows down instead, so a storm
/// of 503s costs one request a look, not one per client retry. Reads that fail otherwise (a
/// dropped connection, a 500) still get the usual retries.
pub(crate) fn polling<T>(f: impl FnOnce() -> T) -> T {
    let before = POLLING.with(|p| p.replace(true));
    let out = f();
    POLLING.with(|p| p.set(before));
    out
}

/// Whether this thread is inside [`polling`].
#[cfg(feature = "s3")]
fn is_polling() -> bool {
    POLLING.with(|p| p.get())
}

/// How large objects (`S3Store::put_large`, `S3Store::get_large`) are split and retried.
#[derive(Clone, Debug, PartialEq)]
pub struct PartOptions {
    /// Bytes per part (S3 needs at least 5 MiB for every part but the last); an object of at
    /// most this size is one PUT or one GET.
    pub part_size: usize,
    /// Parts in flight at once.
    pub concurrency: usize,
    /// Tries per request (part, PUT, GET, completion), the first included.
    pub attempts: usize,
    /// Wait before the first retry of a request; doubling, at most 8 s.
    pub backoff: Duration,
}

impl PartOptions {
    /// Whether try `attempt` (from 1) of `what`, which failed with `err`, is retried: the wait
    /// before the next try (doubling from [`PartOptions::backoff`], at most 8 s), said in a
    /// warning; `None` when `err` is not transient (only [`Error::Unavailable`] is) or the
    /// tries are used up. The one retry policy of large transfers and of the requests around
    /// them.
    pub fn retry_after(&self, what: &str, err: &Error, attempt: usize) -> Option<Duration> {
        let attempts = self.attempts.max(1);
        if !matches!(err, Error::Unavailable { .. }) || attempt >= attempts {
            return None;
        }
        let doublings = u32::try_from(attempt - 1).unwrap_or(u32::MAX).min(16);
        let wait = (self.backoff * 2u32.pow(doublings)).min(Duration::from_secs(8));
        tracing::warn!(
            "{what}: {err}; retry {attempt} of {} in {:.1} s",
            attempts - 1,
            wait.as_secs_f64()
        );
        Some(wait)
    }
}

impl Default for PartOptions {
    fn default() -> Self {
        PartOptions {
            part_size: 64 << 20,
            concurrency: 4,
            attempts: 5,
            backoff: Duration::from_millis(200),
        }
    }
}
