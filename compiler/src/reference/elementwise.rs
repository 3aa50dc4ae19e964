//! Elementwise ops: plain per-element math, floats in f64 rounded to the dtype, integers with
//! the wrapping and division rules of StableHLO as XLA implements them.

use crate::dtype::DType;
use crate::ir::{BinaryOp, CompareOp, UnaryOp};

use super::data::{round_float, wrap_signed, wrap_unsigned, Data};

pub(crate) fn unary(op: UnaryOp, dtype: DType, x: &Data) -> Data {
    // Inference refuses a dtype the op does not take, so `None` (no integer value) is never
    // reached through a checked graph; the operand is then passed through.
    match x {
        Data::F(v) => Data::F(
            v.iter()
                .map(|&a| round_float(dtype, op.on_float(a)))
                .collect(),
        ),
        Data::I(v) => Data::I(
            v.iter()
                .map(|&a| wrap_signed(dtype, op.on_int(a).unwrap_or(a)))
                .collect(),
        ),
        Data::U(v) => Data::U(
            v.iter()
                .map(|&a| wrap_unsigned(dtype, op.on_uint(a).unwrap_or(a)))
                .collect(),
        ),
        Data::P(v) => Data::P(
            v.iter()
                .map(|&a| if op == UnaryOp::Not { !a } else { a })
                .collect(),
        ),
    }
}

pub(crate) fn binary(op: BinaryOp, dtype: DType, x: &Data, y: &Data) -> Data {
    match (x, y) {
        (Data::F(a), Data::F(b)) => Data::F(
            a.iter()
                .zip(b)
                .map(|(&a, &b)| round_float(dtype, binary_f(op, a, b)))
                .collect(),
        ),
        (Data::I(a), Data::I(b)) => Data::I(
            a.iter()
                .zip(b)
                .map(|(&a, &b)| binary_i(op, dtype, a, b))
                .collect(),
        ),
        (Data::U(a), Data::U(b)) => Data::U(
            a.iter()
                .zip(b)
                .map(|(&a, &b)| wrap_unsigned(dtype, binary_u(op, dtype, a, b)))
                .collect(),
        ),
        (Data::P(a), Data::P(b)) => {
            Data::P(a.iter().zip(b).map(|(&a, &b)| binary_p(op, a, b)).collect())
        }
        _ => x.clone(),
    }
}

fn binary_f(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Rem => a % b,
        BinaryOp::Pow => a.powf(b),
        BinaryOp::Max => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.max(b)
            }
        }
        BinaryOp::Min => {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else {
                a.min(b)
            }
        }
        // Bitwise ops are not defined on floats (inference refuses them).
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => a,
    }
}

/// Signed integers at the dtype's width. Division by zero gives -1 and remainder by zero the
/// dividend; MIN / -1 wraps to MIN (XLA's definitions).
fn binary_i(op: BinaryOp, dtype: DType, a: i64, b: i64) -> i64 {
    let (min, bits) = match dtype {
        DType::I32 => (i32::MIN as i64, 32),
        DType::I64
        | DType::F32
        | DType::F64
        | DType::BF16
        | DType::F16
        | DType::U32
        | DType::U8
        | DType::Pred => (i64::MIN, 64),
    };
    let r = match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => match b {
            0 => -1,
            -1 if a == min => min,
            _ => a / b,
        },
        BinaryOp::Rem => match b {
            0 => a,
            -1 => 0,
            _ => a % b,
        },
        BinaryOp::Pow => {
            if b < 0 {
                match a {
                    1 => 1,
                    -1 if b % 2 == 0 => 1,
                    -1 => -1,
                    _ => 0,
                }
            } else {
                pow_wrapping(a as u64, b as u64, bits) as i64
            }
        }
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::And => a & b,
        BinaryOp::Or => a | b,
        BinaryOp::Xor => a ^ b,
    };
    wrap_signed(dtype, r)
}

