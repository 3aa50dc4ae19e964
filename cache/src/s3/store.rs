//! S3 (or any S3-compatible server) as a [`Store`], through the `object_store` crate.
//!
//! The crate is async; this store owns a small current-thread tokio runtime and blocks on it,
//! so the cache's API stays synchronous. Every request is bounded: a per-request timeout, a
//! connect timeout, and a bounded number of retries within a bounded total time. After that
//! the error is [`Error::Unavailable`] (the cache warns once and goes on without the tier);
//! a refusal of our credentials is [`Error::Denied`] (a configuration error).

use std::net::IpAddr;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::aws::{AmazonS3, AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as ObjectPath;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, PutPayload, RetryConfig};

use super::{S3Options, S3_TIMEOUT_ENV, THREAD_REQUESTS};
use crate::error::{Error, Result};
use crate::store::{ObjectMeta, PutMode, Store, Tier};

/// An S3 bucket and key prefix.
pub struct S3Store {
    pub(crate) runtime: tokio::runtime::Runtime,
    /// The options, for the bounds of requests with a body ([`S3Options::request_bound`]).
    pub(crate) opts: S3Options,
    /// What sets the bounds, as messages about a request without an answer name it.
    bounds_from: String,
    pub(crate) store: AmazonS3,
    /// The same client without retries of its own, for reads of a poll ([`super::polling`]).
    once: AmazonS3,
    prefix: String,
    pub(crate) url: String,
    /// Whether the server honours `If-None-Match: *` on PUT; probed once, on the first
    /// create-only write (or by `doctor`).
    conditional: std::sync::OnceLock<bool>,
}

/// How long (at least; three times its own look and write when longer) a create-only write
/// without conditional PUT waits before reading the object back: writers racing on one name
/// have all written by then, and all read the same last writer.
const COMPARE_AFTER_WRITE_SETTLE: Duration = Duration::from_millis(250);

/// True for `localhost`, 127.0.0.0/8 and `::1`.
fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h.eq_ignore_ascii_case("localhost") || h.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The host of an `http(s)://host[:port][/...]` endpoint.
fn endpoint_host(endpoint: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = endpoint.split_once("://")?;
    let authority = rest.split('/').next()?;
    let authority = authority.rsplit('@').next()?;
    let host = if authority.starts_with('[') {
        authority.split_inclusive(']').next()?
    } else {
        authority.split(':').next()?
    };
    Some((scheme, host))
}

/// `(bucket, prefix)` of `s3://bucket/prefix`, prefix without surrounding slashes.
fn parse_url(url: &str) -> Result<(String, String)> {
    let invalid = |message: &str| Error::InvalidUrl {
        url: url.to_string(),
        message: message.to_string(),
    };
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| invalid("expected s3://bucket/prefix"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let bucket_ok = (3..=63).contains(&bucket.len())
        && bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !bucket.starts_with(['-', '.'])
        && !bucket.ends_with(['-', '.']);
    if !bucket_ok {
        return Err(invalid(
            "the bucket name must be 3-63 characters of a-z, 0-9, '-' and '.'",
        ));
    }
    let prefix = prefix.trim_matches('/');
    if prefix.split('/').any(|c| c == "." || c == "..")
        || prefix.contains("//")
        || prefix.chars().any(|c| c.is_control())
    {
        return Err(invalid(
            "the prefix may not contain '.', '..', empty components or control characters",
        ));
    }
    Ok((bucket.to_string(), prefix.to_string()))
}

/// Credentials and region of `AWS_PROFILE` from the shared files, used only when the
/// environment names no access key (object_store reads environment variables, not profiles).
fn apply_profile(mut b: AmazonS3Builder) -> AmazonS3Builder {
    let profile = std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty());
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let file = |var: &str, default: &str| {
        std::env::var_os(var)
            .map(std::path::PathBuf::from)
            .or_else(|| home.as_ref().map(|h| h.join(".aws").join(default)))
    };
    let name = profile.clone().unwrap_or_else(|| "default".to_string());
    let section = |path: Option<std::path::PathBuf>, header: &str| -> Vec<(String, String)> {
        let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else {
            return Vec::new();
        };
        let mut inside = false;
        let mut out = Vec::new();
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                inside = line.trim_matches(['[', ']']).trim() == header;
            } else if let (true, Some((k, v))) = (inside, line.split_once('=')) {
                out.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        out
    };
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        for (k, v) in section(file("AWS_SHARED_CREDENTIALS_FILE", "credentials"), &name) {
            match k.as_str() {
                "aws_access_key_id" => b = b.with_access_key_id(v),
                "aws_secret_access_key" => b = b.with_secret_access_key(v),
                "aws_session_token" => b = b.with_token(v),
                _ => {}
            }
        }
    }
    if std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none()
    {
        let header = if name == "default" {
            name.clone()
        } else {
            format!("profile {name}")
        };
        if let Some((_, v)) = section(file("AWS_CONFIG_FILE", "config"), &header)
            .into_iter()
            .find(|(k, _)| k == "region")
        {
            b = b.with_region(v);
        }
    }
    b
}

