//! Shape and dtype inference: the result type of an op from its operands' types, or an error
//! naming the op, the operand types and what was expected.

use crate::dtype::DType;
use crate::error::{Error, Result};

use super::families::DTypeClass;
use super::op::{Op, ScanBody, ScanOutput};
use super::types::TensorType;

mod process;
use process::{infer_process_bucket, infer_process_collective};

/// The result type of `op` applied to operands of types `operands`.
///
/// Cheap enough to call once per traced op: it allocates only the result (and a message on
/// error). [`Op::Parameter`] has no inferable type (its type is given to `Graph::parameter`),
/// so it is an error here.
pub fn infer(op: &Op, operands: &[&TensorType]) -> Result<TensorType> {
    let ty = infer_type(op, operands)?;
    if ty.checked_size().is_none() {
        return Err(shape_error(
            op,
            operands,
            format!(
                "the result {:?} has more bytes than memory can address",
                ty.dims
            ),
        ));
    }
    Ok(ty)
}

fn infer_type(op: &Op, operands: &[&TensorType]) -> Result<TensorType> {
    let e = |message: String| shape_error(op, operands, message);
    match op {
        Op::Parameter { .. } => Err(e(
            "a parameter's type is given when it is created, not inferred".to_string(),
        )),
        Op::Constant(lit) => {
            arity(op, operands, 0)?;
            lit.check()?;
            Ok(lit.ty())
        }
        Op::Unary(u) => {
            let x = unary(op, operands)?;
            dtype_in(op, x.dtype, u.dtypes())?;
            Ok(x.clone())
        }
        Op::Binary(b) => {
            // `binary` checks that both operands have one type.
            let (x, _) = binary(op, operands)?;
            dtype_in(op, x.dtype, b.dtypes())?;
            Ok(x.clone())
        }
        Op::Compare(_) => {
            let (x, _) = binary(op, operands)?;
            Ok(TensorType::new(DType::Pred, x.dims.clone()))
        }
        Op::Select => {
            arity(op, operands, 3)?;
            let (p, t, f) = (operands[0], operands[1], operands[2]);
            if p.dtype != DType::Pred {
                return Err(e(format!("the condition must be pred, got {}", p.dtype)));
            }
            if t != f {
                return Err(e("both branches must have the same type".to_string()));
            }
            if !p.dims.is_empty() && p.dims != t.dims {
                return Err(e(
                    "the condition must be a scalar or have the branches' shape".to_string(),
                ));
            }
            Ok(t.clone())
        }
        Op::Convert(to) => {
            let x = unary(op, operands)?;
            Ok(TensorType::new(*to, x.dims.clone()))
        }
        Op::Scan {
            body,
            length,
            output,
            ..
        } => infer_scan(op, operands, body, *length, *output),
        Op::Call { body, output } => body.result_type(op, operands, *output),
        Op::ReplicaId | Op::ProcessIndex => {
            arity(op, operands, 0)?;
            Ok(TensorType::new(DType::U32, Vec::new()))
        }
        Op::ProcessCollective {
            collective,
            processes,
            ..
        } => infer_process_collective(op, operands, *collective, *processes),
        Op::ProcessBucket {
            op: r,
            layouts,
            output,
            ..
        } => infer_process_bucket(op, operands, *r, layouts.len(), *output),
        Op::Iota { dims, dim, dtype } => {
            arity(op, operands, 0)?;
            if *dim >= dims.len() {
                return Err(e(format!("dim {dim} is out of range for dims {dims:?}")));
            }
            dtype_in(op, *dtype, DTypeClass::Numeric)?;
            Ok(TensorType::new(*dtype, dims.clone()))
        }
        Op::BroadcastInDim {
            dims,
            broadcast_dimensions: bd,
        } => {
            let x = unary(op, operands)?;
            if bd.len() != x.rank() {
                return Err(e(format!(
                    "broadcast_dimensions {bd:?} must name one result dimension per operand \
                     dimension"
                )));
            }
            for (i, &r) in bd.iter().enumerate() {
                if r >= dims.len() || bd[..i].contains(&r) {
                    return Err(e(format!(
                        "broadcast_dimensions {bd:?} must be distinct dimensions of the result \
                         {dims:?}"
                    )));
                }
                if x.dims[i] != 1 && x.dims[i] != dims[r] {
                    return Err(e(format!(
                        "operand dimension {i} (size {}) cannot broadcast to result dimension \
                         {r} of {dims:?}",
                        x.dims[i]
                    )));
                }
            }
            Ok(TensorType::new(x.dtype, dims.clone()))
        }
        Op::Reshape { dims } => {
            let x = unary(op, operands)?;
            let count = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if count != Some(x.element_count()) {
                return Err(e(format!(
                    "cannot reshape {} elements into {dims:?}",
                    x.element_count()
                )));
            }
            Ok(TensorType::new(x.dtype, dims.clone()))
        }
        Op::Transpose { perm } => {
            let x = unary(op, operands)?;
            if !is_permutation(perm, x.rank()) {
                return Err(e(format!(
                    "perm {perm:?} is not a permutation of 0..{}",
                    x.rank()
                )));
            }
            Ok(TensorType::new(
                x.dtype,
                perm.iter().map(|&p| x.dims[p]).collect(),
            ))
        }
        Op::Slice {
            start,
            limit,
            stride,
        } => {
            let x = unary(op, operands)?;
            let r = x.rank();
            if start.len() != r || limit.len() != r || stride.len() != r {
                return Err(e(format!("start, limit and stride need {r} entries each")));
            }
            let mut dims = Vec::with_capacity(r);
            for i in 0..r {
                if start[i] > limit[i] || limit[i] > x.dims[i] || stride[i] == 0 {
                    return Err(e(format!(
                        "dimension {i}: expected start <= limit <= {} and stride >= 1, \
                         got start {} limit {} stride {}",
                        x.dims[i], start[i], limit[i], stride[i]
                    )));
                }
                dims.push((limit[i] - start[i]).div_ceil(stride[i]));
            }
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::DynamicSlice { sizes } => {
            let x = first(op, operands)?;
            indices(op, operands, 1, x.rank())?;
            if sizes.len() != x.rank() || sizes.iter().zip(&x.dims).any(|(s, d)| s > d) {
                return Err(e(format!(
                    "sizes {sizes:?} must have one entry per dimension, each <= the operand's"
                )));
            }
            Ok(TensorType::new(x.dtype, sizes.clone()))
        }
        Op::DynamicUpdateSlice => {
            let x = first(op, operands)?;
            let u = operands
                .get(1)
                .ok_or_else(|| e("expected an operand and an update".to_string()))?;
            if u.dtype != x.dtype
                || u.rank() != x.rank()
                || u.dims.iter().zip(&x.dims).any(|(a, b)| a > b)
            {
                return Err(e(
                    "the update must have the operand's dtype and rank and fit inside it"
                        .to_string(),
                ));
            }
            indices(op, operands, 2, x.rank())?;
            Ok(x.clone())
        }
        Op::Concatenate { dim } => {
            let x = first(op, operands)?;
            if *dim >= x.rank() {
                return Err(e(format!(
                    "dim {dim} is out of range for rank {}",
                    x.rank()
                )));
            }
            let mut dims = x.dims.clone();
            for y in &operands[1..] {
                let same_rest = y.rank() == x.rank()
                    && y.dims
                        .iter()
                        .zip(&x.dims)
                        .enumerate()
                        .all(|(i, (a, b))| i == *dim || a == b);
                if y.dtype != x.dtype || !same_rest {
                    return Err(e(format!(
                        "operands must share dtype and every dimension but {dim}"
                    )));
                }
                dims[*dim] = dims[*dim]
                    .checked_add(y.dims[*dim])
                    .ok_or_else(|| e("the result is too large".to_string()))?;
            }
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::Pad {
            low,
            high,
            interior,
        } => {
            arity(op, operands, 2)?;
            let (x, v) = (operands[0], operands[1]);
            if v.dtype != x.dtype || v.rank() != 0 {
                return Err(e(format!("the pad value must be a {} scalar", x.dtype)));
            }
            let r = x.rank();
            if low.len() != r || high.len() != r || interior.len() != r {
                return Err(e(format!("low, high and interior need {r} entries each")));
            }
            let mut dims = Vec::with_capacity(r);
            for i in 0..r {
                // i128 holds every sum of these i64/usize terms without overflow.
                let d = x.dims[i] as i128;
                let n = low[i] as i128 + high[i] as i128 + d + (d - 1).max(0) * interior[i] as i128;
                if n < 0 || n > usize::MAX as i128 {
                    return Err(e(format!("dimension {i} would have negative size {n}")));
                }
                dims.push(n as usize);
            }
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::Reduce(r, dims) => {
            let x = unary(op, operands)?;
            dtype_in(op, x.dtype, r.dtypes())?;
            for (i, &d) in dims.iter().enumerate() {
                if d >= x.rank() || dims[..i].contains(&d) {
                    return Err(e(format!(
                        "dims {dims:?} must be distinct dimensions below rank {}",
                        x.rank()
                    )));
                }
            }
            let kept = (0..x.rank())
                .filter(|i| !dims.contains(i))
                .map(|i| x.dims[i])
                .collect();
            Ok(TensorType::new(x.dtype, kept))
        }
        Op::TopK { k } => {
            let x = unary(op, operands)?;
            if x.rank() == 0 || x.dtype == DType::Pred {
                return Err(e("takes a numeric operand of rank at least 1".into()));
            }
            let n = x.dims[x.rank() - 1];
            if *k == 0 || *k > n || n > i32::MAX as usize {
                return Err(e(format!(
                    "k {k} must be in 1..={n} (the last dimension) for i32 positions"
                )));
            }
            let mut dims = x.dims.clone();
            dims[x.rank() - 1] = *k;
            Ok(TensorType::new(DType::I32, dims))
        }
        Op::ArgMax { dim, index_dtype }
        | Op::ArgMin { dim, index_dtype }
        | Op::ArgSort {
            dim, index_dtype, ..
        } => {
            let x = unary(op, operands)?;
            dtype_in(op, x.dtype, DTypeClass::Numeric)?;
            if !index_dtype.is_int() {
                return Err(e(format!(
                    "the index dtype must be an integer, got {index_dtype}"
                )));
            }
            if *dim >= x.rank() {
                return Err(e(format!(
                    "dim {dim} is out of range for rank {}",
                    x.rank()
                )));
            }
            let max_index: u64 = match index_dtype {
                DType::U8 => u8::MAX as u64,
                DType::I32 => i32::MAX as u64,
                DType::U32 => u32::MAX as u64,
                DType::I64 => i64::MAX as u64,
                // refused as an index dtype below
                DType::F32 | DType::F64 | DType::BF16 | DType::F16 | DType::Pred => u64::MAX,
            };
            if x.dims[*dim] as u64 > max_index.saturating_add(1) {
                return Err(e(format!(
                    "{index_dtype} cannot index {} positions along dim {dim}",
                    x.dims[*dim]
                )));
            }
            // a sort keeps the dimension it orders; argmax/argmin remove it
            let sorts = matches!(op, Op::ArgSort { .. });
            let kept = (0..x.rank())
                .filter(|i| sorts || i != dim)
                .map(|i| x.dims[i])
                .collect();
            Ok(TensorType::new(*index_dtype, kept))
        }
        Op::DotGeneral {
            lhs_batch,
            rhs_batch,
            lhs_contract,
            rhs_contract,
        } => {
            arity(op, operands, 2)?;
            let (l, r) = (operands[0], operands[1]);
            dtype_in(op, l.dtype, DTypeClass::Numeric)?;
            if l.dtype != r.dtype {
                return Err(e(format!(
                    "operands must have the same dtype, got {} and {} (convert one with to_dtype)",
                    l.dtype, r.dtype
                )));
            }
            if lhs_batch.len() != rhs_batch.len() || lhs_contract.len() != rhs_contract.len() {
                return Err(e(
                    "lhs and rhs need as many batch and as many contracting dims".to_string(),
                ));
            }
            let valid = |t: &TensorType, a: &[usize], b: &[usize]| {
                let all = a.iter().chain(b);
                all.clone()
                    .enumerate()
                    .all(|(i, &d)| d < t.rank() && !all.clone().take(i).any(|&p| p == d))
            };
            if !valid(l, lhs_batch, lhs_contract) || !valid(r, rhs_batch, rhs_contract) {
                return Err(e(
                    "batch and contracting dims must be distinct dimensions of each operand"
                        .to_string(),
                ));
            }
            let pairs = lhs_batch
                .iter()
                .zip(rhs_batch)
                .chain(lhs_contract.iter().zip(rhs_contract));
            for (&a, &b) in pairs {
                if l.dims[a] != r.dims[b] {
                    return Err(e(format!(
                        "lhs dimension {a} (size {}) must equal rhs dimension {b} (size {})",
                        l.dims[a], r.dims[b]
                    )));
                }
            }
            let mut dims: Vec<usize> = lhs_batch.iter().map(|&d| l.dims[d]).collect();
            let free = |t: &TensorType, a: &[usize], b: &[usize]| {
                (0..t.rank())
                    .filter(|i| !a.contains(i) && !b.contains(i))
                    .map(|i| t.dims[i])
                    .collect::<Vec<_>>()
            };
            dims.extend(free(l, lhs_batch, lhs_contract));
            dims.extend(free(r, rhs_batch, rhs_contract));
            Ok(TensorType::new(l.dtype, dims))
        }
        Op::StopGradient => Ok(unary(op, operands)?.clone()),
        Op::After => Ok(first(op, operands)?.clone()),
        Op::ShardingConstraint { .. } => Ok(unary(op, operands)?.clone()),
        Op::ReduceWindow {
            window,
            stride,
            padding,
            ..
        } => reduce_window(op, operands, (window, stride, padding)),
        Op::Convolution {
            stride,
            padding,
            dilation,
            groups,
        } => convolution(op, operands, (stride, padding, dilation), *groups),
        Op::Gather => {
            arity(op, operands, 2)?;
            let (t, i) = (operands[0], operands[1]);
            table_and_indices(op, operands, t, i)?;
            let mut dims = i.dims.clone();
            dims.extend_from_slice(&t.dims[1..]);
            Ok(TensorType::new(t.dtype, dims))
        }
        Op::ScatterAdd => {
            arity(op, operands, 3)?;
            let (t, i, u) = (operands[0], operands[1], operands[2]);
            table_and_indices(op, operands, t, i)?;
            dtype_in(op, t.dtype, DTypeClass::Numeric)?;
            let want: Vec<usize> = i.dims.iter().chain(&t.dims[1..]).copied().collect();
            if u.dtype != t.dtype || u.dims != want {
                return Err(e(format!(
                    "updates must be {}",
                    TensorType::new(t.dtype, want)
                )));
            }
            Ok(t.clone())
        }
        Op::RandomBits { dims } => {
            let k = unary(op, operands)?;
            if k.dtype != DType::U32 || k.dims != [2] {
                return Err(e("the key must be u32[2]".to_string()));
            }
            let count = dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
            if count.is_none_or(|n| n > u32::MAX as usize) {
                return Err(e(
                    "at most 2^32-1 elements (the counter is 32 bits)".to_string()
                ));
            }
            Ok(TensorType::new(DType::U32, dims.clone()))
        }
        Op::AllReduce {
            op: r,
            replica_groups,
        } => {
            let x = unary(op, operands)?;
            dtype_in(op, x.dtype, r.dtypes())?;
            group_size(op, operands, replica_groups)?;
            Ok(x.clone())
        }
        Op::AllGather {
            dim,
            replica_groups,
        } => {
            let x = unary(op, operands)?;
            let n = group_size(op, operands, replica_groups)?;
            if *dim >= x.rank() {
                return Err(e(format!(
                    "dim {dim} is out of range for rank {}",
                    x.rank()
                )));
            }
            let mut dims = x.dims.clone();
            dims[*dim] = dims[*dim]
                .checked_mul(n)
                .ok_or_else(|| e("the result is too large".to_string()))?;
            Ok(TensorType::new(x.dtype, dims))
        }
        Op::ReduceScatter {
            op: r,
            dim,
            replica_groups,
        } => {
            let x = unary(op, operands)?;
            dtype_in(op, x.dtype, r.dtypes())?;
            let n = group_size(op, operands, replica_groups)?;
            if *dim >= x.rank() || x.dims[*dim] % n != 0 {
                return Err(e(format!(
                    "dimension {dim} must exist and divide by the group size {n}"
                )));
            }
            let mut dims = x.dims.clone();
            dims[*dim] /= n;
            Ok(TensorType::new(x.dtype, dims))
        }
    }
}

/// The `Error::Shape` for `op` with these operands.
pub fn shape_error(op: &Op, operands: &[&TensorType], message: String) -> Error {
    let operands = operands
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Error::Shape {
        op: op.name(),
        operands,
        message,
    }
}

fn arity(op: &Op, operands: &[&TensorType], n: usize) -> Result<()> {
    if operands.len() != n {
        return Err(shape_error(
            op,
            operands,
            format!("expected {n} operands, got {}", operands.len()),
        ));
    }
    Ok(())
}

pub(super) fn unary<'a>(op: &Op, operands: &[&'a TensorType]) -> Result<&'a TensorType> {
    arity(op, operands, 1)?;
    Ok(operands[0])
}

