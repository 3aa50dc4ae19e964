//! Shape rules of the tensor layer: NumPy broadcasting and dimension arguments.

use std::panic::Location;

use crate::error::{Error, Result};

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
    fn negative_dims() {
        let l = Location::caller();
        assert_eq!(dim_index("sum", -1, &[2, 3], l).unwrap(), 1);
        assert!(dim_index("sum", 2, &[2, 3], l).is_err());
        assert!(dim_index("sum", -3, &[2, 3], l).is_err());
    }
}
