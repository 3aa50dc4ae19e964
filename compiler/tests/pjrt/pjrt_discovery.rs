//! Plugin discovery, in its own test binary because it changes environment variables.

use neuron_pc_compiler::pjrt::pins::pin_for_library;
use neuron_pc_compiler::pjrt::{find_plugin, Target, TargetStatus};
use neuron_pc_compiler::Error;
use neuron_pc_test_support::process::run_alone;

#[test]
fn discovery_rules() {
    // alone in a process of its own: it sets NEURON_PC_CPU_PLUGIN, which every test that loads
    // the plugin reads
    if !run_alone(module_path!(), "discovery_rules") {
        return;
    }
    // The project's .venv has one of the pinned cpu plugins (scripts/setup installs the default).
    let cpu = find_plugin(Target::Cpu).expect("run scripts/setup");
    let pin = pin_for_library(&cpu).expect("the discovered cpu plugin is a pinned one");
    assert_eq!(pin.target, Target::Cpu);

    // An explicit variable wins, and a wrong one is an error naming the path and the variable.
    std::env::set_var("NEURON_PC_CPU_PLUGIN", "/nonexistent/plugin.so");
    let err = find_plugin(Target::Cpu).unwrap_err().to_string();
    assert!(
        err.contains("/nonexistent/plugin.so") && err.contains("NEURON_PC_CPU_PLUGIN"),
        "{err}"
    );
    std::env::set_var("NEURON_PC_CPU_PLUGIN", &cpu);
    assert_eq!(find_plugin(Target::Cpu).unwrap(), cpu);
    std::env::remove_var("NEURON_PC_CPU_PLUGIN");

    // A target whose plugin is not installed: one line naming the library and the variable.
    let err = find_plugin(Target::Trn1).unwrap_err();
    assert!(matches!(err, Error::PluginNotFound { .. }));
    let line = err.to_string();
    assert!(!line.contains('\n'));
    assert!(
        line.contains("libneuronpjrt.so") && line.contains("NEURON_PC_NEURON_PLUGIN"),
        "{line}"
    );

    let status = TargetStatus::probe(Target::Cpu);
    assert_eq!(status.error, None);
    assert_eq!(status.platform_name.as_deref(), Some("cpu"));
    let (major, minor) = status
        .api_version
        .as_deref()
        .and_then(|v| v.split_once('.'))
        .map(|(a, b)| (a.parse::<u32>().unwrap(), b.parse::<u32>().unwrap()))
        .expect("an api version");
    // Bindings come from the 0.81 header; newer plugins keep its struct layouts.
    assert!(major == 0 && minor >= 81, "{major}.{minor}");
    let missing = TargetStatus::probe(Target::Cuda);
    assert!(missing.path.is_none() && missing.error.is_some());
}
