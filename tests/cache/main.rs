//! `neuron-pc cache` and `neuron-pc doctor` as a user drives them, and cache faults a job and the
//! command line meet (local and on the loopback S3 server).

#[path = "../common/mod.rs"]
#[allow(dead_code)]
mod common;
#[path = "../../cache/tests/store/common/server.rs"]
#[allow(dead_code)]
mod server;

mod after_a_job;
mod doctor;
mod exit_codes;
mod faults;
mod user_commands;
