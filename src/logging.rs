//! Warnings users must see (recompiles, cache trouble) go through `tracing`. A training job
//! that installs no subscriber of its own still gets them on stderr: the first device installs
//! a default one, filtered by `NEURON_PC_LOG` (default `warn`). A job with its own subscriber
//! keeps it.

/// The variable that filters neuron-pc's logs (`info`, `debug`, `neuron_pc=debug`, ...).
pub const LOG_ENV: &str = "NEURON_PC_LOG";

/// Installs the default stderr subscriber unless one is already set.
pub fn init_default() {
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .finish();
    // Another thread may have won the race; either way a subscriber is set.
    let _ = tracing::subscriber::set_global_default(subscriber);
}
