//! Sharding plans: which partition spec each named parameter gets on a device mesh, applied as
//! a model is built ([`crate::nn::VarBuilder::with_sharding`]: each parameter uploaded straight
//! into its blocks) or to a model already built ([`reshard`] over its `state_tensors()`).
//!
//! The mesh, partition specs and shardings themselves are the compiler's
//! ([`neuron_pc_compiler::sharding`]); a device takes a mesh from
//! [`crate::DeviceConfig::with_mesh`].
//!
//! A plan is a [`ShardingPlan`]: [`Fsdp`], the Llama layout
//! ([`crate::models::llama::LlamaSharding`]), or any closure of name, shape and mesh:
//!
//! ```
//! use neuron_pc::sharding::{split_if_divisible, Fsdp, ShardingPlan, MODEL_AXIS};
//! use neuron_pc::{Mesh, PartitionSpec};
//! # fn main() -> neuron_pc::Result<()> {
//! let mesh = Mesh::new(&[("data", 2), ("model", 2)], &[0, 1, 2, 3])?;
//! // FSDP: the first dimension the `data` axis divides
//! let spec = Fsdp.spec("mlp.0.weight", &[512, 128], &mesh);
//! assert_eq!(spec, PartitionSpec::new(&[&["data"]]));
//! // the projections split by output features over `model`, the rest whole
//! let plan = |name: &str, dims: &[usize], mesh: &Mesh| match name.ends_with("proj.weight") {
//!     true => split_if_divisible(dims, &[(0, MODEL_AXIS)], mesh),
//!     false => PartitionSpec::replicated(),
//! };
//! assert_eq!(plan.spec("proj.weight", &[63, 256], &mesh), PartitionSpec::replicated());
//! assert_eq!(plan.spec("proj.weight", &[64, 256], &mesh).to_string(), "P('model',)");
//! # Ok(()) }
//! ```

use neuron_pc_compiler::sharding::{Mesh, PartitionSpec};

use crate::error::Result;
use crate::tensor::Tensor;

/// The mesh axis FSDP splits parameters over, and a batch is split over
/// ([`crate::LazyDevice::shard`]).
pub use crate::tensor::DATA_AXIS;
/// The mesh axis expert parallelism splits a mixture's experts over
/// ([`crate::models::llama::LlamaSharding`]); data parallel outside them.
pub use crate::tensor::EXPERT_AXIS;
/// The mesh axis tensor parallelism splits layers over.
pub const MODEL_AXIS: &str = "model";

/// Which partition spec a parameter gets, by its state-dict name and shape.
pub trait ShardingPlan: Send + Sync {
    /// The spec of parameter `name` of shape `dims` on `mesh`. A spec whose axes do not divide
    /// a dimension is refused where the tensor is placed; plans should leave such a dimension
    /// whole (see [`split_if_divisible`]).
    fn spec(&self, name: &str, dims: &[usize], mesh: &Mesh) -> PartitionSpec;

    /// The spec of a stacked tensor `name` (a `*` for its first dimension: scanned layers'
    /// `layers.*.…`, a mixture's experts `experts.*.…`) of shape `dims`. By default its rows'
    /// spec (asked of [`ShardingPlan::spec`] for row 0) with the stacking dimension whole:
    /// every device holds its block of every row.
    fn stacked_spec(&self, name: &str, dims: &[usize], mesh: &Mesh) -> PartitionSpec {
        stacked_whole(self, name, dims, mesh)
    }
}

impl<F: Fn(&str, &[usize], &Mesh) -> PartitionSpec + Send + Sync> ShardingPlan for F {
    fn spec(&self, name: &str, dims: &[usize], mesh: &Mesh) -> PartitionSpec {
        self(name, dims, mesh)
    }
}

/// A spec splitting dimension `d` of `dims` over each `(d, axis)` of `splits` whose axis is in
/// `mesh` with more than one device and divides the dimension; every other dimension whole.
pub fn split_if_divisible(dims: &[usize], splits: &[(usize, &str)], mesh: &Mesh) -> PartitionSpec {
    let mut spec: Vec<Vec<String>> = vec![Vec::new(); dims.len()];
    for &(d, axis) in splits {
        let Some(size) = mesh.axis_size(axis).filter(|&s| s > 1) else {
            continue;
        };
        if d < dims.len() && dims[d].is_multiple_of(size) {
            spec[d].push(axis.to_string());
        }
    }
    while spec.last().is_some_and(Vec::is_empty) {
        spec.pop();
    }
    PartitionSpec(spec)
}

/// FSDP (ZeRO-3) for any model: each parameter's first dimension that the `data` axis divides
/// is split over it.
pub struct Fsdp;

impl ShardingPlan for Fsdp {
    fn spec(&self, _name: &str, dims: &[usize], mesh: &Mesh) -> PartitionSpec {
        let Some(size) = mesh.axis_size(DATA_AXIS) else {
            return PartitionSpec::replicated();
        };
        match dims.iter().position(|d| d.is_multiple_of(size)) {
            Some(d) => split_if_divisible(dims, &[(d, DATA_AXIS)], mesh),
            None => PartitionSpec::replicated(),
        }
    }
}

/// The spec `plan` gives tensor `name` of shape `dims`: for a stacked tensor (a `*` in its
/// name), [`ShardingPlan::stacked_spec`].
pub fn spec_of(plan: &dyn ShardingPlan, name: &str, dims: &[usize], mesh: &Mesh) -> PartitionSpec {
    if !crate::state_dict::is_stacked(name) || dims.is_empty() {
        return plan.spec(name, dims, mesh);
    }
    plan.stacked_spec(name, dims, mesh)
}

/// A stacked tensor's rows' spec (asked for row 0, `layers.0.…`) with the stacking dimension
/// whole: every device holds its block of every layer, as it would unstacked.
pub fn stacked_whole<P: ShardingPlan + ?Sized>(
    plan: &P,
    name: &str,
    dims: &[usize],
    mesh: &Mesh,
) -> PartitionSpec {
    if dims.is_empty() {
        return plan.spec(name, dims, mesh);
    }
    let row = plan.spec(
        &crate::state_dict::stacked_row_name(name, 0),
        &dims[1..],
        mesh,
    );
    if row.0.is_empty() {
        return row;
    }
    let mut spec = vec![Vec::new()];
    spec.extend(row.0);
    PartitionSpec(spec)
}

/// Lays out each named tensor (a model's `state_tensors()`) on its device's mesh as `plan`
/// says, in place (each value passes through the host once). For a model built without a plan.
pub fn reshard(named: &[(String, Tensor)], plan: &dyn ShardingPlan) -> Result<()> {
    for (name, t) in named {
        let device = t.device()?;
        let Some(mesh) = device.mesh() else {
            return Ok(());
        };
        t.reshard(&spec_of(plan, name, t.dims(), mesh))?;
    }
    Ok(())
}