fn first<'a>(op: &Op, operands: &[&'a TensorType]) -> Result<&'a TensorType> {
    operands
        .first()
        .copied()
        .ok_or_else(|| shape_error(op, operands, "expected at least one operand".to_string()))
}

fn binary<'a>(op: &Op, operands: &[&'a TensorType]) -> Result<(&'a TensorType, &'a TensorType)> {
    arity(op, operands, 2)?;
    let (x, y) = (operands[0], operands[1]);
    if x.dtype != y.dtype {
        return Err(shape_error(
            op,
            operands,
            format!(
                "expected operands of the same shape and dtype, got dtypes {} and {} \
                 (convert one with to_dtype)",
                x.dtype, y.dtype
            ),
        ));
    }
    if x != y {
        return Err(shape_error(
            op,
            operands,
            "expected operands of the same shape (broadcast explicitly first)".to_string(),
        ));
    }
    Ok((x, y))
}

/// `[n, c_in, s..]` with `[c_out, c_in / groups, k..]` gives `[n, c_out, o..]`,
/// `o = (s + 2 padding - dilation (k - 1) - 1) / stride + 1`.
fn convolution(
    op: &Op,
    operands: &[&TensorType],
    (stride, padding, dilation): (&[usize], &[usize], &[usize]),
    groups: usize,
) -> Result<TensorType> {
    arity(op, operands, 2)?;
    let e = |message: String| shape_error(op, operands, message);
    let (x, w) = (operands[0], operands[1]);
    dtype_in(op, x.dtype, DTypeClass::Float)?;
    if x.dtype != w.dtype {
        return Err(e("the input and the kernel must have the same dtype".into()));
    }
    let k = x.rank().saturating_sub(2);
    if x.rank() < 3 || w.rank() != x.rank() {
        return Err(e(
            "expected an input [n, c, spatial..] and a kernel [o, c / groups, \
             window..] of the same rank, at least 3"
                .into(),
        ));
    }
    if [stride, padding, dilation].iter().any(|v| v.len() != k) {
        return Err(e(format!(
            "stride, padding and dilation need one entry per spatial dimension ({k})"
        )));
    }
    if stride.contains(&0) || dilation.contains(&0) {
        return Err(e("stride and dilation must be at least 1".into()));
    }
    let (c_in, c_out) = (x.dims[1], w.dims[0]);
    if groups == 0 || w.dims[1] * groups != c_in || !c_out.is_multiple_of(groups) {
        return Err(e(format!(
            "{groups} groups do not fit {c_in} input channels, kernel input channels {} \
             and {c_out} output channels",
            w.dims[1]
        )));
    }
    let mut dims = vec![x.dims[0], c_out];
    for i in 0..k {
        let padded = x.dims[2 + i] + 2 * padding[i];
        let reach = dilation[i] * w.dims[2 + i].saturating_sub(1) + 1;
        if w.dims[2 + i] == 0 || padded < reach {
            return Err(e(format!(
                "spatial dimension {i}: the window ({} with dilation {}) does not fit \
                 {padded} padded entries",
                w.dims[2 + i],
                dilation[i]
            )));
        }
        dims.push((padded - reach) / stride[i] + 1);
    }
    Ok(TensorType::new(x.dtype, dims))
}

