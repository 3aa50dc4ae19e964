//! The trial run's protocol between a job and `neuron-pc compile` / `analyze`, written by the lazy
//! device and read by the command line with these same types.
//!
//! - The trial run (`NEURON_PC_EXTRACT_DIR=dir`): each new graph not already cached becomes
//!   `<key>.mlir` (the program) and then `<key>.json` (a [`GraphRecord`]), each through a
//!   temporary name and a rename. The record is written last, so a reader that sees a record
//!   always sees the whole program.
//! - The graph log (`NEURON_PC_GRAPH_LOG=file`): one [`GraphLogLine`] of JSON per new graph of
//!   a real run, which `analyze --log` compares with a trial run.
//!
//! What `neuron-pc compile` reads from a trial run's directory:
//!
//! ```no_run
//! use std::path::Path;
//! use neuron_pc::compile::extract::GraphRecord;
//! # fn main() -> std::io::Result<()> {
//! for entry in std::fs::read_dir("extract")? {
//!     let path = entry?.path();
//!     if path.extension().is_some_and(|e| e == "json") {
//!         let record = GraphRecord::read(&path)?; // written after its <key>.mlir
//!         println!("{} from {}: {} ops", record.key, record.site, record.nodes);
//!     }
//! }
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::panic::Location;
use std::path::Path;

use neuron_pc_compiler::ir::Graph;

use super::ProgramKey;
use crate::error::{Error, Result};

/// What the `<key>.json` record of an extracted graph holds.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GraphRecord {
    /// The graph's cache key (64 hex characters); also the file names' stem.
    pub key: String,
    /// The named components the key was computed from (`flag.*`, `compiler.*`, ...): what
    /// `neuron-pc analyze` compares to say why two keys differ.
    #[serde(default)]
    pub components: BTreeMap<String, String>,
    /// Ops in the graph (parameters excluded).
    #[serde(default)]
    pub nodes: usize,
    /// Parameter types, like `f32[64,32]`.
    #[serde(default)]
    pub params: Vec<String>,
    /// The name of each parameter's tensor (`mlp.0.weight`, `ids`), `""` when unnamed.
    #[serde(default)]
    pub param_names: Vec<String>,
    /// Output types, like `f32[64,32]`.
    #[serde(default)]
    pub outputs: Vec<String>,
    /// The user's source line of the mark_step (or read) that produced it.
    #[serde(default)]
    pub site: String,
    /// Process id of the job that produced it.
    #[serde(default)]
    pub pid: u32,
    /// The device of each replica of a data-parallel program (empty: one device); compiled
    /// with this assignment, which is part of the key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicas: Vec<usize>,
    /// The devices are a mesh's, the program partitioned over them by XLA's SPMD partitioner
    /// (one replica, `replicas.len()` partitions), not replicas.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partitioned: bool,
}

impl GraphRecord {
    /// The record of `graph`, keyed `key`, cut at `site`, its parameters named `names`.
    pub fn new(
        key: &ProgramKey,
        graph: &Graph,
        site: &Location<'_>,
        names: &[String],
    ) -> GraphRecord {
        GraphRecord {
            key: key.hex().to_string(),
            components: key.inputs.components.clone(),
            nodes: graph.op_count(),
            params: param_types(graph),
            param_names: names.to_vec(),
            outputs: graph
                .outputs()
                .iter()
                .map(|&o| graph.node_type(o).to_string())
                .collect(),
            site: site.to_string(),
            pid: std::process::id(),
            replicas: Vec::new(),
            partitioned: false,
        }
    }

    /// Reads one `<key>.json` record.
    pub fn read(path: &Path) -> std::io::Result<GraphRecord> {
        let bytes = std::fs::read(path)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}

fn param_types(graph: &Graph) -> Vec<String> {
    graph
        .parameter_types()
        .iter()
        .map(|t| t.to_string())
        .collect()
}

/// Writes one extracted graph into `dir`: the program, then its record.
pub(crate) fn write_graph(
    dir: &Path,
    program: &super::Program,
    graph: &Graph,
    site: &Location<'_>,
    names: &[String],
) -> Result<()> {
    let (key, text) = (&program.key, &program.text);
    let err = |e: std::io::Error| Error::Extract(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(err)?;
    let mut record = GraphRecord::new(key, graph, site, names);
    if program.options.num_replicas > 1 || program.options.num_partitions > 1 {
        record.replicas = program.options.device_assignment.clone();
        record.partitioned = program.options.num_partitions > 1;
    }
    let json = serde_json::to_vec_pretty(&record).map_err(|e| Error::Extract(e.to_string()))?;
    let write = crate::state_dict::write_atomic;
    write(&dir.join(format!("{key}.mlir")), text.as_bytes()).map_err(err)?;
    write(&dir.join(format!("{key}.json")), &json).map_err(err)
}

/// One line of the graph log: a graph this run needed, and the step it first appeared at.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GraphLogLine {
    /// The graph's cache key (64 hex characters).
    pub key: String,
    /// The step it first appeared at: the device's `mark_step` count then.
    pub step: u64,
    /// Ops in the graph (parameters excluded).
    #[serde(default)]
    pub nodes: usize,
    /// Parameter types, like `f32[64,32]`.
    #[serde(default)]
    pub params: Vec<String>,
    /// As in [`GraphRecord::param_names`].
    #[serde(default)]
    pub param_names: Vec<String>,
    /// The user's source line of the mark_step (or read) that produced it.
    #[serde(default)]
    pub site: String,
}

/// Appends to the graph log; a failure is a warning (the log is a diagnostic aid).
pub(crate) fn append_graph_log(
    path: &Path,
    key: &ProgramKey,
    graph: &Graph,
    site: &Location<'_>,
    step: u64,
    names: &[String],
) {
    let line = GraphLogLine {
        key: key.hex().to_string(),
        step,
        nodes: graph.op_count(),
        params: param_types(graph),
        param_names: names.to_vec(),
        site: site.to_string(),
    };
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let mut text = serde_json::to_string(&line).map_err(std::io::Error::other)?;
        text.push('\n');
        f.write_all(text.as_bytes())
    })();
    if let Err(e) = result {
        tracing::warn!("graph log {}: {e}", path.display());
    }
}
