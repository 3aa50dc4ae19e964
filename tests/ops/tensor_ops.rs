//! The tensor-layer ops PyTorch users reach for (matmul semantics, shape ops, clamp, var/std,
//! logsumexp, where, detach, gather, type promotion, normal random numbers): values on the cpu
//! plugin against the plain Rust references of `host_ref/`, gradients against finite
//! differences (`grad_check/`).

use crate::grad_check;
use crate::host_ref;

use grad_check::{device, vals, Check};
use host_ref::{assert_close, at_broadcast, matmul, ravel, reduce_dim, unravel};
use neuron_pc::nn::HostRng;
use neuron_pc::{grad, nn, DType, LazyDevice, Tensor};

fn rand_vec(rng: &mut HostRng, n: usize) -> Vec<f64> {
    (0..n).map(|_| rng.uniform() * 2.0 - 1.0).collect()
}

fn host(dev: &LazyDevice, v: &[f64], dims: &[usize]) -> Tensor {
    dev.from_slice(v, dims).unwrap()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64_vec()
}

#[test]
fn matmul_follows_torch_semantics() {
    let dev = device();
    let mut rng = HostRng::new(11);
    let cases: [(&[usize], &[usize]); 9] = [
        (&[2, 4, 5, 8], &[1, 4, 8, 5]),
        (&[3, 4], &[4]),
        (&[4], &[4, 3]),
        (&[4], &[4]),
        (&[4], &[2, 4, 3]),
        (&[2, 3, 4], &[4]),
        (&[2, 1, 3, 4], &[5, 4, 2]),
        (&[3, 4], &[2, 4, 5]),
        (&[2, 3, 4], &[4, 5]),
    ];
    for (ad, bd) in cases {
        let a = rand_vec(&mut rng, ad.iter().product());
        let b = rand_vec(&mut rng, bd.iter().product());
        let (want, want_dims) = matmul(&a, ad, &b, bd);
        let y = host(&dev, &a, ad).matmul(&host(&dev, &b, bd)).unwrap();
        assert_eq!(y.dims(), &want_dims[..], "{ad:?} @ {bd:?}");
        assert_close(&values(&y), &want, 1e-12, &format!("{ad:?} @ {bd:?}"));
    }
    // the example shape
    let y = dev
        .zeros(&[2, 4, 5, 8], DType::F32)
        .unwrap()
        .matmul(&dev.zeros(&[1, 4, 8, 5], DType::F32).unwrap())
        .unwrap();
    assert_eq!(y.dims(), &[2, 4, 5, 5]);
    // mismatches are errors naming matmul and both shapes, at the caller's line
    let bad = dev
        .zeros(&[2, 3], DType::F32)
        .unwrap()
        .matmul(&dev.zeros(&[4, 5], DType::F32).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("matmul")
            && bad.contains("f32[2,3]")
            && bad.contains("3 vs 4")
            && bad.contains("tensor_ops.rs"),
        "{bad}"
    );
    let bad = dev
        .zeros(&[2, 3, 4], DType::F32)
        .unwrap()
        .matmul(&dev.zeros(&[3, 4, 5], DType::F32).unwrap())
        .unwrap_err()
        .to_string();
    assert!(bad.contains("matmul") && bad.contains("2 vs 3"), "{bad}");
    let scalar = dev.scalar(1.0, DType::F32).unwrap();
    assert!(scalar.matmul(&scalar).is_err());
}

#[test]
fn matmul_gradients() {
    let c = Check::new(21);
    let r = |d: &[usize]| c.rand(d, -1.0, 1.0);
    c.op(
        "batch broadcast",
        &[r(&[2, 1, 2, 3]), r(&[1, 2, 3, 2])],
        |x| x[0].matmul(&x[1]),
    );
    c.op("matrix-vector", &[r(&[3, 4]), r(&[4])], |x| {
        x[0].matmul(&x[1])
    });
    c.op("vector-matrix", &[r(&[4]), r(&[4, 3])], |x| {
        x[0].matmul(&x[1])
    });
    c.op("vector-vector", &[r(&[4]), r(&[4])], |x| x[0].matmul(&x[1]));
    c.op("vector-batch", &[r(&[3]), r(&[2, 3, 2])], |x| {
        x[0].matmul(&x[1])
    });
    c.op("batch-vector", &[r(&[2, 2, 3]), r(&[3])], |x| {
        x[0].matmul(&x[1])
    });
    c.op("matrix-batch", &[r(&[2, 3]), r(&[2, 3, 2])], |x| {
        x[0].matmul(&x[1])
    });
    c.finish();
}