/// Each dimension `d` with window `w`, stride `s` and padding `p` becomes `(d + 2p - w) / s + 1`.
fn reduce_window(
    op: &Op,
    operands: &[&TensorType],
    (window, stride, padding): (&[usize], &[usize], &[usize]),
) -> Result<TensorType> {
    let x = unary(op, operands)?;
    dtype_in(op, x.dtype, DTypeClass::Float)?;
    let e = |message: String| shape_error(op, operands, message);
    if [window, stride, padding]
        .iter()
        .any(|v| v.len() != x.rank())
    {
        return Err(e(format!(
            "window, stride and padding need one entry per dimension ({})",
            x.rank()
        )));
    }
    let mut dims = Vec::with_capacity(x.rank());
    for (i, &d) in x.dims.iter().enumerate() {
        if window[i] == 0 || stride[i] == 0 || d + 2 * padding[i] < window[i] {
            return Err(e(format!(
                "dimension {i}: window {} with stride {} does not fit {} padded entries",
                window[i],
                stride[i],
                d + 2 * padding[i]
            )));
        }
        dims.push((d + 2 * padding[i] - window[i]) / stride[i] + 1);
    }
    Ok(TensorType::new(x.dtype, dims))
}

pub(super) fn dtype_in(op: &Op, dtype: DType, class: DTypeClass) -> Result<()> {
    if class.contains(dtype) {
        Ok(())
    } else {
        Err(Error::UnsupportedDType {
            op: op.name(),
            dtype,
        })
    }
}

