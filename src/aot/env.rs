//! What every AOT command needs: the effective flags, the compiler (plugin, client, identity)
//! and the cache, opened the way the lazy device opens them so keys and entries agree.

use anyhow::{anyhow, Context};
use neuron_pc_cache::{Cache, CacheKey as StoreKey, CacheOptions};
use neuron_pc_compiler::flags::CompilerFlags;
use neuron_pc_compiler::key::{cache_key, CacheKey, CompilerIdentity};
use neuron_pc_compiler::pjrt::{find_plugin, Client, ClientOptions, CompileOptions, Plugin};

/// Cache URL variable (same as the device's).
pub const CACHE_URL_ENV: &str = "NEURON_COMPILE_CACHE_URL";

/// The compiler and cache of one AOT command.
pub struct AotEnv {
    pub flags: CompilerFlags,
    pub options: CompileOptions,
    pub client: Client,
    pub identity: CompilerIdentity,
    pub cache: Cache,
    /// The URL the cache was opened from, if one was named.
    pub cache_url: Option<String>,
}

impl AotEnv {
    /// Loads the target's plugin and opens the cache at `url` (or the environment's default).
    pub fn open(flags: CompilerFlags, url: Option<&str>) -> anyhow::Result<AotEnv> {
        let plugin =
            Plugin::load(&find_plugin(flags.target)?).context("loading the PJRT plugin")?;
        let client = Client::new(&plugin, &ClientOptions::default())?;
        let identity = CompilerIdentity::of(&client)?;
        let mut opts =
            CacheOptions::from_env().map_err(|e| anyhow!("compile cache options: {e}"))?;
        opts.compiler_version = identity.version_string();
        let cache_url = cache_url(&flags, url);
        let cache = match &cache_url {
            Some(u) => Cache::open(u, opts),
            None => Cache::from_env(opts),
        }
        .map_err(|e| anyhow!("compile cache: {e}"))?;
        Ok(AotEnv {
            options: neuron_pc_compiler::passes::compile_options(&flags),
            flags,
            client,
            identity,
            cache,
            cache_url,
        })
    }

    /// The key of compiling `text` here.
    pub fn key_of(&self, text: &str) -> CacheKey {
        cache_key(text, &self.options, &self.flags, &self.identity)
    }
}

/// The cache URL in effect: `url` (from `--cache`), else `NEURON_COMPILE_CACHE_URL`, else the
/// flags' cache directory; none means the cache crate's default.
pub fn cache_url(flags: &CompilerFlags, url: Option<&str>) -> Option<String> {
    url.map(str::to_string)
        .or_else(|| std::env::var(CACHE_URL_ENV).ok().filter(|v| !v.is_empty()))
        .or_else(|| flags.cache_dir.clone())
}

/// A hex key as the cache crate's key type.
pub fn store_key(hex: &str) -> anyhow::Result<StoreKey> {
    StoreKey::parse(hex).map_err(|e| anyhow!("key {hex}: {e}"))
}
