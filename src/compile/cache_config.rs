//! Which persistent cache a process uses, decided in one place for the lazy device, the
//! ahead-of-time worker and every `neuron-pc` command.
//!
//! Precedence for the location: a `--cache` flag, then `NEURON_COMPILE_CACHE_URL`, then the
//! `--cache_dir` word of `NEURON_CC_FLAGS`, then the default local directory. `NEURON_PC_CACHE=0`
//! turns the persistent cache off. The `NEURON_PC_CACHE_*` variables (read-only, signing, local
//! tier, size bound, S3 timeouts) become the cache's options.

use std::path::PathBuf;

use neuron_pc_cache::{Cache, CacheOptions, Error as CacheError};
use neuron_pc_compiler::flags::CompilerFlags;
use neuron_pc_compiler::key::CompilerIdentity;

use crate::error::{Error, Result};

pub use neuron_pc_cache::CACHE_URL_ENV;
/// `0` turns the persistent cache off (executables are kept in memory only).
pub const USE_CACHE_ENV: &str = "NEURON_PC_CACHE";
/// `1`: a compile cache that cannot be opened or reached at start fails the job.
pub const CACHE_STRICT_ENV: &str = "NEURON_PC_CACHE_STRICT";

/// A resolved cache configuration: where, whether, and how.
#[derive(Clone, Debug)]
pub struct CacheConfig {
    /// A directory, `file:///dir` or `s3://bucket/prefix`; `None` is the default local
    /// directory ([`neuron_pc_cache::default_dir`]).
    pub url: Option<String>,
    /// Whether to use a persistent cache at all.
    pub enabled: bool,
    /// Read-only, signing, tiers, size bound, S3 timeouts.
    pub options: CacheOptions,
}

impl Default for CacheConfig {
    /// The default local directory with default options (the environment is not read: see
    /// [`CacheConfig::resolve`]).
    fn default() -> Self {
        CacheConfig {
            url: None,
            enabled: true,
            options: CacheOptions::default(),
        }
    }
}

impl CacheConfig {
    /// No persistent cache: every new graph is compiled, executables live in memory only.
    pub fn disabled() -> CacheConfig {
        CacheConfig {
            enabled: false,
            ..CacheConfig::default()
        }
    }

    /// The cache at `url` with default options.
    pub fn at(url: impl Into<String>) -> CacheConfig {
        CacheConfig {
            url: Some(url.into()),
            ..CacheConfig::default()
        }
    }

    /// The configuration in effect for `url_flag` (a command's `--cache`) under `flags` and
    /// the environment (see the module docs for the precedence).
    pub fn resolve(url_flag: Option<&str>, flags: &CompilerFlags) -> Result<CacheConfig> {
        let url = url_flag
            .filter(|u| !u.is_empty())
            .map(str::to_string)
            .or_else(|| std::env::var(CACHE_URL_ENV).ok().filter(|v| !v.is_empty()))
            .or_else(|| flags.cache_dir.clone());
        let options =
            CacheOptions::from_env().map_err(|e| Error::Config(format!("compile cache: {e}")))?;
        Ok(CacheConfig {
            url,
            enabled: std::env::var(USE_CACHE_ENV).map_or(true, |v| v != "0"),
            options,
        })
    }

    /// The location as given, or the default directory.
    pub fn location(&self) -> String {
        match &self.url {
            Some(u) => u.clone(),
            None => neuron_pc_cache::default_dir().display().to_string(),
        }
    }

    /// The directory of the local tier: the cache's directory, or for an `s3://` cache the
    /// local tier in front of it (`None` when that is turned off, or for a URL of another
    /// scheme).
    pub fn local_dir(&self) -> Option<PathBuf> {
        let location = self.location();
        if location.starts_with("s3://") {
            let o = &self.options;
            return o.local_tier.then(|| {
                o.local_dir
                    .clone()
                    .unwrap_or_else(neuron_pc_cache::default_dir)
            });
        }
        if let Some(path) = location.strip_prefix("file://") {
            return Some(PathBuf::from(path));
        }
        (!location.contains("://")).then(|| PathBuf::from(location))
    }