/// Operands `from..` must be exactly `rank` integer scalars of one dtype.
fn indices(op: &Op, operands: &[&TensorType], from: usize, rank: usize) -> Result<()> {
    let idx = operands.get(from..).unwrap_or(&[]);
    let ok = idx.len() == rank
        && idx
            .iter()
            .all(|t| t.rank() == 0 && t.dtype.is_int() && t.dtype == idx[0].dtype);
    if !ok {
        return Err(shape_error(
            op,
            operands,
            format!("expected {rank} scalar integer start indices of one dtype"),
        ));
    }
    Ok(())
}

fn table_and_indices(
    op: &Op,
    operands: &[&TensorType],
    table: &TensorType,
    idx: &TensorType,
) -> Result<()> {
    if table.dims.first().is_none_or(|&rows| rows == 0) {
        return Err(shape_error(
            op,
            operands,
            "the table needs a first dimension with at least one row".to_string(),
        ));
    }
    if !idx.dtype.is_int() {
        return Err(shape_error(
            op,
            operands,
            format!("indices must be integers, got {}", idx.dtype),
        ));
    }
    Ok(())
}

fn group_size(op: &Op, operands: &[&TensorType], groups: &[Vec<usize>]) -> Result<usize> {
    let n = groups.first().map_or(0, |g| g.len());
    let mut seen: Vec<usize> = groups.iter().flatten().copied().collect();
    seen.sort_unstable();
    let distinct = seen.windows(2).all(|w| w[0] != w[1]);
    if n == 0 || !distinct || groups.iter().any(|g| g.len() != n) {
        return Err(shape_error(
            op,
            operands,
            format!(
                "replica_groups {groups:?} must be non-empty groups of one size with distinct \
                 replicas"
            ),
        ));
    }
    Ok(n)
}

