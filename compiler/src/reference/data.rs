//! Values of the reference evaluator: exact integers, floats held as f64 but always rounded to
//! their dtype, and the index arithmetic the layout ops share.

use crate::dtype::DType;
use crate::error::Result;
use crate::host::{read_as_f64, write_f64_as, HostTensor};
use crate::ir::TensorType;

/// Elements of one tensor, by kind. Every value is kept normalized to its dtype: floats are
/// exactly representable in it, integers wrapped to its width.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Data {
    F(Vec<f64>),
    I(Vec<i64>),
    U(Vec<u64>),
    P(Vec<bool>),
}

/// One element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Scalar {
    F(f64),
    I(i64),
    U(u64),
    P(bool),
}

impl Scalar {
    pub(crate) fn as_f64(self) -> f64 {
        match self {
            Scalar::F(v) => v,
            Scalar::I(v) => v as f64,
            Scalar::U(v) => v as f64,
            Scalar::P(v) => v as u8 as f64,
        }
    }

    /// The value as an integer index (floats truncate; used for start indices).
    pub(crate) fn as_i64(self) -> i64 {
        match self {
            Scalar::F(v) => v as i64,
            Scalar::I(v) => v,
            Scalar::U(v) => v as i64,
            Scalar::P(v) => v as i64,
        }
    }
}

/// A typed tensor value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Value {
    pub ty: TensorType,
    pub data: Data,
}

pub(crate) fn round_float(d: DType, v: f64) -> f64 {
    match d {
        DType::F32 => v as f32 as f64,
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        DType::F16 => half::f16::from_f64(v).to_f64(),
        DType::F64 | DType::I32 | DType::I64 | DType::U32 | DType::U8 | DType::Pred => v,
    }
}

pub(crate) fn wrap_signed(d: DType, v: i64) -> i64 {
    match d {
        DType::I32 => v as i32 as i64,
        DType::I64 => v,
        // not a signed integer type: no wrapping to do
        DType::F32 | DType::F64 | DType::BF16 | DType::F16 | DType::U32 | DType::U8 => v,
        DType::Pred => v,
    }
}

pub(crate) fn wrap_unsigned(d: DType, v: u64) -> u64 {
    match d {
        DType::U32 => v as u32 as u64,
        DType::U8 => v as u8 as u64,
        // not a narrow unsigned type: no wrapping to do
        DType::F32
        | DType::F64
        | DType::BF16
        | DType::F16
        | DType::I32
        | DType::I64
        | DType::Pred => v,
    }
}

impl Data {
    pub(crate) fn len(&self) -> usize {
        match self {
            Data::F(v) => v.len(),
            Data::I(v) => v.len(),
            Data::U(v) => v.len(),
            Data::P(v) => v.len(),
        }
    }

    pub(crate) fn get(&self, i: usize) -> Scalar {
        match self {
            Data::F(v) => Scalar::F(v[i]),
            Data::I(v) => Scalar::I(v[i]),
            Data::U(v) => Scalar::U(v[i]),
            Data::P(v) => Scalar::P(v[i]),
        }
    }

    /// Elements at `idx`, in order.
    pub(crate) fn take(&self, idx: &[usize]) -> Data {
        match self {
            Data::F(v) => Data::F(idx.iter().map(|&i| v[i]).collect()),
            Data::I(v) => Data::I(idx.iter().map(|&i| v[i]).collect()),
            Data::U(v) => Data::U(idx.iter().map(|&i| v[i]).collect()),
            Data::P(v) => Data::P(idx.iter().map(|&i| v[i]).collect()),
        }
    }

    /// All elements of `parts` one after another (all of one kind).
    pub(crate) fn concat(parts: &[&Data]) -> Data {
        let mut out = match parts.first() {
            Some(Data::F(_)) => Data::F(Vec::new()),
            Some(Data::I(_)) => Data::I(Vec::new()),
            Some(Data::U(_)) => Data::U(Vec::new()),
            Some(Data::P(_)) | None => Data::P(Vec::new()),
        };
        for p in parts {
            match (&mut out, p) {
                (Data::F(o), Data::F(v)) => o.extend_from_slice(v),
                (Data::I(o), Data::I(v)) => o.extend_from_slice(v),
                (Data::U(o), Data::U(v)) => o.extend_from_slice(v),
                (Data::P(o), Data::P(v)) => o.extend_from_slice(v),
                _ => {}
            }
        }
        out
    }

