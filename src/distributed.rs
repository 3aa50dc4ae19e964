//! What a process of a multi-process run tells its accelerator's runtime, each a pure function
//! of the launcher's [`Topology`] (and of the devices each process drives):
//!
//! - cuda: the PJRT client's options `node_id` (this process), `num_nodes` (the processes)
//!   and, with several processes on one machine, `visible_devices` (the GPUs this process
//!   drives), plus the key-value callbacks through the run's store (the client exchanges its
//!   topology and NCCL ids through them);
//! - Neuron: the runtime's variables, set before the plugin initialises as torch-neuronx does:
//!   `NEURON_RT_ROOT_COMM_ID` (where rank 0's collectives bootstrap listens),
//!   `NEURON_PJRT_PROCESS_INDEX`, `NEURON_PJRT_PROCESSES_NUM_DEVICES` (the devices of every
//!   process) and `NEURON_RT_VISIBLE_CORES` (this process's cores on its machine).
//!
//! Every process compiles the same program over the global replica count with a global device
//! assignment (`device/mod.rs`) and feeds its own devices. None of this has run on a GPU or a
//! Trainium here (no such machine); the functions are unit-tested, and `check_launch` lets a
//! multi-process cuda run start only with a store to hand the callbacks.
//!
//! ```
//! use neuron_pc::distributed::{cuda_client_options, neuron_process_env};
//! use neuron_pc::topology::Topology;
//! # fn main() -> neuron_pc::Result<()> {
//! // Rank 3 of 4, the second of two processes on its machine (as torchrun says).
//! let vars = [("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")];
//! let t = Topology::from_vars(|name| {
//!     vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
//! })?;
//!
//! // On Trainium, with 2 NeuronCores per process: this process drives cores 2 and 3.
//! let env = neuron_process_env(&t, 2);
//! assert!(env.contains(&("NEURON_PJRT_PROCESS_INDEX", "3".to_string())));
//! assert!(env.contains(&("NEURON_PJRT_PROCESSES_NUM_DEVICES", "2,2,2,2".to_string())));
//! assert!(env.contains(&("NEURON_RT_VISIBLE_CORES", "2-3".to_string())));
//!
//! // On cuda, with 2 GPUs per process: `node_id` 3 of 4 processes, GPUs 2 and 3 of the machine.
//! let names: Vec<String> = cuda_client_options(&t, 2).into_iter().map(|(k, _)| k).collect();
//! assert_eq!(names, ["node_id", "num_nodes", "visible_devices"]);
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use neuron_pc_compiler::pjrt::{ClientOptions, KeyValueStore, KvError, OptionValue, Target};

use crate::error::{Error, Result};
use crate::store::{KvStore, ScopedStore, StoreError};
use crate::topology::Topology;

/// The cuda plugin's client options for `replicas` devices per process.
pub fn cuda_client_options(t: &Topology, replicas: usize) -> Vec<(String, OptionValue)> {
    if !t.is_multi_process() {
        return Vec::new();
    }
    let mut options = vec![
        ("node_id".to_string(), OptionValue::Int64(t.rank as i64)),
        (
            "num_nodes".to_string(),
            OptionValue::Int64(t.world_size as i64),
        ),
    ];
    if t.local_world_size > 1 {
        // several processes share the machine's GPUs: each drives its own block of them
        let first = (t.local_rank * replicas) as i64;
        let devices = (first..first + replicas as i64).collect();
        options.push((
            "visible_devices".to_string(),
            OptionValue::Int64List(devices),
        ));
    }
    options
}

/// `1`: the cuda client mocks NCCL (the plugin's `enable_mock_nccl`), so the processes of a
/// multi-process run may share one GPU; collectives then compute nothing real. For testing the
/// multi-process plumbing (`scripts/gpu-check`) on a machine with one GPU.
pub const CUDA_MOCK_NCCL_ENV: &str = "NEURON_PC_CUDA_MOCK_NCCL";

/// Whether [`CUDA_MOCK_NCCL_ENV`] is `1`.
pub fn mock_nccl_requested() -> bool {
    std::env::var(CUDA_MOCK_NCCL_ENV).is_ok_and(|v| v == "1")
}

/// `options` with the plugin's `enable_mock_nccl` when `mock`: every process then drives the
/// machine's first GPU, so `visible_devices` is left out.
pub fn mock_nccl(
    mut options: Vec<(String, OptionValue)>,
    mock: bool,
) -> Vec<(String, OptionValue)> {
    if mock && !options.is_empty() {
        options.retain(|(k, _)| k != "visible_devices");
        options.push(("enable_mock_nccl".to_string(), OptionValue::Bool(true)));
    }
    options
}

