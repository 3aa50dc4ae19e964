//! Shape rules of the tensor layer: NumPy broadcasting and dimension arguments.

use std::panic::Location;

use neuron_pc_compiler::DType;

use crate::error::{Error, Result};

/// A shape error of the tensor layer, reported at the user's call site.
pub(crate) fn shape_error(
    op: &'static str,
    operands: String,
    message: String,
    location: &'static Location<'static>,
) -> Error {
    Error::Op {
        location,
        source: neuron_pc_compiler::Error::Shape {
            op,
            operands,
            message,
        },
    }
}

/// PyTorch's type promotion for two tensor operands: a float beats an integer, an integer
/// beats pred; within a kind the wider type wins, `f16` with `bf16` gives `f32`, and an unsigned
/// integer with a signed one gives the signed type if it is wider, else `i64`.
pub(crate) fn promote(a: DType, b: DType) -> DType {
    fn kind(d: DType) -> u8 {
        if d.is_float() {
            2
        } else if d.is_int() {
            1
        } else {
            0
        }
    }
    if a == b {
        return a;
    }
    let (ka, kb) = (kind(a), kind(b));
    if ka != kb {
        return if ka > kb { a } else { b };
    }
    let (sa, sb) = (a.size_in_bytes(), b.size_in_bytes());
    if a.is_float() {
        return match (sa, sb) {
            (2, 2) => DType::F32,
            _ if sa >= sb => a,
            _ => b,
        };
    }
    match (a.is_signed_int(), b.is_signed_int()) {
        (true, true) | (false, false) => {
            if sa >= sb {
                a
            } else {
                b
            }
        }
        (true, false) if sa > sb => a,
        (false, true) if sb > sa => b,
        _ => DType::I64,
    }
}

/// The broadcast shape of `a` and `b` under NumPy's rules (align from the right; a dimension
/// of 1 stretches).
pub(crate) fn broadcast_shape(
    op: &'static str,
    a: &[usize],
    b: &[usize],
    location: &'static Location<'static>,
) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            1
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::Op {
                    location,
                    source: neuron_pc_compiler::Error::Shape {
                        op,
                        operands: format!("{a:?}, {b:?}"),
                        message: format!(
                            "shapes cannot be broadcast together (dimension {i}: {da} vs {db})"
                        ),
                    },
                })
            }
        };
    }
    Ok(out)
}

/// Resolves a possibly negative dimension index against `rank`.
pub(crate) fn dim_index(
    op: &'static str,
    dim: isize,
    dims: &[usize],
    location: &'static Location<'static>,
) -> Result<usize> {
    let rank = dims.len() as isize;
    let d = if dim < 0 { dim + rank } else { dim };
    if d < 0 || d >= rank {
        return Err(Error::Op {
            location,
            source: neuron_pc_compiler::Error::Shape {
                op,
                operands: format!("{dims:?}"),
                message: format!("dimension {dim} is out of range for rank {rank}"),
            },
        });
    }
    Ok(d as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_broadcasting() {
        let l = Location::caller();
        assert_eq!(
            broadcast_shape("add", &[4, 1, 3], &[5, 1], l).unwrap(),
            vec![4, 5, 3]
        );
        assert_eq!(broadcast_shape("add", &[], &[2, 3], l).unwrap(), vec![2, 3]);
        assert_eq!(
            broadcast_shape("add", &[2, 3], &[2, 3], l).unwrap(),
            vec![2, 3]
        );
        let e = broadcast_shape("add", &[2, 3], &[4, 3], l)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dimension 0: 2 vs 4") && e.contains("shape.rs"),
            "{e}"
        );
    }

    #[test]
    fn type_promotion_follows_pytorch() {
        use DType::*;
        // (a, b, torch.promote_types(a, b))
        let table = [
            (F32, F32, F32),
            (I32, F32, F32),
            (F16, I64, F16),
            (F16, BF16, F32),
            (F16, F32, F32),
            (F64, F32, F64),
            (BF16, F64, F64),
            (I32, I64, I64),
            (U8, I32, I32),
            (U8, U32, U32),
            (U32, I32, I64),
            (U8, Pred, U8),
            (Pred, F16, F16),
        ];
        for (a, b, want) in table {
            assert_eq!(promote(a, b), want, "{a} with {b}");
            assert_eq!(promote(b, a), want, "{b} with {a}");
        }
    }

    #[test]
    fn negative_dims() {
        let l = Location::caller();
        assert_eq!(dim_index("sum", -1, &[2, 3], l).unwrap(), 1);
        assert!(dim_index("sum", 2, &[2, 3], l).is_err());
        assert!(dim_index("sum", -3, &[2, 3], l).is_err());
    }
}
