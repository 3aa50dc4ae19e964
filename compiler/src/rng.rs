//! SplitMix64: the one small seeded generator of the workspace, for host-side parameter
//! initialisation and reproducible test inputs. Device-side randomness is threefry
//! ([`crate::ir::Op::RandomBits`]); this never enters a graph.

/// A 64-bit SplitMix generator: every seed gives a reproducible stream, and consecutive seeds
/// give unrelated streams.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`, on the 2^-53 grid.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// A standard normal value (the ziggurat method of Marsaglia and Tsang with 128 layers,
    /// as Doornik describes it): one draw and one comparison for ~98% of values, against a
    /// logarithm, a square root and a cosine each for Box-Muller. Initialising a model draws
    /// millions of these, on the path to its first step.
    pub fn normal(&mut self) -> f64 {
        let z = ziggurat();
        loop {
            let bits = self.next_u64();
            // the low 7 bits pick a layer, the top 53 a signed position in it: disjoint bits
            let i = (bits & 0x7f) as usize;
            let u = 2.0 * ((bits >> 11) as f64 * UNIT) - 1.0;
            if u.abs() < z.ratio[i] {
                return u * z.x[i];
            }
            if i == 0 {
                return self.normal_tail(u < 0.0);
            }
            // the wedge between the layer's rectangle and the density
            let x = u * z.x[i];
            let f0 = (-0.5 * (z.x[i] * z.x[i] - x * x)).exp();
            let f1 = (-0.5 * (z.x[i + 1] * z.x[i + 1] - x * x)).exp();
            if f1 + self.unit() * (f0 - f1) < 1.0 {
                return x;
            }
        }
    }

    /// A value beyond `ZIGGURAT_R` in size (Marsaglia's tail method).
    fn normal_tail(&mut self, negative: bool) -> f64 {
        loop {
            let x = self.unit().max(f64::MIN_POSITIVE).ln() / ZIGGURAT_R;
            let y = self.unit().max(f64::MIN_POSITIVE).ln();
            if -2.0 * y >= x * x {
                return if negative {
                    x - ZIGGURAT_R
                } else {
                    ZIGGURAT_R - x
                };
            }
        }
    }
}

/// 2^-53: `(bits >> 11) * UNIT` is uniform in `[0, 1)`.
const UNIT: f64 = 1.0 / (1u64 << 53) as f64;
/// Where the tail starts, and the area of each of the 128 layers (Doornik, "An Improved
/// Ziggurat Method to Generate Normal Random Samples", 2005).
const ZIGGURAT_R: f64 = 3.442_619_855_899;
const ZIGGURAT_V: f64 = 9.912_563_035_262_17e-3;

/// The layer edges `x[0] > x[1] = R > ... > x[128] = 0` (x[0] the base layer's pseudo-width,
/// `V / f(R)`) and `ratio[i] = x[i + 1] / x[i]`, the part of layer `i` under the density.
struct Ziggurat {
    x: [f64; 129],
    ratio: [f64; 128],
}

fn ziggurat() -> &'static Ziggurat {
    static TABLES: std::sync::OnceLock<Ziggurat> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| {
        let mut x = [0.0; 129];
        let mut f = (-0.5 * ZIGGURAT_R * ZIGGURAT_R).exp();
        x[0] = ZIGGURAT_V / f;
        x[1] = ZIGGURAT_R;
        for i in 2..128 {
            x[i] = (-2.0 * (ZIGGURAT_V / x[i - 1] + f).ln()).sqrt();
            f = (-0.5 * x[i] * x[i]).exp();
        }
        let mut ratio = [0.0; 128];
        for i in 0..128 {
            ratio[i] = x[i + 1] / x[i];
        }
        Ziggurat { x, ratio }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_matches_the_published_splitmix64_outputs() {
        // First outputs for seed 1234567 as listed with the reference C implementation.
        let mut r = SplitMix64::new(1234567);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            [
                6457827717110365317,
                3203168211198807973,
                9817491932198370423
            ]
        );
    }

    #[test]
    fn uniform_stays_in_range_and_normal_has_unit_variance() {
        let mut r = SplitMix64::new(7);
        let xs: Vec<f64> = (0..20_000).map(|_| r.uniform(-2.0, 3.0)).collect();
        assert!(xs.iter().all(|&x| (-2.0..3.0).contains(&x)));
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        assert!((mean - 0.5).abs() < 0.05, "mean {mean}");
        let ns: Vec<f64> = (0..20_000).map(|_| r.normal()).collect();
        let m = ns.iter().sum::<f64>() / ns.len() as f64;
        let var = ns.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / ns.len() as f64;
        assert!(
            m.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "mean {m} var {var}"
        );
    }

    /// The standard normal CDF (Abramowitz and Stegun 7.1.26 for erf, error below 1.5e-7).
    fn phi(x: f64) -> f64 {
        let z = x.abs() / std::f64::consts::SQRT_2;
        let t = 1.0 / (1.0 + 0.327_591_1 * z);
        let poly = t
            * (0.254_829_592
                + t * (-0.284_496_736
                    + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
        let erf = 1.0 - poly * (-z * z).exp();
        0.5 * (1.0 + x.signum() * erf)
    }

    #[test]
    fn normal_follows_the_normal_distribution_in_the_body_and_the_tails() {
        let n = 400_000;
        let mut r = SplitMix64::new(3);
        let mut xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
        // Kolmogorov-Smirnov distance to the normal CDF (1.95 / sqrt(n) is the 0.1% level)
        let ks = xs
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let c = phi(x);
                (c - i as f64 / n as f64)
                    .abs()
                    .max((c - (i + 1) as f64 / n as f64).abs())
            })
            .fold(0.0, f64::max);
        assert!(ks < 1.95 / (n as f64).sqrt(), "KS distance {ks}");
        // each side's tail beyond the ziggurat's base (R = 3.44): 2.88e-4 of the values
        let beyond = |t: f64| xs.iter().filter(|&&x| x > t).count() as f64 / n as f64;
        let below = xs.iter().filter(|&&x| x < -3.5).count() as f64 / n as f64;
        for (got, want) in [
            (beyond(3.5), 2.33e-4),
            (below, 2.33e-4),
            (beyond(2.0), 0.02275),
        ] {
            assert!(
                (got - want).abs() < 0.25 * want,
                "tail {got}, expected {want}"
            );
        }
        // fourth moment 3 (a uniform or a clipped draw would be far off)
        let kurt = xs.iter().map(|x| x.powi(4)).sum::<f64>() / n as f64;
        assert!((kurt - 3.0).abs() < 0.1, "fourth moment {kurt}");
        // the layers' edges: x[1] = R, x[128] = 0, decreasing, and the top layer reaches 0
        let z = ziggurat();
        assert_eq!(z.x[1], ZIGGURAT_R);
        assert!(z.x.windows(2).all(|w| w[0] > w[1]) && z.x[127] > 0.0);
    }
}