    /// Builds `dtype` data from scalars, converting and normalizing each.
    pub(crate) fn from_scalars(dtype: DType, it: impl Iterator<Item = Scalar>) -> Data {
        if dtype.is_float() {
            Data::F(it.map(|s| round_float(dtype, s.as_f64())).collect())
        } else if dtype.is_signed_int() {
            Data::I(
                it.map(|s| float_to_int(dtype, s).unwrap_or_else(|| wrap_signed(dtype, to_i64(s))))
                    .collect(),
            )
        } else if dtype.is_unsigned_int() {
            let f = |s| {
                float_to_int(dtype, s)
                    .map_or_else(|| wrap_unsigned(dtype, to_i64(s) as u64), |v| v as u64)
            };
            Data::U(it.map(f).collect())
        } else {
            Data::P(it.map(|s| s.as_f64() != 0.0).collect())
        }
    }
}

/// A float converted to integer `dtype`: truncated toward zero, saturated at the type's
/// bounds, NaN giving 0 (Rust `as`); `None` for non-float scalars.
fn float_to_int(dtype: DType, s: Scalar) -> Option<i64> {
    let Scalar::F(v) = s else { return None };
    Some(match dtype {
        DType::I32 => v as i32 as i64,
        DType::U32 => v as u32 as i64,
        DType::U8 => v as u8 as i64,
        DType::I64 | DType::F32 | DType::F64 | DType::BF16 | DType::F16 | DType::Pred => v as i64,
    })
}

/// Integer conversion with StableHLO/`as` semantics: floats truncate toward zero and saturate
/// (NaN gives 0); integers keep their two's-complement bits.
fn to_i64(s: Scalar) -> i64 {
    match s {
        Scalar::F(v) => v as i64,
        Scalar::I(v) => v,
        Scalar::U(v) => v as i64,
        Scalar::P(v) => v as i64,
    }
}

impl Value {
    pub(crate) fn from_host(t: &HostTensor) -> Value {
        let d = t.dtype();
        let w = d.size_in_bytes();
        let chunks = t.bytes().chunks_exact(w);
        let data = if d.is_float() {
            Data::F(chunks.map(|b| read_as_f64(d, b)).collect())
        } else if d.is_signed_int() {
            Data::I(
                chunks
                    .map(|b| le_u64(b) as i64)
                    .map(|v| sign_extend(d, v))
                    .collect(),
            )
        } else if d.is_unsigned_int() {
            Data::U(chunks.map(le_u64).collect())
        } else {
            Data::P(chunks.map(|b| b[0] != 0).collect())
        };
        Value {
            ty: TensorType::new(d, t.dims().to_vec()),
            data,
        }
    }

    pub(crate) fn to_host(&self) -> Result<HostTensor> {
        let d = self.ty.dtype;
        let w = d.size_in_bytes();
        let mut bytes = Vec::with_capacity(self.data.len() * w);
        match &self.data {
            Data::F(v) => v.iter().for_each(|&x| write_f64_as(d, x, &mut bytes)),
            Data::I(v) => v
                .iter()
                .for_each(|&x| bytes.extend_from_slice(&x.to_le_bytes()[..w])),
            Data::U(v) => v
                .iter()
                .for_each(|&x| bytes.extend_from_slice(&x.to_le_bytes()[..w])),
            Data::P(v) => v.iter().for_each(|&x| bytes.push(x as u8)),
        }
        HostTensor::from_bytes(d, &self.ty.dims, bytes)
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(a)
}

fn sign_extend(d: DType, v: i64) -> i64 {
    match d {
        DType::I32 => v as u32 as i32 as i64,
        DType::I64
        | DType::F32
        | DType::F64
        | DType::BF16
        | DType::F16
        | DType::U32
        | DType::U8
        | DType::Pred => v,
    }
}

/// Row-major strides of `dims`.
pub(crate) fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The multi-index of linear position `i` in `dims` (written into `out`).
pub(crate) fn unravel(mut i: usize, dims: &[usize], out: &mut [usize]) {
    for k in (0..dims.len()).rev() {
        let d = dims[k].max(1);
        out[k] = i % d;
        i /= d;
    }
}

/// Calls `f(out_linear, out_multi_index)` for every element of `dims`, in row-major order.
pub(crate) fn for_each_index(dims: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let n: usize = dims.iter().product();
    let mut idx = vec![0; dims.len()];
    for i in 0..n {
        unravel(i, dims, &mut idx);
        f(i, &idx);
    }
}
