//! Plain Rust references for the tensor-layer ops, written as loops over output elements
//! (sharing no code with the library) so the tests compare two independent computations.
#![allow(dead_code)] // each test binary uses a different part

/// Row-major strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// The multi-index of flat position `i`.
pub fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        idx[d] = i % dims[d];
        i /= dims[d];
    }
    idx
}

/// Flat position of `idx` in `dims`.
pub fn ravel(idx: &[usize], dims: &[usize]) -> usize {
    idx.iter().zip(strides(dims)).map(|(i, s)| i * s).sum()
}

/// Reads `v` (shape `dims`) at the trailing-aligned `idx` of a broadcast shape: dimensions of
/// size 1 read index 0, missing leading dimensions are ignored.
pub fn at_broadcast(v: &[f64], dims: &[usize], idx: &[usize]) -> f64 {
    let off = idx.len() - dims.len();
    let local: Vec<usize> = dims
        .iter()
        .enumerate()
        .map(|(d, &n)| if n == 1 { 0 } else { idx[off + d] })
        .collect();
    v[ravel(&local, dims)]
}

/// `torch.matmul` by its definition: vectors are promoted to matrices and back, batch
/// dimensions broadcast. Returns (values, dims).
pub fn matmul(a: &[f64], ad: &[usize], b: &[f64], bd: &[usize]) -> (Vec<f64>, Vec<usize>) {
    let (a_dims, drop_m) = if ad.len() == 1 {
        (vec![1, ad[0]], true)
    } else {
        (ad.to_vec(), false)
    };
    let (b_dims, drop_n) = if bd.len() == 1 {
        (vec![bd[0], 1], true)
    } else {
        (bd.to_vec(), false)
    };
    let (ra, rb) = (a_dims.len(), b_dims.len());
    let (m, k, n) = (a_dims[ra - 2], a_dims[ra - 1], b_dims[rb - 1]);
    let batch_rank = (ra - 2).max(rb - 2);
    let mut batch = vec![1; batch_rank];
    for (i, slot) in batch.iter_mut().enumerate() {
        let pick = |dims: &[usize]| {
            let r = dims.len() - 2;
            if i + r >= batch_rank {
                dims[i + r - batch_rank]
            } else {
                1
            }
        };
        *slot = pick(&a_dims).max(pick(&b_dims));
    }
    let mut out_dims = batch.clone();
    out_dims.extend([m, n]);
    let total: usize = out_dims.iter().product();
    let mut out = vec![0.0; total];
    for (o, slot) in out.iter_mut().enumerate() {
        let idx = unravel(o, &out_dims);
        let (i, j) = (idx[batch_rank], idx[batch_rank + 1]);
        let mut acc = 0.0;
        for kk in 0..k {
            let mut ia = idx[..batch_rank].to_vec();
            ia.extend([i, kk]);
            let mut ib = idx[..batch_rank].to_vec();
            ib.extend([kk, j]);
            acc += at_broadcast(a, &a_dims, &ia) * at_broadcast(b, &b_dims, &ib);
        }
        *slot = acc;
    }
    let mut dims = batch;
    if !drop_m {
        dims.push(m);
    }
    if !drop_n {
        dims.push(n);
    }
    (out, dims)
}

/// Reduces `v` over dimension `d` with `f(values along d)`; the dimension is removed.
pub fn reduce_dim(v: &[f64], dims: &[usize], d: usize, f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let mut out_dims = dims.to_vec();
    out_dims.remove(d);
    let total: usize = out_dims.iter().product();
    (0..total)
        .map(|o| {
            let idx = unravel(o, &out_dims);
            let line: Vec<f64> = (0..dims[d])
                .map(|j| {
                    let mut full = idx.clone();
                    full.insert(d, j);
                    v[ravel(&full, dims)]
                })
                .collect();
            f(&line)
        })
        .collect()
}

