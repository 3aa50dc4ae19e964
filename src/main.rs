//! The `neuron-pc` command line.

mod aot;
mod cache_cmd;
mod cli_targets;

use clap::{Parser, Subcommand};

/// Train on XLA accelerators without waiting on the compiler: ahead-of-time compilation of
/// every step graph and a shared, content-addressed cache of compiled executables.
#[derive(Parser)]
#[command(name = "neuron-pc", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List compile targets, where their PJRT plugins are and whether they load.
    Targets(cli_targets::TargetsArgs),
    /// Run a job in extract mode and compile every graph it makes into the cache, in parallel
    /// worker processes, while it runs: `neuron-pc compile [OPTIONS] -- <command> [args...]`.
    Compile(aot::compile_cmd::CompileArgs),
    /// Compile StableHLO text files (from any frontend, e.g. a JAX export) into the cache.
    CompileGraphs(aot::graphs_cmd::CompileGraphsArgs),
    /// Compile (or load from the cache) one StableHLO program and run it on .npy inputs.
    RunGraph(aot::run_graph::RunGraphArgs),
    /// Report the graphs a job makes: counts, sizes, shape-only variants, and graphs a real run
    /// needed that the trial run never produced.
    Analyze(aot::analyze::AnalyzeArgs),
    /// Look after the persistent compile cache: ls, stats, show, verify, prune, rm, clear.
    Cache(cache_cmd::CacheArgs),
    /// Internal: a worker process that compiles graphs one at a time (run by `compile` and
    /// `compile-graphs`).
    #[command(name = "__compile-worker", hide = true)]
    CompileWorker(aot::worker::WorkerArgs),
}

fn main() {
    init_logging();
    // clap exits with 2 on usage errors and 0 for --help/--version.
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            1
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Targets(args) => cli_targets::run(args),
        Command::Compile(args) => aot::compile_cmd::run(args),
        Command::CompileGraphs(args) => aot::graphs_cmd::run(args),
        Command::RunGraph(args) => aot::run_graph::run(args),
        Command::Analyze(args) => aot::analyze::run(args),
        Command::Cache(args) => cache_cmd::run(args),
        Command::CompileWorker(args) => aot::worker::run(args),
    }
}

/// The error and its causes on one line, each cause once: a cause whose text the line already
/// holds (errors that print their source and also report it) is left out.
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

fn init_logging() {
    neuron_pc::logging::init_default();
}

#[cfg(test)]
mod tests {
    use super::error_line;

    /// An error that prints its source and also reports it, as `thiserror`'s `{path}: {source}`
    /// variants do.
    #[derive(Debug)]
    struct AtPath(std::io::Error);

    impl std::fmt::Display for AtPath {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "/c: {}", self.0)
        }
    }

    impl std::error::Error for AtPath {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(17);
        let shown = io.to_string();
        let e = anyhow::Error::new(AtPath(io)).context("opening the compile cache");
        assert_eq!(
            error_line(&e),
            format!("opening the compile cache: /c: {shown}")
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_line(&plain), "outer: inner");
    }
}
