//! neuron-pc's content-addressed store of compiled executables.
//!
//! It stores opaque bytes under validated hex keys computed by the compiler crate, and knows
//! nothing of XLA or graphs. Backends: a local directory, S3 (or any S3-compatible server), and
//! a tier of the two (local in front: read-through, write-through).
//!
//! The rule that shapes it: a broken cache never breaks a training job, and a wrong executable
//! is never returned. Every read is verified (size, SHA-256, signature when a signing key is
//! set); a missing, partial or corrupt entry is a miss with a warning, repaired by the next
//! write. Storage that is unreachable is warned about once and skipped; storage that refuses our
//! credentials is an error when the cache is opened.

#![warn(missing_docs)]

mod cache;
mod error;
mod health;
mod key;
mod lease;
mod maintain;
mod options;
mod probe;
mod record;
mod s3;
mod store;

pub use cache::{
    Cache, EntryInfo, Hit, Lookup, Obtained, PutOutcome, Stats, TierStats, VerifyReport,
    WaitMetrics,
};
pub use error::{Error, Result};
#[allow(deprecated)]
pub use key::CacheKey;
pub use key::EntryKey;
pub use lease::Lease;
pub use maintain::{ExecutableCheck, Judged};
pub use options::{
    default_dir, parse_size, CacheOptions, CACHE_URL_ENV, LOCAL_DIR_ENV, LOCAL_TIER_ENV,
    MAX_SIZE_ENV, READ_ONLY_ENV, SIGNING_KEY_ENV,
};
pub use probe::{ProbeStep, ProbeTimes, TierProbe};
pub use record::{hostname, EntryRecord, FailureRecord, ENTRY_FORMAT_VERSION};
#[cfg(feature = "s3")]
pub use s3::S3Store;
pub use s3::{PartOptions, S3Options, DEFAULT_S3_BUDGET, S3_TIMEOUT_ENV};
pub use store::{LocalStore, ObjectMeta, PutMode, Store, Tier};
