//! Tensor types and literal constants.

use std::fmt;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::host::{read_as_f64, write_f64_as, HostTensor};

/// A static tensor type: element type and dimensions (row-major; `[]` is a scalar).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorType {
    /// The element type.
    pub dtype: DType,
    /// The dimensions, outermost first.
    pub dims: Vec<usize>,
}

impl TensorType {
    /// A type from its parts.
    pub fn new(dtype: DType, dims: Vec<usize>) -> TensorType {
        TensorType { dtype, dims }
    }

    /// A rank-0 tensor type.
    pub fn scalar(dtype: DType) -> TensorType {
        TensorType {
            dtype,
            dims: Vec::new(),
        }
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    /// The number of elements (saturating at `usize::MAX`; [`TensorType::checked_size`] tells
    /// whether the type is addressable at all).
    pub fn element_count(&self) -> usize {
        self.dims.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// Bytes of a dense value, or `None` if that overflows `usize`.
    pub fn checked_size(&self) -> Option<usize> {
        self.dims
            .iter()
            .try_fold(self.dtype.size_in_bytes(), |a, &d| a.checked_mul(d))
    }

    /// Host bytes of a dense value of this type.
    pub fn size_in_bytes(&self) -> usize {
        self.element_count()
            .saturating_mul(self.dtype.size_in_bytes())
    }
}

/// `f32[32,128]`; a scalar is `f32[]`.
impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.dims.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// A constant value: either one element repeated over `dims` (a splat) or every element.
///
/// Values are kept as little-endian bytes of `dtype` so that equality and hashing are exact
/// (bit patterns, so `-0.0 != 0.0` and NaN payloads are distinguished) and derivable.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Literal {
    dtype: DType,
    dims: Vec<usize>,
    /// One element (splat) or `product(dims)` elements; a one-element literal is both.
    bytes: Vec<u8>,
}

impl Literal {
    /// `value` converted to `dtype` (`as`-style for integers, nearest for floats, `!= 0` for
    /// pred) and repeated over `dims`.
    pub fn splat(dtype: DType, value: f64, dims: &[usize]) -> Literal {
        let mut bytes = Vec::with_capacity(dtype.size_in_bytes());
        write_f64_as(dtype, value, &mut bytes);
        Literal {
            dtype,
            dims: dims.to_vec(),
            bytes,
        }
    }

    /// One element given by its raw little-endian bytes, repeated over `dims`.
    pub fn splat_bytes(dtype: DType, element: &[u8], dims: &[usize]) -> Result<Literal> {
        if element.len() != dtype.size_in_bytes() {
            return Err(Error::HostData {
                message: format!(
                    "a {dtype} splat needs {} bytes, got {}",
                    dtype.size_in_bytes(),
                    element.len()
                ),
            });
        }
        Ok(Literal {
            dtype,
            dims: dims.to_vec(),
            bytes: element.to_vec(),
        })
    }

    /// Every element of `host`.
    pub fn dense(host: &HostTensor) -> Literal {
        Literal {
            dtype: host.dtype(),
            dims: host.dims().to_vec(),
            bytes: host.bytes().to_vec(),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The tensor type of the value.
    pub fn ty(&self) -> TensorType {
        TensorType::new(self.dtype, self.dims.clone())
    }

    /// True when one element is stored for the whole shape.
    pub fn is_splat(&self) -> bool {
        self.bytes.len() == self.dtype.size_in_bytes()
    }

    /// The stored bytes: one element for a splat, else every element.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The little-endian bytes of element `i` (row-major); `None` past the end.
    pub fn element_bytes(&self, i: usize) -> Option<&[u8]> {
        let w = self.dtype.size_in_bytes();
        if i >= self.element_count() {
            return None;
        }
        let j = if self.is_splat() { 0 } else { i };
        self.bytes.get(j * w..(j + 1) * w)
    }

    /// The number of elements the literal stands for (saturating).
    pub fn element_count(&self) -> usize {
        self.dims.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }

    /// Element `i` as f64 (exact except i64 beyond 2^53); `None` past the end.
    pub fn get_f64(&self, i: usize) -> Option<f64> {
        self.element_bytes(i).map(|b| read_as_f64(self.dtype, b))
    }

    /// Expands to a dense host tensor.
    pub fn to_host(&self) -> Result<HostTensor> {
        let data = if self.is_splat() {
            self.bytes.repeat(self.element_count())
        } else {
            self.bytes.clone()
        };
        HostTensor::from_bytes(self.dtype, &self.dims, data)
    }

    /// Checks that the stored bytes fit the shape (a literal built by [`Literal::dense`] from
    /// a valid host tensor always does; this guards graphs that arrive from elsewhere).
    pub fn check(&self) -> Result<()> {
        let w = self.dtype.size_in_bytes();
        let n = self.element_count();
        if self.bytes.len() == w || Some(self.bytes.len()) == n.checked_mul(w) {
            Ok(())
        } else {
            Err(Error::InvalidGraph {
                message: format!(
                    "constant of type {} holds {} bytes",
                    self.ty(),
                    self.bytes.len()
                ),
            })
        }
    }
}

/// `f32[2,3] 1.5` for a splat, `f32[3] {1, 2, 3}` for a dense literal (long ones abbreviated).
impl fmt::Display for Literal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.ty())?;
        if self.is_splat() {
            return match self.get_f64(0) {
                Some(v) => write!(f, " {v}"),
                None => f.write_str(" (empty)"),
            };
        }
        f.write_str(" {")?;
        let n = self.element_count();
        for i in 0..n.min(8) {
            if i > 0 {
                f.write_str(", ")?;
            }
            if let Some(v) = self.get_f64(i) {
                write!(f, "{v}")?;
            }
        }
        if n > 8 {
            write!(f, ", ... ({n} values)")?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display() {
        assert_eq!(
            TensorType::new(DType::F32, vec![32, 128]).to_string(),
            "f32[32,128]"
        );
        assert_eq!(TensorType::scalar(DType::Pred).to_string(), "pred[]");
        assert_eq!(
            Literal::splat(DType::I32, 3.0, &[2]).to_string(),
            "i32[2] 3"
        );
    }

    #[test]
    fn splat_and_dense_literals() {
        let s = Literal::splat(DType::F32, 1.5, &[2, 2]);
        assert!(s.is_splat());
        assert_eq!(s.to_host().unwrap().to_vec::<f32>().unwrap(), vec![1.5; 4]);
        let d = Literal::dense(&HostTensor::from_slice(&[1i32, 2, 3], &[3]).unwrap());
        assert!(!d.is_splat());
        assert_eq!(d.get_f64(2), Some(3.0));
        assert_eq!(d.get_f64(3), None);
        // Bit patterns, not numeric equality.
        assert_ne!(
            Literal::splat(DType::F32, 0.0, &[]),
            Literal::splat(DType::F32, -0.0, &[])
        );
        assert!(Literal::splat_bytes(DType::F32, &[0, 0], &[]).is_err());
    }
}
