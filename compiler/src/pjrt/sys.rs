//! Raw bindings generated at build time from the plugin package's `pjrt_c_api.h`.
#![allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code,
    // generated from the C header, documented there
    missing_docs
)]
#![allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn
)]

/// An argument struct of the C API, created with its `struct_size` set from the header's
/// `*_STRUCT_SIZE` constant and every other field zeroed.
pub trait Args {
    /// The struct zeroed, its `struct_size` set.
    fn new() -> Self;
}

include!(concat!(env!("OUT_DIR"), "/pjrt_c_api.rs"));
