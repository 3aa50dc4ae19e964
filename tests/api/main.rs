//! The library as a user's crate sees it: its public API and module layering, `#[derive(Module)]`,
//! loading weights by name, the README's and the guide's code, PyTorch's defaults, and the error
//! messages users read.

#[path = "../common/mod.rs"]
#[allow(dead_code)]
mod common;

mod derive_module;
mod errors_ux;
mod features;
mod guide_snippets;
mod input_names;
mod layout;
mod op_index;
mod public_api;
mod pytorch_defaults;
mod readme_example;
mod var_builder;
