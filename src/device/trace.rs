//! The recorded computation: an immutable DAG of nodes that pending tensors point into, and
//! the cell behind every tensor (its type, its value: a node or device data, and its donor).
//!
//! Each node carries a small integer for its (op, result type), interned per device, so a step
//! graph's identity can be written as a compact list of integers (see `step.rs`) and compared
//! exactly, with no hash collisions to worry about, on every `mark_step`.

use rustc_hash::FxHashMap as HashMap;
use std::hash::BuildHasher;
use std::panic::Location;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use neuron_pc_compiler::ir::{Literal, Op, TensorType};
use neuron_pc_compiler::pjrt::Buffer;
use neuron_pc_compiler::sharding::Sharding;

/// Device memory holding one tensor's value: one buffer per replica, on that replica's device;
/// on a mesh device, one per mesh position: the whole value, or its block when it is sharded.
pub(crate) struct DeviceData {
    /// Its buffers and the step computing them, set once that step is launched: at once, or
    /// by the device's launch thread for a step's output (see `launch.rs`), which holds the
    /// slot, not the value, so that the value's count (`DeviceData::holders`) never sees it.
    placed: Slot,
    /// The whole value's type.
    pub ty: TensorType,
    /// How the value is split over a mesh device's positions (`buffers[p]` is position `p`'s
    /// block); none: every buffer holds the whole value.
    pub sharding: Option<Arc<Sharding>>,
    /// The sharding's id, interned by the owning device (0: none).
    pub sharding_id: u32,
    /// The replicas may hold different values (a batch shard, a per-replica gradient); false
    /// when they hold the same (parameters, optimizer state, scalars).
    pub per_replica: bool,
    /// The trial run: a zero-filled stand-in for a value that was never computed.
    pub zero_filled: bool,
    /// The buffer's type, interned by the owning device.
    pub ty_id: u32,
    /// The name of the tensor holding this value, when it has one (see `Tensor::set_name`).
    pub name: Mutex<Option<Arc<str>>>,
    /// Its parameter's position in the step walk that last reached it.
    pub mark: WalkMark,
    /// Launches handed over to the launch thread, not yet made, that hold it as an input.
    pub queued: AtomicUsize,
}

/// A value: recorded but not computed (a node), or on the device. It is both a node's operand
/// and the state of a tensor.
#[derive(Clone)]
pub(crate) enum Value {
    Node(Arc<Node>),
    Data(Arc<DeviceData>),
}

impl Value {
    pub fn is_pending(&self) -> bool {
        matches!(self, Value::Node(_))
    }

    /// True when the replicas may hold different values.
    pub fn is_per_replica(&self) -> bool {
        match self {
            Value::Node(n) => n.per_replica,
            Value::Data(d) => d.per_replica,
        }
    }
}

/// A value's identity while it is alive: the address of its node or data.
pub(crate) fn value_key(v: &Value) -> usize {
    match v {
        Value::Node(n) => Arc::as_ptr(n) as *const u8 as usize,
        Value::Data(d) => Arc::as_ptr(d) as *const u8 as usize,
    }
}

/// Values below `roots` in post-order (operands before users), not walking below the values
/// of `stop` (nor listing them).
pub(crate) fn post_order(roots: &[Value], stop: &rustc_hash::FxHashSet<usize>) -> Vec<Value> {
    let mut order = Vec::new();
    let mut seen: rustc_hash::FxHashSet<usize> = rustc_hash::FxHashSet::default();
    for root in roots {
        if stop.contains(&value_key(root)) || !seen.insert(value_key(root)) {
            continue;
        }
        // Iterative, so deep graphs (long training unrolls) cannot overflow the stack.
        let mut stack: Vec<(Value, usize)> = vec![(root.clone(), 0)];
        while let Some((v, i)) = stack.last_mut() {
            let operands: &[Value] = match v {
                Value::Node(n) => &n.operands,
                Value::Data(_) => &[],
            };
            if let Some(c) = operands.get(*i).cloned() {
                *i += 1;
                if !stop.contains(&value_key(&c)) && seen.insert(value_key(&c)) {
                    stack.push((c, 0));
                }
            } else if let Some((v, _)) = stack.pop() {
                order.push(v);
            }
        }
    }
    order
}

