//! The device's door: everything code outside `device/` may do with a device's state. No field
//! of [`DeviceInner`] is visible outside this folder, so the compiler holds every caller to
//! these methods; each takes the locks it needs, in the order `mod.rs` writes down, and lets
//! go of them before it returns (the one exception, [`DeviceInner::record_op`]'s interner,
//! never calls out while it holds it).
//!
//! What callers may do:
//! - record an op ([`DeviceInner::record_op`], [`DeviceInner::record_scalar_op`]) and read a
//!   recorded node's op and type ([`DeviceInner::op_of`]);
//! - register what the metrics count (optimizer state, parameters, gradients: [`Tracked`]), a
//!   recomputed block ([`DeviceInner::add_remat`]), a layout sharding constraints name;
//! - scope autocasting ([`DeviceInner::set_autocast`]) and read the settings (configuration,
//!   mesh, step count).

use std::panic::Location;
use std::sync::{Arc, Weak};

use neuron_pc_compiler::ir::{BinaryOp, Op, TensorType};
use neuron_pc_compiler::sharding::{Mesh, Sharding};
use neuron_pc_compiler::DType;

use super::trace::{Cell, Node, Operands, Recorder, RematRegion, TypeAddrs, Value};
use super::{lock, DeviceConfig, DeviceInner, Mutex};
use crate::error::{Error, Result};
use crate::store::ScopedStore;

/// Tensors the device's metrics count by kind (their bytes per device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tracked {
    /// An optimizer's state (`optimizer_state_bytes`).
    OptimizerState,
    /// What optimizers update (`parameter_bytes`).
    Parameters,
    /// Gradients kept between steps, accumulated sums (`gradient_bytes`).
    Gradients,
}

impl DeviceInner {
    /// Records `op` over `operands` (values whose types are `types`, each a cell's type, so
    /// interned by this device when it comes from a recorded op or an upload) as a new cell:
    /// the one call a traced op makes. An application seen before (the same op over operands
    /// of the same interned types) takes its id and type from the interner without inference.
    pub(crate) fn record_op(
        self: &Arc<Self>,
        op: Op,
        operands: Operands,
        types: &[&Arc<TensorType>],
        site: &'static Location<'static>,
    ) -> Result<Arc<Cell>> {
        let per_replica = self.result_per_replica(&op, &operands);
        let mut rec = lock(&self.recorder);
        self.record_locked(&mut rec, op, operands, types, per_replica, site)
    }

    /// [`DeviceInner::record_op`] for several ops over the same operands (the results of one
    /// call), under one lock.
    pub(crate) fn record_ops(
        self: &Arc<Self>,
        ops: impl Iterator<Item = Op>,
        operands: Operands,
        types: &[&Arc<TensorType>],
        site: &'static Location<'static>,
    ) -> Result<Vec<Arc<Cell>>> {
        let mut rec = lock(&self.recorder);
        ops.map(|op| {
            let per_replica = self.result_per_replica(&op, &operands);
            self.record_locked(&mut rec, op, operands.clone(), types, per_replica, site)
        })
        .collect()
    }

    /// [`DeviceInner::record_op`] with the recorder held.
    fn record_locked(
        self: &Arc<Self>,
        rec: &mut Recorder,
        op: Op,
        operands: Operands,
        types: &[&Arc<TensorType>],
        per_replica: bool,
        site: &'static Location<'static>,
    ) -> Result<Arc<Cell>> {
        let mut addrs = TypeAddrs::new();
        for t in types {
            addrs.push(Arc::as_ptr(t) as usize);
        }
        if let Some((op_id, ty)) = rec.interner.applied(&op, &addrs) {
            return Ok(self.record_interned(rec, op_id, per_replica, ty, operands, site));
        }
        // Operand types on the stack for the usual one to four operands.
        let mut few: [&TensorType; 4] = [&**types[0]; 4];
        let many: Vec<&TensorType>;
        let plain: &[&TensorType] = if types.len() <= few.len() {
            for (slot, t) in few.iter_mut().zip(types) {
                *slot = t;
            }
            &few[..types.len()]
        } else {
            many = types.iter().map(|t| &***t).collect();
            &many
        };
        let ty = neuron_pc_compiler::ir::infer(&op, plain).map_err(|source| Error::Op {
            location: site,
            source,
        })?;
        // Only types interned by this device may be remembered by address.
        let interner = &mut rec.interner;
        let (op_id, ty) = if types.iter().all(|t| interner.is_interned(t)) {
            let key = op.clone();
            let (op_id, ty) = interner.op(op, ty);
            interner.remember(&key, addrs, op_id);
            (op_id, ty)
        } else {
            interner.op(op, ty)
        };
        Ok(self.record_interned(rec, op_id, per_replica, ty, operands, site))
    }

