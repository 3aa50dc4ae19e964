//! Where this process stands in a multi-process run, read from the variables the launcher set.
//!
//! neuron-pc does not launch processes: torchrun (and TorchElastic on EKS), Slurm's `srun`, AWS
//! Batch multi-node parallel jobs and SageMaker training jobs do, and each tells its processes
//! their place in its own variables. [`Topology::from_env`] reads them into one value that the
//! device (replica numbering, the cross-process check), the loader (which rows of a global
//! batch are this process's) and the metrics use. When several launchers' variables are
//! present (torchrun inside a Slurm allocation sets both), the one closest to the process wins:
//! torchrun, then Slurm, then AWS Batch, then SageMaker.
//!
//! Cross-process collectives belong to the accelerator runtime behind the PJRT plugin. XLA's
//! cpu client keeps its collectives inside one process, so on cpu they run through gloo (the
//! `collectives` module, `gloo` feature), whose groups meet through the run's store; a launch
//! that lacks either is refused with one line ([`check_launch`]) unless it only extracts graphs
//! (`neuron-pc compile`).
//!
//! ```
//! use neuron_pc::topology::{Launcher, Topology};
//! # fn main() -> neuron_pc::Result<()> {
//! // What torchrun sets for the second process of the second of two nodes (2 per node);
//! // a job calls `Topology::from_env()`.
//! let vars = [("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1"), ("LOCAL_WORLD_SIZE", "2")];
//! let t = Topology::from_vars(|name| {
//!     vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
//! })?;
//! assert_eq!((t.launcher, t.node_rank, t.num_nodes), (Launcher::Torchrun, 1, 2));
//! // With 8 replicas per process, this one drives replicas 24..32 of 32.
//! assert_eq!((t.global_replica_offset(8), t.global_replicas(8)), (24, 32));
//! println!("{t}"); // rank 3/4 (node 1/2, local 1/2) via torchrun
//! # Ok(()) }
//! ```

use std::fmt;

use neuron_pc_compiler::pjrt::Target;

use crate::error::{Error, Result};

/// Which launcher's variables described this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Launcher {
    /// No launcher: one process.
    Single,
    /// torchrun / torch.distributed.run / TorchElastic (`RANK`, `WORLD_SIZE`, ...).
    Torchrun,
    /// Slurm `srun` (`SLURM_PROCID`, `SLURM_NTASKS`, ...).
    Slurm,
    /// AWS Batch multi-node parallel job (`AWS_BATCH_JOB_NODE_INDEX`, ...): one process per node.
    AwsBatch,
    /// SageMaker training job (`SM_HOSTS`, `SM_CURRENT_HOST`): one process per host.
    SageMaker,
}

impl Launcher {
    fn name(self) -> &'static str {
        match self {
            Launcher::Single => "no launcher",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "Slurm",
            Launcher::AwsBatch => "AWS Batch",
            Launcher::SageMaker => "SageMaker",
        }
    }
}

/// This process's place among the processes of a run.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Topology {
    /// Global process index, `0..world_size`.
    pub rank: usize,
    /// Processes in the run (torchrun's `WORLD_SIZE`).
    pub world_size: usize,
    /// Index among the processes of this node.
    pub local_rank: usize,
    /// Processes on this node (torchrun's `LOCAL_WORLD_SIZE`).
    pub local_world_size: usize,
    /// Index of this node, `0..num_nodes`.
    pub node_rank: usize,
    /// Nodes (machines) in the run.
    pub num_nodes: usize,
    /// Where rank 0 (the rendezvous) listens, when the launcher says.
    pub master_addr: Option<String>,
    /// The port at [`Topology::master_addr`] (`MASTER_PORT`), when set.
    pub master_port: Option<u16>,
    /// The launcher whose variables these are.
    pub launcher: Launcher,
}

impl Default for Topology {
    fn default() -> Self {
        Topology::single()
    }
}