/// What a tensor handle shares: one per recorded op result or uploaded value.
pub(crate) struct Cell {
    /// Creation order; pending outputs of a step are ordered by it.
    pub id: u64,
    /// Shared with the device's [`Interner`] for recorded ops (no allocation per op).
    pub ty: Arc<TensorType>,
    pub device: Weak<super::DeviceInner>,
    pub(super) value: Mutex<Value>,
    /// The device data this tensor held before an in-place update made it pending: if the
    /// step graph reads that data and nothing else holds it, its buffer is donated to the new
    /// value (updated in place instead of copied).
    pub(super) donor: Mutex<Option<Weak<DeviceData>>>,
    /// A name for diagnostics (a parameter's state-dict name, a batch field), passed on to each
    /// new value so recompile warnings and `neuron-pc analyze` can name graph inputs.
    pub(super) name: Mutex<Option<Arc<str>>>,
}

/// What code outside `device/` may do with a cell: read its value, name it, give it a new
/// value (each takes the cell's locks and lets go before returning).
impl Cell {
    /// The current value (a pending node or device data).
    #[inline]
    pub(crate) fn value(&self) -> Value {
        super::lock(&self.value).clone()
    }

    /// Whether the value is still to be computed.
    #[inline]
    pub(crate) fn is_pending(&self) -> bool {
        super::lock(&self.value).is_pending()
    }

    /// Whether the replicas may hold different values of it.
    #[inline]
    pub(crate) fn is_per_replica(&self) -> bool {
        super::lock(&self.value).is_per_replica()
    }

    /// The device data, when the value is computed.
    #[inline]
    pub(crate) fn data(&self) -> Option<Arc<DeviceData>> {
        match &*super::lock(&self.value) {
            Value::Data(d) => Some(d.clone()),
            Value::Node(_) => None,
        }
    }

    /// The name given for diagnostics, if any.
    #[inline]
    pub(crate) fn name(&self) -> Option<Arc<str>> {
        super::lock(&self.name).clone()
    }

    /// Names the cell, and its current device data, for diagnostics.
    pub(crate) fn set_name(&self, name: Arc<str>) {
        if let Value::Data(d) = &*super::lock(&self.value) {
            *super::lock(&d.name) = Some(name.clone());
        }
        *super::lock(&self.name) = Some(name);
    }

    /// Makes `value` the cell's (an in-place update). Data uploaded for it takes the cell's
    /// name, unless it has one; a pending value keeps the data it replaces as the donor of
    /// its buffer. True when the new value is pending (the device must track it).
    pub(crate) fn replace(&self, value: Value) -> bool {
        if let (Value::Data(d), Some(name)) = (&value, self.name()) {
            super::lock(&d.name).get_or_insert(name);
        }
        let pending = value.is_pending();
        let old = std::mem::replace(&mut *super::lock(&self.value), value);
        if let (true, Value::Data(d)) = (pending, &old) {
            *super::lock(&self.donor) = Some(Arc::downgrade(d));
        }
        pending
    }
}

/// What recording an op touches, under the device's one recording lock: the interner, the
/// tensors that may hold pending values, and the next tensor id.
#[derive(Default)]
pub(crate) struct Recorder {
    pub interner: Interner,
    /// Tensors that may hold pending values, pruned at every step.
    pub pending: Vec<Weak<Cell>>,
    /// The length at which [`Recorder::track`] drops the dead entries of `pending`.
    pub prune_at: usize,
    pub next_id: u64,
}

impl Recorder {
    /// The least `prune_at`: a step of up to this many ops is never pruned while recorded.
    pub const PRUNE_FLOOR: usize = 1 << 12;