/// Asserts elementwise closeness (`|a - b| <= tol * (1 + |b|)`; NaN fails, equal infinities
/// pass).
#[track_caller]
pub fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = g == w || (g - w).abs() <= tol * (1.0 + w.abs());
        assert!(
            ok,
            "{what}: element {i}: got {g}, want {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

/// `torch.nn.functional.conv{1,2}d` by its definition: input `[n, c, s..]`, weight
/// `[o, c / groups, k..]`, zeros outside the input. Returns (values, dims).
#[allow(clippy::too_many_arguments)]
pub fn conv(
    x: &[f64],
    xd: &[usize],
    w: &[f64],
    wd: &[usize],
    bias: Option<&[f64]>,
    stride: &[usize],
    padding: &[usize],
    dilation: &[usize],
    groups: usize,
) -> (Vec<f64>, Vec<usize>) {
    let k = xd.len() - 2;
    let (n, c, o) = (xd[0], xd[1], wd[0]);
    let (cg, og) = (c / groups, o / groups);
    let out: Vec<usize> = (0..k)
        .map(|i| (xd[2 + i] + 2 * padding[i] - dilation[i] * (wd[2 + i] - 1) - 1) / stride[i] + 1)
        .collect();
    let mut od = vec![n, o];
    od.extend(&out);
    let kernel = &wd[2..];
    let kk: usize = kernel.iter().product();
    let vals = (0..od.iter().product())
        .map(|flat| {
            let idx = unravel(flat, &od);
            let (b, oc) = (idx[0], idx[1]);
            let g = oc / og;
            let mut acc = bias.map_or(0.0, |b| b[oc]);
            for ci in 0..cg {
                for kf in 0..kk {
                    let koff = unravel(kf, kernel);
                    let mut xi = vec![b, g * cg + ci];
                    let mut inside = true;
                    for i in 0..k {
                        let p = (idx[2 + i] * stride[i] + koff[i] * dilation[i]) as i64
                            - padding[i] as i64;
                        inside &= p >= 0 && (p as usize) < xd[2 + i];
                        xi.push(p.max(0) as usize);
                    }
                    if inside {
                        let mut wi = vec![oc, ci];
                        wi.extend(&koff);
                        acc += x[ravel(&xi, xd)] * w[ravel(&wi, wd)];
                    }
                }
            }
            acc
        })
        .collect();
    (vals, od)
}

/// Max or average pooling by definition (`-inf` / zero padding; the average divides by the
/// kernel size, PyTorch's `count_include_pad=True`).
pub fn pool(
    x: &[f64],
    xd: &[usize],
    kernel: &[usize],
    stride: &[usize],
    padding: &[usize],
    max: bool,
) -> (Vec<f64>, Vec<usize>) {
    let k = kernel.len();
    let out: Vec<usize> = (0..k)
        .map(|i| (xd[2 + i] + 2 * padding[i] - kernel[i]) / stride[i] + 1)
        .collect();
    let mut od = xd[..2].to_vec();
    od.extend(&out);
    let kk: usize = kernel.iter().product();
    let vals = (0..od.iter().product())
        .map(|flat| {
            let idx = unravel(flat, &od);
            let mut acc = if max { f64::NEG_INFINITY } else { 0.0 };
            for kf in 0..kk {
                let koff = unravel(kf, kernel);
                let mut xi = idx[..2].to_vec();
                let mut inside = true;
                for i in 0..k {
                    let p = (idx[2 + i] * stride[i] + koff[i]) as i64 - padding[i] as i64;
                    inside &= p >= 0 && (p as usize) < xd[2 + i];
                    xi.push(p.max(0) as usize);
                }
                if inside {
                    let v = x[ravel(&xi, xd)];
                    acc = if max { acc.max(v) } else { acc + v };
                }
            }
            if max {
                acc
            } else {
                acc / kk as f64
            }
        })
        .collect();
    (vals, od)
}
