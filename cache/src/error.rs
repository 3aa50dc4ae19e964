//! The cache crate's error type.

/// What can go wrong opening or using a cache.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key that is not 64 lowercase hex characters.
    #[error("invalid cache key {key:?}: expected 64 lowercase hex characters")]
    InvalidKey {
        /// The refused text (at most 80 characters of it).
        key: String,
    },

    /// A cache URL (or setting) this crate cannot use.
    #[error("invalid cache URL {url:?}: {message}")]
    InvalidUrl {
        /// The URL or value as given.
        url: String,
        /// What is wrong with it.
        message: String,
    },

    /// Local file system trouble.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory involved.
        path: String,
        /// The operating system's error.
        source: std::io::Error,
    },

    /// The storage refused us (wrong credentials, access denied): a configuration error that
    /// must be fixed, not a miss.
    #[error("{store}: access denied: {message}")]
    Denied {
        /// The store, as `s3://bucket/prefix`.
        store: String,
        /// The server's answer.
        message: String,
    },

    /// The storage could not be reached or failed.
    #[error("{store}: unavailable: {message}")]
    Unavailable {
        /// The store, as `s3://bucket/prefix`.
        store: String,
        /// What failed.
        message: String,
    },

    /// A stored object that fails its checks (digest, size, signature, format).
    #[error("cache entry {key}: {message}")]
    Corrupt {
        /// The entry's key (or object name).
        key: String,
        /// Which check failed.
        message: String,
    },

    /// The compiler failed (now or, recorded, earlier).
    #[error("{0}")]
    Compile(String),

    /// The cache was opened read-only.
    #[error("the cache is read-only")]
    ReadOnly,
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
