//! How a lazy device is set up: from the environment (what jobs launched by `neuron-pc compile`
//! or a fleet scheduler see) or explicitly in code.

use std::path::PathBuf;

use neuron_pc_compiler::flags::CompilerFlags;
use neuron_pc_compiler::pjrt::Target;

use crate::compile::CacheConfig;
use crate::error::{Error, Result};
use crate::topology::Topology;

/// Directory that puts devices of a trial run (set by `neuron-pc compile`).
pub use crate::trial::EXTRACT_DIR_ENV;
/// Any value but `0` makes a new graph after warm-up an error.
pub const NO_NEW_GRAPHS_ENV: &str = "NEURON_PC_NO_COMPILE_AFTER_WARMUP";
/// Any value but `0` turns the step debug mode on: every step cut and, once per source line,
/// every implicit sync is logged on stderr (see `device::debug`), with no other variable set.
pub const DEBUG_STEPS_ENV: &str = "NEURON_PC_DEBUG_STEPS";
/// How many launched steps may run at once before `mark_step` waits for the oldest.
pub const MAX_IN_FLIGHT_ENV: &str = "NEURON_PC_MAX_STEPS_IN_FLIGHT";
/// `0` launches steps on the thread that cuts them (see [`DeviceConfig::launch_thread`]).
pub const LAUNCH_THREAD_ENV: &str = "NEURON_PC_LAUNCH_THREAD";
/// Bytes per device that the outputs of steps in flight may hold (`512M`, `2G`).
pub const MAX_BYTES_IN_FLIGHT_ENV: &str = "NEURON_PC_MAX_BYTES_IN_FLIGHT";
/// Steps a device may have in flight unless `NEURON_PC_MAX_STEPS_IN_FLIGHT` says otherwise.
pub const DEFAULT_MAX_STEPS_IN_FLIGHT: usize = 32;
/// Steps in flight at most over several cpu devices, whatever is asked. XLA's cpu client runs 32
/// executions of a device at once and makes a launch past that wait for its turn on a thread of
/// its pool, which has max(cores, devices) threads. A step with a collective needs a thread for
/// each of its devices at once: that wait starved the other replica of the step before it, and
/// XLA aborted the process after 40 s (`tests/training/async_exec.rs`). 16 leaves room for the
/// launch being made and for executions outside the queue.
pub const CPU_COLLECTIVE_MAX_STEPS_IN_FLIGHT: usize = 16;
/// Bytes per device the outputs of steps in flight may hold unless
/// `NEURON_PC_MAX_BYTES_IN_FLIGHT` says otherwise: 1 GiB.
pub const DEFAULT_MAX_BYTES_IN_FLIGHT: u64 = 1 << 30;
/// A file to append one JSON line per new graph to (read by `neuron-pc analyze`).
pub const GRAPH_LOG_ENV: &str = "NEURON_PC_GRAPH_LOG";
/// How many devices (replicas) a data-parallel job runs on in this process.
pub const DEVICES_ENV: &str = "NEURON_PC_DEVICES";
/// Any value but `0` turns index checks on (see [`DeviceConfig::check_indices`]).
pub const CHECK_INDICES_ENV: &str = "NEURON_PC_CHECK_INDICES";
/// PyTorch/XLA's count of CPU devices, read on the cpu target when `NEURON_PC_DEVICES` is unset.
pub const CPU_NUM_DEVICES_ENV: &str = "CPU_NUM_DEVICES";

