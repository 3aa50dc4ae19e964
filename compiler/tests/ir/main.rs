//! The compiler's IR: each op lowered, compiled and run on the cpu plugin against the reference
//! evaluator, golden StableHLO, shape inference and errors, every pass before and after, and
//! `NEURON_CC_FLAGS`.

mod ops_common;
mod passes_util;

mod flags_parse;
mod ops_call;
mod ops_composite;
mod ops_conv;
mod ops_elementwise;
mod ops_errors;
mod ops_golden;
mod ops_infer;
mod ops_layout;
mod ops_random;
mod ops_reduce;
mod ops_scan;
mod passes_autocast;
mod passes_cross_process;
mod passes_dce_cse;
mod passes_device;
mod passes_fold;
mod passes_optlevel_backend;
mod passes_pipeline;
mod passes_simplify;