fn is_permutation(perm: &[usize], rank: usize) -> bool {
    perm.len() == rank && (0..rank).all(|i| perm.contains(&i))
}

/// The result type of `scan` over operands of types `operands`.
fn infer_scan(
    op: &Op,
    operands: &[&TensorType],
    body: &ScanBody,
    length: usize,
    output: ScanOutput,
) -> Result<TensorType> {
    let e = |message: String| shape_error(op, operands, message);
    let g = &body.graph;
    let params = g.parameter_types();
    if length == 0 {
        return Err(e(
            "a scan runs at least once (a trip count of 0)".to_string()
        ));
    }
    if body.carries + body.xs > params.len() {
        return Err(e(format!(
            "the body has {} parameters, fewer than its {} carries and {} scanned slices",
            params.len(),
            body.carries,
            body.xs
        )));
    }
    if operands.len() != params.len() {
        return Err(e(format!(
            "the body takes {} parameters, the scan has {} operands",
            params.len(),
            operands.len()
        )));
    }
    for (k, (o, p)) in operands.iter().zip(&params).enumerate() {
        let want = if (body.carries..body.carries + body.xs).contains(&k) {
            let mut dims = vec![length];
            dims.extend_from_slice(&p.dims);
            TensorType::new(p.dtype, dims)
        } else {
            p.clone()
        };
        if **o != want {
            return Err(e(format!(
                "operand {k} is {o}, the body's parameter {k} needs {want}{}",
                if want == *p {
                    String::new()
                } else {
                    format!(" ({length} slices of {p})")
                }
            )));
        }
    }
    let outputs = g.output_types();
    if outputs.len() != body.carries {
        return Err(e(format!(
            "the body returns {} values for {} carries",
            outputs.len(),
            body.carries
        )));
    }
    for (k, (o, p)) in outputs.iter().zip(&params).enumerate() {
        if o != p {
            return Err(e(format!(
                "the body changes carry {k} from {p} to {o}; a carry keeps its type"
            )));
        }
    }
    match output {
        ScanOutput::Carry(k) => params
            .get(k)
            .filter(|_| k < body.carries)
            .cloned()
            .ok_or_else(|| e(format!("carry {k} of a scan with {} carries", body.carries))),
        ScanOutput::Stacked(n) => match g.node(n) {
            Some(node) => {
                let mut dims = vec![length];
                dims.extend_from_slice(&node.ty.dims);
                Ok(TensorType::new(node.ty.dtype, dims))
            }
            None => Err(e(format!("stacked {n} of a body of {} nodes", g.len()))),
        },
    }
}
