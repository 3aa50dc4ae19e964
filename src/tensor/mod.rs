//! Lazy tensors. Every op records a node (its shape and dtype checked at the call site) and
//! returns at once; values are computed at the next `mark_step`, or when read.
//!
//! ```no_run
//! use neuron_pc::tensor::Reduction;
//! use neuron_pc::{DType, LazyDevice, Tensor};
//! # fn main() -> neuron_pc::Result<()> {
//! let device = LazyDevice::from_env()?;
//! let x = device.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
//! let w = device.ones(&[3, 2], DType::F32)?;
//! let y = x.matmul(&w)?.relu()?; // recorded, not run: f32 [2, 2]
//! let total = y.sum(&[0, 1], false)?; // a reduction: f32 []
//! let mean = total.all_reduce(Reduction::Mean)?; // over the replicas (one device: itself)
//! device.mark_step()?; // compiled (or found in the cache) and run
//! println!("{:?} {}", y.dims(), mean.item()?);
//!
//! // A step function: traced on its first two calls, replayed without tracing after.
//! let mut step = device.step_fn(|args: &[Tensor]| Ok(vec![args[0].mul(&args[0])?.sum_all()?]));
//! for i in 0..3 {
//!     let v = device.from_slice(&[i as f32; 4], &[4])?;
//!     println!("{}", step.call(&[v])?[0].item()?);
//! }
//! # Ok(()) }
//! ```
#![doc = include_str!("op_index.md")]

mod call;
mod collective;
mod conv;
mod index_check;
mod math;
mod matmul;
mod ops;
mod primitives;
mod shape;
mod shape_ops;
mod sort;

pub use crate::device::{StepFn, Tensor, DATA_AXIS, EXPERT_AXIS};
pub(crate) use call::TracedFn;
pub use collective::Reduction;
pub(crate) use shape::shape_error;

use std::panic::Location;
use std::sync::{Arc, Weak};

use neuron_pc_compiler::ir::{Op, TensorType};
use neuron_pc_compiler::sharding::{PartitionSpec, Sharding};
use neuron_pc_compiler::{DType, Element, HostTensor};

use crate::device::trace::{Operands, Value};
use crate::device::{DeviceInner, LazyDevice};
use crate::error::{Error, Result};

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.cell.is_pending() {
            "pending"
        } else {
            "data"
        };
        write!(f, "Tensor({}, {state})", self.cell.ty)
    }
}

impl Tensor {
    /// Names this tensor for diagnostics: when its value is an input of a step graph, the
    /// recompile warning and `neuron-pc analyze` say `ids` instead of `input 3`.
    /// [`crate::nn::Module::parameters`] names parameters by their state-dict names.
    pub fn set_name(&self, name: &str) {
        self.cell.set_name(Arc::from(name));
    }

    /// The name given with [`Tensor::set_name`], if any.
    pub fn name(&self) -> Option<String> {
        self.cell.name().as_deref().map(str::to_string)
    }

    /// Shape.
    pub fn dims(&self) -> &[usize] {
        &self.cell.ty.dims
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.cell.ty.dtype
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.cell.ty.dims.len()
    }

    /// Number of elements.
    pub fn elem_count(&self) -> usize {
        self.cell.ty.dims.iter().product()
    }

    /// Type as the IR writes it (`f32[2,3]`).
    pub fn ty(&self) -> &TensorType {
        &self.cell.ty
    }

    /// True when the value has not been computed yet.
    pub fn is_pending(&self) -> bool {
        self.cell.is_pending()
    }

    pub(crate) fn device_inner(&self) -> Result<Arc<DeviceInner>> {
        self.cell.device.upgrade().ok_or(Error::DeviceGone)
    }

    /// The device this tensor lives on.
    pub fn device(&self) -> Result<LazyDevice> {
        Ok(LazyDevice {
            inner: self.device_inner()?,
        })
    }

    #[inline]
    pub(crate) fn value(&self) -> Value {
        self.cell.value()
    }

