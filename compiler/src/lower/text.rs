//! Spelling types, attributes and literal values in MLIR text.

use std::fmt::Write;

use crate::dtype::DType;
use crate::host::read_as_f64;
use crate::ir::{Literal, TensorType};

/// `tensor<2x3xf32>`; a scalar is `tensor<f32>`.
pub(crate) fn tensor(ty: &TensorType) -> String {
    tensor_of(ty.dtype, &ty.dims)
}

pub(crate) fn tensor_of(dtype: DType, dims: &[usize]) -> String {
    let mut s = String::with_capacity(16 + dims.len() * 4);
    s.push_str("tensor<");
    for d in dims {
        let _ = write!(s, "{d}x");
    }
    s.push_str(dtype.mlir_name());
    s.push('>');
    s
}

/// `array<i64: 1, 2>` (`array<i64>` when empty).
pub(crate) fn i64_array<T: Copy + Into<i128>>(values: &[T]) -> String {
    if values.is_empty() {
        return "array<i64>".to_string();
    }
    let items: Vec<String> = values.iter().map(|&v| v.into().to_string()).collect();
    format!("array<i64: {}>", items.join(", "))
}

/// `[1, 2]` for the lists inside `#stablehlo.dot<...>` and similar attributes.
pub(crate) fn list(values: &[usize]) -> String {
    let items: Vec<String> = values.iter().map(|v| v.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// `dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>` for replica groups.
pub(crate) fn replica_groups(groups: &[Vec<usize>]) -> String {
    let n = groups.first().map_or(0, |g| g.len());
    let rows: Vec<String> = groups.iter().map(|g| list(g)).collect();
    format!(
        "dense<[{}]> : tensor<{}x{}xi64>",
        rows.join(", "),
        groups.len(),
        n
    )
}

/// One element of `dtype` (its little-endian bytes) as an MLIR literal. Floats print as the
/// shortest decimal that reads back to the same value, or as a hex bit pattern when not finite.
pub(crate) fn element(dtype: DType, bytes: &[u8]) -> String {
    match dtype {
        DType::Pred => if bytes.first().copied().unwrap_or(0) != 0 {
            "true"
        } else {
            "false"
        }
        .to_string(),
        DType::F32 => {
            let v = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            if v.is_finite() {
                decimal(format!("{v:?}"))
            } else {
                format!("0x{:08X}", v.to_bits())
            }
        }
        DType::F64 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(&bytes[..8]);
            let v = f64::from_le_bytes(a);
            if v.is_finite() {
                decimal(format!("{v:?}"))
            } else {
                format!("0x{:016X}", v.to_bits())
            }
        }
        DType::BF16 | DType::F16 => {
            let bits = u16::from_le_bytes([bytes[0], bytes[1]]);
            let v = read_as_f64(dtype, bytes);
            // Every bf16/f16 value is exactly an f32, and the f32's shortest decimal rounds
            // back to it.
            if v.is_finite() {
                decimal(format!("{:?}", v as f32))
            } else {
                format!("0x{bits:04X}")
            }
        }
        DType::I32 => i32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]).to_string(),
        DType::U32 => u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]).to_string(),
        DType::I64 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(&bytes[..8]);
            i64::from_le_bytes(a).to_string()
        }
        DType::U8 => bytes[0].to_string(),
    }
}

/// MLIR float literals need a `.` in the mantissa (`1.0e-05`, not Rust's `1e-5`).
fn decimal(s: String) -> String {
    let (mantissa, exp) = match s.find(['e', 'E']) {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s.as_str(), ""),
    };
    let mut out = mantissa.to_string();
    if !out.contains('.') {
        out.push_str(".0");
    }
    if !exp.is_empty() {
        out.push('e');
        out.push_str(exp);
    }
    out
}

/// The `dense<...>` attribute of a literal (without the trailing type).
pub(crate) fn dense(lit: &Literal) -> String {
    let dtype = lit.dtype();
    let w = dtype.size_in_bytes();
    if lit.element_count() == 0 {
        return format!("dense<{}>", element(dtype, &vec![0u8; w]));
    }
    if lit.is_splat() {
        return format!("dense<{}>", element(dtype, lit.bytes()));
    }
    if dtype == DType::Pred {
        // i1 hex data is bit-packed in MLIR; a nested list is unambiguous.
        let mut s = String::from("dense<");
        nested(&mut s, lit.bytes(), lit.dims(), dtype);
        s.push('>');
        return s;
    }
    // Raw little-endian bytes, exact and compact.
    let mut s = String::with_capacity(10 + lit.bytes().len() * 2);
    s.push_str("dense<\"0x");
    for b in lit.bytes() {
        let _ = write!(s, "{b:02X}");
    }
    s.push_str("\">");
    s
}

fn nested(s: &mut String, bytes: &[u8], dims: &[usize], dtype: DType) {
    let w = dtype.size_in_bytes();
    match dims.split_first() {
        None => s.push_str(&element(dtype, bytes)),
        Some((&n, rest)) => {
            let stride = rest.iter().product::<usize>() * w;
            s.push('[');
            for i in 0..n {
                if i > 0 {
                    s.push_str(", ");
                }
                nested(s, &bytes[i * stride..(i + 1) * stride], rest, dtype);
            }
            s.push(']');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HostTensor;

    #[test]
    fn spellings() {
        assert_eq!(
            tensor(&TensorType::new(DType::U8, vec![2, 3])),
            "tensor<2x3xui8>"
        );
        assert_eq!(tensor(&TensorType::scalar(DType::Pred)), "tensor<i1>");
        assert_eq!(i64_array(&[0i64, 2]), "array<i64: 0, 2>");
        assert_eq!(i64_array::<i64>(&[]), "array<i64>");
        assert_eq!(element(DType::F32, &1e-5f32.to_le_bytes()), "1.0e-5");
        assert_eq!(element(DType::F32, &2.5f32.to_le_bytes()), "2.5");
        assert_eq!(
            element(DType::F32, &f32::NEG_INFINITY.to_le_bytes()),
            "0xFF800000"
        );
        assert_eq!(
            element(DType::BF16, &half::bf16::from_f32(0.1).to_le_bytes()),
            "0.100097656"
        );
        assert_eq!(element(DType::I64, &(-3i64).to_le_bytes()), "-3");
        assert_eq!(
            replica_groups(&[vec![0, 1], vec![2, 3]]),
            "dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>"
        );
    }

    #[test]
    fn dense_literals() {
        let p = HostTensor::from_slice(&[true, false, true, true], &[2, 2]).unwrap();
        assert_eq!(
            dense(&Literal::dense(&p)),
            "dense<[[true, false], [true, true]]>"
        );
        let i = HostTensor::from_slice(&[1i32, 256], &[2]).unwrap();
        assert_eq!(dense(&Literal::dense(&i)), "dense<\"0x0100000000010000\">");
        assert_eq!(dense(&Literal::splat(DType::I32, 7.0, &[3])), "dense<7>");
    }
}
