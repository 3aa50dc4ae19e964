//! Dense host tensors: the values that move between Rust code and a device, and that the
//! reference evaluator and `.npy` files use.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// A Rust scalar type that maps to one [`DType`].
pub trait Element: Copy + Send + Sync + 'static + std::fmt::Debug {
    /// The dtype this Rust type holds (`f32` is [`DType::F32`], `bool` is [`DType::Pred`]).
    const DTYPE: DType;
    /// Appends the little-endian bytes of `self`.
    fn write_le(self, out: &mut Vec<u8>);
    /// Writes the little-endian bytes of `self` into `out`, exactly `DTYPE.size_in_bytes()`
    /// long (the default goes through [`Element::write_le`]).
    fn write_le_into(self, out: &mut [u8]) {
        let mut bytes = Vec::with_capacity(out.len());
        self.write_le(&mut bytes);
        out.copy_from_slice(&bytes);
    }
    /// Reads one element from exactly `DTYPE.size_in_bytes()` little-endian bytes.
    fn read_le(bytes: &[u8]) -> Self;
    /// Lossy conversion used for comparisons and printing.
    fn to_f64(self) -> f64;
    /// Conversion from f64 with the type's own rounding/truncation (`as` semantics).
    fn from_f64(v: f64) -> Self;
}

macro_rules! impl_element_num {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn write_le_into(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(bytes);
                <$t>::from_le_bytes(a)
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}
impl_element_num!(f32, DType::F32);
impl_element_num!(f64, DType::F64);
impl_element_num!(i32, DType::I32);
impl_element_num!(i64, DType::I64);
impl_element_num!(u32, DType::U32);
impl_element_num!(u8, DType::U8);

macro_rules! impl_element_half {
    ($t:ty, $d:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn write_le_into(self, out: &mut [u8]) {
                out.copy_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes([bytes[0], bytes[1]])
            }
            fn to_f64(self) -> f64 {
                self.to_f64()
            }
            fn from_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
        }
    };
}
impl_element_half!(half::bf16, DType::BF16);
impl_element_half!(half::f16, DType::F16);

impl Element for bool {
    const DTYPE: DType = DType::Pred;
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
    fn write_le_into(self, out: &mut [u8]) {
        out[0] = self as u8;
    }
    fn read_le(bytes: &[u8]) -> Self {
        bytes[0] != 0
    }
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
}

/// A dense, row-major tensor in host memory, stored as little-endian bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    dtype: DType,
    dims: Vec<usize>,
    data: Vec<u8>,
}

impl HostTensor {
    /// Builds a tensor from typed values; `values.len()` must equal the product of `dims`.
    pub fn from_slice<T: Element>(values: &[T], dims: &[usize]) -> Result<HostTensor> {
        check_len(values.len(), dims)?;
        let size = T::DTYPE.size_in_bytes();
        let mut data = vec![0u8; values.len() * size];
        // fixed-size chunks: the copy vectorizes (a push per element does not)
        for (chunk, &v) in data.chunks_exact_mut(size.max(1)).zip(values) {
            v.write_le_into(chunk);
        }
        Ok(HostTensor {
            dtype: T::DTYPE,
            dims: dims.to_vec(),
            data,
        })
    }

    /// Builds a tensor from raw little-endian bytes of `dtype`.
    pub fn from_bytes(dtype: DType, dims: &[usize], data: Vec<u8>) -> Result<HostTensor> {
        let n: usize = dims.iter().product();
        if data.len() != n * dtype.size_in_bytes() {
            return Err(Error::HostData {
                message: format!(
                    "{} bytes given for a {dtype} tensor of shape {dims:?}, which needs {}",
                    data.len(),
                    n * dtype.size_in_bytes()
                ),
            });
        }
        Ok(HostTensor {
            dtype,
            dims: dims.to_vec(),
            data,
        })
    }

    /// Converts f64 values into `dtype` (with `as`-style conversion), for tests and constants.
    pub fn from_f64s(dtype: DType, values: &[f64], dims: &[usize]) -> Result<HostTensor> {
        check_len(values.len(), dims)?;
        let mut data = Vec::with_capacity(values.len() * dtype.size_in_bytes());
        for &v in values {
            write_f64_as(dtype, v, &mut data);
        }
        Ok(HostTensor {
            dtype,
            dims: dims.to_vec(),
            data,
        })
    }

