//! Opening a device: the plugin, the client and its devices, the mesh, the rank check.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::time::Instant;

use neuron_pc_compiler::pjrt::{find_plugin, Client, ClientOptions, Device, Plugin, Target};
use neuron_pc_compiler::sharding::Mesh;

use super::inflight::InFlight;
use super::launch::Launcher;
use super::lock_order::{Rank, Ranked};
use super::trace::Recorder;
use super::{diagnose, rank_check, step, DeviceConfig, DeviceInner, LazyDevice, Metrics};
use crate::compile::CachingCompiler;
use crate::error::{Error, Result};
use crate::timeline::{Timeline, DEVICE_TRACK, HOST_TRACK, LAUNCH_TRACK};

impl LazyDevice {
    /// A device configured from the environment (see [`DeviceConfig::from_env`]).
    pub fn from_env() -> Result<LazyDevice> {
        LazyDevice::new(DeviceConfig::from_env()?)
    }

    /// A device with an explicit configuration.
    pub fn new(mut config: DeviceConfig) -> Result<LazyDevice> {
        crate::logging::init_default_with(config.debug_steps);
        config.flags.warn_unused_neuron_flags();
        let target = config.target();
        if config.replicas == 0 {
            return Err(Error::Config("a device needs at least one replica".into()));
        }
        let extracting = config.extract_dir.is_some();
        let rank_check = rank_check::RankCheck::from_env(&config.topology, extracting)?;
        // With the rank check, a refused launch is refused after it (`executables::obtain`).
        let deferred = extracting || rank_check.is_some();
        crate::topology::check_launch(&config.topology, target, deferred)?;
        if extracting {
            crate::trial::mark_trial_run();
        }
        let mesh_size: usize = config.mesh.iter().map(|(_, s)| s).product();
        if !config.mesh.is_empty() {
            if config.replicas != 1 {
                return Err(Error::Config(format!(
                    "a device mesh replaces replicas ({} asked for): split the batch over the \
                     mesh's data axis instead",
                    config.replicas
                )));
            }
            // on cpu each process lays the mesh over its own devices and the processes are
            // its replicas (data parallelism, `collectives`); elsewhere the runtime's program
            // of every process's devices would need one mesh over all of them
            if config.topology.is_multi_process() && target != Target::Cpu {
                return Err(Error::Config(format!(
                    "{target}: a device mesh spans this process's devices; a mesh across the \
                     processes of a {target} run is not supported yet (on cpu each process lays \
                     its own)"
                )));
            }
        }
        let count = if config.mesh.is_empty() {
            config.replicas
        } else {
            mesh_size
        };
        let last = config.device_index + count;
        let cap = super::config::CPU_COLLECTIVE_MAX_STEPS_IN_FLIGHT;
        if target == Target::Cpu && count > 1 && config.max_steps_in_flight > cap {
            if config.max_steps_in_flight != super::config::DEFAULT_MAX_STEPS_IN_FLIGHT {
                tracing::warn!(
                    "{} steps in flight asked for; {cap} over several cpu devices (past 32 \
                     executions a device, XLA's cpu client can starve a step's collective of \
                     threads)",
                    config.max_steps_in_flight
                );
            }
            config.max_steps_in_flight = cap;
        }
        // The cpu client makes as many devices as asked for, and sizes its thread pools as
        // max(cores, devices): ask for the devices this run uses, never the plugin's default
        // of 4 (4 pools' threads on 2 cores made every step 4-5% slower).
        let cpu_device_count = match target {
            Target::Cpu => Some(
                config
                    .cpu_device_count
                    .unwrap_or(0)
                    .max(last as i64)
                    .max(gloo_pool_devices(&config, count)),
            ),
            Target::Cuda | Target::Trn1 | Target::Trn2 => None,
        };
        let mut options = ClientOptions {
            cpu_device_count,
            ..ClientOptions::default()
        };
        let multi_process = config.topology.is_multi_process() && !extracting;
        if multi_process {
            crate::distributed::prepare(&config.topology, target, config.replicas, &mut options)?;
        }
        // ranks under mocked NCCL share one GPU
        let shared = multi_process && crate::distributed::mock_nccl_requested();
        options
            .named
            .extend(crate::distributed::allocator_options(target, shared)?);
        let plugin = Plugin::load(&find_plugin(target)?)?;
        // cpu, several processes: collectives between them are custom calls into gloo, whose
        // handlers XLA must know before the first compile (a plugin without the FFI extension
        // stops here with one line)
        let gloo = target == Target::Cpu && config.topology.is_multi_process();
        if gloo {
            register_collectives(&plugin)?;
        }
        let client = Client::new(&plugin, &options)?;
        if last > client.device_count() && !config.mesh.is_empty() {
            let axes: Vec<String> = config
                .mesh
                .iter()
                .map(|(n, s)| format!("{n} {s}"))
                .collect();
            return Err(Error::Config(format!(
                "a mesh of ({}) needs {mesh_size} devices from device {}: the {target} client \
                 has {}",
                axes.join(", "),
                config.device_index,
                client.device_count()
            )));
        }
        if last > client.device_count() {
            return Err(Error::Config(if config.replicas == 1 {
                format!(
                    "device index {} out of range: the {target} client has {} devices",
                    config.device_index,
                    client.device_count()
                )
            } else {
                format!(
                    "{} replicas from device {} need {last} devices: the {target} client has {}",
                    config.replicas,
                    config.device_index,
                    client.device_count()
                )
            }));
        }
        let devices: Vec<Device> = (config.device_index..last).map(Device).collect();
        // Several processes: on cpu each compiles over its own devices, its programs' cross-
        // process collectives made custom calls (`CachingCompiler::with_processes`); elsewhere (and
        // in the trial run for them) the program spans every process's replicas, numbered globally.
        let topology = &config.topology;
        let ids: Vec<usize> = if topology.is_multi_process() && !gloo {
            (0..topology.global_replicas(config.replicas)).collect()
        } else {
            devices.iter().map(|d| d.0).collect()
        };
        let mesh = if config.mesh.is_empty() {
            None
        } else {
            let axes: Vec<(&str, usize)> =
                config.mesh.iter().map(|(n, s)| (n.as_str(), *s)).collect();
            Some(Mesh::new(&axes, &ids).map_err(|e| Error::Config(e.to_string()))?)
        };
        let compiler = CachingCompiler::for_job(client, config.flags.clone(), &config.cache)?;
        let compiler = match &mesh {
            Some(_) => compiler.with_partitions(&ids),
            None => compiler.with_replicas(&ids),
        };
        let compiler = if gloo {
            compiler.with_processes(topology.world_size)
        } else {
            compiler
        };
        if gloo && !extracting {
            let layout = match config.mesh.is_empty() {
                true => format!("{} device(s)", devices.len()),
                false => {
                    let axes: Vec<String> = config
                        .mesh
                        .iter()
                        .map(|(n, s)| format!("{n} {s}"))
                        .collect();
                    format!("a mesh of ({})", axes.join(", "))
                }
            };
            connect_collectives(topology, config.device_index, devices.len(), &layout)?;
        }
        if !deferred {
            // a job that runs its steps: load last run's first executables while it builds
            compiler.start_prefetch();
        }
        let metrics = Metrics {
            cache_unavailable: compiler.cache_unavailable().map(str::to_string),
            replicas: if mesh.is_some() { 1 } else { devices.len() },
            partitions: compiler.partitions(),
            global_replicas: compiler.global_replicas(),
            rank: config.topology.rank,
            world_size: config.topology.world_size,
            ..Metrics::default()
        };
        // the trial run launches nothing
        let launch_thread = config.launch_thread && !extracting;
        Ok(LazyDevice {
            inner: Arc::new(DeviceInner {
                devices,
                mesh,
                compiler,
                recorder: Ranked::new(Rank::Recorder, Recorder::default()),
                executables: Ranked::new(Rank::Executables, HashMap::default()),
                metrics: Ranked::new(Rank::Metrics, metrics),
                sites: Ranked::new(Rank::Sites, diagnose::Sites::default()),
                optimizer_state: Ranked::new(Rank::Tracked, Vec::new()),
                parameters: Ranked::new(Rank::Tracked, Vec::new()),
                gradients: Ranked::new(Rank::Tracked, Vec::new()),
                index_checks: Ranked::new(Rank::IndexChecks, Vec::new()),
                remat: Ranked::new(Rank::Remat, Vec::new()),
                autocast: Ranked::new(Rank::Autocast, None),
                rank_check,
                in_flight: InFlight::default(),
                timeline: config.trace.as_ref().map(|p| {
                    let t = Timeline::new(p);
                    t.name_track(HOST_TRACK, "host: trace, step cut, compile, launch, wait");
                    t.name_track(DEVICE_TRACK, "device: execution");
                    t.name_track(LAUNCH_TRACK, "launch thread: launch calls");
                    t
                }),
                launcher: Launcher::new(launch_thread),
                walks: Ranked::new(Rank::Walks, (0, step::WalkSizes::default())),
                last_step_end: Ranked::new(Rank::LastStepEnd, Instant::now()),
                retired: Ranked::new(Rank::Retired, Default::default()),
                writes: Default::default(),
                config,
            }),
        })
    }
}

