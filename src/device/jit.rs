//! Finding or building the executable of a step graph: graph passes, lowering, the cache key,
//! then the persistent cache (load) or the compiler (JIT, stored for next time). In extract mode
//! the program is written out for `neuron-pc compile` instead.

use std::panic::Location;
use std::sync::Arc;
use std::time::Instant;

use neuron_pc_compiler::flags::CompilerFlags;
use neuron_pc_compiler::ir::{Graph, TensorType};
use neuron_pc_compiler::key::{cache_key, CacheKey, CompilerIdentity};
use neuron_pc_compiler::pjrt::{Client, CompileOptions, LoadedExecutable, Signature};

use super::config::DeviceConfig;
use super::{extract, lock, metrics, DeviceInner};
use crate::error::{Error, Result};
use crate::persist::{Persistent, Stored};

/// An executable for one step graph (absent in extract mode, where nothing runs).
pub(crate) struct StepExecutable {
    pub loaded: Option<LoadedExecutable>,
    /// The cache key, hex.
    pub key: String,
    pub output_types: Vec<TensorType>,
}

/// Where an executable came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Obtained {
    Memory,
    Disk,
    Remote,
    Compiled,
    /// Compiled by another process while this one waited for it.
    Waited,
    Extracted,
}

pub(crate) struct Jit {
    flags: CompilerFlags,
    options: CompileOptions,
    compiler: CompilerIdentity,
    persistent: Option<Persistent>,
    /// Why the persistent cache (or its shared tier) is not in use, for the metrics.
    pub cache_unavailable: Option<String>,
}

impl Jit {
    pub fn new(client: &Client, config: &DeviceConfig) -> Result<Jit> {
        let compiler = CompilerIdentity::of(client)?;
        let (persistent, cache_unavailable) = if config.persistent_cache {
            let o = Persistent::open(config.cache_url.as_deref(), &compiler)?;
            (o.cache, o.unavailable)
        } else {
            (None, None)
        };
        Ok(Jit {
            options: neuron_pc_compiler::passes::compile_options(&config.flags),
            flags: config.flags.clone(),
            compiler,
            persistent,
            cache_unavailable,
        })
    }

    /// The program text and key of `graph` as this device would compile it.
    pub fn lower(&self, graph: &Graph, aliases: &[(usize, usize)]) -> Result<(String, CacheKey)> {
        let optimized = neuron_pc_compiler::passes::run_pipeline(graph, &self.flags)?;
        let text = neuron_pc_compiler::lower::to_stablehlo_with_aliases(&optimized, aliases)?;
        let key = cache_key(&text, &self.options, &self.flags, &self.compiler);
        Ok((text, key))
    }

    pub fn obtain(
        &self,
        dev: &Arc<DeviceInner>,
        graph: &Graph,
        aliases: &[(usize, usize)],
        site: &'static Location<'static>,
    ) -> Result<(Arc<StepExecutable>, Obtained)> {
        let output_types: Vec<TensorType> = graph
            .outputs()
            .iter()
            .map(|&id| graph.node_type(id).clone())
            .collect();
        let (text, key) = self.lower(graph, aliases)?;
        if tracing::enabled!(tracing::Level::DEBUG) {
            tracing::debug!(key = %key.hex, components = ?key.components, "cache key");
        }
        if let Some(dir) = &dev.config.extract_dir {
            let cached = self
                .persistent
                .as_ref()
                .is_some_and(|p| p.contains(&key.hex));
            if !cached {
                extract::write_graph(dir, &key, &text, graph, site)?;
                lock(&dev.metrics).graphs_extracted += 1;
            }
            let exe = StepExecutable {
                loaded: None,
                key: key.hex,
                output_types,
            };
            return Ok((Arc::new(exe), Obtained::Extracted));
        }
        let signature = Signature::parse(&text);
        let client = &dev.client;
        let compile = || -> std::result::Result<Vec<u8>, String> {
            let exe = client
                .compile(&text, &self.options)
                .map_err(|e| e.to_string())?;
            exe.serialize().map_err(|e| e.to_string())
        };
        let started = Instant::now();
        let (loaded, how) = match &self.persistent {
            Some(p) => match p.get_or_compile(&key, &text, self.flags.retry_failed, compile) {
                Ok(Stored {
                    bytes,
                    how,
                    compile_ms,
                }) => {
                    let t = Instant::now();
                    match client.deserialize(&bytes, signature.clone()) {
                        Ok(exe) => {
                            let mut m = lock(&dev.metrics);
                            match how {
                                Obtained::Compiled => {
                                    m.compiles += 1;
                                    m.compile_ms += compile_ms;
                                }
                                Obtained::Remote => m.remote_hits += 1,
                                Obtained::Waited => m.waited_for_others += 1,
                                _ => m.disk_hits += 1,
                            }
                            m.load_ms += metrics::ms(t.elapsed());
                            (exe, how)
                        }
                        Err(e) => {
                            // A stored executable this plugin cannot load is treated as a miss:
                            // compile here and replace the entry.
                            tracing::warn!(
                                "cache entry {} does not load ({e}); compiling",
                                key.hex
                            );
                            let exe = self.compile_here(dev, &text, &key, signature.clone())?;
                            if let Ok(bytes) = exe.serialize() {
                                p.replace(&key, &text, bytes, metrics::ms(started.elapsed()));
                            }
                            (exe, Obtained::Compiled)
                        }
                    }
                }
                Err(message) => {
                    lock(&dev.metrics).compile_failures += 1;
                    return Err(Error::CompileFailed {
                        key: key.hex,
                        message,
                    });
                }
            },
            None => (
                self.compile_here(dev, &text, &key, signature)?,
                Obtained::Compiled,
            ),
        };
        if let Some(log) = &dev.config.graph_log {
            extract::append_graph_log(log, &key, graph, site, lock(&dev.metrics).steps);
        }
        Ok((
            Arc::new(StepExecutable {
                loaded: Some(loaded),
                key: key.hex,
                output_types,
            }),
            how,
        ))
    }

    fn compile_here(
        &self,
        dev: &DeviceInner,
        text: &str,
        key: &CacheKey,
        signature: Option<Signature>,
    ) -> Result<LoadedExecutable> {
        let t = Instant::now();
        let result = dev.client.compile(text, &self.options);
        let mut m = lock(&dev.metrics);
        match result {
            Ok(exe) => {
                m.compiles += 1;
                m.compile_ms += metrics::ms(t.elapsed());
                let _ = signature;
                Ok(exe)
            }
            Err(e) => {
                m.compile_failures += 1;
                Err(Error::CompileFailed {
                    key: key.hex.clone(),
                    message: e.to_string(),
                })
            }
        }
    }
}
