//! Compile-with-cache: the one place where a program becomes a loaded executable.
//!
//! A [`CachingCompiler`] owns what a compilation needs: the PJRT client of the target, the compiler
//! flags and the compile options they give, the compiler's identity (which enters every key)
//! and the opened persistent cache. The lazy device calls [`CachingCompiler::lower`] on each new
//! step graph and [`CachingCompiler::obtain`] on the program; the worker processes of
//! `neuron-pc compile` call the same `obtain` on the programs a trial run extracted,
//! so keys, entries, failure records and leases agree between the two by construction.
//!
//! A job picks its cache through [`CacheConfig`] (or `NEURON_COMPILE_CACHE_URL`), and its
//! metrics say where each executable came from:
//!
//! ```no_run
//! use neuron_pc::compile::CacheConfig;
//! use neuron_pc::{DeviceConfig, LazyDevice};
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::new(DeviceConfig {
//!     cache: CacheConfig::at("s3://my-bucket/neuron-pc-cache"),
//!     ..DeviceConfig::from_env()?
//! })?;
//! // ... train: every new step graph is looked up in the cache, compiled once if missing ...
//! let m = device.metrics();
//! println!(
//!     "{} compiled here, {} from disk, {} from S3, {} compiled by other processes",
//!     m.compiles, m.disk_hits, m.remote_hits, m.waited_for_others
//! );
//! # Ok(()) }
//! ```

mod cache_config;
pub mod extract;
mod prefetch;

use std::cell::RefCell;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use neuron_pc_cache::{Cache, Obtained as CacheObtained, PutOutcome, Tier};
use neuron_pc_compiler::flags::CompilerFlags;
use neuron_pc_compiler::ir::{Graph, TensorType};
use neuron_pc_compiler::key::{cache_key, CompilerIdentity, ExecutableKey};
use neuron_pc_compiler::lower::Partitioning;
use neuron_pc_compiler::passes::ProcessLayout;
use neuron_pc_compiler::pjrt::{ArgType, Client, CompileOptions, LoadedExecutable, Signature};
use neuron_pc_compiler::sharding::Sharding;

pub use cache_config::{CacheConfig, CACHE_STRICT_ENV, CACHE_URL_ENV, USE_CACHE_ENV};

pub use crate::error::CompileError;
use crate::error::{Error, Result};

/// A program's cache key, held in the compiler's form (hex and the named key inputs) and the
/// cache's validated form, converted once when the key is computed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramKey {
    /// The hex key and the named inputs it was computed from.
    pub inputs: ExecutableKey,
    /// The same key as the cache stores it.
    pub store: neuron_pc_cache::EntryKey,
}

/// The old name of [`ProgramKey`] (until 0.2).
#[deprecated(since = "0.1.1", note = "renamed `ProgramKey`")]
pub type Key = ProgramKey;

impl ProgramKey {
    /// Wraps a computed key.
    pub fn new(inputs: ExecutableKey) -> ProgramKey {
        // The compiler's keys are hex-encoded SHA-256 digests, always valid cache keys.
        let store = neuron_pc_cache::EntryKey::parse(&inputs.hex)
            .expect("a SHA-256 hex digest is a valid cache key");
        ProgramKey { inputs, store }
    }

    /// 64 lowercase hex characters.
    pub fn hex(&self) -> &str {
        &self.inputs.hex
    }

    /// The first 12 characters, as tables and logs show a key.
    pub fn short(&self) -> &str {
        &self.inputs.hex[..12]
    }
}

impl std::fmt::Display for ProgramKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.hex())
    }
}

/// A StableHLO program ready to compile: its text, key and signature.
#[derive(Clone, Debug)]
pub struct Program {
    /// The StableHLO module, as text.
    pub text: String,
    /// The cache key of compiling `text` with `options` (see [`CachingCompiler::key_of`]).
    pub key: ProgramKey,
    /// Parameter and result types (from the IR for traced graphs, read from the text for
    /// programs of other frontends); every launch checks its arguments against it.
    pub signature: Option<Signature>,
    /// What it is compiled with (replica count and device assignment included); part of the
    /// key.
    pub options: CompileOptions,
}