fn binary_u(op: BinaryOp, dtype: DType, a: u64, b: u64) -> u64 {
    let bits = (dtype.size_in_bytes() * 8) as u32;
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => a.checked_div(b).unwrap_or(u64::MAX),
        BinaryOp::Rem => a.checked_rem(b).unwrap_or(a),
        BinaryOp::Pow => pow_wrapping(a, b, bits),
        BinaryOp::Max => a.max(b),
        BinaryOp::Min => a.min(b),
        BinaryOp::And => a & b,
        BinaryOp::Or => a | b,
        BinaryOp::Xor => a ^ b,
    }
}

/// `a^b` modulo 2^bits by repeated squaring.
fn pow_wrapping(mut a: u64, mut b: u64, bits: u32) -> u64 {
    let mask = if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let mut r: u64 = 1;
    while b > 0 {
        if b & 1 == 1 {
            r = r.wrapping_mul(a) & mask;
        }
        a = a.wrapping_mul(a) & mask;
        b >>= 1;
    }
    r
}

fn binary_p(op: BinaryOp, a: bool, b: bool) -> bool {
    match op {
        BinaryOp::And | BinaryOp::Min | BinaryOp::Mul => a & b,
        BinaryOp::Or | BinaryOp::Max | BinaryOp::Add => a | b,
        BinaryOp::Xor | BinaryOp::Sub => a ^ b,
        BinaryOp::Div | BinaryOp::Rem | BinaryOp::Pow => a,
    }
}

pub(crate) fn compare(op: CompareOp, x: &Data, y: &Data) -> Data {
    fn cmp<T: PartialOrd>(op: CompareOp, a: T, b: T) -> bool {
        match op {
            CompareOp::Eq => a == b,
            CompareOp::Ne => a != b,
            CompareOp::Lt => a < b,
            CompareOp::Le => a <= b,
            CompareOp::Gt => a > b,
            CompareOp::Ge => a >= b,
        }
    }
    Data::P(match (x, y) {
        (Data::F(a), Data::F(b)) => a.iter().zip(b).map(|(&a, &b)| cmp(op, a, b)).collect(),
        (Data::I(a), Data::I(b)) => a.iter().zip(b).map(|(&a, &b)| cmp(op, a, b)).collect(),
        (Data::U(a), Data::U(b)) => a.iter().zip(b).map(|(&a, &b)| cmp(op, a, b)).collect(),
        (Data::P(a), Data::P(b)) => a.iter().zip(b).map(|(&a, &b)| cmp(op, a, b)).collect(),
        _ => Vec::new(),
    })
}

/// `select(p, t, f)`; `p` has one element per output element or a single one.
pub(crate) fn select(p: &Data, t: &Data, f: &Data) -> Data {
    let Data::P(p) = p else { return t.clone() };
    let n = t.len();
    let idx: Vec<usize> = (0..n)
        .map(|i| {
            if p[if p.len() == 1 { 0 } else { i }] {
                i
            } else {
                n + i
            }
        })
        .collect();
    Data::concat(&[t, f]).take(&idx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_rules() {
        assert_eq!(binary_i(BinaryOp::Div, DType::I32, -7, 2), -3);
        assert_eq!(binary_i(BinaryOp::Rem, DType::I32, -7, 2), -1);
        assert_eq!(
            binary_i(BinaryOp::Div, DType::I32, i32::MIN as i64, -1),
            i32::MIN as i64
        );
        assert_eq!(
            binary_i(BinaryOp::Add, DType::I32, i32::MAX as i64, 1),
            i32::MIN as i64
        );
        assert_eq!(binary_i(BinaryOp::Pow, DType::I32, 3, 4), 81);
        assert_eq!(binary_i(BinaryOp::Pow, DType::I32, 2, -1), 0);
        assert_eq!(
            wrap_unsigned(DType::U8, binary_u(BinaryOp::Mul, DType::U8, 16, 17)),
            16
        );
        assert_eq!(binary_u(BinaryOp::Div, DType::U32, 9, 0), u64::MAX);
    }
}
