//! Compile targets: the device families neuron-pc compiles for and their fixed facts. Where
//! a target's plugin is found is `discover.rs`'s.

/// A device family neuron-pc can compile for. All share one code path; only the plugin differs.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Cpu,
    Cuda,
    Trn1,
    Trn2,
}

impl Target {
    pub const ALL: [Target; 4] = [Target::Cpu, Target::Cuda, Target::Trn1, Target::Trn2];

    pub fn name(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
            Target::Trn1 => "trn1",
            Target::Trn2 => "trn2",
        }
    }

    pub fn from_name(s: &str) -> Option<Target> {
        Target::ALL.into_iter().find(|t| t.name() == s)
    }

    /// The variable that names the plugin library explicitly (it wins over discovery).
    pub fn env_var(self) -> &'static str {
        match self {
            Target::Cpu => "NEURON_PC_CPU_PLUGIN",
            Target::Cuda => "NEURON_PC_CUDA_PLUGIN",
            Target::Trn1 | Target::Trn2 => "NEURON_PC_NEURON_PLUGIN",
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