    /// Records `op` over `operands` (shape-checked now, reported at the caller's line).
    #[track_caller]
    pub(crate) fn apply(op: Op, operands: &[&Tensor]) -> Result<Tensor> {
        let location = Location::caller();
        Tensor::apply_at(op, operands, location)
    }

    pub(crate) fn apply_at(
        op: Op,
        operands: &[&Tensor],
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let first = operands
            .first()
            .expect("ops built from tensors have operands");
        let dev = first.shared_device(operands, op.name(), location)?;
        if matches!(op, Op::DotGeneral { .. } | Op::Convolution { .. }) {
            if let Some(cast) = autocast_operands(&dev, operands, location)? {
                let refs: Vec<&Tensor> = cast.iter().collect();
                return Tensor::apply_values_of(&dev, op, &refs, location);
            }
        }
        Tensor::apply_values_of(&dev, op, operands, location)
    }

    fn apply_values_of(
        dev: &Arc<DeviceInner>,
        op: Op,
        operands: &[&Tensor],
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let first = operands[0];
        let mut values = Operands::new();
        for t in operands {
            values.push(t.value());
        }
        let mut few: [&Arc<TensorType>; 4] = [&first.cell.ty; 4];
        let many: Vec<&Arc<TensorType>>;
        let types: &[&Arc<TensorType>] = if operands.len() <= few.len() {
            for (slot, t) in few.iter_mut().zip(operands) {
                *slot = &t.cell.ty;
            }
            &few[..operands.len()]
        } else {
            many = operands.iter().map(|t| &t.cell.ty).collect();
            &many
        };
        Tensor::apply_values(dev, op, values, types, location)
    }

    /// Records each of `ops` over the same `operands` (the results of one call), under one lock
    /// of the recorder.
    /// This tensor's device, which every one of `operands` must be on (`op` names the op in
    /// the error).
    fn shared_device(
        &self,
        operands: &[&Tensor],
        op: &'static str,
        location: &'static Location<'static>,
    ) -> Result<Arc<DeviceInner>> {
        if operands
            .iter()
            .any(|t| !Weak::ptr_eq(&t.cell.device, &self.cell.device))
        {
            return Err(Error::DeviceMismatch { location, op });
        }
        self.device_inner()
    }

    pub(crate) fn apply_each(
        ops: impl Iterator<Item = Op>,
        operands: &[&Tensor],
        location: &'static Location<'static>,
    ) -> Result<Vec<Tensor>> {
        let Some(first) = operands.first() else {
            return Err(Error::Config("a call needs at least one operand".into()));
        };
        let dev = first.shared_device(operands, "call", location)?;
        let values: Operands = operands.iter().map(|t| t.value()).collect();
        let types: Vec<&Arc<TensorType>> = operands.iter().map(|t| &t.cell.ty).collect();
        let cells = dev.record_ops(ops, values, &types, location)?;
        Ok(cells.into_iter().map(|cell| Tensor { cell }).collect())
    }

    /// Records `op` over operand values of the given types (each a cell's type, so interned by
    /// `dev` when it comes from a recorded op or an upload) as a new tensor: one call to the
    /// device ([`DeviceInner::record_op`]).
    pub(crate) fn apply_values(
        dev: &Arc<DeviceInner>,
        op: Op,
        values: Operands,
        types: &[&Arc<TensorType>],
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        Ok(Tensor {
            cell: dev.record_op(op, values, types, location)?,
        })
    }

    /// Records an op with no tensor operands (constants, iota) on `dev`.
    #[track_caller]
    pub(crate) fn apply_nullary(dev: &Arc<DeviceInner>, op: Op) -> Result<Tensor> {
        Tensor::apply_nullary_at(dev, op, Location::caller())
    }

    pub(crate) fn apply_nullary_at(
        dev: &Arc<DeviceInner>,
        op: Op,
        location: &'static Location<'static>,
    ) -> Result<Tensor> {
        let ty = neuron_pc_compiler::ir::infer(&op, &[])
            .map_err(|source| Error::Op { location, source })?;
        Ok(Tensor {
            cell: dev.record(op, ty, Default::default(), location),
        })
    }