/// The cpu devices a process of a multi-process cpu run with a mesh of `local` devices asks
/// for, at least: twice its own, so that XLA's thread pool (as many threads as cores or
/// devices) has a thread for each device blocked in a call between processes (it waits for the
/// other processes) and one for the same device's collectives that XLA's partitioner put
/// inside the process (which wait for its other devices, in an order the program does not
/// fix). With fewer, on a machine of few cores, every thread of the pool can be blocked and
/// the step hangs: seen with FSDP over scanned layers, 2 processes of 2 devices on 2 cores.
/// The extra devices are never used. Replicas without a mesh are left as they were: their
/// collectives inside the process are the rewrite's own, around each call between processes,
/// no hang was seen there, and extra threads slow their steps on few cores.
fn gloo_pool_devices(config: &DeviceConfig, local: usize) -> i64 {
    match config.topology.is_multi_process() && !config.mesh.is_empty() && local > 1 {
        true => 2 * local as i64,
        false => 0,
    }
}

#[cfg(feature = "gloo")]
fn register_collectives(plugin: &Plugin) -> Result<()> {
    crate::collectives::register(plugin)
}

#[cfg(feature = "gloo")]
fn connect_collectives(
    topology: &crate::topology::Topology,
    first_device: usize,
    local: usize,
    layout: &str,
) -> Result<()> {
    let store = crate::store::from_env()?.ok_or_else(|| {
        Error::Config(format!(
            "cpu: this process is {topology}; the processes' collective groups meet through \
             the run's store: set {}=etcd://HOST:PORT",
            crate::store::STORE_ENV
        ))
    })?;
    crate::collectives::connect(&store, topology, first_device, local, layout)
}