    /// Adds `cell` to the tensors that may be pending.
    ///
    /// An entry keeps its cell's allocation alive after the tensor is dropped, until the step
    /// cut takes the list. A trace that runs far past the last step's length without a cut (a
    /// loop that never calls `mark_step`) would then hold every temporary it ever made, and
    /// each new tensor would land on fresh pages; so the list drops its dead entries once it
    /// is twice as long as the last step's (at least [`Recorder::PRUNE_FLOOR`]), and sets the
    /// next limit at twice what is left. A trace of the last step's length never prunes, so
    /// the step's dead entries are still freed off the critical path (see `Retired`).
    pub fn track(&mut self, cell: Weak<Cell>) {
        if self.pending.len() >= self.prune_at.max(Self::PRUNE_FLOOR) {
            self.pending.retain(|c| c.strong_count() > 0);
            self.prune_at = 2 * self.pending.len();
        }
        self.pending.push(cell);
    }
}

/// A value held without keeping it alive. Its allocation stays, so no other value takes its
/// address (the key autodiff knows it by) while this is held.
pub(crate) enum WeakValue {
    Node(Weak<Node>),
    Data(Weak<DeviceData>),
}

impl WeakValue {
    pub fn new(v: &Value) -> WeakValue {
        match v {
            Value::Node(n) => WeakValue::Node(Arc::downgrade(n)),
            Value::Data(d) => WeakValue::Data(Arc::downgrade(d)),
        }
    }

    /// The address the live value has (`Arc::as_ptr`), live or not.
    pub fn key(&self) -> usize {
        match self {
            WeakValue::Node(n) => n.as_ptr() as *const u8 as usize,
            WeakValue::Data(d) => d.as_ptr() as *const u8 as usize,
        }
    }

    pub fn upgrade(&self) -> Option<Value> {
        match self {
            WeakValue::Node(n) => n.upgrade().map(Value::Node),
            WeakValue::Data(d) => d.upgrade().map(Value::Data),
        }
    }
}

/// A tensor on a [`crate::LazyDevice`]: a handle to one recorded or computed value, which the
/// device owns (the operations are in `crate::tensor`). Cloning is cheap and shares the value
/// (like `Rc`); use [`Tensor::assign`] for in-place updates.
#[derive(Clone)]
pub struct Tensor {
    pub(crate) cell: Arc<Cell>,
}

/// A block whose activations the backward pass recomputes from its inputs instead of keeping
/// (activation checkpointing, `nn::checkpoint`): the recorded nodes between `inputs` and
/// `outputs`. Held weakly: a block nobody differentiates any more is dropped at the next
/// registration.
pub(crate) struct RematRegion {
    pub inputs: Vec<WeakValue>,
    pub outputs: Vec<Weak<Node>>,
    /// Keep the products without batch dimensions (`dots` policy); recompute the rest.
    pub save_dots: bool,
}

/// One recorded op application.
pub(crate) struct Node {
    /// Index into the device's [`Interner`].
    pub op_id: u32,
    /// The result may differ between replicas (see [`DeviceData::per_replica`]).
    pub per_replica: bool,
    pub operands: Operands,
    /// The line that recorded it (the user's, through `#[track_caller]`), for diagnostics;
    /// none for nodes the library makes on its own (shared constants, placeholders).
    pub site: Option<&'static Location<'static>>,
    /// Its position in the step walk that last reached it.
    pub mark: WalkMark,
}

impl Node {
    pub fn new(op_id: u32, per_replica: bool, operands: Operands) -> Node {
        Node::at(op_id, per_replica, operands, None)
    }

    /// A node recorded at `site`.
    pub fn at(
        op_id: u32,
        per_replica: bool,
        operands: Operands,
        site: Option<&'static Location<'static>>,
    ) -> Node {
        Node {
            op_id,
            per_replica,
            operands,
            site,
            mark: WalkMark::default(),
        }
    }
}

/// Where a step walk put a node or device data: the walk's number and the entry's position.
/// The walk numbers of a device's steps are distinct and walks run one at a time (under the
/// device's walk lock), so a mark from an earlier walk is never taken for the current one and
/// the walk needs no map from nodes to positions (see `step.rs`).
#[derive(Default)]
pub(crate) struct WalkMark {
    walk: AtomicU64,
    pos: AtomicU32,
}

