//! Files that extract mode and the graph log write for `neuron-pc compile` and `analyze`.
//!
//! Extract mode writes `<key>.mlir` (the program) and then `<key>.json` (its record); the record
//! is written last, each file via a temporary name and a rename, so a reader that sees a record
//! always sees the whole program.

use std::io::Write;
use std::panic::Location;
use std::path::Path;

use neuron_pc_compiler::ir::Graph;
use neuron_pc_compiler::key::CacheKey;

use crate::error::{Error, Result};

/// What a `<key>.json` record of an extracted graph holds.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GraphRecord {
    pub key: String,
    pub components: std::collections::BTreeMap<String, String>,
    /// Ops in the graph (parameters excluded).
    pub nodes: usize,
    /// Parameter types, like `f32[64,32]`.
    pub params: Vec<String>,
    /// The name of each parameter's tensor (`mlp.0.weight`, `ids`), `""` when unnamed.
    #[serde(default)]
    pub param_names: Vec<String>,
    pub outputs: Vec<String>,
    /// The user's source line of the mark_step (or read) that produced it.
    pub site: String,
    /// Process id of the job that produced it.
    pub pid: u32,
}

impl GraphRecord {
    pub(crate) fn new(
        key: &CacheKey,
        graph: &Graph,
        site: &Location<'_>,
        names: &[String],
    ) -> GraphRecord {
        GraphRecord {
            key: key.hex.clone(),
            components: key.components.clone(),
            nodes: graph.op_count(),
            params: graph
                .parameter_types()
                .iter()
                .map(|t| t.to_string())
                .collect(),
            param_names: names.to_vec(),
            outputs: graph
                .outputs()
                .iter()
                .map(|&o| graph.node_type(o).to_string())
                .collect(),
            site: site.to_string(),
            pid: std::process::id(),
        }
    }
}

fn write_file_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    crate::checkpoint::write_atomic(path, bytes)
}

/// Writes one extracted graph into `dir`.
pub(crate) fn write_graph(
    dir: &Path,
    key: &CacheKey,
    text: &str,
    graph: &Graph,
    site: &Location<'_>,
    names: &[String],
) -> Result<()> {
    let err = |e: std::io::Error| Error::Extract(format!("{}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(err)?;
    let record = GraphRecord::new(key, graph, site, names);
    let json = serde_json::to_vec_pretty(&record).map_err(|e| Error::Extract(e.to_string()))?;
    write_file_atomic(&dir.join(format!("{}.mlir", key.hex)), text.as_bytes()).map_err(err)?;
    write_file_atomic(&dir.join(format!("{}.json", key.hex)), &json).map_err(err)
}

/// One line of the graph log: a graph this run needed, and the step it first appeared at.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GraphLogLine {
    pub key: String,
    pub step: u64,
    pub nodes: usize,
    pub params: Vec<String>,
    /// As in [`GraphRecord::param_names`].
    #[serde(default)]
    pub param_names: Vec<String>,
    pub site: String,
}

/// Appends to the graph log; a failure is a warning (the log is a diagnostic aid).
pub(crate) fn append_graph_log(
    path: &Path,
    key: &CacheKey,
    graph: &Graph,
    site: &Location<'_>,
    step: u64,
    names: &[String],
) {
    let line = GraphLogLine {
        key: key.hex.clone(),
        step,
        nodes: graph.op_count(),
        params: graph
            .parameter_types()
            .iter()
            .map(|t| t.to_string())
            .collect(),
        param_names: names.to_vec(),
        site: site.to_string(),
    };
    let result = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        let mut text = serde_json::to_string(&line).unwrap_or_default();
        text.push('\n');
        f.write_all(text.as_bytes())
    })();
    if let Err(e) = result {
        tracing::warn!("graph log {}: {e}", path.display());
    }
}