    /// True when the replicas of a data-parallel device may hold different values of this
    /// tensor (a batch shard, anything computed from one, the replica index); false when they
    /// hold the same (uploads with [`LazyDevice::tensor`], parameters, results of collectives
    /// over every replica). See [`LazyDevice::shard`].
    pub fn is_per_replica(&self) -> bool {
        self.cell.is_per_replica()
    }

    /// Copies the value to the host, computing it first if it is pending (an implicit sync).
    /// On several replicas the value must be replicated (the replicas agree); read a
    /// per-replica value with [`Tensor::to_host_replicas`], or combine it first
    /// ([`Tensor::all_reduce`], [`Tensor::all_gather`]).
    #[track_caller]
    pub fn to_host(&self) -> Result<HostTensor> {
        self.read(Location::caller(), Ok)
    }

    /// Reads the value (see [`Tensor::to_host`]) and hands it to `then`, both counted as the
    /// read's time in the metrics.
    fn read<T>(
        &self,
        site: &'static Location<'static>,
        then: impl FnOnce(HostTensor) -> Result<T>,
    ) -> Result<T> {
        let dev = self.device_inner()?;
        if dev.device_count() > 1 && self.is_per_replica() {
            return Err(Error::Placement {
                location: site,
                message: format!(
                    "this {} value differs between the {} replicas: read it with \
                     to_host_replicas(), or all_reduce / all_gather it first",
                    self.cell.ty,
                    dev.device_count()
                ),
            });
        }
        let data = self.computed(&dev, site)?;
        dev.reading(|| {
            let host = dev.download_whole(&data)?;
            dev.poll_index_checks(false)?;
            then(host)
        })
    }

    /// How the value is split over the device's mesh: `None` when each device holds it whole
    /// (always, without a mesh) or when it is pending (its layout is decided by the step that
    /// computes it).
    pub fn sharding(&self) -> Option<Sharding> {
        self.cell
            .data()
            .and_then(|d| d.sharding.as_deref().cloned())
    }

    /// Lays the value out over the device's mesh as `spec` says, in place (a parameter placed
    /// after it was built: PyTorch/XLA's `mark_sharding`). Computes a pending value first. The
    /// whole value passes through the host once; create or load large tensors straight into
    /// their shards instead (see [`LazyDevice::tensor_sharded`] and
    /// [`crate::nn::VarBuilder::with_sharding`]).
    #[track_caller]
    pub fn reshard(&self, spec: &PartitionSpec) -> Result<()> {
        let location = Location::caller();
        let dev = self.device_inner()?;
        let device = LazyDevice { inner: dev.clone() };
        let sharding = device.sharding_for(spec, self.dims(), location)?;
        if sharding.as_ref() == self.sharding().as_ref() && !self.is_pending() {
            return Ok(());
        }
        let host = self.to_host()?;
        let data = match &sharding {
            Some(s) => dev.upload_sharded(&host, s)?,
            None => dev.upload(&host, false)?,
        };
        dev.note_write();
        self.cell.replace(Value::Data(data));
        Ok(())
    }

    /// Every replica's value, in replica order (one entry on a single device).
    #[track_caller]
    pub fn to_host_replicas(&self) -> Result<Vec<HostTensor>> {
        let site = Location::caller();
        let dev = self.device_inner()?;
        let data = self.computed(&dev, site)?;
        dev.reading(|| {
            let hosts = if dev.mesh().is_some() {
                // one replica, whatever the mesh splits it into
                vec![dev.download_whole(&data)?]
            } else {
                (0..dev.device_count())
                    .map(|r| dev.download(&data, r))
                    .collect::<Result<Vec<_>>>()?
            };
            dev.poll_index_checks(false)?;
            Ok(hosts)
        })
    }

