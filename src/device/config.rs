//! How a lazy device is set up: from the environment (what jobs launched by `neuron-pc compile`
//! or a fleet scheduler see) or explicitly in code.

use std::path::PathBuf;

use neuron_pc_compiler::flags::CompilerFlags;
use neuron_pc_compiler::pjrt::Target;

use crate::error::{Error, Result};

/// Directory that puts devices in extract mode (set by `neuron-pc compile`).
pub const EXTRACT_DIR_ENV: &str = "NEURON_PC_EXTRACT_DIR";
/// Any value but `0` makes a new graph after warm-up an error.
pub const NO_NEW_GRAPHS_ENV: &str = "NEURON_PC_NO_COMPILE_AFTER_WARMUP";
/// Any value but `0` turns the step debug mode on: every step cut and, once per source line,
/// every implicit sync is logged on stderr (see `device::debug`), with no other variable set.
pub const DEBUG_STEPS_ENV: &str = "NEURON_PC_DEBUG_STEPS";
/// A file to append one JSON line per new graph to (read by `neuron-pc analyze`).
pub const GRAPH_LOG_ENV: &str = "NEURON_PC_GRAPH_LOG";
/// Compile cache location (a directory, `file://...` or `s3://bucket/prefix`).
pub const CACHE_URL_ENV: &str = "NEURON_COMPILE_CACHE_URL";
/// `0` turns the persistent cache off (in-memory only).
pub const USE_CACHE_ENV: &str = "NEURON_PC_CACHE";

/// Everything a [`crate::LazyDevice`] needs to start.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Compiler flags; their `target` picks the plugin.
    pub flags: CompilerFlags,
    /// The persistent cache's URL; `None` uses the default local directory.
    pub cache_url: Option<String>,
    /// Whether to use a persistent cache at all.
    pub persistent_cache: bool,
    /// Which of the client's devices to run on.
    pub device_index: usize,
    /// CPU plugin: how many devices the client exposes.
    pub cpu_device_count: Option<i64>,
    /// Extract mode: write new graphs here instead of compiling them.
    pub extract_dir: Option<PathBuf>,
    /// Steps a mark_step site runs before a new graph there is reported as a recompile.
    pub warmup_steps: u64,
    /// Make a new graph after warm-up an error instead of a warning.
    pub fail_on_new_graph_after_warmup: bool,
    /// The step debug mode: log every step cut (site, graph key, op count, where the executable
    /// came from, time) and name each line whose read forced an implicit sync, once.
    pub debug_steps: bool,
    /// Append one JSON line per new graph here.
    pub graph_log: Option<PathBuf>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            flags: CompilerFlags::default(),
            cache_url: None,
            persistent_cache: true,
            device_index: 0,
            cpu_device_count: None,
            extract_dir: None,
            warmup_steps: 2,
            fail_on_new_graph_after_warmup: false,
            debug_steps: false,
            graph_log: None,
        }
    }
}

fn flag_env(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

fn path_env(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl DeviceConfig {
    /// Reads `NEURON_CC_FLAGS`, `NEURON_COMPILE_CACHE_URL` and the `NEURON_PC_*` switches.
    pub fn from_env() -> Result<DeviceConfig> {
        let flags = CompilerFlags::from_env().map_err(|e| Error::Config(e.to_string()))?;
        let cache_url = std::env::var(CACHE_URL_ENV)
            .ok()
            .filter(|v| !v.is_empty())
            .or_else(|| flags.cache_dir.clone());
        Ok(DeviceConfig {
            flags,
            cache_url,
            persistent_cache: std::env::var(USE_CACHE_ENV).map_or(true, |v| v != "0"),
            extract_dir: path_env(EXTRACT_DIR_ENV),
            fail_on_new_graph_after_warmup: flag_env(NO_NEW_GRAPHS_ENV),
            debug_steps: flag_env(DEBUG_STEPS_ENV),
            graph_log: path_env(GRAPH_LOG_ENV),
            ..DeviceConfig::default()
        })
    }

    /// The target the flags select.
    pub fn target(&self) -> Target {
        self.flags.target
    }
}