#[test]
fn shape_ops_move_the_right_elements() {
    let dev = device();
    let v: Vec<f64> = (0..24).map(|i| i as f64).collect();
    let x = host(&dev, &v, &[2, 3, 4]);
    // unsqueeze / squeeze / flatten keep the row-major order and only change dims
    for (t, dims) in [
        (x.unsqueeze(0).unwrap(), vec![1, 2, 3, 4]),
        (x.unsqueeze(-1).unwrap(), vec![2, 3, 4, 1]),
        (x.unsqueeze(2).unwrap(), vec![2, 3, 1, 4]),
        (x.unsqueeze(-2).unwrap(), vec![2, 3, 1, 4]),
        (
            x.unsqueeze(1)
                .unwrap()
                .unsqueeze(-1)
                .unwrap()
                .squeeze()
                .unwrap(),
            vec![2, 3, 4],
        ),
        (
            x.unsqueeze(1).unwrap().squeeze_dim(1).unwrap(),
            vec![2, 3, 4],
        ),
        (x.squeeze_dim(1).unwrap(), vec![2, 3, 4]),
        (x.flatten(0, -1).unwrap(), vec![24]),
        (x.flatten(1, 2).unwrap(), vec![2, 12]),
        (x.flatten(-3, -2).unwrap(), vec![6, 4]),
    ] {
        assert_eq!(t.dims(), &dims[..]);
        assert_eq!(values(&t), v);
    }
    assert!(x.unsqueeze(4).is_err() && x.unsqueeze(-5).is_err());
    // permute takes negative dimensions like torch.permute
    let p = x.permute(&[-1, 0, -2]).unwrap();
    assert_eq!(p.dims(), &[4, 2, 3]);
    let got = values(&p);
    for (o, g) in got.iter().enumerate() {
        let idx = unravel(o, &[4, 2, 3]);
        assert_eq!(*g, v[ravel(&[idx[1], idx[2], idx[0]], &[2, 3, 4])]);
    }
    assert!(x.permute(&[0, 1, 3]).is_err());
    assert!(x.flatten(2, 1).is_err());

    // stack / split / chunk against index arithmetic
    let y = host(
        &dev,
        &v.iter().map(|a| a + 100.0).collect::<Vec<_>>(),
        &[2, 3, 4],
    );
    for dim in [0isize, 1, 3, -1] {
        let s = Tensor::stack(&[&x, &y], dim).unwrap();
        let d = if dim < 0 {
            (dim + 4) as usize
        } else {
            dim as usize
        };
        let mut want_dims = vec![2, 3, 4];
        want_dims.insert(d, 2);
        assert_eq!(s.dims(), &want_dims[..], "stack dim {dim}");
        let got = values(&s);
        for (o, g) in got.iter().enumerate() {
            let mut idx = unravel(o, &want_dims);
            let which = idx.remove(d);
            let src = ravel(&idx, &[2, 3, 4]) as f64;
            assert_eq!(*g, src + 100.0 * which as f64, "stack dim {dim} at {o}");
        }
    }
    assert!(Tensor::stack(&[&x, &x.flatten(0, 1).unwrap()], 0).is_err());
    assert!(Tensor::stack(&[], 0).is_err());

    let pieces = x.split(3, -1).unwrap();
    assert_eq!(
        pieces.iter().map(|p| p.dims().to_vec()).collect::<Vec<_>>(),
        vec![vec![2, 3, 3], vec![2, 3, 1]]
    );
    let last = values(&pieces[1]);
    let want: Vec<f64> = (0..6).map(|r| (r * 4 + 3) as f64).collect();
    assert_eq!(last, want);
    let chunks = x.chunk(2, 1).unwrap();
    assert_eq!(
        chunks.iter().map(|p| p.dims()[1]).collect::<Vec<_>>(),
        vec![2, 1]
    );
    assert_eq!(
        values(&chunks[1]),
        vec![8., 9., 10., 11., 20., 21., 22., 23.]
    );
    let parts = x.split_sizes(&[1, 2], 1).unwrap();
    let back = Tensor::cat(&[&parts[0], &parts[1]], -2).unwrap();
    assert_eq!(values(&back), v);
    assert!(x.split_sizes(&[1, 1], 1).is_err());
    assert!(x.split(0, 0).is_err() && x.chunk(0, 0).is_err());
    assert!(Tensor::cat(&[&x, &y], 3).is_err());
    let e = Tensor::cat(&[&x, &x.flatten(1, 2).unwrap()], 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("cat:") && e.contains("f64[2,3,4], f64[2,12]") && e.contains("tensor_ops.rs"),
        "{e}"
    );
}

