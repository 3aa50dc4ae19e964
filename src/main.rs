//! The `neuron-pc` binary: parses the command line and runs it (see [`cli`]).

mod cli;

use clap::Parser;

fn main() {
    neuron_pc::logging::init_default();
    // clap exits with 2 on usage errors and 0 for --help/--version.
    let args = cli::Cli::parse();
    let code = match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            // The final error of the command, one line: the chain without repeats.
            eprintln!("error: {}", error_chain(&e));
            1
        }
    };
    std::process::exit(code);
}

/// `e` and its causes joined by ": ", skipping a cause whose text the previous message
/// already ends with (wrappers that repeat their source).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}
