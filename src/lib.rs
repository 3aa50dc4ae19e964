//! neuron-pc: lazy-tensor training on XLA accelerators with ahead-of-time compilation and a
//! shared compile cache.

pub mod checkpoint;

pub use neuron_pc_compiler::{DType, HostTensor};
