//! Special functions in f64, exact enough to be the reference of the f32/bf16 ops (erf and
//! erfc): the unary op table (`ir`) and the reference evaluator both read them.

/// erfc: `1 - erf(x)` below 3 (at most 12 of f64's digits lost there, far below f32's); from
/// 3 on, the continued fraction `e^(-x^2)/sqrt(pi) / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))`,
/// 80 terms deep, which keeps the relative precision where the result is tiny.
pub fn erfc(x: f64) -> f64 {
    if x.is_nan() || x < 3.0 {
        return 1.0 - erf(x);
    }
    let mut t = x;
    for n in (1..=80).rev() {
        t = x + f64::from(n) / 2.0 / t;
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / t
}

/// erf by its everywhere-convergent series of positive terms,
/// erf(x) = 2/sqrt(pi) * exp(-x^2) * sum_n 2^n x^(2n+1) / (1*3*...*(2n+1)),
/// which has no cancellation; beyond |x| = 6, erf is ±1 to f64 precision.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x.abs() >= 6.0 {
        return x.signum();
    }
    let x2 = x * x;
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0;
    while term.abs() > sum.abs() * 1e-17 {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
    }
    2.0 / std::f64::consts::PI.sqrt() * (-x2).exp() * sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        // Values from Abramowitz & Stegun, table 7.1.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.5, 0.9999992569016276),
        ] {
            assert!(
                (erf(x) - want).abs() < 1e-15,
                "erf({x}) = {} vs {want}",
                erf(x)
            );
            assert!((erf(-x) + want).abs() < 1e-15);
        }
    }

    #[test]
    fn erfc_matches_known_values_into_the_tail() {
        // Up to 2, A&S table 7.1 (as 1 - erf); from 3 on, Python's `math.erfc`.
        for (x, want) in [
            (-1.0, 1.842700792949715),
            (0.0, 1.0),
            (1.0, 0.15729920705028513),
            (2.0, 4.677734981047266e-3),
            (3.0, 2.209049699858544e-5),
            (5.0, 1.537459794428035e-12),
            (10.0, 2.088487583762545e-45),
        ] {
            let got = erfc(x);
            assert!(
                ((got - want) / want).abs() < 1e-12,
                "erfc({x}) = {got} vs {want}"
            );
        }
    }
}