/// Where an executable came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The persistent cache's local tier.
    Disk,
    /// The persistent cache's remote tier (S3).
    Remote,
    /// Compiled by this process.
    Compiled,
    /// Compiled by another process while this one waited on its lease.
    Waited,
}

/// What became of a freshly compiled executable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored {
    /// Written to the cache.
    Yes,
    /// Not written: the cache is read-only.
    ReadOnly,
    /// Not written: this compiler has no persistent cache.
    NoCache,
    /// Writing failed on every tier (the executable is still used).
    Failed(String),
    /// Not compiled here (a hit, or another process's compilation).
    NotApplicable,
}

impl From<PutOutcome> for Stored {
    fn from(put: PutOutcome) -> Stored {
        match put {
            PutOutcome::Stored => Stored::Yes,
            PutOutcome::ReadOnly => Stored::ReadOnly,
            PutOutcome::Failed(m) => Stored::Failed(m),
        }
    }
}

/// A loaded executable and how it was obtained.
#[derive(Debug)]
pub struct Obtained {
    /// The executable, loaded on the compiler's client.
    pub executable: LoadedExecutable,
    /// Where it came from.
    pub source: Source,
    /// Whether a fresh compilation was written to the cache.
    pub stored: Stored,
    /// Wall time of compiling here (0 unless compiled).
    pub compile_ms: f64,
    /// Wall time of loading serialized bytes (0 when compiled here).
    pub load_ms: f64,
}

/// The compiler of one process: target client, flags, options, identity and cache.
pub struct CachingCompiler {
    client: Client,
    flags: CompilerFlags,
    options: CompileOptions,
    identity: CompilerIdentity,
    cache: Option<Arc<Cache>>,
    /// Why a job runs without its cache (or its shared tier), when it does.
    cache_unavailable: Option<String>,
    /// The first-steps hint and the executables loaded ahead from it (`prefetch.rs`).
    hints: Mutex<prefetch::Hints>,
    prefetch_hits: std::sync::atomic::AtomicU64,
    /// Set for a run of several processes whose runtime keeps collectives inside a process
    /// (cpu): programs are recorded over every process's replicas and lowered for this
    /// process's (see [`neuron_pc_compiler::passes::cross_process`]).
    processes: Option<ProcessLayout>,
}

/// The old name of [`CachingCompiler`] (until 0.2): the compiler crate (`neuron_pc_compiler`)
/// lowers and compiles; this type adds the persistent cache in front of it.
#[deprecated(since = "0.1.1", note = "renamed `CachingCompiler`")]
pub type Compiler = CachingCompiler;

impl std::fmt::Debug for CachingCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingCompiler")
            .field("compiler", &self.identity.version_string())
            .field("flags", &self.flags.to_string())
            .field("cache", &self.cache.as_deref().map(Cache::describe))
            .finish()
    }
}

impl CachingCompiler {
    /// A compiler for `client` under `flags`, storing into `cache` (none: memory only).
    pub fn new(
        client: Client,
        flags: CompilerFlags,
        cache: Option<Cache>,
    ) -> Result<CachingCompiler> {
        let identity = CompilerIdentity::of(&client)?;
        // A program of several cpu processes calls the gloo handlers: they must be known to
        // XLA before it compiles or loads one (here, in a trial run's compile workers, in
        // `cache check`). A plugin that cannot take them (no FFI extension: another cpu
        // plugin) still serves every program of one process; a run of several processes
        // registers them again when it opens its device, and stops there with the reason.
        #[cfg(feature = "gloo")]
        if client.platform_name() == "cpu" && client.plugin().has_ffi() {
            let _ = crate::collectives::register(client.plugin());
        }
        Ok(CachingCompiler {
            options: neuron_pc_compiler::passes::compile_options(&flags),
            client,
            flags,
            identity,
            cache: cache.map(Arc::new),
            cache_unavailable: None,
            hints: Mutex::default(),
            prefetch_hits: Default::default(),
            processes: None,
        })
    }

