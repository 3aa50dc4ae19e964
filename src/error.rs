//! The root crate's error type.

use std::panic::Location;

/// Everything the lazy device, the training utilities and checkpoints can report.
///
/// `Display` and `std::error::Error` are written by hand (below) so that a message is never
/// printed twice: a variant whose message already contains its cause's text reports no separate
/// `source()`, or anyhow's `Caused by:` list would repeat it.
///
/// `#[non_exhaustive]`: new failures get new variants without breaking a job's `match`, which
/// needs a `_` arm.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// An op was called with operands it cannot take; `location` is the user's call site.
    Op {
        /// The user's line that called the op.
        location: &'static Location<'static>,
        /// The compiler's error (the operand shapes or dtypes it refused).
        source: neuron_pc_compiler::Error,
    },

    /// Compiling, lowering or running failed.
    Compiler(neuron_pc_compiler::Error),

    /// An op mixed tensors of two devices.
    DeviceMismatch {
        /// The user's line that called the op.
        location: &'static Location<'static>,
        /// The op's name.
        op: &'static str,
    },

    /// The tensor's device was dropped; its value is gone with it.
    DeviceGone,

    /// Bad configuration (environment variables, flags, URLs).
    Config(String),

    /// A new graph appeared after warm-up while new graphs were made an error.
    NewGraphAfterWarmup(String),

    /// A compilation failed (now or, recorded in the cache, earlier).
    CompileFailed {
        /// The graph's cache key (64 hex characters).
        key: String,
        /// The compiler's error, or the failure the cache recorded.
        source: CompileError,
    },

    /// `grad` met an op on a float path from a parameter to the loss that has no gradient.
    NotDifferentiable {
        /// The user's line that recorded the op.
        location: &'static Location<'static>,
        /// The op's name.
        op: &'static str,
        /// Why it has no gradient.
        reason: &'static str,
    },

    /// A step failed to launch, or failed while running (reported at the first wait for it: a
    /// read of one of its values, a later step using them, the bound on steps in flight, or
    /// the device's drop).
    StepFailed {
        /// The `mark_step` (or read) in the user's code that cut the step.
        site: &'static Location<'static>,
        /// The device's `mark_step` count when the step was launched.
        step: u64,
        /// The runtime's error.
        message: String,
    },

    /// The trial run could not write a graph.
    Extract(String),

    /// A value that differs between replicas was used where one value is needed (read as one
    /// host tensor, or assigned to a replicated tensor such as a parameter).
    Placement {
        /// The user's line that read or assigned the value.
        location: &'static Location<'static>,
        /// What is wrong with the value's placement.
        message: String,
    },

    /// Saving or loading a checkpoint failed (see [`crate::state_dict`]).
    Checkpoint(crate::state_dict::CheckpointError),

    /// With index checks on (`NEURON_PC_CHECK_INDICES=1`), an op met a class label, embedding
    /// row or gather index outside its range; `site` is the op's call in the user's code.
    IndexOutOfRange {
        /// The op's call in the user's code.
        site: &'static Location<'static>,
        /// The op's name.
        op: &'static str,
        /// The step the op was recorded in, counted from 1 as [`Error::StepFailed`] counts
        /// (the first step is step 1).
        step: u64,
        /// How many values were outside the valid range, the range, the smallest and largest.
        message: String,
    },

    /// The run's key-value store failed (see [`crate::store`]).
    Store(crate::store::StoreError),

    /// The ranks of a multi-process run traced different graphs
    /// (see [`crate::device::rank_check`]).
    RanksDiverged(String),

    /// A file or stream failed. `?` on a `std::io::Error` gives `path: None`;
    /// [`Error::io_at`] names the file.
    Io {
        /// The file, when known.
        path: Option<std::path::PathBuf>,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A JSON document (a model's `config.json`, a job's own settings) did not parse; `?` on a
    /// `serde_json::Error` gives `path: None`, [`Error::json_at`] names the file.
    Json {
        /// The file, when known.
        path: Option<std::path::PathBuf>,
        /// The parser's error (line and column included).
        source: serde_json::Error,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Op { location, source } => write!(f, "{location}: {source}"),
            Error::Compiler(e) => e.fmt(f),
            Error::DeviceMismatch { location, op } => {
                write!(f, "{location}: {op} mixes tensors of different devices")
            }
            Error::DeviceGone => f.write_str("the device this tensor lives on has been dropped"),
            Error::Config(m) | Error::NewGraphAfterWarmup(m) => f.write_str(m),
            Error::CompileFailed { key, source } => {
                write!(f, "compiling graph {key} failed: {source}")
            }
            Error::NotDifferentiable {
                location,
                op,
                reason,
            } => write!(f, "{location}: {op} is not differentiable ({reason})"),
            Error::StepFailed {
                site,
                step,
                message,
            } => write!(
                f,
                "{site}: the step of this mark_step (step {step}) failed: {message}"
            ),
            Error::Extract(m) => write!(f, "the trial run: {m}"),
            Error::Placement { location, message } => write!(f, "{location}: {message}"),
            Error::Checkpoint(e) => e.fmt(f),
            Error::IndexOutOfRange {
                site,
                op,
                step,
                message,
            } => write!(
                f,
                "{site}: {op}: index out of range in step {step}: {message} \
                 (checked because NEURON_PC_CHECK_INDICES is on)"
            ),
            Error::Store(e) => e.fmt(f),
            Error::RanksDiverged(m) => f.write_str(m),
            Error::Io { path, source } => match path {
                Some(path) => write!(f, "{}: {source}", path.display()),
                None => source.fmt(f),
            },
            Error::Json { path, source } => match path {
                Some(path) => write!(f, "{}: not valid JSON: {source}", path.display()),
                None => write!(f, "not valid JSON: {source}"),
            },
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Op's, Checkpoint's, Io's and Json's messages include their causes' text; Compiler
            // is transparent, so its own cause is the next link. An io::Error's own inner
            // error (one made with `io::Error::other`) is likewise in its text.
            Error::Compiler(e) => e.source(),
            Error::Io { .. } | Error::Json { .. } => None,
            Error::Checkpoint(_)
            | Error::Store(_)
            | Error::RanksDiverged(_)
            | Error::Op { .. }
            | Error::DeviceMismatch { .. }
            | Error::DeviceGone
            | Error::Config(_)
            | Error::NewGraphAfterWarmup(_)
            | Error::CompileFailed { .. }
            | Error::NotDifferentiable { .. }
            | Error::StepFailed { .. }
            | Error::Extract(_)
            | Error::Placement { .. }
            | Error::IndexOutOfRange { .. } => None,
        }
    }
}

