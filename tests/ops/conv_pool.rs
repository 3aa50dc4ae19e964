//! `conv1d`/`conv2d` (stride, padding, dilation, groups) and max/avg pooling: values on the cpu
//! plugin against the loop references of `host_ref/`, gradients against finite differences.

use crate::grad_check;
use crate::host_ref;

use grad_check::{device, vals, Check};
use host_ref::{assert_close, conv, pool};
use neuron_pc::nn::HostRng;
use neuron_pc::{DType, Tensor};

fn rand_vec(rng: &mut HostRng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.uniform() * 2.0 - 1.0).collect()
}

/// (input dims, weight dims, stride, padding, dilation, groups)
type ConvCase = (
    &'static [usize],
    &'static [usize],
    &'static [usize],
    &'static [usize],
    &'static [usize],
    usize,
);

const CASES: [ConvCase; 7] = [
    (&[2, 3, 7], &[4, 3, 3], &[1], &[0], &[1], 1),
    (&[2, 4, 9], &[6, 2, 3], &[2], &[1], &[2], 2),
    (&[1, 4, 8], &[4, 1, 2], &[1], &[1], &[1], 4),
    (&[2, 3, 6, 5], &[4, 3, 3, 2], &[1, 1], &[0, 0], &[1, 1], 1),
    (&[1, 4, 7, 6], &[6, 2, 3, 3], &[2, 1], &[1, 2], &[1, 2], 2),
    (&[2, 2, 5, 5], &[2, 1, 2, 2], &[2, 2], &[1, 0], &[2, 1], 2),
    (&[1, 3, 4, 4], &[2, 3, 1, 1], &[1, 1], &[0, 0], &[1, 1], 1),
];

fn run_conv(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    case: &ConvCase,
) -> neuron_pc::Result<Tensor> {
    let (_, _, s, p, d, g) = *case;
    if s.len() == 1 {
        x.conv1d(w, b, s[0], p[0], d[0], g)
    } else {
        x.conv2d(w, b, [s[0], s[1]], [p[0], p[1]], [d[0], d[1]], g)
    }
}

#[test]
fn conv_matches_the_definition() {
    let dev = device();
    let mut rng = HostRng::new(31);
    for case in &CASES {
        let (xd, wd, s, p, d, g) = *case;
        let xv = rand_vec(&mut rng, xd.iter().product());
        let wv = rand_vec(&mut rng, wd.iter().product());
        let bv = rand_vec(&mut rng, wd[0]);
        let (want, want_dims) = conv(&xv, xd, &wv, wd, Some(&bv), s, p, d, g);
        let x = dev.from_slice(&xv, xd).unwrap();
        let w = dev.from_slice(&wv, wd).unwrap();
        let b = dev.from_slice(&bv, &[wd[0]]).unwrap();
        let y = run_conv(&x, &w, Some(&b), case).unwrap();
        assert_eq!(y.dims(), &want_dims[..], "{case:?}");
        let got = y.to_host().unwrap().to_f64_vec();
        assert_close(&got, &want, 1e-12, &format!("{case:?}"));
        // f32 gives the same within f32 rounding
        let y32 = run_conv(
            &x.to_dtype(DType::F32).unwrap(),
            &w.to_dtype(DType::F32).unwrap(),
            None,
            case,
        )
        .unwrap();
        let (want, _) = conv(&xv, xd, &wv, wd, None, s, p, d, g);
        assert_close(&y32.to_host().unwrap().to_f64_vec(), &want, 1e-5, "f32");
    }
}