// Without gloo a multi-process cpu run was refused before the plugin loaded (`check_launch`),
// except in a trial run, which runs nothing.
#[cfg(not(feature = "gloo"))]
fn register_collectives(_: &Plugin) -> Result<()> {
    Ok(())
}

#[cfg(not(feature = "gloo"))]
fn connect_collectives(_: &crate::topology::Topology, _: usize, _: usize, _: &str) -> Result<()> {
    Ok(())
}

impl LazyDevice {
    /// True in the trial run of `neuron-pc compile` (the child job it runs to capture the step
    /// graphs): nothing is executed and every value read is a zero-filled stand-in. The library
    /// then writes none of the user's files (checkpoints are skipped with one line each, see
    /// [`crate::trial`]); a job's own outputs (metrics files, logs, uploads, a "best model"
    /// copy) should be skipped the same way:
    ///
    /// ```no_run
    /// # fn main() -> neuron_pc::Result<()> {
    /// # let device = neuron_pc::LazyDevice::from_env()?;
    /// if !device.is_trial_run() {
    ///     std::fs::write("metrics.json", "{}").expect("metrics written");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn is_trial_run(&self) -> bool {
        self.inner.config.extract_dir.is_some()
    }

    /// The old name of [`LazyDevice::is_trial_run`] (until 0.2).
    #[deprecated(since = "0.1.1", note = "renamed `is_trial_run`")]
    pub fn is_extracting(&self) -> bool {
        self.is_trial_run()
    }
}
