//! The cache crate's error type.

/// What can go wrong opening or using a cache.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key that is not 64 lowercase hex characters.
    #[error("invalid cache key {key:?}: expected 64 lowercase hex characters")]
    InvalidKey { key: String },

    /// A cache URL this crate cannot use.
    #[error("invalid cache URL {url:?}: {message}")]
    InvalidUrl { url: String, message: String },

    /// Local file system trouble.
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },

    /// The storage refused us (wrong credentials, access denied): a configuration error that
    /// must be fixed, not a miss.
    #[error("{store}: access denied: {message}")]
    Denied { store: String, message: String },

    /// The storage could not be reached or failed.
    #[error("{store}: unavailable: {message}")]
    Unavailable { store: String, message: String },

    /// A stored object that fails its checks (digest, size, signature, format).
    #[error("cache entry {key}: {message}")]
    Corrupt { key: String, message: String },

    /// The compiler failed (now or, recorded, earlier).
    #[error("{0}")]
    Compile(String),

    /// The cache was opened read-only.
    #[error("the cache is read-only")]
    ReadOnly,
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