#[test]
fn conv_rejects_bad_shapes_with_errors() {
    let dev = device();
    let x = dev.zeros(&[1, 4, 5, 5], DType::F32).unwrap();
    let w = dev.zeros(&[6, 2, 3, 3], DType::F32).unwrap();
    let cases = [
        (
            x.conv2d(&w, None, [1, 1], [0, 0], [1, 1], 1),
            "weight dimension 1",
        ),
        (x.conv2d(&w, None, [1, 1], [0, 0], [1, 1], 3), "groups (3)"),
        (x.conv2d(&w, None, [0, 1], [0, 0], [1, 1], 2), "stride"),
        (
            x.conv2d(&w, None, [1, 1], [0, 0], [3, 3], 2),
            "does not fit",
        ),
        (x.conv1d(&w, None, 1, 0, 1, 2), "rank 3"),
        (
            x.conv2d(
                &w,
                Some(&dev.zeros(&[5], DType::F32).unwrap()),
                [1, 1],
                [0, 0],
                [1, 1],
                2,
            ),
            "bias",
        ),
        (x.max_pool2d([2, 2], [2, 2], [2, 0]), "half the kernel"),
        (x.avg_pool1d(2, 2, 0), "rank 3"),
    ];
    for (r, want) in cases {
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains(want) && e.contains("conv_pool.rs"),
            "{e} (want {want})"
        );
    }
}

#[test]
fn pooling_matches_the_definition() {
    let dev = device();
    let mut rng = HostRng::new(32);
    // (input dims, kernel, stride, padding)
    type PoolCase = (
        &'static [usize],
        &'static [usize],
        &'static [usize],
        &'static [usize],
    );
    let cases: [PoolCase; 5] = [
        (&[2, 3, 8], &[2], &[2], &[0]),
        (&[1, 2, 9], &[3], &[2], &[1]),
        (&[2, 2, 6, 6], &[2, 2], &[2, 2], &[0, 0]),
        (&[1, 3, 7, 5], &[3, 2], &[2, 1], &[1, 1]),
        (&[1, 1, 5, 5], &[3, 3], &[1, 1], &[1, 0]),
    ];
    for (xd, k, s, p) in cases {
        let xv = rand_vec(&mut rng, xd.iter().product());
        let x = dev.from_slice(&xv, xd).unwrap();
        for max in [true, false] {
            let (want, want_dims) = pool(&xv, xd, k, s, p, max);
            let y = match (k.len(), max) {
                (1, true) => x.max_pool1d(k[0], s[0], p[0]),
                (1, false) => x.avg_pool1d(k[0], s[0], p[0]),
                (_, true) => x.max_pool2d([k[0], k[1]], [s[0], s[1]], [p[0], p[1]]),
                (_, false) => x.avg_pool2d([k[0], k[1]], [s[0], s[1]], [p[0], p[1]]),
            }
            .unwrap();
            assert_eq!(y.dims(), &want_dims[..]);
            let what = format!(
                "{} pool {xd:?} k{k:?} s{s:?} p{p:?}",
                if max { "max" } else { "avg" }
            );
            assert_close(&y.to_host().unwrap().to_f64_vec(), &want, 1e-12, &what);
        }
    }
}

#[test]
fn conv_and_pool_gradients() {
    let c = Check::new(33);
    for (i, case) in CASES.iter().enumerate() {
        let (xd, wd, ..) = *case;
        c.op(
            &format!("conv case {i}"),
            &[
                c.rand(xd, -1.0, 1.0),
                c.rand(wd, -1.0, 1.0),
                c.rand(&[wd[0]], -1.0, 1.0),
            ],
            |x| run_conv(&x[0], &x[1], Some(&x[2]), case),
        );
    }
    // distinct values so every window has a unique maximum
    let distinct = |n: usize, seed: u64| {
        let mut rng = HostRng::new(seed);
        let mut v: Vec<f64> = (0..n).map(|i| i as f64 * 0.1 - 1.0).collect();
        for i in (1..n).rev() {
            v.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        v
    };
    c.op("max_pool1d", &[vals(&distinct(12, 1), &[1, 2, 6])], |x| {
        x[0].max_pool1d(3, 2, 1)
    });
    c.op(
        "max_pool2d",
        &[vals(&distinct(50, 2), &[1, 2, 5, 5])],
        |x| x[0].max_pool2d([2, 3], [2, 1], [1, 1]),
    );
    c.op("avg_pool1d", &[c.rand(&[2, 2, 7], -1.0, 1.0)], |x| {
        x[0].avg_pool1d(3, 2, 1)
    });
    c.op("avg_pool2d", &[c.rand(&[1, 2, 4, 5], -1.0, 1.0)], |x| {
        x[0].avg_pool2d([2, 2], [2, 2], [1, 0])
    });
    c.finish();
}