#[test]
fn shape_op_gradients() {
    let c = Check::new(22);
    let r = |d: &[usize]| c.rand(d, -1.0, 1.0);
    c.op("unsqueeze/squeeze", &[r(&[2, 3])], |x| {
        x[0].unsqueeze(-1)?.exp()?.squeeze()
    });
    c.op("flatten", &[r(&[2, 3, 2])], |x| x[0].flatten(1, 2)?.sin());
    c.op("stack dim 1", &[r(&[2, 3]), r(&[2, 3])], |x| {
        Tensor::stack(&[&x[0], &x[1]], 1)
    });
    c.op("split, reordered", &[r(&[2, 5])], |x| {
        let p = x[0].split(2, 1)?;
        Tensor::cat(&[&p[2], &p[0].exp()?, &p[1]], -1)
    });
    c.op("chunk", &[r(&[4, 3])], |x| {
        let p = x[0].chunk(2, 0)?;
        p[0].mul(&p[1])
    });
    c.op("cat negative dim", &[r(&[2, 3]), r(&[2, 1])], |x| {
        Tensor::cat(&[&x[0], &x[1]], -1)
    });
    c.finish();
}

#[test]
fn reductions_and_pointwise_against_references() {
    let dev = device();
    let mut rng = HostRng::new(23);
    let dims = [3usize, 5];
    let v: Vec<f64> = rand_vec(&mut rng, 15).iter().map(|a| a * 3.0).collect();
    let x = host(&dev, &v, &dims);

    let clamped: Vec<f64> = v.iter().map(|a| a.clamp(-1.0, 0.5)).collect();
    assert_eq!(values(&x.clamp(Some(-1.0), Some(0.5)).unwrap()), clamped);
    let lower: Vec<f64> = v.iter().map(|a| a.max(0.25)).collect();
    assert_eq!(values(&x.clamp(Some(0.25), None).unwrap()), lower);
    assert!(x.clamp(Some(1.0), Some(0.0)).is_err());

    for (d, correction) in [(0usize, 1usize), (1, 1), (1, 0)] {
        let var = |line: &[f64]| {
            let n = line.len() as f64;
            let m = line.iter().sum::<f64>() / n;
            line.iter().map(|a| (a - m) * (a - m)).sum::<f64>() / (n - correction as f64)
        };
        let want = reduce_dim(&v, &dims, d, var);
        let got = values(&x.var(&[d as isize], correction, false).unwrap());
        assert_close(&got, &want, 1e-12, "var");
        let want_std: Vec<f64> = want.iter().map(|a| a.sqrt()).collect();
        let got = x.std(&[d as isize - 2], correction, true).unwrap();
        let mut kept = dims.to_vec();
        kept[d] = 1;
        assert_eq!(got.dims(), &kept[..]);
        assert_close(&values(&got), &want_std, 1e-12, "std");
    }

    let lse = |line: &[f64]| line.iter().map(|a| a.exp()).sum::<f64>().ln();
    assert_close(
        &values(&x.logsumexp(&[1], false).unwrap()),
        &reduce_dim(&v, &dims, 1, lse),
        1e-12,
        "logsumexp",
    );
    // stable where exp overflows, and -inf rows give -inf
    let big = host(
        &dev,
        &[1000.0, 1000.0, -f64::INFINITY, -f64::INFINITY],
        &[2, 2],
    );
    let got = values(&big.logsumexp(&[-1], true).unwrap());
    assert_close(&got[..1], &[1000.0 + 2f64.ln()], 1e-12, "logsumexp large");
    assert_eq!(got[1], -f64::INFINITY);

    // where with broadcasting: cond [3, 1], on_true [5], on_false scalar
    let cond_v = [1.0, 0.0, 1.0];
    let cond = host(&dev, &cond_v, &[3, 1])
        .gt(&dev.scalar(0.5, DType::F64).unwrap())
        .unwrap();
    let t: Vec<f64> = rand_vec(&mut rng, 5);
    let w = Tensor::where_cond(
        &cond,
        &host(&dev, &t, &[5]),
        &dev.scalar(-7.0, DType::F64).unwrap(),
    )
    .unwrap();
    assert_eq!(w.dims(), &[3, 5]);
    let want: Vec<f64> = (0..15)
        .map(|o| {
            let idx = unravel(o, &[3, 5]);
            if at_broadcast(&cond_v, &[3, 1], &idx) > 0.5 {
                at_broadcast(&t, &[5], &idx)
            } else {
                -7.0
            }
        })
        .collect();
    assert_eq!(values(&w), want);

    // gather along dims 1 and 0 (torch.gather)
    let idx_v = [4i32, 0, 0, 2, 1, 3];
    let idx = dev.from_slice(&idx_v, &[3, 2]).unwrap();
    let got = values(&x.gather(1, &idx).unwrap());
    let want: Vec<f64> = (0..6).map(|o| v[(o / 2) * 5 + idx_v[o] as usize]).collect();
    assert_eq!(got, want);
    let idx0 = dev.from_slice(&[2i32, 0, 1, 1], &[1, 4]).unwrap();
    let got = values(&x.gather(-2, &idx0).unwrap());
    let want: Vec<f64> = [2usize, 0, 1, 1]
        .iter()
        .enumerate()
        .map(|(j, &i)| v[i * 5 + j])
        .collect();
    assert_eq!(got, want);
    assert!(x.gather(1, &x).is_err(), "float index");
    assert!(x
        .gather(1, &dev.from_slice(&[0i32; 4], &[4]).unwrap())
        .is_err());
    assert!(x
        .gather(1, &dev.from_slice(&[0i32; 8], &[4, 2]).unwrap())
        .is_err());
}

