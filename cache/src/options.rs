//! How a cache is opened: options, environment variables, sizes, the default directory.

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::s3::S3Options;

/// Where the cache is: a directory, `file:///dir` or `s3://bucket/prefix`.
pub const CACHE_URL_ENV: &str = "NEURON_COMPILE_CACHE_URL";
/// A secret; when set, entries are signed when written and unsigned ones are refused.
pub const SIGNING_KEY_ENV: &str = "NEURON_PC_CACHE_SIGNING_KEY";
/// `1`: never write (consumer fleets, read-only mounts or credentials).
pub const READ_ONLY_ENV: &str = "NEURON_PC_CACHE_READ_ONLY";
/// Size bound of the local tier, like `10G` or `500M`.
pub const MAX_SIZE_ENV: &str = "NEURON_PC_CACHE_MAX_SIZE";
/// `0`: no local tier in front of an `s3://` cache.
pub const LOCAL_TIER_ENV: &str = "NEURON_PC_CACHE_LOCAL_TIER";
/// Directory of the local tier in front of an `s3://` cache.
pub const LOCAL_DIR_ENV: &str = "NEURON_PC_CACHE_LOCAL_DIR";

/// How a cache is opened.
#[derive(Clone, Debug)]
pub struct CacheOptions {
    /// Never write (no entries, failure records, locks or repairs).
    pub read_only: bool,
    /// Bound on the local tier's bytes; least recently used entries go first.
    pub max_local_bytes: Option<u64>,
    /// HMAC secret: sign entries written, refuse unsigned or mis-signed ones.
    pub signing_key: Option<Vec<u8>>,
    /// How long to wait for another process compiling the same key.
    pub lock_wait: Duration,
    /// Lease length (renewed while compiling).
    pub lease_secs: u64,
    /// First pause of a process waiting on another's lease; pauses double (with jitter) up
    /// to [`CacheOptions::lock_poll_cap`].
    pub lock_poll_first: Duration,
    /// Longest pause between two looks at a lease another process holds.
    pub lock_poll_cap: Duration,
    /// Identity of the compiler, stored in failure records.
    pub compiler_version: String,
    /// neuron-pc version written into records.
    pub tool_version: String,
    /// For `s3://` caches: keep a local tier in front (read-through, write-through).
    pub local_tier: bool,
    /// That local tier's directory (default: [`default_dir`]).
    pub local_dir: Option<PathBuf>,
    /// Time bounds of S3 requests.
    pub s3: S3Options,
    /// How long an unreachable tier is skipped before it is tried again.
    pub retry_down_after: Duration,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            read_only: false,
            max_local_bytes: None,
            signing_key: None,
            lock_wait: Duration::from_secs(3600),
            lease_secs: 60,
            lock_poll_first: Duration::from_millis(50),
            lock_poll_cap: Duration::from_secs(2),
            compiler_version: String::new(),
            tool_version: env!("CARGO_PKG_VERSION").to_string(),
            local_tier: true,
            local_dir: None,
            s3: S3Options::default(),
            retry_down_after: Duration::from_secs(60),
        }
    }
}

impl CacheOptions {
    /// Options from `NEURON_PC_CACHE_READ_ONLY`, `NEURON_PC_CACHE_MAX_SIZE`,
    /// `NEURON_PC_CACHE_SIGNING_KEY`, `NEURON_PC_CACHE_LOCAL_TIER`, `NEURON_PC_CACHE_LOCAL_DIR`
    /// and `NEURON_PC_CACHE_S3_TIMEOUT`.
    pub fn from_env() -> Result<CacheOptions> {
        let max_local_bytes = match std::env::var(MAX_SIZE_ENV) {
            Ok(s) => Some(parse_size(&s).ok_or_else(|| Error::InvalidUrl {
                url: s.clone(),
                message: format!("{MAX_SIZE_ENV} must be a size like 500M or 10G"),
            })?),
            Err(_) => None,
        };
        let o = CacheOptions {
            read_only: std::env::var(READ_ONLY_ENV).is_ok_and(|v| !v.is_empty() && v != "0"),
            max_local_bytes,
            signing_key: std::env::var(SIGNING_KEY_ENV)
                .ok()
                .filter(|k| !k.is_empty())
                .map(String::into_bytes),
            local_tier: std::env::var(LOCAL_TIER_ENV).map_or(true, |v| v != "0"),
            local_dir: std::env::var_os(LOCAL_DIR_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            s3: S3Options::from_env()?,
            ..CacheOptions::default()
        };
        Ok(o)
    }
}

/// Parses `123`, `10K`, `500M`, `2G`, `1T` (binary multiples).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 1u64 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        'T' => (&s[..s.len() - 1], 1 << 40),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok()?.checked_mul(mult)
}

/// The default local cache directory: `$XDG_CACHE_HOME/neuron-pc`, else `~/.cache/neuron-pc`.
pub fn default_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("neuron-pc");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("neuron-pc")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10"), Some(10));
        assert_eq!(parse_size("2K"), Some(2048));
        assert_eq!(parse_size("500M"), Some(500 << 20));
        assert_eq!(parse_size("1g"), Some(1 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999T"), None);
    }
}