/// Everything a [`crate::LazyDevice`] needs to start.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Compiler flags; their `target` picks the plugin.
    pub flags: CompilerFlags,
    /// The persistent compile cache ([`CacheConfig::disabled`] for none).
    pub cache: CacheConfig,
    /// Which of the client's devices to run on (the first, with several replicas).
    pub device_index: usize,
    /// Replicas of every step graph (SPMD data parallelism over devices
    /// `device_index..device_index + replicas`); 1 runs on one device.
    pub replicas: usize,
    /// A device mesh: named axes, major first, laid over devices `device_index..` (their count
    /// is the product of the sizes). Every step program is then partitioned by XLA's SPMD
    /// partitioner over the mesh, and tensors may be sharded over it (see
    /// [`crate::LazyDevice::tensor_sharded`]). Empty: no mesh. Replaces `replicas`: data
    /// parallelism on a mesh is a batch split over its `data` axis.
    pub mesh: Vec<(String, usize)>,
    /// CPU plugin: how many devices the client exposes (at least the ones this device runs
    /// on; by default exactly those).
    pub cpu_device_count: Option<i64>,
    /// The trial run: write new graphs here instead of compiling them.
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
    /// Steps that may be running at once: `mark_step` launches a step and returns, and waits
    /// for the oldest only past this bound or `max_bytes_in_flight` (1: every step is waited
    /// for before `mark_step` returns). Over several cpu devices it is at most 16: past 32
    /// executions a device, XLA's cpu client can starve a step's all-reduce of threads.
    pub max_steps_in_flight: usize,
    /// Bytes per device that the outputs of steps in flight may hold; past it, `mark_step`
    /// waits for the oldest step (never for the one it launched). Outputs that reuse a donated
    /// input count nothing, so a training step whose parameters and optimizer state are
    /// updated in place is held back by the step count alone.
    pub max_bytes_in_flight: u64,
    /// Launch each step on the device's own launch thread, so that `mark_step` returns once
    /// the step is handed over and the loop traces the next step while the runtime launches
    /// this one (as PyTorch/XLA schedules its executions). A failure to launch is then the
    /// error of the next `mark_step`, read or `synchronize`. Off (`NEURON_PC_LAUNCH_THREAD=0`):
    /// `mark_step` makes the launch call itself. The trial run always does.
    pub launch_thread: bool,
    /// Write a Chrome trace-event timeline of the device's phases here when it is dropped
    /// (`NEURON_PC_TRACE`; see [`crate::timeline`]).
    pub trace: Option<PathBuf>,
    /// This process's place in a multi-process run, from the launcher's variables.
    pub topology: Topology,
    /// Index checks: a class label (`cross_entropy`), embedding row or `gather` index outside
    /// its range is an error naming the op and its line, read at the next sync after the step
    /// that computed it (as PyTorch raises). Off by default: XLA then clamps an embedding row
    /// into the table (index 9 of 4 rows reads row 3), and an out-of-range label or gather
    /// index selects nothing (a zero). The checks add a few small outputs to every step graph.
    pub check_indices: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            flags: CompilerFlags::default(),
            cache: CacheConfig::default(),
            device_index: 0,
            replicas: 1,
            mesh: Vec::new(),
            cpu_device_count: None,
            extract_dir: None,
            warmup_steps: 2,
            fail_on_new_graph_after_warmup: false,
            debug_steps: false,
            graph_log: None,
            max_steps_in_flight: DEFAULT_MAX_STEPS_IN_FLIGHT,
            max_bytes_in_flight: DEFAULT_MAX_BYTES_IN_FLIGHT,
            launch_thread: true,
            trace: None,
            topology: Topology::single(),
            check_indices: false,
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

/// A count of at least 1 from the variable `name`.
fn count_env(name: &str, v: &str) -> Result<usize> {
    v.trim()
        .parse::<usize>()
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| {
            Error::Config(format!(
                "{name}={v:?}: expected a whole number of at least 1"
            ))
        })
}

/// A switch that is on by default from the variable `name`: `0` or `1` (empty: `default`);
/// anything else is an error rather than a guess (`false` would otherwise read as on).
fn switch_env(name: &str, v: &str, default: bool) -> Result<bool> {
    match v.trim() {
        "" => Ok(default),
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(Error::Config(format!("{name}={v:?}: expected 0 or 1"))),
    }
}

/// A size in bytes (`123`, `512M`, `2G`) from the variable `name`.
fn size_env(name: &str, v: &str) -> Result<u64> {
    neuron_pc_cache::parse_size(v)
        .ok_or_else(|| Error::Config(format!("{name}={v:?}: expected a size like 512M or 2G")))
}