impl WalkMark {
    /// The position given in walk `walk`, if that walk reached this.
    pub fn get(&self, walk: u64) -> Option<u32> {
        (self.walk.load(Ordering::Relaxed) == walk).then(|| self.pos.load(Ordering::Relaxed))
    }

    pub fn set(&self, walk: u64, pos: u32) {
        self.pos.store(pos, Ordering::Relaxed);
        self.walk.store(walk, Ordering::Relaxed);
    }
}

/// A node's operands, inline for up to two.
pub(crate) type Operands = smallvec::SmallVec<[Value; 2]>;

/// Distinct (op, result type) pairs and distinct types seen by one device.
///
/// Ops are found by the hash of `(op, type)` and compared by reference, so a hit (almost every
/// op of every step after the first) allocates nothing.
///
/// Types are interned too, one `Arc` per distinct type for the device's life, so the address of
/// a cell's type identifies the type; `applied` maps an op and its operands' type addresses to
/// the op's id, skipping type inference for every application seen before.
#[derive(Default)]
pub(crate) struct Interner {
    ops: HashMap<u64, Vec<u32>>,
    op_list: Vec<(Op, Arc<TensorType>)>,
    types: HashMap<Arc<TensorType>, u32>,
    type_list: Vec<Arc<TensorType>>,
    applied: HashMap<u64, Vec<(u32, TypeAddrs)>>,
    /// Splat constants by the address of their interned type and the value's bits: the one
    /// node every use shares (it has no operands and never changes, so a step graph that uses
    /// the constant twice holds it once, and no use allocates).
    splats: HashMap<(usize, u64), Arc<Node>>,
    /// Shardings of device data on a mesh device, ids from 1 (0: whole on every device).
    shardings: HashMap<Arc<Sharding>, u32>,
    sharding_list: Vec<Arc<Sharding>>,
    /// The same shardings by their `mhlo.sharding` text and shape, as sharding constraints
    /// name them.
    by_hlo: HashMap<(String, Vec<usize>), Arc<Sharding>>,
    /// `applied` for the ops with a small key (see [`small_key`]): by the key, the operand
    /// count and up to three operand type addresses, with no `Op` hashed or compared.
    small: HashMap<(u32, [usize; 3]), (u32, Arc<TensorType>)>,
}

/// A key for the ops whose only attribute is a fieldless enum (elementwise ops, `select`,
/// `convert`): the variant, the attribute and the operand count, when there are at most three.
/// Any other op, a new one included, takes the general path, which is right for every op: the
/// wildcard decides a shortcut, not what the op does.
#[allow(clippy::wildcard_enum_match_arm)]
fn small_key(op: &Op, operands: usize) -> Option<u32> {
    if operands > 3 {
        return None;
    }
    let (kind, attr) = match op {
        Op::Unary(u) => (1, *u as u32),
        Op::Binary(b) => (2, *b as u32),
        Op::Compare(c) => (3, *c as u32),
        Op::Select => (4, 0),
        Op::Convert(d) => (5, *d as u32),
        _ => return None,
    };
    Some(kind << 24 | attr << 2 | operands as u32)
}

/// The first three of `addrs`, zero-padded.
fn three(addrs: &[usize]) -> [usize; 3] {
    let mut a = [0; 3];
    a[..addrs.len()].copy_from_slice(addrs);
    a
}

/// The addresses of interned operand types.
pub(crate) type TypeAddrs = smallvec::SmallVec<[usize; 4]>;

impl Interner {
    /// The id of `(op, ty)` and the interned type.
    pub fn op(&mut self, op: Op, ty: TensorType) -> (u32, Arc<TensorType>) {
        let hash = rustc_hash::FxBuildHasher.hash_one((&op, &ty));
        if let Some(ids) = self.ops.get(&hash) {
            for &id in ids {
                let (o, t) = &self.op_list[id as usize];
                if *o == op && **t == ty {
                    return (id, t.clone());
                }
            }
        }
        let id = self.op_list.len() as u32;
        let ty = self.ty_arc(ty);
        self.op_list.push((op, ty.clone()));
        self.ops.entry(hash).or_default().push(id);
        (id, ty)
    }

