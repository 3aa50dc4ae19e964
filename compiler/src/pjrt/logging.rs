//! Keeping the plugin's own log output (absl / TSL logging to stderr) away from users unless
//! they ask for it with `NEURON_PC_PLUGIN_LOGS=1`.

use std::sync::Once;

/// The switch that lets the plugin's logs through.
pub const PLUGIN_LOGS_ENV: &str = "NEURON_PC_PLUGIN_LOGS";

/// True when the user asked to see the plugin's own logs.
pub fn plugin_logs_enabled() -> bool {
    std::env::var(PLUGIN_LOGS_ENV).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Raises the minimum log level of the XLA logging the plugin reads at load time. Called once,
/// before the first plugin is loaded; it leaves a level the user set explicitly alone.
pub(crate) fn quiet_plugin_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plugin_logs_enabled() {
            return;
        }
        for var in ["TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL"] {
            if std::env::var_os(var).is_none() {
                let value = if var == "TF_CPP_MIN_LOG_LEVEL" {
                    "3"
                } else {
                    "0"
                };
                // Set before the plugin's threads exist; the plugin reads it during its own
                // initialization.
                std::env::set_var(var, value);
            }
        }
    });
}