/// JAX's allocator variables, which the cuda plugin's client takes as options of its own:
/// `XLA_PYTHON_CLIENT_PREALLOCATE` (`preallocate`), `XLA_PYTHON_CLIENT_MEM_FRACTION`
/// (`memory_fraction`) and `XLA_PYTHON_CLIENT_ALLOCATOR` (`allocator`).
pub const CUDA_ALLOCATOR_ENV: [(&str, &str); 3] = [
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "preallocate"),
    ("XLA_PYTHON_CLIENT_MEM_FRACTION", "memory_fraction"),
    ("XLA_PYTHON_CLIENT_ALLOCATOR", "allocator"),
];

/// The cuda client's allocator options from JAX's variables (read through `var`), as JAX reads
/// them. The plugin's own default is to take 75% of the GPU's memory at start; a process that
/// shares its GPU with others of the same run (`shared`: the compile command and its workers
/// beside the trial run, ranks under mocked NCCL) takes memory as it needs it instead, unless
/// the user said otherwise, so that the second process on the GPU is not refused its memory.
pub fn cuda_allocator_options(
    shared: bool,
    var: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, OptionValue)>> {
    let mut options = Vec::new();
    let [(pre_env, pre), (frac_env, frac), (alloc_env, alloc)] = CUDA_ALLOCATOR_ENV;
    match var(pre_env).as_deref().map(str::trim) {
        None if shared => options.push((pre.to_string(), OptionValue::Bool(false))),
        None => {}
        Some(v) => {
            let b = match v.to_ascii_lowercase().as_str() {
                "1" | "true" => true,
                "0" | "false" => false,
                _ => {
                    return Err(Error::Config(format!(
                        "{pre_env}={v:?}: expected true or false"
                    )))
                }
            };
            options.push((pre.to_string(), OptionValue::Bool(b)));
        }
    }
    if let Some(v) = var(frac_env) {
        match v.trim().parse::<f32>() {
            Ok(x) if x > 0.0 && x <= 1.0 => options.push((frac.to_string(), OptionValue::Float(x))),
            _ => {
                return Err(Error::Config(format!(
                    "{frac_env}={v:?}: expected a fraction of the GPU's memory in (0, 1], e.g. .5"
                )))
            }
        }
    }
    if let Some(v) = var(alloc_env) {
        let v = v.trim().to_ascii_lowercase();
        if !["default", "platform", "bfc", "cuda_async"].contains(&v.as_str()) {
            return Err(Error::Config(format!(
                "{alloc_env}={v:?}: expected default, platform, bfc or cuda_async"
            )));
        }
        options.push((alloc.to_string(), OptionValue::String(v)));
    }
    Ok(options)
}

/// [`cuda_allocator_options`] from the process's environment; none for other targets.
pub fn allocator_options(target: Target, shared: bool) -> Result<Vec<(String, OptionValue)>> {
    match target {
        Target::Cuda => cuda_allocator_options(shared, |k| std::env::var(k).ok()),
        _ => Ok(Vec::new()),
    }
}

/// The Neuron runtime's variables for `cores` NeuronCores per process, rank 0's collectives
/// bootstrap listening on `root_port` of the launcher's master address.
pub fn neuron_runtime_env(
    t: &Topology,
    cores: usize,
    root_port: u16,
) -> Result<Vec<(&'static str, String)>> {
    if !t.is_multi_process() {
        return Ok(Vec::new());
    }
    let Some(addr) = t.master_addr.as_deref() else {
        return Err(Error::Config(format!(
            "neuron: this process is {t}, but the launcher named no master address for the \
             collectives' bootstrap: set MASTER_ADDR (or NEURON_RT_ROOT_COMM_ID=HOST:PORT)"
        )));
    };
    let mut env = vec![("NEURON_RT_ROOT_COMM_ID", format!("{addr}:{root_port}"))];
    env.extend(neuron_process_env(t, cores));
    Ok(env)
}

/// The Neuron runtime's per-process variables (all but the bootstrap address).
pub fn neuron_process_env(t: &Topology, cores: usize) -> Vec<(&'static str, String)> {
    let first = t.local_rank * cores;
    let visible = if cores == 1 {
        first.to_string()
    } else {
        format!("{first}-{}", first + cores - 1)
    };
    vec![
        ("NEURON_PJRT_PROCESS_INDEX", t.rank.to_string()),
        (
            "NEURON_PJRT_PROCESSES_NUM_DEVICES",
            vec![cores.to_string(); t.world_size].join(","),
        ),
        ("NEURON_RT_VISIBLE_CORES", visible),
    ]
}

