//! The compiler crate's error type.

use crate::dtype::DType;

/// Everything that can go wrong in graph building, lowering, flag parsing and the PJRT layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An op was given operands whose shapes or dtypes it cannot take.
    #[error("{op}: {message} (operands: {operands})")]
    Shape {
        /// The op's name (e.g. `add`).
        op: &'static str,
        /// The operands' types, comma-separated (e.g. `f32[2,3], f32[3]`).
        operands: String,
        /// What is wrong with them.
        message: String,
    },

    /// An op does not support the dtype it was given.
    #[error("{op} does not support dtype {dtype}")]
    UnsupportedDType {
        /// The op's name.
        op: &'static str,
        /// The dtype it was given.
        dtype: DType,
    },

    /// A graph that breaks a structural rule (dangling node id, bad output list, ...).
    #[error("invalid graph: {message}")]
    InvalidGraph {
        /// Which rule is broken, and where.
        message: String,
    },

    /// Host data that does not fit the shape or dtype it claims.
    #[error("host data: {message}")]
    HostData {
        /// What does not fit.
        message: String,
    },

    /// A compiler flag (`NEURON_CC_FLAGS` or the command line) that is unknown or malformed.
    #[error("{message}")]
    Flag {
        /// The whole message shown to the user (it names the flag).
        message: String,
    },

    /// The target's plugin library could not be found.
    #[error(
        "{target}: PJRT plugin {library} not found; install it or set {env_var}=/path/to/{library}"
    )]
    PluginNotFound {
        /// The target's name (`cpu`, `cuda`, `trn1`, `trn2`).
        target: String,
        /// The file name of the plugin library that was looked for.
        library: String,
        /// The variable that names the library's path explicitly.
        env_var: String,
    },

    /// A library was found but could not be loaded as a PJRT plugin.
    #[error("cannot load PJRT plugin {path}: {message}")]
    PluginLoad {
        /// The library's path.
        path: String,
        /// Why it could not be loaded.
        message: String,
    },

    /// A PJRT C API call returned an error.
    #[error("{api_fn} failed ({code}): {message}")]
    Pjrt {
        /// The C API function that failed (e.g. `PJRT_Client_Compile`).
        api_fn: &'static str,
        /// The plugin's error code.
        code: PjrtErrorCode,
        /// The plugin's message.
        message: String,
    },

    /// Arguments handed to an executable do not match its signature.
    #[error("execute: {message}")]
    Argument {
        /// Which argument does not match, and how.
        message: String,
    },
    /// A loaded executable does not take or return what its program does (it was compiled
    /// from another program).
    #[error("executable does not match its program: {message}")]
    Interface {
        /// What differs.
        message: String,
    },
    /// A device mesh or a tensor's partition spec that cannot work (an unknown axis, a size the
    /// axis does not divide, a mesh larger than the devices).
    #[error("sharding: {message}")]
    Sharding {
        /// What cannot work.
        message: String,
    },
    /// The reference evaluator cannot evaluate an op in this setting.
    #[error("reference evaluator, {op}: {message}")]
    Evaluate {
        /// The op's name.
        op: &'static str,
        /// Why it cannot be evaluated.
        message: String,
    },
}

/// The plugin's error code, as in `PJRT_Error_Code` (absl status codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PjrtErrorCode {
    /// The operation was cancelled (1).
    Cancelled,
    /// An unknown error (2); also what an error without a readable code becomes.
    Unknown,
    /// An argument the plugin rejects (3).
    InvalidArgument,
    /// A deadline passed before the operation finished (4).
    DeadlineExceeded,
    /// Something asked for was not found (5).
    NotFound,
    /// Something to be created already exists (6).
    AlreadyExists,
    /// The caller may not do this (7).
    PermissionDenied,
    /// Out of a resource, such as device memory (8).
    ResourceExhausted,
    /// The system is not in the state the operation needs (9).
    FailedPrecondition,
    /// The operation was aborted (10).
    Aborted,
    /// A value past the valid range (11).
    OutOfRange,
    /// The plugin does not implement this (12); also a C API function the plugin lacks.
    Unimplemented,
    /// An internal error of the plugin (13).
    Internal,
    /// The service is unavailable for now (14).
    Unavailable,
    /// Unrecoverable data loss or corruption (15).
    DataLoss,
    /// The caller has no valid credentials (16).
    Unauthenticated,
    /// A code this crate does not know; the number is kept.
    Other(i32),
}

impl PjrtErrorCode {
    /// The code for a raw `PJRT_Error_Code` value; a value not listed is kept as
    /// [`PjrtErrorCode::Other`].
    pub fn from_raw(code: i32) -> PjrtErrorCode {
        use PjrtErrorCode::*;
        match code {
            1 => Cancelled,
            2 => Unknown,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            n => Other(n),
        }
    }
}

impl std::fmt::Display for PjrtErrorCode {
    // the named codes print as PJRT names them
    #[allow(clippy::wildcard_enum_match_arm)]
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PjrtErrorCode::Other(n) => write!(f, "code {n}"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