    /// The op id of `op` applied to operands of the interned types at `addrs`, if that
    /// application was seen before, and its result type.
    pub fn applied(&self, op: &Op, addrs: &[usize]) -> Option<(u32, Arc<TensorType>)> {
        if let Some(k) = small_key(op, addrs.len()) {
            let (id, ty) = self.small.get(&(k, three(addrs)))?;
            return Some((*id, ty.clone()));
        }
        let hash = rustc_hash::FxBuildHasher.hash_one((op, addrs));
        let hits = self.applied.get(&hash)?;
        hits.iter().find_map(|(id, a)| {
            let (o, t) = &self.op_list[*id as usize];
            (a[..] == *addrs && o == op).then(|| (*id, t.clone()))
        })
    }

    /// Remembers that `op` on operands of the types at `addrs` is op `id`.
    pub fn remember(&mut self, op: &Op, addrs: TypeAddrs, id: u32) {
        if let Some(k) = small_key(op, addrs.len()) {
            let ty = self.op_list[id as usize].1.clone();
            self.small.insert((k, three(&addrs)), (id, ty));
            return;
        }
        let hash = rustc_hash::FxBuildHasher.hash_one((op, &addrs[..]));
        self.applied.entry(hash).or_default().push((id, addrs));
    }

    /// The node of the constant `value` (converted to `ty`'s dtype) repeated over `ty`. When
    /// `ty` is interned, a value seen before is found by its bits and the type's address alone,
    /// and its node is shared.
    pub fn splat(&mut self, ty: &Arc<TensorType>, value: f64) -> Arc<Node> {
        let key = (Arc::as_ptr(ty) as usize, value.to_bits());
        if let Some(node) = self.splats.get(&key) {
            return node.clone();
        }
        let lit = Literal::splat(ty.dtype, value, &ty.dims);
        let (id, shared) = self.op(Op::Constant(lit), (**ty).clone());
        let node = Arc::new(Node::new(id, false, Operands::new()));
        // Interned types live as long as the interner, so their addresses are never reused.
        if Arc::ptr_eq(&shared, ty) {
            self.splats.insert(key, node.clone());
        }
        node
    }

    /// True when `ty` is this interner's shared copy of its type.
    pub fn is_interned(&self, ty: &Arc<TensorType>) -> bool {
        self.types
            .get(&**ty)
            .is_some_and(|&id| Arc::ptr_eq(&self.type_list[id as usize], ty))
    }

    /// The one shared copy of `ty`.
    pub fn ty_arc(&mut self, ty: TensorType) -> Arc<TensorType> {
        let id = self.ty(&ty);
        self.type_list[id as usize].clone()
    }

    pub fn ty(&mut self, ty: &TensorType) -> u32 {
        if let Some(&id) = self.types.get(ty) {
            return id;
        }
        let id = self.type_list.len() as u32;
        let shared = Arc::new(ty.clone());
        self.type_list.push(shared.clone());
        self.types.insert(shared, id);
        id
    }

    /// The id of `sharding` (from 1) and its shared copy.
    pub fn sharding(&mut self, sharding: &Sharding) -> (u32, Arc<Sharding>) {
        if let Some((s, &id)) = self.shardings.get_key_value(sharding) {
            return (id, s.clone());
        }
        let shared = Arc::new(sharding.clone());
        self.sharding_list.push(shared.clone());
        let id = self.sharding_list.len() as u32;
        self.shardings.insert(shared.clone(), id);
        self.by_hlo
            .insert((shared.hlo(), shared.dims().to_vec()), shared.clone());
        (id, shared)
    }

    /// The sharding interned with the `mhlo.sharding` text `hlo` for shape `dims`.
    pub fn sharding_by_hlo(&self, hlo: &str, dims: &[usize]) -> Option<Arc<Sharding>> {
        self.by_hlo.get(&(hlo.to_string(), dims.to_vec())).cloned()
    }

    pub fn op_of(&self, id: u32) -> (&Op, &TensorType) {
        let (op, ty) = &self.op_list[id as usize];
        (op, ty)
    }

    /// The shared copy of op `id`'s result type.
    pub fn result_type(&self, id: u32) -> &Arc<TensorType> {
        &self.op_list[id as usize].1
    }

