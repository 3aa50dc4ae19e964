//! The cache over its stores: one suite for the local directory and S3 (the loopback server),
//! conditional writes, leases, processes racing, faults, listings at scale, symlinks and the
//! environment.

mod common;

mod conditional;
mod env;
mod faults;
mod lease_wait;
mod processes;
mod s3_faults;
mod s3_listing;
mod scale;
mod suite;
mod symlinks;