    /// A compiler whose cache is opened from `config` the way a training job opens it (see
    /// [`CacheConfig::open_for_job`]).
    pub fn for_job(
        client: Client,
        flags: CompilerFlags,
        config: &CacheConfig,
    ) -> Result<CachingCompiler> {
        let mut c = CachingCompiler::new(client, flags, None)?;
        let (cache, unavailable) = config.open_for_job(&c.identity)?;
        (c.cache, c.cache_unavailable) = (cache.map(Arc::new), unavailable);
        Ok(c)
    }

    /// A compiler whose cache must open (the `neuron-pc` commands): any failure is an error.
    pub fn with_cache(
        client: Client,
        flags: CompilerFlags,
        config: &CacheConfig,
    ) -> Result<CachingCompiler> {
        let mut c = CachingCompiler::new(client, flags, None)?;
        let cache = config
            .open(Some(&c.identity))
            .map_err(|e| Error::Config(format!("compile cache: {e}")))?;
        c.cache = Some(Arc::new(cache));
        Ok(c)
    }

    /// Compiles SPMD programs replicated over `devices` of the client (replica `i` on
    /// `devices[i]`): the replica count and assignment enter the compile options and therefore
    /// every key. One device (the default) compiles single-device programs.
    pub fn with_replicas(mut self, devices: &[usize]) -> CachingCompiler {
        self.options = if devices.len() > 1 {
            self.options.replicated(devices)
        } else {
            let mut o = self.options;
            o.num_replicas = 1;
            o.device_assignment.clear();
            o
        };
        self
    }

    /// Compiles programs partitioned by XLA's SPMD partitioner over `devices` (mesh position
    /// `p` on `devices[p]`): one replica, `devices.len()` partitions; the partition count and
    /// the assignment enter every key, and the shardings are in each program's text.
    pub fn with_partitions(mut self, devices: &[usize]) -> CachingCompiler {
        self.options = self.options.partitioned(devices);
        self
    }

    /// Lowers every program recorded over `processes` processes of this one's replicas for
    /// this process alone, its collectives between processes made custom calls (the cpu
    /// target's multi-process runs; see `collectives`, with the `gloo` feature).
    /// Call it after [`CachingCompiler::with_replicas`] or [`CachingCompiler::with_partitions`]:
    /// the layout is read from them.
    pub fn with_processes(mut self, processes: usize) -> CachingCompiler {
        self.processes = (processes > 1).then(|| ProcessLayout {
            processes,
            local: self.options.num_replicas.max(1),
            partitioned: self.partitions() > 1,
        });
        self
    }

    /// Replicas of the whole run: [`CachingCompiler::replicas`], times the processes when programs
    /// are lowered for one of several ([`CachingCompiler::with_processes`]).
    pub fn global_replicas(&self) -> usize {
        self.replicas() * self.processes.map_or(1, |p| p.processes)
    }

    /// [`neuron_pc_compiler::passes::run_pipeline`], then the rewrite for this process of
    /// several when there is one.
    fn optimize(&self, graph: &Graph) -> Result<Graph> {
        let optimized = neuron_pc_compiler::passes::run_pipeline(graph, &self.flags)?;
        Ok(match self.processes {
            Some(layout) => neuron_pc_compiler::passes::cross_process(&optimized, layout)?,
            None => optimized,
        })
    }

    /// How many partitions each program is split into (1 unless
    /// [`CachingCompiler::with_partitions`]).
    pub fn partitions(&self) -> usize {
        self.options.num_partitions.max(1)
    }

    /// How many replicas each program runs on.
    pub fn replicas(&self) -> usize {
        self.options.num_replicas
    }

