//! The root crate's error type.

use std::panic::Location;

/// Everything the lazy device, the training utilities and checkpoints can report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An op was called with operands it cannot take; `location` is the user's call site.
    #[error("{location}: {source}")]
    Op {
        location: &'static Location<'static>,
        source: neuron_pc_compiler::Error,
    },

    /// Compiling, lowering or running failed.
    #[error(transparent)]
    Compiler(#[from] neuron_pc_compiler::Error),

    /// An op mixed tensors of two devices.
    #[error("{location}: {op} mixes tensors of different devices")]
    DeviceMismatch {
        location: &'static Location<'static>,
        op: &'static str,
    },

    /// The tensor's device was dropped; its value is gone with it.
    #[error("the device this tensor lives on has been dropped")]
    DeviceGone,

    /// Bad configuration (environment variables, flags, URLs).
    #[error("{0}")]
    Config(String),

    /// A new graph appeared after warm-up while new graphs were made an error.
    #[error("{0}")]
    NewGraphAfterWarmup(String),

    /// A compilation failed (now or, recorded in the cache, earlier).
    #[error("compiling graph {key} failed: {source}")]
    CompileFailed { key: String, source: CompileError },

    /// `grad` met an op on a float path from a parameter to the loss that has no gradient.
    #[error("{location}: {op} is not differentiable ({reason})")]
    NotDifferentiable {
        location: &'static Location<'static>,
        op: &'static str,
        reason: &'static str,
    },

    /// A step failed to launch, or failed while running (reported at the first wait for it: a
    /// read of one of its values, a later step using them, the bound on steps in flight, or
    /// the device's drop).
    #[error("{site}: the step of this mark_step (step {step}) failed: {message}")]
    StepFailed {
        site: &'static Location<'static>,
        step: u64,
        message: String,
    },

    /// Extract mode could not write a graph.
    #[error("extract mode: {0}")]
    Extract(String),

    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
}

/// Why no executable could be had (see `crate::compile::Compiler::get_or_compile`).
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The compiler (or lowering, or loading) failed here.
    #[error(transparent)]
    Compiler(#[from] neuron_pc_compiler::Error),
    /// A failure this compiler recorded in the cache earlier (not retried unless asked).
    #[error("{0}")]
    Recorded(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