impl fmt::Display for Topology {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rank {}/{} (node {}/{}, local {}/{}) via {}",
            self.rank,
            self.world_size,
            self.node_rank,
            self.num_nodes,
            self.local_rank,
            self.local_world_size,
            self.launcher.name()
        )
    }
}

impl Topology {
    /// One process, no launcher.
    pub fn single() -> Topology {
        Topology {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            node_rank: 0,
            num_nodes: 1,
            master_addr: None,
            master_port: None,
            launcher: Launcher::Single,
        }
    }

    /// The topology the environment describes (see the module documentation).
    pub fn from_env() -> Result<Topology> {
        Topology::from_vars(|name| std::env::var(name).ok().filter(|v| !v.trim().is_empty()))
    }

    /// The topology the variables `get` returns describe (`None`: unset).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Topology> {
        let vars = Vars(&get);
        let t = if get("RANK").is_some() || get("WORLD_SIZE").is_some() {
            vars.torchrun()?
        } else if get("SLURM_PROCID").is_some() && get("SLURM_NTASKS").is_some() {
            vars.slurm()?
        } else if get("AWS_BATCH_JOB_NODE_INDEX").is_some() {
            vars.aws_batch()?
        } else if get("SM_HOSTS").is_some() && get("SM_CURRENT_HOST").is_some() {
            vars.sagemaker()?
        } else {
            Topology::single()
        };
        t.validate()?;
        Ok(t)
    }

    /// More than one process.
    pub fn is_multi_process(&self) -> bool {
        self.world_size > 1
    }

    /// The global index of this process's first replica when every process drives `local`
    /// replicas.
    pub fn global_replica_offset(&self, local: usize) -> usize {
        self.rank * local
    }

    /// Replicas in the whole run when every process drives `local`.
    pub fn global_replicas(&self, local: usize) -> usize {
        self.world_size * local
    }

    fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Config(format!("{}: {m}", self.launcher.name())));
        if self.world_size == 0 || self.rank >= self.world_size {
            return bad(format!(
                "rank {} is not below the world size {}",
                self.rank, self.world_size
            ));
        }
        if self.local_world_size == 0 || self.local_rank >= self.local_world_size {
            return bad(format!(
                "local rank {} is not below the local world size {}",
                self.local_rank, self.local_world_size
            ));
        }
        if self.num_nodes == 0 || self.node_rank >= self.num_nodes {
            return bad(format!(
                "node {} is not below the node count {}",
                self.node_rank, self.num_nodes
            ));
        }
        Ok(())
    }
}

/// Typed reads of launcher variables, each error naming the variable and its value.
struct Vars<'a, F: Fn(&str) -> Option<String>>(&'a F);

