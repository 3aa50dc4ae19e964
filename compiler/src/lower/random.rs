//! Random bits as threefry-2x32 (20 rounds) written out in StableHLO integer ops, so every
//! backend produces the same bits as [`crate::reference::threefry2x32`].

use crate::dtype::DType;

use super::text::tensor_of;
use super::Emitter;

/// Rotation amounts of threefry-2x32, used in groups of four alternately.
pub(crate) const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];
/// The key-schedule parity constant of Threefish/threefry.
pub(crate) const PARITY: u32 = 0x1BD1_1BDA;

struct Ops<'a> {
    e: &'a mut Emitter,
    v: &'a str,
    n: usize,
    ty: String,
    scalar: String,
}

impl Ops<'_> {
    fn name(&mut self) -> String {
        self.n += 1;
        format!("{}_t{}", self.v, self.n)
    }

    fn bin(&mut self, op: &str, a: &str, b: &str) -> String {
        let r = self.name();
        self.e
            .line(&format!("{r} = stablehlo.{op} {a}, {b} : {}", self.ty));
        r
    }

    fn constant(&mut self, c: u32) -> String {
        let r = self.name();
        self.e.line(&format!(
            "{r} = stablehlo.constant dense<{c}> : {}",
            self.ty
        ));
        r
    }

    /// Key word `i` of `key` as a scalar.
    fn key_word(&mut self, key: &str, i: usize) -> String {
        let s = self.name();
        let k = tensor_of(DType::U32, &[2]);
        let one = tensor_of(DType::U32, &[1]);
        self.e.line(&format!(
            "{s} = \"stablehlo.slice\"({key}) {{start_indices = array<i64: {i}>, \
             limit_indices = array<i64: {}>, strides = array<i64: 1>}} : ({k}) -> {one}",
            i + 1
        ));
        let r = self.name();
        self.e.line(&format!(
            "{r} = \"stablehlo.reshape\"({s}) : ({one}) -> {}",
            self.scalar
        ));
        r
    }

    fn broadcast(&mut self, scalar: &str) -> String {
        let r = self.name();
        self.e.line(&format!(
            "{r} = \"stablehlo.broadcast_in_dim\"({scalar}) \
             {{broadcast_dimensions = array<i64>}} : ({}) -> {}",
            self.scalar, self.ty
        ));
        r
    }

    fn rotl(&mut self, x: &str, r: u32) -> String {
        let left = self.constant(r);
        let right = self.constant(32 - r);
        let a = self.bin("shift_left", x, &left);
        let b = self.bin("shift_right_logical", x, &right);
        self.bin("or", &a, &b)
    }
}

/// Emits `u32[dims]` random bits from the `u32[2]` key `key`; returns the result's name.
pub(crate) fn emit(e: &mut Emitter, v: &str, key: &str, dims: &[usize]) -> String {
    let count: usize = dims.iter().product();
    let ty = tensor_of(DType::U32, &[count]);
    let scalar = tensor_of(DType::U32, &[]);
    let mut o = Ops {
        e,
        v,
        n: 0,
        ty: ty.clone(),
        scalar: scalar.clone(),
    };
    let k0 = o.key_word(key, 0);
    let k1 = o.key_word(key, 1);
    let parity = o.name();
    o.e.line(&format!(
        "{parity} = stablehlo.constant dense<{PARITY}> : {scalar}"
    ));
    let k01 = o.name();
    o.e.line(&format!("{k01} = stablehlo.xor {k0}, {k1} : {scalar}"));
    let k2 = o.name();
    o.e.line(&format!("{k2} = stablehlo.xor {k01}, {parity} : {scalar}"));
    let ks = [o.broadcast(&k0), o.broadcast(&k1), o.broadcast(&k2)];
    // Counter (0, i): the first word starts as 0 + ks0, the second as i + ks1.
    let iota = o.name();
    o.e.line(&format!(
        "{iota} = \"stablehlo.iota\"() {{iota_dimension = 0 : i64}} : () -> {ty}"
    ));
    let mut x0 = ks[0].clone();
    let mut x1 = o.bin("add", &iota, &ks[1]);
    for group in 0..5usize {
        for &r in &ROTATIONS[group % 2] {
            x0 = o.bin("add", &x0, &x1);
            let rot = o.rotl(&x1, r);
            x1 = o.bin("xor", &rot, &x0);
        }
        let j = group + 1;
        x0 = o.bin("add", &x0, &ks[j % 3]);
        let inc = o.constant(j as u32);
        let k = o.bin("add", &ks[(j + 1) % 3], &inc);
        x1 = o.bin("add", &x1, &k);
    }
    // Only the first word is the result; the second word's last update stays in the text
    // (XLA drops it) so programs and their cache keys are those of earlier versions.
    drop(x1);
    let out = v.to_string();
    o.e.line(&format!(
        "{out} = \"stablehlo.reshape\"({x0}) : ({ty}) -> {}",
        tensor_of(DType::U32, dims)
    ));
    out
}
