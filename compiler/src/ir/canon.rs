//! The canonical byte form of a graph and its SHA-256 fingerprint.
//!
//! Layout (all integers little-endian, fixed width; every list length-prefixed with a u64):
//! magic `NPCG`, [`CANONICAL_VERSION`] as u32, the node count, then per node: the op tag (u8),
//! the op's attributes, the operand positions, the result type (dtype tag u8 + dims); then the
//! outputs. Parameters appear as nodes with their index and type, never their values. Tags are
//! written out here by hand (not taken from enum discriminants) so reordering an enum cannot
//! silently change every hash.

use sha2::{Digest, Sha256};

use crate::dtype::DType;

use super::graph::Graph;
use super::op::{BinaryOp, CompareOp, Op, ReduceOp, UnaryOp};
use super::types::{Literal, TensorType};

/// Version of the canonical encoding. Change this when the encoding of any op, attribute or
/// type changes, or when an op's meaning changes, so old hashes can never match new graphs.
pub const CANONICAL_VERSION: u32 = 1;

impl Graph {
    /// The canonical bytes (see the module docs): equal graphs give equal bytes in every
    /// process and on every machine.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut w = Writer(Vec::with_capacity(64 + self.len() * 48));
        w.0.extend_from_slice(b"NPCG");
        w.u32(CANONICAL_VERSION);
        w.len(self.len());
        for node in self.nodes() {
            write_op(&mut w, &node.op);
            w.len(node.operands.len());
            for o in &node.operands {
                w.len(o.0);
            }
            write_type(&mut w, &node.ty);
        }
        w.len(self.outputs().len());
        for o in self.outputs() {
            w.len(o.0);
        }
        w.0
    }

    /// SHA-256 of [`Graph::canonical_bytes`].
    pub fn fingerprint(&self) -> [u8; 32] {
        Sha256::digest(self.canonical_bytes()).into()
    }

    /// [`Graph::fingerprint`] as 64 lowercase hex digits.
    pub fn fingerprint_hex(&self) -> String {
        hex::encode(self.fingerprint())
    }
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, v: usize) {
        self.0.extend_from_slice(&(v as u64).to_le_bytes());
    }
    fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn usizes(&mut self, v: &[usize]) {
        self.len(v.len());
        for &x in v {
            self.len(x);
        }
    }
    fn groups(&mut self, groups: &[Vec<usize>]) {
        self.len(groups.len());
        for g in groups {
            self.usizes(g);
        }
    }
}

fn write_type(w: &mut Writer, ty: &TensorType) {
    w.u8(dtype_tag(ty.dtype));
    w.usizes(&ty.dims);
}

fn write_literal(w: &mut Writer, lit: &Literal) {
    w.u8(dtype_tag(lit.dtype()));
    w.usizes(lit.dims());
    w.u8(lit.is_splat() as u8);
    w.len(lit.bytes().len());
    w.0.extend_from_slice(lit.bytes());
}

