//! What every AOT command needs: the library's [`CachingCompiler`] for the effective flags, with
//! the cache resolved and opened the one way the lazy device resolves it, so keys and entries
//! agree.

use anyhow::Context;
use neuron_pc::compile::{CacheConfig, CachingCompiler};
use neuron_pc_cache::Cache;
use neuron_pc_compiler::flags::CompilerFlags;
use neuron_pc_compiler::pjrt::{find_plugin, Client, ClientOptions, Plugin, Target};

/// The compiler and cache of one AOT command.
pub struct AotEnv {
    pub compiler: CachingCompiler,
    /// How the cache was resolved (workers are started with the same location).
    pub cache: CacheConfig,
}

impl AotEnv {
    /// Loads the target's plugin and opens the cache at `url` (a `--cache` flag; `None`: the
    /// environment's or the default, see [`CacheConfig::resolve`]).
    pub fn open(flags: CompilerFlags, url: Option<&str>) -> anyhow::Result<AotEnv> {
        AotEnv::open_with_devices(flags, url, 0)
    }

    /// As [`AotEnv::open`], with a cpu client of at least `devices` devices (for programs
    /// replicated over that many).
    pub fn open_with_devices(
        flags: CompilerFlags,
        url: Option<&str>,
        devices: usize,
    ) -> anyhow::Result<AotEnv> {
        let cache = CacheConfig::resolve(url, &flags)?;
        let plugin =
            Plugin::load(&find_plugin(flags.target)?).context("loading the PJRT plugin")?;
        // One device unless a replicated program needs more (the plugin's default is 4, and
        // its thread pools grow with the device count).
        // It compiles beside the trial run and its workers, on the same GPU: memory as needed.
        let options = ClientOptions {
            cpu_device_count: (flags.target == Target::Cpu).then_some(devices.max(1) as i64),
            named: neuron_pc::distributed::allocator_options(flags.target, true)?,
            ..Default::default()
        };
        let client = Client::new(&plugin, &options)?;
        let compiler = CachingCompiler::with_cache(client, flags, &cache)?;
        Ok(AotEnv { compiler, cache })
    }

    /// The opened cache.
    pub fn cache(&self) -> &Cache {
        self.compiler
            .cache()
            .expect("CachingCompiler::with_cache always opens a cache")
    }
}
