//! The recorded computation: an immutable DAG of nodes that pending tensors point into.
//!
//! Each node carries a small integer for its (op, result type), interned per device, so a step
//! graph's identity can be written as a compact list of integers (see `step.rs`) and compared
//! exactly, with no hash collisions to worry about, on every `mark_step`.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use neuron_pc_compiler::ir::{Op, TensorType};
use neuron_pc_compiler::pjrt::Buffer;

/// Device memory holding one tensor's value.
pub(crate) struct DeviceData {
    pub buffer: Buffer,
    /// Extract mode: a zero-filled stand-in for a value that was never computed.
    pub zero_filled: bool,
    /// The buffer's type, interned by the owning device.
    pub ty_id: u32,
    /// The name of the tensor holding this value, when it has one (see `Tensor::set_name`).
    pub name: std::sync::Mutex<Option<Arc<str>>>,
}

/// An operand: another recorded node, or data already on the device.
#[derive(Clone)]
pub(crate) enum Value {
    Node(Arc<Node>),
    Data(Arc<DeviceData>),
}

/// One recorded op application.
pub(crate) struct Node {
    /// Index into the device's [`Interner`].
    pub op_id: u32,
    pub operands: Vec<Value>,
}

/// Distinct (op, result type) pairs and distinct types seen by one device.
#[derive(Default)]
pub(crate) struct Interner {
    ops: HashMap<(Op, TensorType), u32>,
    op_list: Vec<(Op, TensorType)>,
    types: HashMap<TensorType, u32>,
    type_list: Vec<TensorType>,
}

impl Interner {
    pub fn op(&mut self, op: Op, ty: TensorType) -> u32 {
        let key = (op, ty);
        if let Some(&id) = self.ops.get(&key) {
            return id;
        }
        let id = self.op_list.len() as u32;
        self.op_list.push(key.clone());
        self.ops.insert(key, id);
        id
    }

    pub fn ty(&mut self, ty: &TensorType) -> u32 {
        if let Some(&id) = self.types.get(ty) {
            return id;
        }
        let id = self.type_list.len() as u32;
        self.type_list.push(ty.clone());
        self.types.insert(ty.clone(), id);
        id
    }

    pub fn op_of(&self, id: u32) -> &(Op, TensorType) {
        &self.op_list[id as usize]
    }

    pub fn type_of(&self, id: u32) -> &TensorType {
        &self.type_list[id as usize]
    }
}

impl DeviceData {
    /// The buffer's type.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.buffer.dtype(), self.buffer.dims().to_vec())
    }
}
