//! Helpers the tests of several workspace crates share, as a dev-dependency instead of files
//! included with `#[path]` across crates: [`s3`], a real S3-compatible server on loopback, and
//! [`paths`], scratch directories and the example binaries.

pub mod paths;
pub mod s3;
