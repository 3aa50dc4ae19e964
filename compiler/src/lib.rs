//! neuron-pc's compiler layer: element types and host tensors, the graph IR and its passes,
//! lowering to StableHLO text, compiler flags and cache keys, and the PJRT runtime layer that
//! loads a plugin, compiles, serializes and executes.

#![warn(missing_docs)]
// A match that decides something for every op lists every variant (a new primitive is then a
// compile error wherever it must be decided); one that picks out a variant is an `if let`.
#![warn(clippy::wildcard_enum_match_arm)]

pub mod dtype;
pub mod error;
pub mod flags;
pub mod host;
pub mod ir;
pub mod key;
pub mod lower;
pub mod optlevel;
pub mod passes;
pub mod pjrt;
pub mod reference;
pub mod rng;
pub mod sharding;
pub mod special;

pub use dtype::DType;
pub use error::{Error, PjrtErrorCode, Result};
pub use host::{Element, HostTensor};