#[test]
fn composite_gradients() {
    let c = Check::new(24);
    let s = [3, 4];
    // values away from the bounds, so the kinks are not hit
    c.op(
        "clamp",
        &[vals(
            &[
                -2.0, -0.5, 0.1, 0.7, 1.5, -1.2, 0.3, 2.2, -0.1, 0.45, -0.8, 0.9,
            ],
            &s,
        )],
        |x| x[0].clamp(Some(-1.0), Some(0.5)),
    );
    c.op("var unbiased", &[c.rand(&s, -1.0, 1.0)], |x| {
        x[0].var(&[1], 1, false)
    });
    c.op("var dims 0,1 biased", &[c.rand(&s, -1.0, 1.0)], |x| {
        x[0].var(&[0, 1], 0, true)
    });
    c.op("std", &[c.rand(&s, -1.0, 1.0)], |x| {
        x[0].std(&[0], 1, false)
    });
    c.op("logsumexp", &[c.rand(&s, -2.0, 2.0)], |x| {
        x[0].logsumexp(&[-1], false)
    });
    c.op("logsumexp keepdim dim 0", &[c.rand(&s, -2.0, 2.0)], |x| {
        x[0].logsumexp(&[0], true)
    });
    let cond = c
        .f64s(&[1.0, -1.0, 1.0], &[3, 1])
        .gt(&c.f64s(&[0.0], &[]))
        .unwrap();
    c.op(
        "where broadcast",
        &[c.rand(&[4], -1.0, 1.0), c.rand(&[3, 4], -1.0, 1.0)],
        |x| Tensor::where_cond(&cond, &x[0], &x[1]),
    );
    let idx = c.i32s(&[3, 0, 0, 2, 1, 1], &[3, 2]);
    c.op("gather dim 1, repeats", &[c.rand(&s, -1.0, 1.0)], |x| {
        x[0].gather(1, &idx)
    });
    c.finish();
}

#[test]
fn detach_stops_the_gradient() {
    let dev = device();
    let x = host(&dev, &[0.5, -1.5, 2.0], &[3]);
    let y = x.mul(&x.detach().unwrap()).unwrap().sum_all().unwrap();
    let g = grad(&y, &[&x]).unwrap();
    // d/dx sum(x * stop(x)) = stop(x), where without detach it would be 2x
    assert_eq!(values(&g[0]), vec![0.5, -1.5, 2.0]);
    assert_eq!(values(&x.detach().unwrap()), vec![0.5, -1.5, 2.0]);
    let only = x.detach().unwrap().exp().unwrap().sum_all().unwrap();
    assert_eq!(values(&grad(&only, &[&x]).unwrap()[0]), vec![0.0; 3]);
}