    /// `x op c` for `x` of interned type `ty`, with `c` one splat constant of that type: found
    /// by the value and the type and shared by every use, one node and no tensor of its own
    /// (one lock for the constant and the op).
    pub(crate) fn record_scalar_op(
        self: &Arc<Self>,
        op: BinaryOp,
        x: Value,
        ty: &Arc<TensorType>,
        value: f64,
        site: &'static Location<'static>,
    ) -> Result<Arc<Cell>> {
        let op = Op::Binary(op);
        // a splat constant is the same on every replica: x decides
        let per_replica = self.result_per_replica(&op, std::slice::from_ref(&x));
        let mut rec = lock(&self.recorder);
        let c = Value::Node(rec.interner.splat(ty, value));
        let operands = Operands::from_buf([x, c]);
        self.record_locked(&mut rec, op, operands, &[ty, ty], per_replica, site)
    }

    /// The op and result type of the recorded op `op_id` (copies: no lock is kept).
    pub(crate) fn op_of(&self, op_id: u32) -> (Op, TensorType) {
        let rec = lock(&self.recorder);
        let (op, ty) = rec.interner.op_of(op_id);
        (op.clone(), ty.clone())
    }

    /// What differentiating `node` reads, under one lock: its op, its result type and its
    /// operands' types (each the device's shared copy).
    pub(crate) fn op_view(&self, node: &Node) -> (Op, Arc<TensorType>, Vec<Arc<TensorType>>) {
        let mut rec = lock(&self.recorder);
        let op = rec.interner.op_of(node.op_id).0.clone();
        let ty = rec.interner.result_type(node.op_id).clone();
        let operands = (node.operands.iter())
            .map(|o| match o {
                Value::Node(n) => rec.interner.result_type(n.op_id).clone(),
                Value::Data(d) => rec.interner.ty_arc(d.ty()),
            })
            .collect();
        (op, ty, operands)
    }

    /// [`DeviceInner::detached_cell`] of a type the device already shares (no lookup).
    pub(crate) fn detached_cell_of(
        self: &Arc<Self>,
        value: Value,
        ty: Arc<TensorType>,
    ) -> Arc<Cell> {
        Arc::new(Cell {
            id: u64::MAX,
            ty,
            device: Arc::downgrade(self),
            value: Mutex::new(value),
            donor: Mutex::new(None),
            name: Mutex::new(None),
        })
    }

    /// Makes `sharding` known by its `mhlo.sharding` text, so that a step whose output a
    /// sharding constraint lays out this way gives the output this layout.
    pub(crate) fn register_sharding(&self, sharding: &Sharding) {
        lock(&self.recorder).interner.sharding(sharding);
    }

    /// Counts `cells` in the metrics as `what` (once each, however often registered).
    pub(crate) fn track<'a>(&self, what: Tracked, cells: impl IntoIterator<Item = &'a Arc<Cell>>) {
        let mut list = lock(match what {
            Tracked::OptimizerState => &self.optimizer_state,
            Tracked::Parameters => &self.parameters,
            Tracked::Gradients => &self.gradients,
        });
        list.retain(|w| w.strong_count() > 0);
        for cell in cells {
            if !list
                .iter()
                .any(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(cell)))
            {
                list.push(Arc::downgrade(cell));
            }
        }
    }

    /// Adds a block the backward pass recomputes, forgetting blocks whose outputs are gone.
    pub(crate) fn add_remat(&self, region: RematRegion) {
        let mut regions = lock(&self.remat);
        regions.retain(|r| r.outputs.iter().any(|o: &Weak<_>| o.strong_count() > 0));
        regions.push(Arc::new(region));
    }

    /// The blocks the backward pass may recompute.
    pub(crate) fn remat_regions(&self) -> Vec<Arc<RematRegion>> {
        lock(&self.remat).clone()
    }

    /// The dtype matrix products are computed in (`LazyDevice::autocast`), if any.
    pub(crate) fn autocast(&self) -> Option<DType> {
        *lock(&self.autocast)
    }

    /// Sets the autocast dtype, returning the previous one (for a scope to restore).
    pub(crate) fn set_autocast(&self, dtype: Option<DType>) -> Option<DType> {
        std::mem::replace(&mut *lock(&self.autocast), dtype)
    }

    /// The configuration the device was opened with.
    pub(crate) fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// The mesh every step is partitioned over, if any.
    pub(crate) fn mesh(&self) -> Option<&Mesh> {
        self.mesh.as_ref()
    }

    /// How many devices this process runs the replicas (or the mesh) on.
    pub(crate) fn device_count(&self) -> usize {
        self.devices.len()
    }

    /// How many steps were cut so far.
    pub(crate) fn steps(&self) -> u64 {
        lock(&self.metrics).steps
    }

    /// The run's store, when ranks are checked through one.
    pub(crate) fn run_store(&self) -> Option<&ScopedStore> {
        self.rank_check.as_ref().map(|c| c.store())
    }
}