    pub fn type_of(&self, id: u32) -> &TensorType {
        &self.type_list[id as usize]
    }
}

/// A launched value's buffers (one per device) and the step that computes them, while it may
/// still be running (none for uploads).
pub(crate) struct Placed {
    pub buffers: Vec<Buffer>,
    pub producer: Option<Arc<super::inflight::StepRun>>,
}

/// Why a step's outputs were never placed: its launch failed (or a step it depends on did).
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    pub site: &'static Location<'static>,
    pub step: u64,
    pub message: String,
}

impl Failure {
    pub fn error(&self) -> crate::error::Error {
        crate::error::Error::StepFailed {
            site: self.site,
            step: self.step,
            message: self.message.clone(),
        }
    }
}

/// Where a value's buffers, or its launch's failure, are placed once.
pub(crate) type Slot = Arc<OnceLock<std::result::Result<Placed, Failure>>>;

impl DeviceData {
    /// A value whose buffers are (or will be) `placed`, of type `ty` (the whole value's).
    pub fn new(
        ty: TensorType,
        placed: Option<Placed>,
        sharding: Option<Arc<Sharding>>,
        sharding_id: u32,
        per_replica: bool,
        zero_filled: bool,
        ty_id: u32,
    ) -> DeviceData {
        let slot = Slot::default();
        if let Some(p) = placed {
            let _ = slot.set(Ok(p));
        }
        DeviceData {
            placed: slot,
            ty,
            sharding,
            sharding_id,
            per_replica,
            zero_filled,
            ty_id,
            name: Mutex::new(None),
            mark: WalkMark::default(),
            queued: AtomicUsize::new(0),
        }
    }

    /// Its holders, less the launches queued to the launch thread: what a donation check
    /// counts, under the queue's lock (`Launcher::counting`), where a launch made lets go of
    /// both at once. Launches are made in cut order and let go of their inputs once made, so a
    /// queued one no longer holds the value when a later launch donates it.
    pub fn holders(this: &Arc<DeviceData>) -> usize {
        // The count first, then the queued holds: a launch that lets go outside the lock (one
        // never made) drops its hold before its `Arc`, so a hold still counted is never missing
        // from the `Arc`'s count read before (which, seeing the launch's `Arc` gone, sees its
        // hold gone too, by the fence).
        let strong = Arc::strong_count(this);
        std::sync::atomic::fence(Ordering::Acquire);
        strong.saturating_sub(this.queued.load(Ordering::Relaxed))
    }

    /// The value's type (the whole value's, when the buffers hold blocks).
    pub fn ty(&self) -> TensorType {
        self.ty.clone()
    }

    /// Its buffers and producer, once its step was launched (waiting for the launch).
    pub fn placed(&self) -> crate::error::Result<&Placed> {
        self.placed.wait().as_ref().map_err(Failure::error)
    }

    /// Its buffers, one per device, once its step was launched.
    pub fn buffers(&self) -> crate::error::Result<&[Buffer]> {
        Ok(&self.placed()?.buffers)
    }

    /// The step computing it, when known without waiting (none for uploads and for a step
    /// not yet launched).
    pub fn producer(&self) -> Option<&Arc<super::inflight::StepRun>> {
        match self.placed.get() {
            Some(Ok(p)) => p.producer.as_ref(),
            _ => None,
        }
    }

    /// Bytes of one device's buffer: its block of a sharded value (by type until launched).
    pub fn device_bytes(&self) -> u64 {
        if let Some(Ok(p)) = self.placed.get() {
            return p.buffers.first().map_or(0, |b| b.size_in_bytes() as u64);
        }
        match &self.sharding {
            Some(s) => TensorType::new(self.ty.dtype, s.shard_dims()).size_in_bytes() as u64,
            None => self.ty.size_in_bytes() as u64,
        }
    }

    /// True once its step was launched (or its launch failed).
    pub fn is_placed(&self) -> bool {
        self.placed.get().is_some()
    }

