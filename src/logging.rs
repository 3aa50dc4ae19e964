//! Warnings users must see (recompiles, cache trouble) go through `tracing`. A training job
//! that installs no subscriber of its own still gets them on stderr: the first device installs
//! a default one, filtered by `NEURON_PC_LOG` (default `warn`). A job with its own subscriber
//! keeps it.
//!
//! ```
//! // Before any device, to have the default subscriber from the start: `NEURON_PC_LOG=info`
//! // shows more. A job that sets its own subscriber first keeps it; calling again is a no-op.
//! neuron_pc::logging::init_default();
//! neuron_pc::logging::init_default();
//! ```

/// The `tracing` target of the step debug mode's lines (`NEURON_PC_DEBUG_STEPS`), let through
/// at info level by the default subscriber whenever that mode is on.
pub const DEBUG_STEPS_TARGET: &str = "neuron_pc::debug_steps";

/// The variable that filters neuron-pc's logs (`info`, `debug`, `neuron_pc=debug`, ...).
pub const LOG_ENV: &str = "NEURON_PC_LOG";

/// Installs the default stderr subscriber unless one is already set.
pub fn init_default() {
    init_default_with(false)
}

/// [`init_default`]; with `debug_steps`, the step debug mode's lines pass at info level whatever
/// the filter says, so the mode prints without any other variable set.
pub fn init_default_with(debug_steps: bool) {
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let mut filter = tracing_subscriber::EnvFilter::try_from_env(LOG_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    if debug_steps {
        if let Ok(d) = format!("{}=info", DEBUG_STEPS_TARGET).parse() {
            filter = filter.add_directive(d);
        }
    }
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .finish();
    // Another thread may have won the race; either way a subscriber is set.
    let _ = tracing::subscriber::set_global_default(subscriber);
}