    /// The compile options every program is compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.options
    }

    /// The PJRT client of the target, which compiles and loads every executable.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The compiler flags (`NEURON_CC_FLAGS`) programs are lowered and compiled under.
    pub fn flags(&self) -> &CompilerFlags {
        &self.flags
    }

    /// Who compiles (platform and version, plugin fingerprint, `XLA_FLAGS`); it enters every
    /// cache key.
    pub fn identity(&self) -> &CompilerIdentity {
        &self.identity
    }

    /// The persistent cache, if any.
    pub fn cache(&self) -> Option<&Cache> {
        self.cache.as_deref()
    }

    /// Starts loading, on a thread, the cache entries the previous run of this program (same
    /// executable, same compile options) obtained first, as its hint in the cache says; a
    /// step whose key is among them then finds its executable loaded or loading. Call it
    /// once, before building the model, in a process that runs its steps. See
    /// `src/compile/prefetch.rs`.
    pub fn start_prefetch(&self) {
        let Some(cache) = &self.cache else {
            return;
        };
        let options = format!(
            "{}\n{}\n{}",
            self.identity.version_string(),
            self.flags,
            hex::encode(self.options.to_proto())
        );
        let hints = prefetch::Hints::start(prefetch::hint_id(&options), cache, &self.client);
        *self.hints.lock().unwrap_or_else(|e| e.into_inner()) = hints;
    }

    /// The prefetched executable of `program`, checked against its signature, if there is
    /// one.
    fn prefetched(&self, program: &Program) -> Option<Obtained> {
        let (exe, load_ms) = self
            .hints
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take(&program.key)?;
        let started = Instant::now();
        let (exe, interface) = exe?;
        let executable = match program.signature.clone() {
            Some(sig) => match exe.checked_against(interface.as_ref(), sig) {
                Ok(exe) => exe,
                Err(e) => {
                    // loaded again by the caller, whose failing check warns, recompiles and
                    // replaces the entry
                    tracing::debug!("prefetched cache entry {} is not usable: {e}", program.key);
                    return None;
                }
            },
            None => exe,
        };
        Some(Obtained {
            executable,
            source: Source::Disk,
            stored: Stored::NotApplicable,
            compile_ms: 0.0,
            load_ms: load_ms + ms_since(started),
        })
    }

    /// Why this job runs without its cache (or without its shared tier), if it does.
    pub fn cache_unavailable(&self) -> Option<&str> {
        self.cache_unavailable.as_deref()
    }

    /// The key of compiling `text` with this compiler.
    pub fn key_of(&self, text: &str) -> ProgramKey {
        self.key_with(text, &self.options)
    }

    fn key_with(&self, text: &str, options: &CompileOptions) -> ProgramKey {
        ProgramKey::new(cache_key(text, options, &self.flags, &self.identity))
    }

    /// Runs the graph passes the flags ask for, lowers the result to StableHLO (with `aliases`
    /// as `(parameter, output)` donation pairs) and keys it. The signature comes from the IR.
    pub fn lower(&self, graph: &Graph, aliases: &[(usize, usize)]) -> Result<Program> {
        let optimized = self.optimize(graph)?;
        let options = neuron_pc_compiler::lower::LowerOptions {
            own_handlers: self.client.runs_own_handlers(),
        };
        let text =
            neuron_pc_compiler::lower::to_stablehlo_with_options(&optimized, aliases, options)?;
        Ok(Program {
            key: self.key_of(&text),
            signature: Some(signature_of(&optimized)),
            text,
            options: self.options.clone(),
        })
    }

    /// [`CachingCompiler::lower`] for a partitioned program: `params` and `outputs` are the
    /// sharding of each parameter and output (none: whole on every device). The signature is each
    /// device's: the blocks' types.
    pub fn lower_sharded(
        &self,
        graph: &Graph,
        aliases: &[(usize, usize)],
        params: &[Option<Arc<Sharding>>],
        outputs: &[Option<Arc<Sharding>>],
    ) -> Result<Program> {
        let optimized = self.optimize(graph)?;
        let hlo = |s: &Option<Arc<Sharding>>| {
            Some(
                s.as_deref()
                    .map_or_else(|| "{replicated}".to_string(), Sharding::hlo),
            )
        };
        let partitioning = Partitioning {
            num_partitions: self.partitions(),
            params: params.iter().map(hlo).collect(),
            outputs: outputs.iter().map(hlo).collect(),
        };
        let text = neuron_pc_compiler::lower::to_stablehlo_partitioned(
            &optimized,
            aliases,
            &partitioning,
        )?;
        let mut signature = signature_of(&optimized);
        let blocks = |args: &mut Vec<ArgType>, shardings: &[Option<Arc<Sharding>>]| {
            for (a, s) in args.iter_mut().zip(shardings) {
                if let Some(s) = s {
                    a.dims = s.shard_dims();
                }
            }
        };
        blocks(&mut signature.params, params);
        blocks(&mut signature.results, outputs);
        Ok(Program {
            key: self.key_of(&text),
            signature: Some(signature),
            text,
            options: self.options.clone(),
        })
    }

    /// A program given as text by another frontend (its signature is read from the text).
    pub fn program(&self, text: String) -> Program {
        self.program_on(text, &[])
    }

    /// A program given as text, replicated over `devices` (replica `i` on `devices[i]`; none
    /// or one device: a single-device program), as extracted from a data-parallel job.
    pub fn program_on(&self, text: String, devices: &[usize]) -> Program {
        let options = if devices.len() > 1 {
            self.options.clone().replicated(devices)
        } else {
            self.options.clone()
        };
        Program {
            key: self.key_with(&text, &options),
            signature: Signature::parse(&text),
            text,
            options,
        }
    }

    /// A program given as text, partitioned by XLA's SPMD partitioner over `devices` (as
    /// extracted from a job on a mesh). Its signature is not read from the text, which has the
    /// whole values' types, not the blocks'.
    pub fn program_partitioned_on(&self, text: String, devices: &[usize]) -> Program {
        let options = self.options.clone().partitioned(devices);
        Program {
            key: self.key_with(&text, &options),
            signature: None,
            text,
            options,
        }
    }

    /// True when the cache holds a verified entry for `key`.
    pub fn contains(&self, key: &ProgramKey) -> bool {
        self.cache.as_ref().is_some_and(|c| c.contains(&key.store))
    }

    /// The executable of `program`: loaded from the cache, waited for while another process
    /// compiles it, or compiled here and stored. An entry that does not load is a miss:
    /// compiled again and replaced. A failure recorded earlier is returned as
    /// [`CompileError::Recorded`] unless the flags ask to retry failed compilations.
    pub fn obtain(&self, program: &Program) -> Result<Obtained, CompileError> {
        let Some(cache) = self.cache.as_deref() else {
            let started = Instant::now();
            let executable = self.compile_here(program)?;
            return Ok(Obtained {
                executable,
                source: Source::Compiled,
                stored: Stored::NoCache,
                compile_ms: ms_since(started),
                load_ms: 0.0,
            });
        };
        let obtained = self.prefetched(program).map_or_else(
            || self.obtain_in(cache, program),
            |o| {
                self.prefetch_hits
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(o)
            },
        );
        if let Ok(o) = &obtained {
            let mut hints = self.hints.lock().unwrap_or_else(|e| e.into_inner());
            hints.obtained(&program.key, cache, || o.executable.temp_bytes());
        }
        obtained
    }

    /// The old name of [`CachingCompiler::obtain`] (until 0.2; the cache's own
    /// `Cache::get_or_compile` is the step below it).
    #[deprecated(since = "0.1.1", note = "renamed `obtain`")]
    pub fn get_or_compile(&self, program: &Program) -> Result<Obtained, CompileError> {
        self.obtain(program)
    }

    /// How many executables came from the prefetch ([`CachingCompiler::start_prefetch`]).
    pub fn prefetch_hits(&self) -> u64 {
        self.prefetch_hits
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn obtain_in(&self, cache: &Cache, program: &Program) -> Result<Obtained, CompileError> {
        // The compile closure keeps the loaded executable and the typed error; the cache sees
        // the serialized bytes and the message.
        let fresh: RefCell<Option<LoadedExecutable>> = RefCell::new(None);
        let failure: RefCell<Option<neuron_pc_compiler::Error>> = RefCell::new(None);
        let compile = || -> std::result::Result<Vec<u8>, String> {
            let result = self
                .compile_here(program)
                .and_then(|exe| exe.serialize().map(|bytes| (exe, bytes)));
            match result {
                Ok((exe, bytes)) => {
                    *fresh.borrow_mut() = Some(exe);
                    Ok(bytes)
                }
                Err(e) => {
                    let message = e.to_string();
                    *failure.borrow_mut() = Some(e);
                    Err(message)
                }
            }
        };
        let obtained = cache.get_or_compile(
            &program.key.store,
            &program.text,
            &program.key.inputs.components,
            self.flags.retry_failed,
            compile,
        );
        let (hit, source) = match obtained {
            Ok(CacheObtained::Compiled {
                compile_ms, stored, ..
            }) => {
                let executable = fresh
                    .into_inner()
                    .expect("the cache reports a compilation only after the closure succeeded");
                return Ok(Obtained {
                    executable,
                    source: Source::Compiled,
                    stored: Stored::from(stored),
                    compile_ms,
                    load_ms: 0.0,
                });
            }
            Ok(CacheObtained::Hit(h)) => {
                let source = match h.tier {
                    Tier::Local => Source::Disk,
                    Tier::Remote => Source::Remote,
                };
                (h, source)
            }
            Ok(CacheObtained::Waited(h)) => (h, Source::Waited),
            Err(e) => {
                return Err(match failure.into_inner() {
                    Some(e) => CompileError::Compiler(e),
                    None => CompileError::Recorded(e.to_string()),
                })
            }
        };
        let started = Instant::now();
        match self
            .client
            .deserialize(&hit.executable, program.signature.clone())
        {
            Ok(executable) => Ok(Obtained {
                executable,
                source,
                stored: Stored::NotApplicable,
                compile_ms: 0.0,
                load_ms: ms_since(started),
            }),
            Err(e) => {
                // A verified entry this plugin cannot load: compile here and replace it.
                tracing::warn!(
                    "cache entry {} does not load ({e}); compiling it again",
                    program.key
                );
                self.recompile_and_replace(cache, program)
            }
        }
    }

    /// Compiles `program` and overwrites its cache entry.
    fn recompile_and_replace(
        &self,
        cache: &Cache,
        program: &Program,
    ) -> Result<Obtained, CompileError> {
        let started = Instant::now();
        let executable = self.compile_here(program)?;
        let compile_ms = ms_since(started);
        let stored = match executable.serialize() {
            Ok(bytes) => cache
                .replace(
                    &program.key.store,
                    &bytes,
                    &program.text,
                    &program.key.inputs.components,
                    compile_ms,
                )
                .into(),
            Err(e) => Stored::Failed(e.to_string()),
        };
        Ok(Obtained {
            executable,
            source: Source::Compiled,
            stored,
            compile_ms,
            load_ms: 0.0,
        })
    }

    fn compile_here(&self, program: &Program) -> neuron_pc_compiler::Result<LoadedExecutable> {
        self.client.compile_with_signature(
            &program.text,
            &program.options,
            program.signature.clone(),
        )
    }
}

/// The parameter and result types of `graph`.
pub fn signature_of(graph: &Graph) -> Signature {
    let arg = |t: &TensorType| ArgType {
        dtype: t.dtype,
        dims: t.dims.clone(),
    };
    Signature {
        params: graph.parameter_types().iter().map(arg).collect(),
        results: graph
            .outputs()
            .iter()
            .map(|&o| arg(graph.node_type(o)))
            .collect(),
    }
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}