impl S3Store {
    /// Connects to `s3://bucket/prefix` with credentials, region and endpoint from the
    /// standard AWS environment variables (and `AWS_PROFILE`'s shared files). Makes no
    /// request; see [`S3Store::probe`].
    pub fn open(url: &str, opts: &S3Options) -> Result<S3Store> {
        let (bucket, prefix) = parse_url(url)?;
        let mut builder = apply_profile(AmazonS3Builder::from_env()).with_bucket_name(&bucket);
        if let Some(e) = &opts.endpoint {
            builder = builder.with_endpoint(e);
        }
        if let Some((id, secret)) = &opts.credentials {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
        }
        if builder
            .get_config_value(&AmazonS3ConfigKey::Region)
            .is_none()
            && builder
                .get_config_value(&AmazonS3ConfigKey::DefaultRegion)
                .is_none()
        {
            builder = builder.with_region("us-east-1");
        }
        let mut client = ClientOptions::new()
            .with_timeout(opts.timeout)
            .with_connect_timeout(opts.connect_timeout);
        if let Some(endpoint) = builder.get_config_value(&AmazonS3ConfigKey::Endpoint) {
            let Some((scheme, host)) = endpoint_host(&endpoint) else {
                return Err(Error::InvalidUrl {
                    url: endpoint,
                    message: "AWS_ENDPOINT_URL must look like https://host[:port]".into(),
                });
            };
            match scheme {
                "https" => {}
                "http" if is_loopback(host) => client = client.with_allow_http(true),
                "http" => {
                    return Err(Error::InvalidUrl {
                        url: endpoint.clone(),
                        message: "plain http is allowed only for loopback endpoints \
                                  (127.0.0.1, localhost, ::1); use https"
                            .into(),
                    })
                }
                other => {
                    return Err(Error::InvalidUrl {
                        url: endpoint.clone(),
                        message: format!("unsupported endpoint scheme {other}://"),
                    })
                }
            }
        }
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: opts.initial_backoff,
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: opts.max_retries,
            retry_timeout: opts.retry_timeout,
        };
        let builder = builder.with_client_options(client);
        let build = |retry: RetryConfig| {
            builder
                .clone()
                .with_retry(retry)
                .build()
                .map_err(|e| Error::InvalidUrl {
                    url: url.to_string(),
                    message: e.to_string(),
                })
        };
        let once = build(RetryConfig {
            max_retries: 0,
            ..retry.clone()
        })?;
        let store = build(retry)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|source| Error::Io {
                path: "tokio runtime".into(),
                source,
            })?;
        Ok(S3Store {
            runtime,
            opts: opts.clone(),
            bounds_from: S3_TIMEOUT_ENV.to_string(),
            store,
            once,
            prefix,
            url: url.trim_end_matches('/').to_string(),
            conditional: std::sync::OnceLock::new(),
        })
    }

    /// Names `what` (a variable, an option) in messages about requests that got no answer in
    /// time, instead of the cache's `NEURON_PC_CACHE_S3_TIMEOUT`: for a store whose bounds
    /// another setting gives (checkpoints).
    pub fn bounds_from(mut self, what: impl Into<String>) -> S3Store {
        self.bounds_from = what.into();
        self
    }

    /// Whether the server honours `If-None-Match: *` on PUT: a second create-only PUT of one
    /// probe object must be refused. Asked of the server once per store (the first create-only
    /// write, or `doctor`); a server that ignores it is reported in one loud line, and
    /// create-only writes then fall back to compare-after-write (see [`Store::put`]).
    pub fn conditional_put(&self) -> Result<bool> {
        if let Some(v) = self.conditional.get() {
            return Ok(*v);
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!(
            "locks/.conditional-put-probe.{}.{}.{nanos}",
            crate::record::hostname(),
            std::process::id()
        );
        let first = self.put_raw(&name, b"first", object_store::PutMode::Create);
        let second = first
            .as_ref()
            .ok()
            .map(|_| self.put_raw(&name, b"second", object_store::PutMode::Create));
        let _ = self.delete(&name);
        let honoured = match (first?, second.transpose()?) {
            (true, Some(false)) => true,
            // A first create-only PUT refused: a leftover of the same name; say nothing.
            (false, _) => return Ok(true),
            _ => false,
        };
        if !honoured {
            tracing::warn!(
                "compile cache: {} ignores If-None-Match: * on PUT (conditional writes): \
                 compile leases and first-writer-wins fall back to compare-after-write; set \
                 NEURON_PC_CACHE_STRICT=1 to refuse such a server",
                self.url
            );
        }
        let _ = self.conditional.set(honoured);
        Ok(honoured)
    }

    fn put_raw(&self, name: &str, bytes: &[u8], mode: object_store::PutMode) -> Result<bool> {
        let path = self.path(name);
        let payload = PutPayload::from(bytes.to_vec());
        let bound = self.opts.request_bound(bytes.len() as u64);
        let r = self.block_within(bound, self.store.put_opts(&path, payload, mode.into()))?;
        match r {
            Ok(_) => Ok(true),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Ok(false),
            Err(e) => Err(self.map(e)),
        }
    }

    /// A create-only write on a server without conditional PUT: absent when looked at, then
    /// written, then, after [`COMPARE_AFTER_WRITE_SETTLE`], read back: the writer whose bytes
    /// are there won (every racer reads the same last writer). Callers write unique bytes (a
    /// lease carries a nonce, a record its compile time).
    fn create_by_compare(&self, name: &str, bytes: &[u8]) -> Result<bool> {
        let started = std::time::Instant::now();
        if self.get(name)?.is_some() {
            return Ok(false);
        }
        self.put_raw(name, bytes, object_store::PutMode::Overwrite)?;
        // A racer's look and write take about as long as ours: on a slow server, wait longer.
        std::thread::sleep(COMPARE_AFTER_WRITE_SETTLE.max(started.elapsed() * 3));
        Ok(self.get(name)?.as_deref() == Some(bytes))
    }

    /// One listing request: `Denied` for refused or missing credentials, `InvalidUrl` for a
    /// bucket that does not exist, `Unavailable` when the server cannot be reached.
    pub fn probe(&self) -> Result<()> {
        let prefix = self.path("locks/");
        let r = self.block(async { self.store.list_with_delimiter(Some(&prefix)).await })?;
        match r {
            Ok(_) => Ok(()),
            Err(object_store::Error::NotFound { .. }) => Err(self.no_bucket()),
            Err(e) if e.to_string().contains("NoSuchBucket") => Err(self.no_bucket()),
            Err(e) => Err(self.map(e)),
        }
    }

    fn no_bucket(&self) -> Error {
        let bucket = self.url["s3://".len()..]
            .split('/')
            .next()
            .unwrap_or_default();
        Error::InvalidUrl {
            url: self.url.clone(),
            message: format!(
                "the bucket {bucket} does not exist (create it, or fix the bucket name in the URL)"
            ),
        }
    }

    /// The bound on one request of no body ([`S3Options::request_bound`] of 0 bytes).
    pub(crate) fn budget(&self) -> Duration {
        self.opts.request_bound(0)
    }

    /// Runs one operation on the runtime within the budget; running out of it is a timed-out
    /// [`Error::Unavailable`].
    fn block<T>(&self, fut: impl std::future::Future<Output = T>) -> Result<T> {
        self.block_within(self.budget(), fut)
    }

    /// [`S3Store::block`] within `bound`.
    fn block_within<T>(
        &self,
        bound: Duration,
        fut: impl std::future::Future<Output = T>,
    ) -> Result<T> {
        THREAD_REQUESTS.with(|n| n.set(n.get() + 1));
        self.runtime
            .block_on(async { tokio::time::timeout(bound, fut).await })
            .map_err(|_| self.no_answer(bound))
    }

    /// A request that got no answer within `bound`.
    fn no_answer(&self, bound: Duration) -> Error {
        Error::Unavailable {
            store: self.url.clone(),
            message: format!(
                "no answer within {:.1} s ({})",
                bound.as_secs_f64(),
                self.bounds_from
            ),
            timed_out: true,
            throttled: false,
        }
    }

    /// Everything under `base`, one page (request) at a time, each page within the per-request
    /// budget: a listing of N pages may take up to N budgets, so it grows with the work and a
    /// large cache is not cut off by a bound sized for one request.
    fn list_pages(
        &self,
        base: Option<&ObjectPath>,
    ) -> Result<std::result::Result<Vec<object_store::ObjectMeta>, object_store::Error>> {
        /// Objects per page of an S3 listing (`ListObjectsV2`'s default and maximum).
        const PAGE: usize = 1000;
        let r = self.runtime.block_on(async {
            let mut stream = self.store.list(base);
            let mut out = Vec::new();
            loop {
                if out.len() % PAGE == 0 {
                    THREAD_REQUESTS.with(|n| n.set(n.get() + 1));
                }
                // Objects of a page already received come at once; the first of each page
                // waits for its request.
                match tokio::time::timeout(self.budget(), stream.try_next()).await {
                    Err(_) => return Err(out.len()),
                    Ok(Err(e)) => return Ok(Err(e)),
                    Ok(Ok(None)) => return Ok(Ok(out)),
                    Ok(Ok(Some(m))) => out.push(m),
                }
            }
        });
        r.map_err(|listed| Error::Unavailable {
            store: self.url.clone(),
            message: format!(
                "no answer within {:.1} s for page {} of a listing ({} bounds each request; a \
                 listing may take that long per page of {PAGE} objects)",
                self.budget().as_secs_f64(),
                listed / PAGE + 1,
                self.bounds_from
            ),
            timed_out: true,
            throttled: false,
        })
    }

    /// A GET of `name` through `client`.
    fn get_with(&self, client: &AmazonS3, name: &str) -> Result<Option<Vec<u8>>> {
        let path = self.path(name);
        // the answer within the bound of a request of no body, the body within the budget
        let answer = self.budget();
        let r = self.block_within(self.opts.budget(), async {
            match tokio::time::timeout(answer, client.get(&path)).await {
                Err(_) => None,
                Ok(Err(e)) => Some(Err(e)),
                Ok(Ok(got)) => Some(got.bytes().await),
            }
        })?;
        let Some(r) = r else {
            return Err(self.no_answer(answer));
        };
        match r {
            Ok(b) => Ok(Some(b.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.map(e)),
        }
    }

    pub(crate) fn path(&self, name: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(name)
        } else {
            ObjectPath::from(format!("{}/{name}", self.prefix))
        }
    }

    pub(crate) fn map(&self, e: object_store::Error) -> Error {
        let store = self.url.clone();
        match e {
            object_store::Error::PermissionDenied { source, .. }
            | object_store::Error::Unauthenticated { source, .. } => Error::Denied {
                store,
                message: one_line(&source.to_string()),
            },
            other => {
                let message = one_line(&other.to_string());
                // Some servers answer refused signatures with 400 and an S3 error code.
                if [
                    "InvalidAccessKeyId",
                    "SignatureDoesNotMatch",
                    "AccessDenied",
                    "ExpiredToken",
                    "InvalidToken",
                ]
                .iter()
                .any(|c| message.contains(c))
                {
                    Error::Denied { store, message }
                } else if message.to_ascii_lowercase().contains("credential")
                    // No key configured: object_store asked the instance metadata service.
                    || message.contains("/latest/api/token")
                    || message.contains("/latest/meta-data/")
                {
                    Error::Denied {
                        store,
                        message: format!(
                            "no usable credentials ({message}); set AWS_ACCESS_KEY_ID and \
                             AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
                        ),
                    }
                } else {
                    let lower = message.to_ascii_lowercase();
                    // Not "timeout": every retry message names `retry_timeout`.
                    let timed_out = lower.contains("timed out");
                    // By the answer's status or code, never by bare digits (an endpoint's
                    // port may contain "503").
                    let throttled = [
                        "slowdown",
                        "503 service unavailable",
                        "429 too many requests",
                        "toomanyrequests",
                        "throttl",
                    ]
                    .iter()
                    .any(|w| lower.contains(w));
                    Error::Unavailable {
                        store,
                        message,
                        timed_out,
                        throttled,
                    }
                }
            }
        }
    }
}