impl DeviceConfig {
    /// Reads `NEURON_CC_FLAGS`, the cache's variables (see [`CacheConfig::resolve`]) and the
    /// `NEURON_PC_*` switches.
    pub fn from_env() -> Result<DeviceConfig> {
        let flags = CompilerFlags::from_env().map_err(|e| Error::Config(e.to_string()))?;
        let cache = CacheConfig::resolve(None, &flags)?;
        let replicas = match std::env::var(DEVICES_ENV) {
            Ok(v) if !v.is_empty() => count_env(DEVICES_ENV, &v)?,
            _ => match std::env::var(CPU_NUM_DEVICES_ENV) {
                Ok(v) if !v.is_empty() && flags.target == Target::Cpu => {
                    count_env(CPU_NUM_DEVICES_ENV, &v)?
                }
                _ => 1,
            },
        };
        Ok(DeviceConfig {
            replicas,
            topology: Topology::from_env()?,
            flags,
            cache,
            extract_dir: path_env(EXTRACT_DIR_ENV),
            fail_on_new_graph_after_warmup: flag_env(NO_NEW_GRAPHS_ENV),
            debug_steps: flag_env(DEBUG_STEPS_ENV),
            check_indices: flag_env(CHECK_INDICES_ENV),
            graph_log: path_env(GRAPH_LOG_ENV),
            trace: path_env(crate::timeline::TRACE_ENV),
            max_steps_in_flight: match std::env::var(MAX_IN_FLIGHT_ENV) {
                Ok(v) if !v.is_empty() => count_env(MAX_IN_FLIGHT_ENV, &v)?,
                _ => DEFAULT_MAX_STEPS_IN_FLIGHT,
            },
            max_bytes_in_flight: match std::env::var(MAX_BYTES_IN_FLIGHT_ENV) {
                Ok(v) if !v.is_empty() => size_env(MAX_BYTES_IN_FLIGHT_ENV, &v)?,
                _ => DEFAULT_MAX_BYTES_IN_FLIGHT,
            },
            launch_thread: match std::env::var(LAUNCH_THREAD_ENV) {
                Ok(v) => switch_env(LAUNCH_THREAD_ENV, &v, true)?,
                Err(_) => true,
            },
            ..DeviceConfig::default()
        })
    }

    /// This configuration with a device mesh of `axes` (name, size), major first:
    /// `with_mesh(&[("data", 2), ("model", 2)])` lays a 2 x 2 mesh over 4 devices.
    pub fn with_mesh(mut self, axes: &[(&str, usize)]) -> DeviceConfig {
        self.mesh = axes.iter().map(|(n, s)| (n.to_string(), *s)).collect();
        self
    }

    /// The target the flags select.
    pub fn target(&self) -> Target {
        self.flags.target
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_counts_from_variables() {
        let gib = size_env(MAX_BYTES_IN_FLIGHT_ENV, "2G").unwrap();
        assert_eq!(gib, 2 << 30);
        assert_eq!(
            size_env(MAX_BYTES_IN_FLIGHT_ENV, "512M").unwrap(),
            512 << 20
        );
        assert_eq!(size_env(MAX_BYTES_IN_FLIGHT_ENV, "4096").unwrap(), 4096);
        let e = size_env(MAX_BYTES_IN_FLIGHT_ENV, "lots")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("NEURON_PC_MAX_BYTES_IN_FLIGHT=\"lots\": expected a size like 512M"),
            "{e}"
        );
        assert_eq!(count_env(MAX_IN_FLIGHT_ENV, "8").unwrap(), 8);
        assert!(!switch_env(LAUNCH_THREAD_ENV, "0", true).unwrap());
        assert!(switch_env(LAUNCH_THREAD_ENV, "", true).unwrap());
        let e = switch_env(LAUNCH_THREAD_ENV, "off", true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("NEURON_PC_LAUNCH_THREAD=\"off\": expected 0 or 1"),
            "{e}"
        );
        let e = count_env(MAX_IN_FLIGHT_ENV, "0").unwrap_err().to_string();
        assert!(e.contains("expected a whole number of at least 1"), "{e}");
    }
}