#[test]
fn mixed_dtypes_promote_like_pytorch() {
    let dev = device();
    let i = dev.from_slice(&[1i32, -2, 3], &[3]).unwrap();
    let f = dev.from_slice(&[0.5f32, 0.25, -1.0], &[3]).unwrap();
    let s = i.add(&f).unwrap();
    assert_eq!(s.dtype(), DType::F32);
    assert_eq!(s.to_vec::<f32>().unwrap(), vec![1.5, -1.75, 2.0]);
    let h = f.to_dtype(DType::F16).unwrap();
    let b = f.to_dtype(DType::BF16).unwrap();
    let hb = h.mul(&b).unwrap();
    assert_eq!(hb.dtype(), DType::F32);
    assert_eq!(values(&hb), vec![0.25, 0.0625, 1.0]);
    let d = dev.from_slice(&[2.0f64, 2.0, 2.0], &[3]).unwrap();
    assert_eq!(f.mul(&d).unwrap().dtype(), DType::F64);
    assert_eq!(values(&i.lt(&f).unwrap()), vec![0.0, 1.0, 0.0]);
    let m = f.reshape(&[1, 3]).unwrap().matmul(&d).unwrap();
    assert_eq!(m.dtype(), DType::F64);
    assert_eq!(values(&m), vec![-0.5]);
    let c = Tensor::cat(&[&i, &f], 0).unwrap();
    assert_eq!(c.dtype(), DType::F32);
    assert_eq!(values(&c), vec![1.0, -2.0, 3.0, 0.5, 0.25, -1.0]);
    // gradients come back in each input's own dtype
    let x = dev.from_slice(&[0.5f32, 1.0], &[2]).unwrap();
    let y = dev.from_slice(&[2.0f64, 3.0], &[2]).unwrap();
    let loss = x.mul(&y).unwrap().sum_all().unwrap();
    let g = grad(&loss, &[&x, &y]).unwrap();
    assert_eq!(g[0].dtype(), DType::F32);
    assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![2.0, 3.0]);
    assert_eq!(g[1].to_vec::<f64>().unwrap(), vec![0.5, 1.0]);

    // labels must be integers: float labels are refused, naming the dtype
    let logits = dev.zeros(&[2, 3], DType::F32).unwrap();
    let float_labels = dev.from_slice(&[0.0f32, 2.0], &[2]).unwrap();
    for e in [
        nn::one_hot(&float_labels, 3, DType::F32)
            .unwrap_err()
            .to_string(),
        nn::cross_entropy(&logits, &float_labels)
            .unwrap_err()
            .to_string(),
    ] {
        assert!(e.contains("integer") && e.contains("f32"), "{e}");
    }
}

#[test]
fn randn_is_standard_normal() {
    let dev = device();
    let n = 1 << 16;
    let key = dev.key(7).unwrap();
    let z = dev.randn(&key, &[n / 4, 4]).unwrap();
    assert_eq!(z.dims(), &[n / 4, 4]);
    assert_eq!(z.dtype(), DType::F32);
    let v = values(&z);
    let mean = v.iter().sum::<f64>() / n as f64;
    let var = v.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / n as f64;
    // standard errors: mean 1/sqrt(n) = 0.004, variance sqrt(2/n) = 0.0055; allow 5 of them
    assert!(mean.abs() < 0.02, "mean {mean}");
    assert!((var - 1.0).abs() < 0.03, "variance {var}");
    // the normal CDF at a few points (standard error of a proportion <= 0.002)
    for (x, cdf) in [
        (-1.0, 0.158_655),
        (0.0, 0.5),
        (0.5, 0.691_462),
        (2.0, 0.977_25),
    ] {
        let p = v.iter().filter(|&&a| a < x).count() as f64 / n as f64;
        assert!((p - cdf).abs() < 0.01, "P(z < {x}) = {p}, want {cdf}");
    }
    assert!(v.iter().all(|a| a.is_finite()));
    // same key, same values; another key, other values
    assert_eq!(values(&dev.randn(&key, &[n / 4, 4]).unwrap()), v);
    let other = values(&dev.randn(&dev.key(8).unwrap(), &[n / 4, 4]).unwrap());
    assert!(other.iter().zip(&v).filter(|(a, b)| a == b).count() < n / 100);
}

#[test]
fn collectives_on_one_replica() {
    use neuron_pc::tensor::Reduction;
    let dev = device();
    let v = [0.5, -1.0, 2.0, 3.5];
    let x = host(&dev, &v, &[2, 2]);
    let one = [vec![0]];
    for y in [
        x.all_reduce(Reduction::Sum).unwrap(),
        x.all_reduce_in(Reduction::Max, &one).unwrap(),
        x.all_reduce(Reduction::Mean).unwrap(),
        x.all_gather_in(1, &one).unwrap(),
        x.reduce_scatter(Reduction::Sum, 0).unwrap(),
    ] {
        assert_eq!(y.dims(), &[2, 2]);
        assert_eq!(values(&y), v);
    }
    // the gradient of a summed all-reduce is the all-reduced gradient (here: itself)
    let c = Check::new(25);
    c.op("all_reduce sum", &[c.rand(&[2, 3], -1.0, 1.0)], |x| {
        x[0].all_reduce_in(Reduction::Sum, &[vec![0]])?.exp()
    });
    c.finish();
}