fn one_line(s: &str) -> String {
    let s: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    s.chars().take(400).collect()
}

impl Store for S3Store {
    fn describe(&self) -> String {
        self.url.clone()
    }

    fn tier(&self) -> Tier {
        Tier::Remote
    }

    fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        if super::is_polling() {
            match self.get_with(&self.once, name) {
                // a look that failed otherwise than by throttling or a timeout gets the retries
                Err(Error::Unavailable {
                    throttled: false,
                    timed_out: false,
                    ..
                }) => {}
                r => return r,
            }
        }
        self.get_with(&self.store, name)
    }

    fn put(&self, name: &str, bytes: &[u8], mode: PutMode) -> Result<bool> {
        match mode {
            PutMode::Overwrite => self.put_raw(name, bytes, object_store::PutMode::Overwrite),
            PutMode::CreateOnly if self.conditional_put()? => {
                self.put_raw(name, bytes, object_store::PutMode::Create)
            }
            PutMode::CreateOnly => self.create_by_compare(name, bytes),
        }
    }

    fn conditional_put(&self) -> Result<bool> {
        S3Store::conditional_put(self)
    }

    fn delete(&self, name: &str) -> Result<()> {
        let path = self.path(name);
        match self.block(self.store.delete(&path))? {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.map(e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        // object_store lists whole path segments; list the enclosing directory and filter.
        let dir = match prefix.rsplit_once('/') {
            Some((d, _)) => d.to_string(),
            None => String::new(),
        };
        let full = if self.prefix.is_empty() {
            dir
        } else if dir.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}/{dir}", self.prefix)
        };
        let base = if full.is_empty() {
            None
        } else {
            Some(ObjectPath::from(full))
        };
        let r = self.list_pages(base.as_ref())?;
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let mut out: Vec<ObjectMeta> = r
            .map_err(|e| self.map(e))?
            .into_iter()
            .filter_map(|m| {
                let name = m.location.as_ref().strip_prefix(&strip)?.to_string();
                name.starts_with(prefix).then(|| ObjectMeta {
                    name,
                    size: m.size,
                    modified: m.last_modified.into(),
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse_url("s3://bucket/a/b/").unwrap(),
            ("bucket".into(), "a/b".into())
        );
        assert_eq!(
            parse_url("s3://bucket").unwrap(),
            ("bucket".into(), String::new())
        );
        for bad in [
            "s3://",
            "s3://B",
            "s3://ab",
            "s3://bucket/../x",
            "s3://bucket/a//b",
            "s3://-bucket/x",
            "s3://bu_cket",
            "s3://bucket/a\nb",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn loopback_hosts() {
        for (e, host, lo) in [
            ("http://127.0.0.1:9000", "127.0.0.1", true),
            ("http://127.3.4.5", "127.3.4.5", true),
            ("http://localhost:1/x", "localhost", true),
            ("http://[::1]:9000", "[::1]", true),
            ("http://10.0.0.1:9000", "10.0.0.1", false),
            ("http://localhost.evil.com", "localhost.evil.com", false),
            ("http://user@example.com:80", "example.com", false),
        ] {
            let (_, h) = endpoint_host(e).unwrap();
            assert_eq!(h, host);
            assert_eq!(is_loopback(h), lo, "{e}");
        }
    }
}
