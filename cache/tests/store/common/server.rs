//! The loopback S3 server (moto_server), from the workspace's test-support crate, which the root
//! crate's tests use too.

pub use neuron_pc_test_support::s3::*;
