//! Moving a model's parameters (and optimizer state) between the device and a [`StateDict`].
//!
//! Placeholder module: filled in by the PyTorch interop work.
