//! threefry-2x32 with 20 rounds (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3",
//! SC 2011), the counter-based generator behind [`crate::ir::Op::RandomBits`].

use super::data::{Data, Value};

const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
const PARITY: u32 = 0x1BD1_1BDA;

/// Encrypts the counter `(c0, c1)` under `key`, returning both output words.
pub fn threefry2x32(key: [u32; 2], counter: [u32; 2]) -> [u32; 2] {
    let ks = [key[0], key[1], key[0] ^ key[1] ^ PARITY];
    let mut x0 = counter[0].wrapping_add(ks[0]);
    let mut x1 = counter[1].wrapping_add(ks[1]);
    for group in 0..5usize {
        for &r in &ROTATIONS[group % 2] {
            x0 = x0.wrapping_add(x1);
            x1 = x1.rotate_left(r) ^ x0;
        }
        let j = group + 1;
        x0 = x0.wrapping_add(ks[j % 3]);
        x1 = x1.wrapping_add(ks[(j + 1) % 3]).wrapping_add(j as u32);
    }
    [x0, x1]
}

/// Element `i` is the first word of `threefry2x32(key, (0, i))`.
pub(crate) fn random_bits(key: &Value, count: usize) -> Data {
    let k = |i| key.data.get(i).as_i64() as u32;
    let key = [k(0), k(1)];
    Data::U(
        (0..count)
            .map(|i| threefry2x32(key, [0, i as u32])[0] as u64)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answer_vectors() {
        // The Random123 known-answer tests for threefry2x32_20 (also used by JAX).
        assert_eq!(threefry2x32([0, 0], [0, 0]), [0x6b20_0159, 0x99ba_4efe]);
        assert_eq!(
            threefry2x32([u32::MAX, u32::MAX], [u32::MAX, u32::MAX]),
            [0x1cb9_96fc, 0xbb00_2be7]
        );
        assert_eq!(
            threefry2x32([0x1319_8a2e, 0x0370_7344], [0x243f_6a88, 0x85a3_08d3]),
            [0xc492_3a9c, 0x483d_f7a0]
        );
    }
}
