//! neuron-pc: lazy-tensor training on XLA accelerators with ahead-of-time compilation and a
//! shared compile cache.
//!
//! ```no_run
//! use neuron_pc::{LazyDevice, HostTensor};
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! let w = device.tensor(&HostTensor::from_slice(&[0.5f32, -1.0], &[2])?)?;
//! let x = device.tensor(&HostTensor::from_slice(&[2.0f32, 3.0], &[2])?)?;
//! let y = w.mul(&x)?.tanh()?;
//! device.mark_step()?;               // one graph: compiled once, cached, run
//! println!("{:?}", y.to_vec::<f32>()?);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

// `#[derive(Module)]` names this crate `::neuron_pc`, in here as in a user's crate.
extern crate self as neuron_pc;

pub mod amp;
// Matches that decide something for every op list every variant (see `neuron_pc_compiler`).
#[warn(clippy::wildcard_enum_match_arm)]
pub mod autodiff;
/// The old name of [`state_dict`] (until 0.2): "checkpoint" now names training checkpoints
/// alone ([`state::Checkpoints`]); activation recomputation is [`nn::remat`].
#[deprecated(since = "0.1.1", note = "renamed `neuron_pc::state_dict`")]
pub mod checkpoint {
    pub use crate::state::{CKPT_S3_ANSWER_TIMEOUT, CKPT_S3_TIMEOUT_ENV};
    pub use crate::state_dict::*;
}
#[cfg(feature = "gloo")]
pub mod collectives;
pub mod compile;
pub mod data;
#[warn(clippy::wildcard_enum_match_arm)]
pub mod device;
pub mod distributed;
mod error;
pub mod logging;
pub mod models;
#[cfg(feature = "monitor")]
pub mod monitor;
pub mod nn;
pub mod optim;
pub mod sharding;
pub mod state;
pub mod state_dict;
pub mod store;
pub mod tensor;
pub mod timeline;
pub mod topology;
pub mod trial;

pub use autodiff::grad;
pub use device::{DeviceConfig, LazyDevice, Metrics};
pub use error::{Error, Result};
pub use neuron_pc_compiler::sharding::{Mesh, PartitionSpec, Sharding};
pub use neuron_pc_compiler::{DType, HostTensor};
pub use tensor::{StepFn, Tensor, DATA_AXIS};
pub use topology::Topology;
