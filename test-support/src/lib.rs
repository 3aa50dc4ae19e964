//! Helpers the tests of several workspace crates share, as a dev-dependency instead of files
//! included with `#[path]` across crates: [`s3`], a real S3-compatible server on loopback;
//! [`proxy`], a counting, fault-injecting HTTP proxy to put in front of it; [`paths`], scratch
//! directories and the example binaries; [`launch`], free ports and torchrun's variables for
//! tests that start ranks; and [`process`], the test process's resident memory
//! and [`process::run_alone`] for tests that change process-wide state.

pub mod launch;
pub mod paths;
pub mod process;
pub mod proxy;
pub mod s3;