    /// The device data of this value, computed first if it is pending: what a checkpoint
    /// snapshot holds so that later updates of the tensor leave it as it is.
    #[track_caller]
    pub(crate) fn held_data(&self) -> Result<Arc<crate::device::trace::DeviceData>> {
        let dev = self.device_inner()?;
        self.computed(&dev, Location::caller())
    }

    /// The device data of this tensor, computing it first if it is pending.
    fn computed(
        &self,
        dev: &Arc<DeviceInner>,
        site: &'static Location<'static>,
    ) -> Result<Arc<crate::device::trace::DeviceData>> {
        if self.is_pending() {
            dev.sync(vec![self.cell.clone()], site, false)?;
        }
        Ok(self
            .cell
            .data()
            .expect("a sync leaves data behind or fails"))
    }

    /// The values as a flat vector of `T` (which must be the tensor's dtype).
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.read(Location::caller(), |host| Ok(host.to_vec::<T>()?))
    }

    /// The single value of a one-element tensor, as f64.
    #[track_caller]
    pub fn item(&self) -> Result<f64> {
        let location = Location::caller();
        if self.elem_count() != 1 {
            return Err(Error::Op {
                location,
                source: neuron_pc_compiler::Error::Shape {
                    op: "item",
                    operands: self.cell.ty.to_string(),
                    message: "expected a tensor with one element".into(),
                },
            });
        }
        self.read(location, |host| Ok(host.to_f64_vec()[0]))
    }

    /// Makes this tensor hold `value` from now on (an in-place update, as optimizers do to
    /// parameters). Shapes and dtypes must match.
    #[track_caller]
    pub fn assign(&self, value: &Tensor) -> Result<()> {
        let location = Location::caller();
        if value.cell.ty != self.cell.ty {
            return Err(Error::Op {
                location,
                source: neuron_pc_compiler::Error::Shape {
                    op: "assign",
                    operands: format!("{}, {}", self.cell.ty, value.cell.ty),
                    message: "the new value must have the same shape and dtype".into(),
                },
            });
        }
        if !Weak::ptr_eq(&self.cell.device, &value.cell.device) {
            return Err(Error::DeviceMismatch {
                location,
                op: "assign",
            });
        }
        let dev = self.device_inner()?;
        let new_value = value.value();
        if dev.device_count() > 1 && new_value.is_per_replica() && !self.is_per_replica() {
            return Err(Error::Placement {
                location,
                message: format!(
                    "assigning a value that differs between the {} replicas to a replicated \
                     {} tensor{} would make its replicas diverge; average it over the \
                     replicas first (all_reduce with Mean, or optim::average_gradients)",
                    dev.device_count(),
                    self.cell.ty,
                    self.name().map(|n| format!(" ({n})")).unwrap_or_default()
                ),
            });
        }
        // A value uploaded for this tensor (a loaded checkpoint's) is an input of the next step
        // graph: it carries this tensor's name from now on, so that step's diagnostics name it
        // too, not only the steps after (whose values the device names as it computes them).
        dev.note_write();
        if self.cell.replace(new_value) {
            dev.register_pending(&self.cell);
        }
        Ok(())
    }
}

/// A product's operands cast to the autocast dtype, while [`crate::LazyDevice::autocast`] runs
/// and some float operand has another dtype (`None`: record the product as it is).
fn autocast_operands(
    dev: &Arc<DeviceInner>,
    operands: &[&Tensor],
    location: &'static Location<'static>,
) -> Result<Option<Vec<Tensor>>> {
    let Some(dtype) = dev.autocast() else {
        return Ok(None);
    };
    let lower = |t: &Tensor| {
        matches!(t.dtype(), DType::F32 | DType::F16 | DType::BF16) && t.dtype() != dtype
    };
    if !operands.iter().any(|t| lower(t)) {
        return Ok(None);
    }
    operands
        .iter()
        .map(|t| match lower(t) {
            true => Tensor::apply_values_of(dev, Op::Convert(dtype), &[t], location),
            false => Ok((*t).clone()),
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}
