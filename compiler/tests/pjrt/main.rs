//! The PJRT layer against the real CPU plugin: discovery and integrity of plugins, the runtime
//! (buffers, executables, several devices) and SPMD partitioning.

mod pjrt_discovery;
mod pjrt_integrity;
mod pjrt_runtime;
mod pjrt_spmd;