    /// Where a launch places this value (see `placed`).
    pub fn slot(&self) -> Slot {
        self.placed.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use neuron_pc_compiler::ir::UnaryOp;
    use neuron_pc_compiler::DType;

    #[test]
    fn an_application_is_remembered_by_op_and_operand_types() {
        let mut i = Interner::default();
        let a = i.ty_arc(TensorType::new(DType::F32, vec![2, 3]));
        let b = i.ty_arc(TensorType::new(DType::F32, vec![3, 2]));
        assert!(i.is_interned(&a) && !i.is_interned(&Arc::new((*a).clone())));
        assert!(Arc::ptr_eq(
            &a,
            &i.ty_arc(TensorType::new(DType::F32, vec![2, 3]))
        ));
        let tanh = Op::Unary(UnaryOp::Tanh);
        let at = |t: &Arc<TensorType>| -> TypeAddrs {
            std::iter::once(Arc::as_ptr(t) as usize).collect()
        };
        assert!(i.applied(&tanh, &at(&a)).is_none());
        let (id, ty) = i.op(tanh.clone(), (*a).clone());
        i.remember(&tanh, at(&a), id);
        let (hit, hit_ty) = i.applied(&tanh, &at(&a)).unwrap();
        assert_eq!(hit, id);
        assert!(Arc::ptr_eq(&hit_ty, &ty) && Arc::ptr_eq(&ty, &a));
        // another operand type, another op: not a hit
        assert!(i.applied(&tanh, &at(&b)).is_none());
        assert!(i.applied(&Op::Unary(UnaryOp::Exp), &at(&a)).is_none());
        assert!(i.applied(&tanh, &[at(&a)[0], at(&a)[0]]).is_none());
        // an op with attributes beyond a fieldless enum: found by the op itself
        let flat = Op::Reshape { dims: vec![6] };
        let (fid, _) = i.op(flat.clone(), TensorType::new(DType::F32, vec![6]));
        i.remember(&flat, at(&a), fid);
        assert_eq!(i.applied(&flat, &at(&a)).map(|h| h.0), Some(fid));
        assert!(i.applied(&flat, &at(&b)).is_none());
        assert!(i
            .applied(&Op::Reshape { dims: vec![3, 2] }, &at(&a))
            .is_none());
    }

    /// A pending cell of no device.
    fn pending_cell(id: u64, node: &Arc<Node>) -> Arc<Cell> {
        Arc::new(Cell {
            id,
            ty: Arc::new(TensorType::new(DType::F32, vec![1])),
            device: Weak::new(),
            value: Mutex::new(Value::Node(node.clone())),
            donor: Mutex::new(None),
            name: Mutex::new(None),
        })
    }

    #[test]
    fn the_pending_list_drops_dead_entries_only_past_the_last_step() {
        let node = Arc::new(Node::new(0, false, Operands::new()));
        let mut rec = Recorder::default();
        // a long trace of temporaries and no cut: bounded, not one entry per tensor ever made
        let mut longest = 0;
        for id in 0..20_000 {
            rec.track(Arc::downgrade(&pending_cell(id, &node)));
            longest = longest.max(rec.pending.len());
        }
        assert_eq!(longest, Recorder::PRUNE_FLOOR);
        // live tensors are never dropped from it, and keep their order
        let mut rec = Recorder::default();
        let mut live = Vec::new();
        for id in 0..20_000 {
            let c = pending_cell(id, &node);
            rec.track(Arc::downgrade(&c));
            if id % 3 == 0 {
                live.push(c);
            }
        }
        let kept: Vec<u64> = rec
            .pending
            .iter()
            .filter_map(Weak::upgrade)
            .map(|c| c.id)
            .collect();
        assert_eq!(kept, live.iter().map(|c| c.id).collect::<Vec<_>>());
        assert!(rec.pending.len() < 20_000);
        // after a step of 10,000 entries (the cut sets the limit), a trace of that length is
        // not pruned while recorded
        let mut rec = Recorder {
            prune_at: 2 * 10_000,
            ..Recorder::default()
        };
        for id in 0..19_999 {
            rec.track(Arc::downgrade(&pending_cell(id, &node)));
        }
        assert_eq!(rec.pending.len(), 19_999);
    }
}