/// The port rank 0's Neuron collectives bootstrap listens on: `NEURON_RT_PORT` when set, else
/// a free port rank 0 picks and publishes in the run's store, which the other ranks read.
pub fn neuron_root_port(t: &Topology, store: Option<&ScopedStore>) -> Result<u16> {
    if let Ok(v) = std::env::var("NEURON_RT_PORT") {
        return v
            .trim()
            .parse()
            .map_err(|_| Error::Config(format!("NEURON_RT_PORT={v:?}: expected a port number")));
    }
    let Some(store) = store else {
        return Err(Error::Config(format!(
            "neuron: this process is {t}; the collectives' bootstrap port must be agreed: set \
             NEURON_RT_PORT (the same on every process), NEURON_RT_ROOT_COMM_ID=HOST:PORT, or \
             NEURON_PC_STORE so that rank 0 publishes a free one"
        )));
    };
    const KEY: &str = "neuron/root_port";
    if t.rank == 0 {
        let port = std::net::TcpListener::bind(("0.0.0.0", 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| Error::Config(format!("neuron: no free port for the bootstrap: {e}")))?
            .port();
        store.set(KEY, port.to_string().as_bytes())?;
        return Ok(port);
    }
    let value = store.get(KEY, store_wait())?;
    String::from_utf8_lossy(&value)
        .trim()
        .parse()
        .map_err(|_| Error::Config(format!("neuron: rank 0 published a bad port {value:?}")))
}

/// Sets up a multi-process run's runtime before its plugin loads: the cuda client's options
/// and key-value store, or the Neuron runtime's variables (those the user set are kept).
pub fn prepare(
    t: &Topology,
    target: Target,
    replicas: usize,
    options: &mut ClientOptions,
) -> Result<()> {
    match target {
        Target::Cpu => Ok(()),
        Target::Cuda => {
            let Some(store) = crate::store::from_env()? else {
                return crate::topology::check_launch_with(t, target, false, false);
            };
            let mock = mock_nccl_requested();
            options
                .named
                .extend(mock_nccl(cuda_client_options(t, replicas), mock));
            options.kv_store = Some(pjrt_kv(&store));
            Ok(())
        }
        Target::Trn1 | Target::Trn2 => {
            let env = if std::env::var_os("NEURON_RT_ROOT_COMM_ID").is_none() {
                let store = crate::store::from_env()?;
                neuron_runtime_env(t, replicas, neuron_root_port(t, store.as_ref())?)?
            } else {
                neuron_process_env(t, replicas)
            };
            for (name, value) in env {
                if std::env::var_os(name).is_none() {
                    // before the plugin (and the runtime it loads) reads its environment
                    std::env::set_var(name, value);
                }
            }
            Ok(())
        }
    }
}

/// How long a rank waits for rank 0's port at start: the rank check's default wait (reading
/// its variable here would make `distributed` and `device` use each other).
fn store_wait() -> Duration {
    Duration::from_secs(300)
}

/// The run's store as the PJRT client's key-value store (under `pjrt/` in the run's namespace).
pub struct PjrtKv(pub ScopedStore);

impl PjrtKv {
    fn key(key: &str) -> String {
        format!("pjrt/{key}")
    }
}

fn kv_error(e: StoreError) -> KvError {
    match e {
        StoreError::Timeout { .. } => KvError::NotFound(e.to_string()),
        other => KvError::Failed(other.to_string()),
    }
}

impl KeyValueStore for PjrtKv {
    fn get(&self, key: &str, timeout: Duration) -> std::result::Result<Vec<u8>, KvError> {
        self.0.get(&Self::key(key), timeout).map_err(kv_error)
    }

    fn try_get(&self, key: &str) -> std::result::Result<Vec<u8>, KvError> {
        match self.0.try_get(&Self::key(key)).map_err(kv_error)? {
            Some(v) => Ok(v),
            None => Err(KvError::NotFound(format!("{key} is not set"))),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> std::result::Result<(), KvError> {
        self.0.set(&Self::key(key), value).map_err(kv_error)
    }
}

/// The client's key-value store for a multi-process cuda run.
pub fn pjrt_kv(store: &ScopedStore) -> Arc<dyn KeyValueStore> {
    Arc::new(PjrtKv(store.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Launcher;

    fn topo(rank: usize, world: usize, local_rank: usize, local_world: usize) -> Topology {
        Topology {
            rank,
            world_size: world,
            local_rank,
            local_world_size: local_world,
            node_rank: rank / local_world,
            num_nodes: world / local_world,
            master_addr: Some("10.1.2.3".into()),
            master_port: Some(29500),
            launcher: Launcher::Torchrun,
        }
    }

    #[test]
    fn cuda_options_name_the_process_and_its_gpus() {
        assert!(cuda_client_options(&Topology::single(), 8).is_empty());
        // one process per node with all 8 GPUs: no visible_devices
        assert_eq!(
            cuda_client_options(&topo(3, 4, 0, 1), 8),
            vec![
                ("node_id".to_string(), OptionValue::Int64(3)),
                ("num_nodes".to_string(), OptionValue::Int64(4)),
            ]
        );
        // 4 processes per machine, 2 GPUs each: local rank 2 drives GPUs 4 and 5
        let o = cuda_client_options(&topo(6, 8, 2, 4), 2);
        assert_eq!(o[0].1, OptionValue::Int64(6));
        assert_eq!(o[1].1, OptionValue::Int64(8));
        assert_eq!(
            o[2],
            ("visible_devices".into(), OptionValue::Int64List(vec![4, 5]))
        );
    }

    #[test]
    fn allocator_options_follow_jax_variables_and_shared_gpus_take_memory_as_needed() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert!(cuda_allocator_options(false, env(&[])).unwrap().is_empty());
        assert_eq!(
            cuda_allocator_options(true, env(&[])).unwrap(),
            vec![("preallocate".to_string(), OptionValue::Bool(false))]
        );
        let all = env(&[
            ("XLA_PYTHON_CLIENT_PREALLOCATE", "true"),
            ("XLA_PYTHON_CLIENT_MEM_FRACTION", ".25"),
            ("XLA_PYTHON_CLIENT_ALLOCATOR", "Platform"),
        ]);
        // the user's word wins over the shared default
        assert_eq!(
            cuda_allocator_options(true, all).unwrap(),
            vec![
                ("preallocate".to_string(), OptionValue::Bool(true)),
                ("memory_fraction".to_string(), OptionValue::Float(0.25)),
                (
                    "allocator".to_string(),
                    OptionValue::String("platform".into())
                ),
            ]
        );
        for (bad, names) in [
            (
                env(&[("XLA_PYTHON_CLIENT_PREALLOCATE", "yes")]),
                "PREALLOCATE",
            ),
            (
                env(&[("XLA_PYTHON_CLIENT_MEM_FRACTION", "1.5")]),
                "MEM_FRACTION",
            ),
            (
                env(&[("XLA_PYTHON_CLIENT_MEM_FRACTION", "half")]),
                "MEM_FRACTION",
            ),
            (env(&[("XLA_PYTHON_CLIENT_ALLOCATOR", "slab")]), "ALLOCATOR"),
        ] {
            let e = cuda_allocator_options(false, bad).unwrap_err().to_string();
            assert!(e.contains(names) && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn mock_nccl_shares_the_gpu_and_only_for_multi_process_runs() {
        let two_on_one = cuda_client_options(&topo(1, 2, 1, 2), 1);
        assert_eq!(mock_nccl(two_on_one.clone(), false), two_on_one);
        assert_eq!(
            mock_nccl(two_on_one, true),
            vec![
                ("node_id".to_string(), OptionValue::Int64(1)),
                ("num_nodes".to_string(), OptionValue::Int64(2)),
                ("enable_mock_nccl".to_string(), OptionValue::Bool(true)),
            ]
        );
        assert!(mock_nccl(Vec::new(), true).is_empty());
    }

    #[test]
    fn neuron_variables_split_the_cores_and_name_the_bootstrap() {
        assert!(neuron_runtime_env(&Topology::single(), 32, 1)
            .unwrap()
            .is_empty());
        // two trn1.32xlarge nodes, one process each with all 32 cores
        let env = neuron_runtime_env(&topo(1, 2, 0, 1), 32, 62182).unwrap();
        assert_eq!(
            env,
            vec![
                ("NEURON_RT_ROOT_COMM_ID", "10.1.2.3:62182".to_string()),
                ("NEURON_PJRT_PROCESS_INDEX", "1".to_string()),
                ("NEURON_PJRT_PROCESSES_NUM_DEVICES", "32,32".to_string()),
                ("NEURON_RT_VISIBLE_CORES", "0-31".to_string()),
            ]
        );
        // 32 processes of one core on one node: process 5 has core 5
        let env = neuron_runtime_env(&topo(5, 32, 5, 32), 1, 7000).unwrap();
        assert_eq!(env[2].1.split(',').count(), 32);
        assert_eq!(env[3], ("NEURON_RT_VISIBLE_CORES", "5".to_string()));
        // 4 processes of 8 cores: local rank 3 has cores 24-31
        let env = neuron_runtime_env(&topo(7, 8, 3, 4), 8, 7000).unwrap();
        assert_eq!(env[3].1, "24-31");
        let mut no_addr = topo(1, 2, 0, 1);
        no_addr.master_addr = None;
        let e = neuron_runtime_env(&no_addr, 32, 1).unwrap_err().to_string();
        assert!(e.contains("MASTER_ADDR"), "{e}");
    }
}
