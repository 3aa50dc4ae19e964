//! The PJRT runtime layer: load a plugin at run time, create a client, compile StableHLO text,
//! serialize and deserialize executables, move buffers between host and device, execute.
//!
//! Every C call goes through `pjrt_call!`, which checks that the plugin implements the
//! function, fills the argument struct's size from the header, and turns a `PJRT_Error` into
//! [`crate::Error::Pjrt`] (freeing it). Every handle type frees its object in `Drop`, and holds
//! an `Arc` of what must outlive it (buffers and executables keep their client alive).

/// Calls `PJRT_Api.$fn` with `$args` (a `*mut` args struct), checked as described above.
macro_rules! pjrt_call {
    ($plugin:expr, $fn:ident, $args:expr) => {{
        let plugin: &$crate::pjrt::api::Plugin = $plugin;
        let offset = std::mem::offset_of!($crate::pjrt::sys::PJRT_Api, $fn);
        match plugin.raw().$fn {
            Some(f) if plugin.has_field(offset) => {
                // SAFETY: the plugin implements this function (its table is long enough and the
                // pointer is set); callers pass an args struct made by `Args::new()` whose
                // pointers are valid for the duration of the call.
                let err = unsafe { f($args) };
                plugin.check(stringify!($fn), err)
            }
            _ => Err($crate::error::Error::Pjrt {
                api_fn: stringify!($fn),
                code: $crate::error::PjrtErrorCode::Unimplemented,
                message: "not implemented by this plugin".to_string(),
            }),
        }
    }};
}

pub mod api;
mod buffer;
mod client;
mod cuda_libs;
mod discover;
mod event;
mod executable;
pub mod ffi;
pub mod integrity;
mod interface;
pub use interface::{parameter_types_in, Interface};
pub mod kv;
mod logging;
mod malloc;
mod options;
pub mod pins;
mod signature;
pub mod step_loop;
pub mod sys;
mod target;

pub use api::Plugin;
pub use buffer::Buffer;
pub use client::{Client, ClientOptions, Device, OptionValue};
pub use discover::{find_plugin, TargetStatus};
pub use event::Event;
pub use executable::{Launched, LaunchedReplicas, LoadedExecutable, MemoryStats};
pub use kv::{KeyValueStore, KvError};
pub use logging::plugin_logs_enabled;
pub use malloc::{
    freed_memory_releases, keeps_freed_pages, prefault, prefaulted_bytes, release_after_compile,
    release_freed_memory, set_release_after_compile, tune_allocator_once, JEMALLOC,
    MALLOC_TUNING_VAR,
};
pub use options::{CompileOptions, OverrideValue};
pub use signature::{ArgType, Signature};
pub use step_loop::StepLoop;
pub use target::Target;