impl From<neuron_pc_compiler::Error> for Error {
    fn from(e: neuron_pc_compiler::Error) -> Error {
        Error::Compiler(e)
    }
}

impl From<crate::state_dict::CheckpointError> for Error {
    fn from(e: crate::state_dict::CheckpointError) -> Error {
        Error::Checkpoint(e)
    }
}

impl From<crate::store::StoreError> for Error {
    fn from(e: crate::store::StoreError) -> Error {
        Error::Store(e)
    }
}

impl From<std::io::Error> for Error {
    fn from(source: std::io::Error) -> Error {
        Error::Io { path: None, source }
    }
}

impl From<serde_json::Error> for Error {
    fn from(source: serde_json::Error) -> Error {
        Error::Json { path: None, source }
    }
}

impl Error {
    /// An I/O error on `path`, for `map_err(|e| Error::io_at(&path, e))` where a bare `?`
    /// would lose which file it was.
    pub fn io_at(path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            path: Some(path.into()),
            source,
        }
    }

    /// A JSON error in the file at `path` (see [`Error::io_at`]).
    pub fn json_at(path: impl Into<std::path::PathBuf>, source: serde_json::Error) -> Error {
        Error::Json {
            path: Some(path.into()),
            source,
        }
    }

    /// This error as reported under the op the user called: a tensor method that records an IR
    /// op of another name (`matmul` records `dot_general`) renames shape and dtype errors, so
    /// messages speak of what the user wrote.
    pub(crate) fn for_user_op(self, name: &'static str) -> Error {
        use neuron_pc_compiler::Error as C;
        match self {
            Error::Op { location, source } => Error::Op {
                location,
                source: match source {
                    C::Shape {
                        operands, message, ..
                    } => C::Shape {
                        op: name,
                        operands,
                        message,
                    },
                    C::UnsupportedDType { dtype, .. } => C::UnsupportedDType { op: name, dtype },
                    other => other,
                },
            },
            other => other,
        }
    }
}

/// Why no executable could be had (see `crate::compile::CachingCompiler::obtain`).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn read(path: &str) -> Result<String> {
        Ok(std::fs::read_to_string(path)?)
    }

    #[test]
    fn io_and_json_errors_convert_with_question_mark_and_print_one_line() {
        let missing = "/nonexistent/neuron-pc/config.json";
        let e = read(missing).unwrap_err();
        assert!(matches!(e, Error::Io { path: None, .. }), "{e:?}");
        let e = Error::io_at(missing, std::io::Error::from(std::io::ErrorKind::NotFound));
        let text = e.to_string();
        assert!(text.starts_with(missing), "{text}");
        assert!(!text.contains('\n'), "{text}");
        assert!(std::error::Error::source(&e).is_none());

        let parse = |s: &str| -> Result<serde_json::Value> { Ok(serde_json::from_str(s)?) };
        let e = parse("{").unwrap_err();
        assert!(matches!(e, Error::Json { path: None, .. }), "{e:?}");
        let json = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        let text = Error::json_at("cfg.json", json).to_string();
        assert!(text.starts_with("cfg.json: not valid JSON: "), "{text}");
        // anyhow's chain (`{:#}`) prints the cause once: it is in the message, not `source()`.
        let chain = format!("{:#}", anyhow::Error::from(e));
        assert_eq!(chain.matches("EOF").count(), 1, "{chain}");
    }
}
