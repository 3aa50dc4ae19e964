//! The device's view of the persistent compile cache (the `neuron-pc-cache` crate).
//!
//! Bad configuration (an invalid URL, credentials the storage refuses) is an error when the
//! device starts; any other storage trouble is a warning and the job goes on compiling.

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

impl Persistent {
    /// Opens the cache at `url` (or the environment's / the default location).
    pub fn open(url: Option<&str>, compiler: &CompilerIdentity) -> Result<Option<Persistent>> {
        let mut opts = CacheOptions::from_env().map_err(|e| Error::Config(e.to_string()))?;
        opts.compiler_version = compiler.version_string();
        let opened = match url {
            Some(u) => Cache::open(u, opts),
            None => Cache::from_env(opts),
        };
        match opened {
            Ok(cache) => Ok(Some(Persistent { cache })),
            Err(e @ (CacheError::InvalidUrl { .. } | CacheError::Denied { .. })) => {
                Err(Error::Config(format!("compile cache: {e}")))
            }
            Err(e) => {
                tracing::warn!("compile cache unavailable ({e}); compiling without it");
                Ok(None)
            }
        }
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