impl<F: Fn(&str) -> Option<String>> Vars<'_, F> {
    fn get(&self, name: &str) -> Option<String> {
        (self.0)(name).map(|v| v.trim().to_string())
    }

    fn num(&self, name: &str) -> Result<Option<usize>> {
        self.get(name)
            .map(|v| {
                v.parse::<usize>()
                    .map_err(|_| Error::Config(format!("{name}={v:?}: expected a whole number")))
            })
            .transpose()
    }

    fn need(&self, name: &str, launcher: &str) -> Result<usize> {
        self.num(name)?.ok_or_else(|| {
            Error::Config(format!(
                "{launcher}: {name} is not set (the launcher sets it)"
            ))
        })
    }

    fn port(&self, name: &str) -> Result<Option<u16>> {
        self.get(name)
            .map(|v| {
                v.parse::<u16>()
                    .map_err(|_| Error::Config(format!("{name}={v:?}: expected a port number")))
            })
            .transpose()
    }

    fn torchrun(&self) -> Result<Topology> {
        let rank = self.need("RANK", "torchrun")?;
        let world_size = self.need("WORLD_SIZE", "torchrun")?;
        let local_rank = self.num("LOCAL_RANK")?.unwrap_or(rank);
        let local_world_size = self.num("LOCAL_WORLD_SIZE")?.unwrap_or(world_size);
        let num_nodes = world_size.div_ceil(local_world_size.max(1)).max(1);
        let node_rank = match self.num("GROUP_RANK")? {
            Some(n) => n,
            None => rank / local_world_size.max(1),
        };
        Ok(Topology {
            rank,
            world_size,
            local_rank,
            local_world_size,
            node_rank,
            num_nodes,
            master_addr: self.get("MASTER_ADDR"),
            master_port: self.port("MASTER_PORT")?,
            launcher: Launcher::Torchrun,
        })
    }

    fn slurm(&self) -> Result<Topology> {
        let rank = self.need("SLURM_PROCID", "Slurm")?;
        let world_size = self.need("SLURM_NTASKS", "Slurm")?;
        let node_rank = self.num("SLURM_NODEID")?.unwrap_or(0);
        let num_nodes = match self.num("SLURM_NNODES")? {
            Some(n) => n,
            None => self.num("SLURM_JOB_NUM_NODES")?.unwrap_or(1),
        };
        let local_world_size = match self.num("SLURM_NTASKS_PER_NODE")? {
            Some(n) => n,
            None => match self.get("SLURM_TASKS_PER_NODE") {
                Some(v) => tasks_on_node(&v, node_rank).ok_or_else(|| {
                    Error::Config(format!(
                        "SLURM_TASKS_PER_NODE={v:?}: expected counts like 4(x2),3 covering \
                         node {node_rank}"
                    ))
                })?,
                None => world_size.div_ceil(num_nodes.max(1)),
            },
        };
        let nodelist = self
            .get("SLURM_JOB_NODELIST")
            .or_else(|| self.get("SLURM_NODELIST"));
        Ok(Topology {
            rank,
            world_size,
            local_rank: self.num("SLURM_LOCALID")?.unwrap_or(0),
            local_world_size,
            node_rank,
            num_nodes,
            master_addr: self
                .get("MASTER_ADDR")
                .or_else(|| nodelist.as_deref().and_then(first_host)),
            master_port: self.port("MASTER_PORT")?,
            launcher: Launcher::Slurm,
        })
    }

    fn aws_batch(&self) -> Result<Topology> {
        let node = self.need("AWS_BATCH_JOB_NODE_INDEX", "AWS Batch")?;
        let nodes = self.need("AWS_BATCH_JOB_NUM_NODES", "AWS Batch")?;
        let main = self.num("AWS_BATCH_JOB_MAIN_NODE_INDEX")?.unwrap_or(0);
        // The main node is not told its own address: it listens, the others connect to it.
        let master_addr = match self.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS") {
            Some(a) => Some(a),
            None if node == main => None,
            None => {
                return Err(Error::Config(format!(
                    "AWS Batch: node {node} is not the main node ({main}) but \
                     AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is not set"
                )))
            }
        };
        Ok(Topology {
            rank: node,
            world_size: nodes,
            local_rank: 0,
            local_world_size: 1,
            node_rank: node,
            num_nodes: nodes,
            master_addr,
            master_port: self.port("MASTER_PORT")?,
            launcher: Launcher::AwsBatch,
        })
    }

    fn sagemaker(&self) -> Result<Topology> {
        let hosts_text = self.get("SM_HOSTS").unwrap_or_default();
        let hosts: Vec<String> = serde_json::from_str(&hosts_text).map_err(|_| {
            Error::Config(format!(
                "SM_HOSTS={hosts_text:?}: expected a JSON list of host names"
            ))
        })?;
        let current = self.get("SM_CURRENT_HOST").unwrap_or_default();
        let node = hosts.iter().position(|h| *h == current).ok_or_else(|| {
            Error::Config(format!(
                "SM_CURRENT_HOST={current:?} is not in SM_HOSTS {hosts:?}"
            ))
        })?;
        Ok(Topology {
            rank: node,
            world_size: hosts.len(),
            local_rank: 0,
            local_world_size: 1,
            node_rank: node,
            num_nodes: hosts.len(),
            master_addr: hosts.first().cloned(),
            master_port: self.port("MASTER_PORT")?,
            launcher: Launcher::SageMaker,
        })
    }
}

