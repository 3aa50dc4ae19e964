//! The `neuron-pc` command line.

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
}

fn main() {
    init_logging();
    // clap exits with 2 on usage errors and 0 for --help/--version.
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Targets(args) => cli_targets::run(args),
    }
}

fn init_logging() {
    neuron_pc::logging::init_default();
}
