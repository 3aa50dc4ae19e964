//! Element types shared by the IR, the lowering, the PJRT layer and host tensors.

use serde::{Deserialize, Serialize};

/// An element type a tensor can hold. The set matches what the PJRT layer can move between host
/// and device and what the IR can lower to StableHLO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DType {
    /// 32-bit IEEE float (`torch.float32`).
    F32,
    /// 64-bit IEEE float (`torch.float64`).
    F64,
    /// bfloat16: float32's 8 exponent bits with 7 mantissa bits (`torch.bfloat16`).
    BF16,
    /// 16-bit IEEE half float, 5 exponent bits and 10 mantissa bits (`torch.float16`).
    F16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// 32-bit unsigned integer (`ui32` in MLIR); random bits and PRNG keys use it.
    U32,
    /// 8-bit unsigned integer (`ui8` in MLIR).
    U8,
    /// Boolean; one byte per element on the host.
    Pred,
}

impl DType {
    /// Every dtype, in a fixed order (used by tests and listings).
    pub const ALL: [DType; 9] = [
        DType::F32,
        DType::F64,
        DType::BF16,
        DType::F16,
        DType::I32,
        DType::I64,
        DType::U32,
        DType::U8,
        DType::Pred,
    ];

    /// Bytes per element in host memory (and in PJRT's dense layout).
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 | DType::Pred => 1,
        }
    }

    /// The element type as written in StableHLO / MLIR tensor types (`tensor<2x3xf32>`).
    pub fn mlir_name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U32 => "ui32",
            DType::U8 => "ui8",
            DType::Pred => "i1",
        }
    }

    /// Short lowercase name used in messages, file records and `.npy` mapping (`f32`, `pred`).
    pub fn name(self) -> &'static str {
        match self {
            DType::Pred => "pred",
            DType::U32 => "u32",
            DType::U8 => "u8",
            other @ (DType::F32
            | DType::F64
            | DType::BF16
            | DType::F16
            | DType::I32
            | DType::I64) => other.mlir_name(),
        }
    }

    /// Parses [`DType::name`] or [`DType::mlir_name`] spellings.
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s || d.mlir_name() == s)
    }

    /// True for f32, f64, bf16 and f16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::BF16 | DType::F16)
    }

    /// True for i32 and i64.
    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// True for u32 and u8 (not pred).
    pub fn is_unsigned_int(self) -> bool {
        matches!(self, DType::U32 | DType::U8)
    }

    /// True for the signed and unsigned integers (not pred).
    pub fn is_int(self) -> bool {
        self.is_signed_int() || self.is_unsigned_int()
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
            assert_eq!(DType::from_name(d.mlir_name()), Some(d));
        }
        assert_eq!(DType::from_name("f8"), None);
    }

    #[test]
    fn sizes() {
        let sizes: Vec<usize> = DType::ALL.iter().map(|d| d.size_in_bytes()).collect();
        assert_eq!(sizes, vec![4, 8, 2, 2, 4, 8, 4, 1, 1]);
    }
}