/// The task count of node `node` in Slurm's `SLURM_TASKS_PER_NODE` (`4(x2),3`: nodes 0 and 1
/// run 4 tasks, node 2 runs 3).
fn tasks_on_node(spec: &str, node: usize) -> Option<usize> {
    let mut seen = 0;
    for part in spec.split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((c, r)) => (c, r.strip_suffix(')')?.parse::<usize>().ok()?),
            None => (part, 1),
        };
        let count = count.trim().parse::<usize>().ok()?;
        if node < seen + repeat {
            return Some(count);
        }
        seen += repeat;
    }
    None
}

/// The first host of a Slurm node list (`trn1-[001-004,007],gpu9` gives `trn1-001`).
fn first_host(list: &str) -> Option<String> {
    let head = match list.find('[') {
        Some(open) if list.find(',').is_none_or(|c| c > open) => {
            let close = list[open..].find(']')? + open;
            let first = list[open + 1..close].split([',', '-']).next()?;
            format!("{}{first}", &list[..open])
        }
        _ => list.split(',').next()?.to_string(),
    };
    Some(head).filter(|h| !h.is_empty())
}

/// Refuses a launch this build cannot serve: several processes on cpu need the `gloo` feature
/// and the run's store (`NEURON_PC_STORE`), where their collective groups meet, and a cuda
/// client of several processes needs the store for its key-value callbacks (see
/// [`crate::distributed`]). Extracting graphs (`extracting`) runs nothing and is
/// always allowed.
pub fn check_launch(topology: &Topology, target: Target, extracting: bool) -> Result<()> {
    let has_store = std::env::var(crate::store::STORE_ENV).is_ok_and(|v| !v.trim().is_empty());
    check_launch_with(topology, target, extracting, has_store)
}

/// [`check_launch`] with the store's presence given.
pub fn check_launch_with(
    topology: &Topology,
    target: Target,
    extracting: bool,
    has_store: bool,
) -> Result<()> {
    if !topology.is_multi_process() || extracting {
        return Ok(());
    }
    match target {
        Target::Cpu if !cfg!(feature = "gloo") => Err(Error::Config(format!(
            "cpu: this process is {topology}; collectives between processes on cpu run through \
             gloo, which this build leaves out: build with the `gloo` feature (Debian's \
             libgloo-dev), or run one process with several devices (NEURON_PC_DEVICES=N)"
        ))),
        Target::Cpu if !has_store => Err(Error::Config(format!(
            "cpu: this process is {topology}; the processes' collective groups meet through \
             the run's store: set NEURON_PC_STORE=etcd://HOST:PORT"
        ))),
        Target::Cuda if !has_store => Err(Error::Config(format!(
            "cuda: this process is {topology}; a cuda client of several processes exchanges \
             its topology through a key-value store every process reaches: set \
             NEURON_PC_STORE=etcd://HOST:PORT (or run one process per node with \
             NEURON_PC_DEVICES set to its GPU count)"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_task_counts_and_node_lists() {
        assert_eq!(tasks_on_node("4(x2),3", 0), Some(4));
        assert_eq!(tasks_on_node("4(x2),3", 1), Some(4));
        assert_eq!(tasks_on_node("4(x2),3", 2), Some(3));
        assert_eq!(tasks_on_node("4(x2),3", 3), None);
        assert_eq!(tasks_on_node("8", 0), Some(8));
        assert_eq!(tasks_on_node("x", 0), None);
        assert_eq!(
            first_host("trn1-[001-004,007]").as_deref(),
            Some("trn1-001")
        );
        assert_eq!(first_host("node7,node9").as_deref(), Some("node7"));
        assert_eq!(first_host("gpu9,trn1-[3-4]").as_deref(), Some("gpu9"));
        assert_eq!(first_host("single").as_deref(), Some("single"));
    }
}