    /// Opens the cache; every failure is an error (what a command that looks after the cache
    /// wants). `compiler` names the compiler in failure records.
    pub fn open(
        &self,
        compiler: Option<&CompilerIdentity>,
    ) -> std::result::Result<Cache, CacheError> {
        let mut opts = self.options.clone();
        if let Some(c) = compiler {
            opts.compiler_version = c.version_string();
        }
        Cache::open(&self.location(), opts)
    }

    /// Opens the cache for a training job: no cache when disabled. A cache that cannot be
    /// opened (a missing bucket, refused or missing credentials, a root that is a symlink, an
    /// unreachable server) costs the job its cache, never the job: one error-level line now,
    /// and the reason comes back for the metrics (`cache_unavailable`); the job compiles.
    /// [`CACHE_STRICT_ENV`]`=1` makes it an error instead (a fleet that must not compile
    /// everything).
    pub fn open_for_job(
        &self,
        compiler: &CompilerIdentity,
    ) -> Result<(Option<Cache>, Option<String>)> {
        if !self.enabled {
            return Ok((None, None));
        }
        let strict = std::env::var(CACHE_STRICT_ENV).is_ok_and(|v| !v.is_empty() && v != "0");
        let (cache, problem) = match self.open(Some(compiler)) {
            Ok(cache) => {
                let down = cache.disabled_tiers();
                let mut problem =
                    (!down.is_empty()).then(|| format!("{} cannot be reached", down.join(", ")));
                // Strict mode asks now (otherwise the first create-only write asks, and a
                // server without conditional PUT gets the compare-after-write fallback).
                if strict && problem.is_none() {
                    match cache.without_conditional_put() {
                        Ok(v) if v.is_empty() => {}
                        Ok(v) => {
                            problem = Some(format!(
                                "{} ignores If-None-Match: * on PUT (no conditional writes)",
                                v.join(", ")
                            ))
                        }
                        Err(e) => problem = Some(e.to_string()),
                    }
                }
                (Some(cache), problem)
            }
            Err(e @ CacheError::InvalidKey { .. }) => {
                return Err(Error::Config(format!("compile cache: {e}")))
            }
            Err(e) => (None, Some(e.to_string())),
        };
        if let Some(p) = &problem {
            if strict {
                return Err(Error::Config(format!(
                    "compile cache unavailable: {p} ({CACHE_STRICT_ENV} is set)"
                )));
            }
            tracing::error!(
                "compile cache unavailable: {p}; this job compiles every graph itself (set \
                 {CACHE_STRICT_ENV}=1 to fail instead)"
            );
        }
        Ok((cache, problem))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flag_wins_over_the_flags_cache_dir() {
        let flags = CompilerFlags {
            cache_dir: Some("/from/flags".into()),
            ..CompilerFlags::default()
        };
        let c = CacheConfig::resolve(Some("/from/flag"), &flags).unwrap();
        assert_eq!(c.url.as_deref(), Some("/from/flag"));
        // Without the flag the environment variable (if a test runner set one) or the flags'
        // directory decides; never the default while either is present.
        let c = CacheConfig::resolve(None, &flags).unwrap();
        let want = std::env::var(CACHE_URL_ENV)
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| "/from/flags".into());
        assert_eq!(c.url.as_deref(), Some(want.as_str()));
    }

    #[test]
    fn the_local_tier_directory_of_each_kind_of_url() {
        assert_eq!(CacheConfig::at("/c").local_dir(), Some(PathBuf::from("/c")));
        assert_eq!(
            CacheConfig::at("file:///c/d").local_dir(),
            Some(PathBuf::from("/c/d"))
        );
        let mut s3 = CacheConfig::at("s3://b/p");
        s3.options.local_dir = Some("/front".into());
        assert_eq!(s3.local_dir(), Some(PathBuf::from("/front")));
        s3.options.local_tier = false;
        assert_eq!(s3.local_dir(), None);
        assert_eq!(CacheConfig::at("gs://b").local_dir(), None);
        assert_eq!(
            CacheConfig::default().local_dir(),
            Some(neuron_pc_cache::default_dir())
        );
    }

    #[test]
    fn disabled_and_default_locations() {
        assert!(!CacheConfig::disabled().enabled);
        assert_eq!(
            CacheConfig::default().location(),
            neuron_pc_cache::default_dir().display().to_string()
        );
        assert_eq!(CacheConfig::at("s3://b/p").location(), "s3://b/p");
    }
}
