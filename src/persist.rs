//! The device's view of the persistent compile cache (the `neuron-pc-cache` crate).
//!
//! A cache that cannot be opened (a missing bucket, refused or missing credentials, a root
//! that is a symlink, an unreachable server) costs a job its cache, never the job: one
//! error-level line at start, `cache_unavailable` in the metrics, and the job compiles.
//! `NEURON_PC_CACHE_STRICT=1` makes it fatal instead (a fleet that must not compile
//! everything). Invalid settings (a malformed size or timeout) are always errors.

use neuron_pc_cache::{
    Cache, CacheKey as StoreKey, CacheOptions, Error as CacheError, Obtained as CacheObtained, Tier,
};
use neuron_pc_compiler::key::{CacheKey, CompilerIdentity};

use crate::device::jit::Obtained;
use crate::error::{Error, Result};

/// An executable's serialized bytes and where they came from.
pub(crate) struct Stored {
    pub bytes: Vec<u8>,
    pub how: Obtained,
    pub compile_ms: f64,
}

pub(crate) struct Persistent {
    cache: Cache,
}

/// `1`: a compile cache that cannot be opened or reached at start fails the job.
pub const CACHE_STRICT_ENV: &str = "NEURON_PC_CACHE_STRICT";

/// The cache a job opened, or why it runs without one (or without its shared tier).
pub(crate) struct Opened {
    pub cache: Option<Persistent>,
    pub unavailable: Option<String>,
}

impl Persistent {
    /// Opens the cache at `url` (or the environment's / the default location).
    pub fn open(url: Option<&str>, compiler: &CompilerIdentity) -> Result<Opened> {
        let mut opts = CacheOptions::from_env().map_err(|e| Error::Config(e.to_string()))?;
        opts.compiler_version = compiler.version_string();
        let opened = match url {
            Some(u) => Cache::open(u, opts),
            None => Cache::from_env(opts),
        };
        let (cache, problem) = match opened {
            Ok(cache) => {
                let down = cache.disabled_tiers();
                let problem =
                    (!down.is_empty()).then(|| format!("{} cannot be reached", down.join(", ")));
                (Some(Persistent { cache }), problem)
            }
            Err(e @ CacheError::InvalidKey { .. }) => {
                return Err(Error::Config(format!("compile cache: {e}")))
            }
            Err(e) => (None, Some(e.to_string())),
        };
        if let Some(p) = &problem {
            if std::env::var(CACHE_STRICT_ENV).is_ok_and(|v| !v.is_empty() && v != "0") {
                return Err(Error::Config(format!(
                    "compile cache unavailable: {p} ({CACHE_STRICT_ENV} is set)"
                )));
            }
            tracing::error!(
                "compile cache unavailable: {p}; this job compiles every graph itself (set {CACHE_STRICT_ENV}=1 to fail instead)"
            );
        }
        Ok(Opened {
            cache,
            unavailable: problem,
        })
    }

    pub fn contains(&self, key: &str) -> bool {
        StoreKey::parse(key).is_ok_and(|k| self.cache.contains(&k))
    }

    pub fn get_or_compile(
        &self,
        key: &CacheKey,
        text: &str,
        retry_failed: bool,
        compile: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
    ) -> std::result::Result<Stored, String> {
        let k = StoreKey::parse(&key.hex).map_err(|e| e.to_string())?;
        let tier = |t: Tier| {
            if t == Tier::Local {
                Obtained::Disk
            } else {
                Obtained::Remote
            }
        };
        match self
            .cache
            .get_or_compile(&k, text, &key.components, retry_failed, compile)
        {
            Ok(CacheObtained::Hit(h)) => Ok(Stored {
                bytes: h.executable,
                how: tier(h.tier),
                compile_ms: 0.0,
            }),
            Ok(CacheObtained::Waited(h)) => Ok(Stored {
                bytes: h.executable,
                how: Obtained::Waited,
                compile_ms: 0.0,
            }),
            Ok(CacheObtained::Compiled {
                executable,
                compile_ms,
            }) => Ok(Stored {
                bytes: executable,
                how: Obtained::Compiled,
                compile_ms,
            }),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Overwrites an entry that could not be loaded with a fresh compilation.
    pub fn replace(&self, key: &CacheKey, text: &str, bytes: Vec<u8>, compile_ms: f64) {
        if let Ok(k) = StoreKey::parse(&key.hex) {
            self.cache
                .replace(&k, &bytes, text, &key.components, compile_ms);
        }
    }
}
