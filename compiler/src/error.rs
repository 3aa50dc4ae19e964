//! The compiler crate's error type.

use crate::dtype::DType;

/// Everything that can go wrong in graph building, lowering, flag parsing and the PJRT layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An op was given operands whose shapes or dtypes it cannot take.
    #[error("{op}: {message} (operands: {operands})")]
    Shape {
        op: &'static str,
        operands: String,
        message: String,
    },

    /// An op does not support the dtype it was given.
    #[error("{op} does not support dtype {dtype}")]
    UnsupportedDType { op: &'static str, dtype: DType },

    /// A graph that breaks a structural rule (dangling node id, bad output list, ...).
    #[error("invalid graph: {message}")]
    InvalidGraph { message: String },

    /// Host data that does not fit the shape or dtype it claims.
    #[error("host data: {message}")]
    HostData { message: String },

    /// A compiler flag (`NEURON_CC_FLAGS` or the command line) that is unknown or malformed.
    #[error("{message}")]
    Flag { message: String },

    /// The target's plugin library could not be found.
    #[error(
        "{target}: PJRT plugin {library} not found; install it or set {env_var}=/path/to/{library}"
    )]
    PluginNotFound {
        target: String,
        library: String,
        env_var: String,
    },

    /// A library was found but could not be loaded as a PJRT plugin.
    #[error("cannot load PJRT plugin {path}: {message}")]
    PluginLoad { path: String, message: String },

    /// A PJRT C API call returned an error.
    #[error("{api_fn} failed ({code}): {message}")]
    Pjrt {
        api_fn: &'static str,
        code: PjrtErrorCode,
        message: String,
    },

    /// Arguments handed to an executable do not match its signature.
    #[error("execute: {message}")]
    Argument { message: String },
    /// A loaded executable does not take or return what its program does (it was compiled
    /// from another program).
    #[error("executable does not match its program: {message}")]
    Interface { message: String },
    /// A device mesh or a tensor's partition spec that cannot work (an unknown axis, a size the
    /// axis does not divide, a mesh larger than the devices).
    #[error("sharding: {message}")]
    Sharding { message: String },
    /// The reference evaluator cannot evaluate an op in this setting.
    #[error("reference evaluator, {op}: {message}")]
    Evaluate { op: &'static str, message: String },
}

/// The plugin's error code, as in `PJRT_Error_Code` (absl status codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PjrtErrorCode {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
    /// A code this crate does not know; the number is kept.
    Other(i32),
}

impl PjrtErrorCode {
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
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PjrtErrorCode::Other(n) => write!(f, "code {n}"),
            other => write!(f, "{other:?}"),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
