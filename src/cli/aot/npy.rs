//! A small, strict `.npy` reader and writer (format versions 1.0-3.0, little-endian, C order).
//!
//! dtypes: `<f4 <f8 <f2 <i4 <i8 <u4 |u1 |b1` map to f32 f64 f16 i32 i64 u32 u8 pred. NumPy has no
//! bfloat16; arrays of `ml_dtypes.bfloat16` (what JAX uses) are saved by NumPy as the opaque
//! 2-byte void type `<V2`, so `<V2` / `|V2` are read as bf16 and bf16 is written as `<V2`
//! (`np.load(...).view(ml_dtypes.bfloat16)` gets the values back). Anything else — big-endian,
//! Fortran order, object or structured arrays, a data size that disagrees with the shape — is
//! an error naming the file.

use std::path::Path;

use anyhow::{anyhow, bail};
use neuron_pc_compiler::{DType, HostTensor};

const MAGIC: &[u8] = b"\x93NUMPY";

/// The `descr` written for each dtype.
pub fn descr(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::BF16 => "<V2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U32 => "<u4",
        DType::U8 => "|u1",
        DType::Pred => "|b1",
    }
}

fn dtype_of(descr: &str) -> Option<DType> {
    Some(match descr {
        "<f4" => DType::F32,
        "<f8" => DType::F64,
        "<f2" => DType::F16,
        "<V2" | "|V2" => DType::BF16,
        "<i4" => DType::I32,
        "<i8" => DType::I64,
        "<u4" => DType::U32,
        "|u1" | "<u1" => DType::U8,
        "|b1" => DType::Pred,
        _ => return None,
    })
}

/// Parses `.npy` bytes.
pub fn parse(bytes: &[u8]) -> anyhow::Result<HostTensor> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        bail!("not a .npy file (bad magic)");
    }
    let (header_len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 => {
            if bytes.len() < 12 {
                bail!("truncated header");
            }
            (
                u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
                12usize,
            )
        }
        v => bail!("unsupported .npy format version {v}"),
    };
    let end = start
        .checked_add(header_len)
        .filter(|&e| e <= bytes.len())
        .ok_or_else(|| anyhow!("truncated header"))?;
    let header =
        std::str::from_utf8(&bytes[start..end]).map_err(|_| anyhow!("header is not text"))?;
    let descr = dict_value(header, "descr").ok_or_else(|| anyhow!("header has no descr"))?;
    let descr = descr.trim().trim_matches(['\'', '"']);
    let dtype = dtype_of(descr).ok_or_else(|| {
        anyhow!(
            "unsupported dtype {descr:?} \
             (supported: <f4 <f8 <f2 <V2(bf16) <i4 <i8 <u4 |u1 |b1, little-endian)"
        )
    })?;
    match dict_value(header, "fortran_order").map(str::trim) {
        Some("False") => {}
        Some("True") => {
            bail!("Fortran-order arrays are not supported; save with np.ascontiguousarray")
        }
        _ => bail!("header has no fortran_order"),
    }
    let shape_text = dict_value(header, "shape").ok_or_else(|| anyhow!("header has no shape"))?;
    let inner = shape_text
        .trim()
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| anyhow!("bad shape {shape_text}"))?;
    let dims = inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| anyhow!("bad dimension {s:?}"))
        })
        .collect::<anyhow::Result<Vec<usize>>>()?;
    let count = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| anyhow!("shape too large"))?;
    let want = count
        .checked_mul(dtype.size_in_bytes())
        .ok_or_else(|| anyhow!("shape too large"))?;
    let data = &bytes[end..];
    if data.len() != want {
        bail!(
            "data is {} bytes but shape {dims:?} of {descr} needs {want}",
            data.len()
        );
    }
    if dtype == DType::Pred && data.iter().any(|&b| b > 1) {
        bail!("bool data holds values other than 0 and 1");
    }
    Ok(HostTensor::from_bytes(dtype, &dims, data.to_vec())?)
}

/// The text after `'name':` up to the next top-level comma (a tuple stays whole).
fn dict_value<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    let pat = format!("'{name}':");
    let start = header.find(&pat)? + pat.len();
    let rest = &header[start..];
    let mut depth = 0i32;
    for (i, c) in rest.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' | '}' if depth == 0 => return Some(&rest[..i]),
            _ => {}
        }
    }
    None
}

/// Reads a `.npy` file.
pub fn read(path: &Path) -> anyhow::Result<HostTensor> {
    let bytes = std::fs::read(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    parse(&bytes).map_err(|e| anyhow!("{}: {e}", path.display()))
}

/// Encodes a tensor as `.npy` (version 1.0) bytes.
pub fn encode(t: &HostTensor) -> Vec<u8> {
    let shape = match t.dims() {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        ds => format!(
            "({})",
            ds.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': {shape}, }}",
        descr(t.dtype())
    );
    // Magic (6) + version (2) + length (2) + header + newline, padded to 64 bytes.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.bytes().len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(t.bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_dtype() {
        for dtype in DType::ALL {
            let t = HostTensor::from_bytes(
                dtype,
                &[2, 3],
                (0..6 * dtype.size_in_bytes())
                    .map(|i| (i % 2) as u8)
                    .collect(),
            )
            .unwrap();
            let b = encode(&t);
            assert_eq!((10 + u16::from_le_bytes([b[8], b[9]]) as usize) % 64, 0);
            let back = parse(&b).unwrap();
            assert_eq!(back.dtype(), dtype);
            assert_eq!(back.dims(), &[2, 3]);
            assert_eq!(back.bytes(), t.bytes());
        }
    }

    #[test]
    fn refuses_what_it_does_not_read() {
        let t = HostTensor::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
        let good = encode(&t);
        let swap = |from: &str, to: &str| {
            let mut b = good.clone();
            let at = b
                .windows(from.len())
                .position(|w| w == from.as_bytes())
                .unwrap();
            b[at..at + to.len()].copy_from_slice(to.as_bytes());
            parse(&b).unwrap_err().to_string()
        };
        assert!(swap("<f4", ">f4").contains("unsupported dtype"));
        assert!(swap("False", "True ").contains("Fortran"));
        assert!(parse(&good[..good.len() - 1])
            .unwrap_err()
            .to_string()
            .contains("needs 8"));
        assert!(parse(b"hello").is_err());
        // A scalar.
        let s0 = HostTensor::from_slice(&[7i64], &[]).unwrap();
        assert_eq!(parse(&encode(&s0)).unwrap().dims(), &[] as &[usize]);
    }
}