fn write_op(w: &mut Writer, op: &Op) {
    match op {
        Op::Parameter { index } => {
            w.u8(1);
            w.len(*index);
        }
        Op::Constant(lit) => {
            w.u8(2);
            write_literal(w, lit);
        }
        Op::Unary(u) => {
            w.u8(3);
            w.u8(unary_tag(*u));
        }
        Op::Binary(b) => {
            w.u8(4);
            w.u8(binary_tag(*b));
        }
        Op::Compare(c) => {
            w.u8(5);
            w.u8(compare_tag(*c));
        }
        Op::Select => w.u8(6),
        Op::Convert(d) => {
            w.u8(7);
            w.u8(dtype_tag(*d));
        }
        Op::Iota { dims, dim, dtype } => {
            w.u8(8);
            w.usizes(dims);
            w.len(*dim);
            w.u8(dtype_tag(*dtype));
        }
        Op::BroadcastInDim {
            dims,
            broadcast_dimensions,
        } => {
            w.u8(9);
            w.usizes(dims);
            w.usizes(broadcast_dimensions);
        }
        Op::Reshape { dims } => {
            w.u8(10);
            w.usizes(dims);
        }
        Op::Transpose { perm } => {
            w.u8(11);
            w.usizes(perm);
        }
        Op::Slice {
            start,
            limit,
            stride,
        } => {
            w.u8(12);
            w.usizes(start);
            w.usizes(limit);
            w.usizes(stride);
        }
        Op::DynamicSlice { sizes } => {
            w.u8(13);
            w.usizes(sizes);
        }
        Op::DynamicUpdateSlice => w.u8(14),
        Op::Concatenate { dim } => {
            w.u8(15);
            w.len(*dim);
        }
        Op::Pad {
            low,
            high,
            interior,
        } => {
            w.u8(16);
            for list in [low, high] {
                w.len(list.len());
                for &v in list {
                    w.i64(v);
                }
            }
            w.usizes(interior);
        }
        Op::Reduce(r, dims) => {
            w.u8(17);
            w.u8(reduce_tag(*r));
            w.usizes(dims);
        }
        Op::ArgMax { dim, index_dtype } => {
            w.u8(18);
            w.len(*dim);
            w.u8(dtype_tag(*index_dtype));
        }
        Op::ArgMin { dim, index_dtype } => {
            w.u8(19);
            w.len(*dim);
            w.u8(dtype_tag(*index_dtype));
        }
        Op::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        } => {
            w.u8(20);
            w.usizes(lhs_batch);
            w.usizes(rhs_batch);
            w.usizes(lhs_contract);
            w.usizes(rhs_contract);
        }
        Op::Gather => w.u8(21),
        Op::ScatterAdd => w.u8(22),
        Op::RandomBits { dims } => {
            w.u8(23);
            w.usizes(dims);
        }
        Op::StopGradient => w.u8(27),
        Op::ReduceWindow {
            op,
            window,
            stride,
            padding,
        } => {
            w.u8(29);
            w.u8(reduce_tag(*op));
            w.usizes(window);
            w.usizes(stride);
            w.usizes(padding);
        }
        Op::Convolution {
            stride,
            padding,
            dilation,
            groups,
        } => {
            w.u8(28);
            w.usizes(stride);
            w.usizes(padding);
            w.usizes(dilation);
            w.len(*groups);
        }
        Op::AllReduce { op, replica_groups } => {
            w.u8(24);
            w.u8(reduce_tag(*op));
            w.groups(replica_groups);
        }
        Op::AllGather {
            dim,
            replica_groups,
        } => {
            w.u8(25);
            w.len(*dim);
            w.groups(replica_groups);
        }
        Op::ReduceScatter {
            op,
            dim,
            replica_groups,
        } => {
            w.u8(26);
            w.u8(reduce_tag(*op));
            w.len(*dim);
            w.groups(replica_groups);
        }
    }
}

fn dtype_tag(d: DType) -> u8 {
    match d {
        DType::F32 => 1,
        DType::F64 => 2,
        DType::BF16 => 3,
        DType::F16 => 4,
        DType::I32 => 5,
        DType::I64 => 6,
        DType::U32 => 7,
        DType::U8 => 8,
        DType::Pred => 9,
    }
}

fn unary_tag(u: UnaryOp) -> u8 {
    match u {
        UnaryOp::Neg => 1,
        UnaryOp::Abs => 2,
        UnaryOp::Sign => 3,
        UnaryOp::Exp => 4,
        UnaryOp::Log => 5,
        UnaryOp::Log1p => 6,
        UnaryOp::Tanh => 7,
        UnaryOp::Logistic => 8,
        UnaryOp::Sqrt => 9,
        UnaryOp::Rsqrt => 10,
        UnaryOp::Sin => 11,
        UnaryOp::Cos => 12,
        UnaryOp::Erf => 13,
        UnaryOp::Floor => 14,
        UnaryOp::Ceil => 15,
        UnaryOp::Not => 16,
    }
}

fn binary_tag(b: BinaryOp) -> u8 {
    match b {
        BinaryOp::Add => 1,
        BinaryOp::Sub => 2,
        BinaryOp::Mul => 3,
        BinaryOp::Div => 4,
        BinaryOp::Rem => 5,
        BinaryOp::Pow => 6,
        BinaryOp::Max => 7,
        BinaryOp::Min => 8,
        BinaryOp::And => 9,
        BinaryOp::Or => 10,
        BinaryOp::Xor => 11,
    }
}

fn compare_tag(c: CompareOp) -> u8 {
    match c {
        CompareOp::Eq => 1,
        CompareOp::Ne => 2,
        CompareOp::Lt => 3,
        CompareOp::Le => 4,
        CompareOp::Gt => 5,
        CompareOp::Ge => 6,
    }
}

fn reduce_tag(r: ReduceOp) -> u8 {
    match r {
        ReduceOp::Sum => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Prod => 4,
    }
}