    /// A tensor of zeros (false for pred).
    pub fn zeros(dtype: DType, dims: &[usize]) -> HostTensor {
        let n: usize = dims.iter().product();
        HostTensor {
            dtype,
            dims: dims.to_vec(),
            data: vec![0; n * dtype.size_in_bytes()],
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape, outermost dimension first (empty for a scalar).
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The number of elements: the product of the dims (1 for a scalar).
    pub fn element_count(&self) -> usize {
        self.dims.iter().product()
    }

    /// The raw data: row-major, little-endian, [`DType::size_in_bytes`] per element.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    /// The raw data, as [`HostTensor::bytes`], without a copy.
    pub fn into_bytes(self) -> Vec<u8> {
        self.data
    }

    /// The values as `T`; an error if `T` is not this tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype {
            return Err(Error::HostData {
                message: format!("tensor holds {}, asked for {}", self.dtype, T::DTYPE),
            });
        }
        let w = self.dtype.size_in_bytes();
        Ok(self.data.chunks_exact(w).map(T::read_le).collect())
    }

    /// Every element converted to f64 (exact for all dtypes but i64/u64 beyond 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let w = self.dtype.size_in_bytes();
        self.data
            .chunks_exact(w)
            .map(|b| read_as_f64(self.dtype, b))
            .collect()
    }
}

fn check_len(len: usize, dims: &[usize]) -> Result<()> {
    let n: usize = dims.iter().product();
    if len != n {
        return Err(Error::HostData {
            message: format!("{len} values given for shape {dims:?}, which holds {n}"),
        });
    }
    Ok(())
}

/// Reads one element of `dtype` from its little-endian bytes as f64.
pub fn read_as_f64(dtype: DType, b: &[u8]) -> f64 {
    match dtype {
        DType::F32 => f32::read_le(b).to_f64(),
        DType::F64 => f64::read_le(b),
        DType::BF16 => half::bf16::read_le(b).to_f64(),
        DType::F16 => half::f16::read_le(b).to_f64(),
        DType::I32 => i32::read_le(b).to_f64(),
        DType::I64 => i64::read_le(b).to_f64(),
        DType::U32 => u32::read_le(b).to_f64(),
        DType::U8 => u8::read_le(b).to_f64(),
        DType::Pred => bool::read_le(b).to_f64(),
    }
}

/// Appends `v` converted to `dtype` as little-endian bytes.
pub fn write_f64_as(dtype: DType, v: f64, out: &mut Vec<u8>) {
    match dtype {
        DType::F32 => f32::from_f64(v).write_le(out),
        DType::F64 => v.write_le(out),
        DType::BF16 => half::bf16::from_f64(v).write_le(out),
        DType::F16 => half::f16::from_f64(v).write_le(out),
        DType::I32 => i32::from_f64(v).write_le(out),
        DType::I64 => i64::from_f64(v).write_le(out),
        DType::U32 => u32::from_f64(v).write_le(out),
        DType::U8 => u8::from_f64(v).write_le(out),
        DType::Pred => bool::from_f64(v).write_le(out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_round_trip() {
        let t = HostTensor::from_slice(&[1.5f32, -2.0, 3.25, 0.0], &[2, 2]).unwrap();
        assert_eq!(t.dtype(), DType::F32);
        assert_eq!(t.bytes().len(), 16);
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.5, -2.0, 3.25, 0.0]);
        assert!(t.to_vec::<i32>().is_err());
        let b = HostTensor::from_slice(&[half::bf16::from_f32(1.5)], &[1]).unwrap();
        assert_eq!(b.bytes(), &0x3fc0u16.to_le_bytes());
    }

    #[test]
    fn f64_conversion_per_dtype() {
        for d in DType::ALL {
            let t = HostTensor::from_f64s(d, &[0.0, 1.0, 2.0], &[3]).unwrap();
            let back = t.to_f64_vec();
            let want = if d == DType::Pred {
                vec![0.0, 1.0, 1.0]
            } else {
                vec![0.0, 1.0, 2.0]
            };
            assert_eq!(back, want, "{d}");
        }
    }

    #[test]
    fn length_mismatch_is_an_error() {
        assert!(HostTensor::from_slice(&[1i32, 2, 3], &[2, 2]).is_err());
        assert!(HostTensor::from_bytes(DType::F32, &[2], vec![0; 7]).is_err());
    }
}
