//! The executable of a step graph: found in this process's memory, extracted for
//! `neuron-pc compile` (a trial run), or obtained from the device's [`Compiler`] (the
//! persistent cache or a compilation), with the device's counters kept.
//!
//! [`Compiler`]: crate::compile::CachingCompiler

use std::panic::Location;
use std::sync::Arc;

use neuron_pc_compiler::ir::{Graph, TensorType};
use neuron_pc_compiler::pjrt::{LoadedExecutable, MemoryStats};
use neuron_pc_compiler::sharding::Sharding;

use super::{lock, DeviceInner};
use crate::compile::{extract, ProgramKey, Source};
use crate::error::{Error, Result};

/// An executable for one step graph (absent in a trial run, where nothing runs).
pub(crate) struct StepExecutable {
    pub loaded: Option<LoadedExecutable>,
    pub key: ProgramKey,
    pub output_types: Vec<TensorType>,
    /// What one execution needs on each device, when the plugin says.
    pub memory: Option<MemoryStats>,
    /// On a mesh: how each output is split over it (none: whole on every device).
    pub out_shardings: Vec<Option<Arc<Sharding>>>,
}

impl StepExecutable {
    /// Output `k`'s sharding, when it is split over a mesh.
    pub fn out_sharding(&self, k: usize) -> Option<&Arc<Sharding>> {
        self.out_shardings.get(k).and_then(Option::as_ref)
    }
}

/// The shardings of a partitioned step's parameters and outputs (none: whole on every device).
pub(crate) struct StepShardings {
    pub params: Vec<Option<Arc<Sharding>>>,
    pub outputs: Vec<Option<Arc<Sharding>>>,
}

/// Where a step's executable came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum How {
    /// This process had it already.
    Memory,
    /// A step function replayed it (no trace, no step cut).
    Replayed,
    /// The trial run: written out for `neuron-pc compile`, not compiled.
    Extracted,
    /// From the compiler: a cache tier, a compilation, or another process's compilation.
    Obtained(Source),
}

impl std::fmt::Display for How {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            How::Memory => "memory hit",
            How::Replayed => "replayed",
            How::Extracted => "extracted",
            How::Obtained(Source::Disk) => "disk hit",
            How::Obtained(Source::Remote) => "remote hit",
            How::Obtained(Source::Compiled) => "compiled",
            How::Obtained(Source::Waited) => "compiled by another process",
        })
    }
}

/// The executable of a graph not found in memory.
pub(crate) fn obtain(
    dev: &Arc<DeviceInner>,
    graph: &Graph,
    aliases: &[(usize, usize)],
    shardings: Option<StepShardings>,
    site: &'static Location<'static>,
    names: &[String],
) -> Result<(Arc<StepExecutable>, How)> {
    let output_types: Vec<TensorType> = graph
        .outputs()
        .iter()
        .map(|&id| graph.node_type(id).clone())
        .collect();
    let compiler = &dev.compiler;
    let lowering = std::time::Instant::now();
    let program = match &shardings {
        Some(s) => compiler.lower_sharded(graph, aliases, &s.params, &s.outputs)?,
        None => compiler.lower(graph, aliases)?,
    };
    let out_shardings = shardings.map(|s| s.outputs).unwrap_or_default();
    dev.phase("lower", lowering, Some(program.key.short()));
    lock(&dev.metrics).last_program_bytes = program.text.len() as u64;
    if tracing::enabled!(tracing::Level::DEBUG) {
        tracing::debug!(
            key = %program.key,
            components = ?program.key.inputs.components,
            "cache key"
        );
    }
    if let Some(dir) = &dev.config.extract_dir {
        if !compiler.contains(&program.key) {
            extract::write_graph(dir, &program, graph, site, names)?;
            lock(&dev.metrics).graphs_extracted += 1;
        }
        let exe = StepExecutable {
            loaded: None,
            key: program.key,
            output_types,
            memory: None,
            out_shardings,
        };
        return Ok((Arc::new(exe), How::Extracted));
    }
    if let Some(check) = &dev.rank_check {
        let step = lock(&dev.metrics).steps;
        let hex = program.key.hex().to_string();
        check.agree(&crate::device::rank_check::GraphNote::of(
            graph, names, &hex, step, site,
        ))?;
        // Cross-process collectives are not set up yet: the check is as far as such a run goes.
        crate::topology::check_launch(&dev.config.topology, dev.config.target(), false)?;
    }
    let obtaining = std::time::Instant::now();
    let obtained = compiler.obtain(&program);
    let phase = match &obtained {
        Ok(o) if o.source == Source::Compiled => "compile",
        Ok(o) if o.source == Source::Waited => "wait for another process's compile",
        Ok(_) => "cache load",
        Err(_) => "compile (failed)",
    };
    dev.phase(phase, obtaining, Some(program.key.short()));
    let obtained = match obtained {
        Ok(o) => o,
        Err(source) => {
            lock(&dev.metrics).compile_failures += 1;
            return Err(Error::CompileFailed {
                key: program.key.hex().to_string(),
                source,
            });
        }
    };
    {
        let mut m = lock(&dev.metrics);
        match obtained.source {
            Source::Compiled => {
                m.compiles += 1;
                m.compile_ms += obtained.compile_ms;
            }
            Source::Disk => m.disk_hits += 1,
            Source::Remote => m.remote_hits += 1,
            Source::Waited => m.waited_for_others += 1,
        }
        m.load_ms += obtained.load_ms;
    }
    if let Some(log) = &dev.config.graph_log {
        let step = lock(&dev.metrics).steps;
        extract::append_graph_log(log, &program.key, graph, site, step, names);
    }
    let exe = StepExecutable {
        memory: obtained.executable.memory_stats(),
        loaded: Some(obtained.executable),
        key: program.key,
        output_types,
        out_shardings,
    };
    Ok((Arc::new(exe), How::Obtained(obtained.source)))
}
