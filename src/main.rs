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
            // The command's final error, on one line.
            eprintln!("error: {}", error_line(&e));
            1
        }
    };
    std::process::exit(code);
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
