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
        /// The request ran out of time (a hung server): the tier is off for the rest of the
        /// process, so a job pays for one timeout, not one per operation.
        timed_out: bool,
        /// The server is throttling us (503 SlowDown, 429): it is there, and asks us to slow
        /// down; a waiter waits longer instead of giving up.
        throttled: bool,
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

    /// No entry matches a key or key prefix.
    #[error("no entry for {key} in {store}")]
    NotFound {
        /// The key or prefix as given.
        key: String,
        /// The cache, for the message.
        store: String,
    },

    /// A key prefix that more than one entry starts with.
    #[error("key prefix {prefix} is ambiguous: {}", candidates.join(", "))]
    Ambiguous {
        /// The prefix as given.
        prefix: String,
        /// Every key it matches.
        candidates: Vec<String>,
    },

    /// The cache was opened read-only.
    #[error("the cache is read-only")]
    ReadOnly,
}

impl Error {
    /// True for a throttling answer (503 SlowDown, 429).
    pub fn is_throttled(&self) -> bool {
        matches!(
            self,
            Error::Unavailable {
                throttled: true,
                ..
            }
        )
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
