//! Compile targets: the device families neuron-pc compiles for and their fixed facts. Where
//! a target's plugin is found is `discover.rs`'s.

/// A device family neuron-pc can compile for. All share one code path; only the plugin differs.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// The host CPU, through XLA's CPU plugin.
    Cpu,
    /// NVIDIA GPUs, through XLA's CUDA plugin.
    Cuda,
    /// AWS Trainium (first generation), through Neuron's plugin.
    Trn1,
    /// AWS Trainium2, through Neuron's plugin.
    Trn2,
}

impl Target {
    /// Every target, in declaration order.
    pub const ALL: [Target; 4] = [Target::Cpu, Target::Cuda, Target::Trn1, Target::Trn2];

    /// The target's name as flags, messages and cache keys spell it (`cpu`, `cuda`, `trn1`,
    /// `trn2`).
    pub fn name(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
            Target::Trn1 => "trn1",
            Target::Trn2 => "trn2",
        }
    }

    /// The target of that exact name (lowercase); `None` for any other string.
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
