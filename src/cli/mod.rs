//! The `neuron-pc` command line: subcommands over the library (`neuron_pc`). Nothing here is
//! used by training jobs; the ahead-of-time orchestration (trial runs, worker processes,
//! reports) lives in [`aot`], the cache's maintenance commands in [`cache`].

mod aot;
mod cache;
mod cache_check;
mod doctor;
mod plot;
mod targets;

use clap::{Parser, Subcommand};

/// Train on XLA accelerators without waiting on the compiler: ahead-of-time compilation of
/// every step graph and a shared, content-addressed cache of compiled executables.
#[derive(Parser)]
#[command(name = "neuron-pc", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List compile targets, where their PJRT plugins are and whether they load.
    Targets(targets::TargetsArgs),
    /// Run a job as a trial run and compile every graph it makes into the cache, in parallel
    /// worker processes, while it runs: `neuron-pc compile [OPTIONS] -- <command> [args...]`.
    Compile(aot::compile_cmd::CompileArgs),
    /// Compile StableHLO text files (from any frontend, e.g. a JAX export) into the cache.
    CompileGraphs(aot::graphs_cmd::CompileGraphsArgs),
    /// Compile (or load from the cache) one StableHLO program and run it on .npy inputs.
    RunGraph(aot::run_graph::RunGraphArgs),
    /// Report the graphs a job makes: counts, sizes, shape-only variants, and graphs a real run
    /// needed that the trial run never produced.
    Analyze(aot::analyze::AnalyzeArgs),
    /// Preflight before a long job: plugin, every device, collectives, the compile cache, free
    /// disk, and a collective bandwidth table; one line per check, exit 1 when any fails.
    Doctor(doctor::DoctorArgs),
    /// Look after the persistent compile cache: ls, stats, show, verify, prune, rm, clear.
    Cache(cache::CacheArgs),
    /// Draw a run's loss and throughput curves to a PNG (from its --tensorboard directory).
    Plot(plot::PlotArgs),
    /// Internal: a worker process that compiles graphs one at a time (run by `compile` and
    /// `compile-graphs`).
    #[command(name = "__compile-worker", hide = true)]
    CompileWorker(aot::worker::WorkerArgs),
}

/// Runs the parsed command; returns the process exit code.
pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Targets(args) => targets::run(args),
        Command::Plot(args) => plot::run(args),
        Command::Compile(args) => aot::compile_cmd::run(args),
        Command::CompileGraphs(args) => aot::graphs_cmd::run(args),
        Command::RunGraph(args) => aot::run_graph::run(args),
        Command::Analyze(args) => aot::analyze::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Cache(args) => cache::run_with(args, Some(&cache_check::check_executable)),
        Command::CompileWorker(args) => aot::worker::run(args),
    }
}
