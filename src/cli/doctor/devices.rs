//! The device checks of `neuron-pc doctor`: the plugin loads and opens a client, every device
//! computes a matmul that agrees with the host, and the collectives over all devices give
//! exactly what the reference evaluator gives. Each program is compiled replicated over the
//! checked devices (replica `r` on device `r`) and run once with every replica's arguments.

use anyhow::Context;
use neuron_pc_compiler::ir::{Graph, Op, ReduceOp, TensorType};
use neuron_pc_compiler::pjrt::{
    find_plugin, Buffer, Client, ClientOptions, CompileOptions, Device, LoadedExecutable, Plugin,
    Target,
};
use neuron_pc_compiler::rng::SplitMix64;
use neuron_pc_compiler::{lower, reference, DType, HostTensor};
use serde_json::json;

use super::{plural, Check};

/// Side of the square matrices of the compute check.
const SIDE: usize = 64;
/// The compute check's bound on `|device - exact| / sum_k |a_ik * b_kj|`: the scale of a dot
/// product's rounding error. f32 accumulation over 64 terms stays near 1e-6.
const MATMUL_TOLERANCE: f64 = 1e-4;
/// The same bound where an f32 dot runs in TF32 by default, as XLA's does on NVIDIA GPUs: each
/// input rounded to 10 mantissa bits is off by up to 2^-11, so a product by up to 2^-10, and
/// the sum stays within 2^-9 (about 2e-3; 1.7e-4 seen on an H200). A wrong result is off by
/// order 1 either way.
const MATMUL_TOLERANCE_TF32: f64 = 1.0 / 512.0;

/// The compute check's tolerance on the platform `client` reports.
fn matmul_tolerance(platform: &str) -> f64 {
    match platform {
        "cuda" | "rocm" | "gpu" => MATMUL_TOLERANCE_TF32,
        _ => MATMUL_TOLERANCE,
    }
}
/// Seed of the compute check's inputs; device `r` uses `SEED + r`, so no two devices see the
/// same matrices and a device that returned another's result would be caught.
const SEED: u64 = 0x5eed_d0c7;

/// A loaded client and the devices to check (replica `r` runs on `devices[r]`).
pub struct Setup {
    pub client: Client,
    pub devices: Vec<usize>,
}

/// The plugin check: finds and loads the target's plugin and opens a client with `wanted`
/// devices (on cpu the client is made with that many).
pub fn load(target: Target, wanted: Option<u32>) -> (Check, Option<Setup>) {
    let path = match find_plugin(target) {
        Ok(p) => p,
        Err(e) => return (Check::fail("plugin", e.to_string()), None),
    };
    let plugin = match Plugin::load(&path) {
        Ok(p) => p,
        Err(e) => return (Check::fail("plugin", e.to_string()), None),
    };
    let (major, minor) = plugin.api_version();
    let named = match neuron_pc::distributed::allocator_options(target, false) {
        Ok(n) => n,
        Err(e) => return (Check::fail("plugin", e.to_string()), None),
    };
    let options = ClientOptions {
        cpu_device_count: wanted.filter(|_| target == Target::Cpu).map(i64::from),
        named,
        ..Default::default()
    };
    let client = match Client::new(&plugin, &options) {
        Ok(c) => c,
        Err(e) => {
            let detail = format!("{}: creating a client failed: {e}", path.display());
            return (Check::fail("plugin", detail), None);
        }
    };
    let available = client.device_count();
    let n = wanted.map_or(available, |w| w as usize);
    let data = json!({
        "target": target.name(),
        "path": path,
        "api_version": format!("{major}.{minor}"),
        "platform_name": client.platform_name(),
        "platform_version": client.platform_version(),
        "devices_available": available,
        "devices": n,
    });
    let described = format!(
        "{target}: {} (PJRT C API {major}.{minor}), platform {} (version {})",
        path.display(),
        client.platform_name(),
        client.platform_version()
    );
    if n == 0 || n > available {
        let detail =
            format!("{described}: {n} devices asked for, the client has {available} (--devices)");
        return (Check::fail("plugin", detail).with_data(data), None);
    }
    let devices = if n < available {
        format!("checking {n} of {available} devices")
    } else {
        plural(n, "device")
    };
    let check = Check::ok("plugin", format!("{described}, {devices}")).with_data(data);
    let setup = Setup {
        client,
        devices: (0..n).collect(),
    };
    (check, Some(setup))
}

/// Lowers `graph` and compiles it replicated over the setup's devices.
pub fn compile(s: &Setup, graph: &Graph) -> anyhow::Result<LoadedExecutable> {
    let text = lower::to_stablehlo(graph).context("lowering")?;
    let options = CompileOptions::default().replicated(&s.devices);
    s.client.compile(&text, &options).context("compiling")
}

/// Uploads replica `r`'s arguments to its device.
pub fn upload(s: &Setup, per_replica: &[Vec<HostTensor>]) -> anyhow::Result<Vec<Vec<Buffer>>> {
    per_replica
        .iter()
        .zip(&s.devices)
        .map(|(args, &d)| {
            args.iter()
                .map(|h| s.client.buffer_from_host(h, Device(d)))
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("copying arguments to device {d}"))
        })
        .collect()
}

/// Runs every replica once and copies each replica's first output back.
fn run_once(
    s: &Setup,
    exe: &LoadedExecutable,
    per_replica: &[Vec<HostTensor>],
) -> anyhow::Result<Vec<HostTensor>> {
    let buffers = upload(s, per_replica)?;
    let args: Vec<Vec<&Buffer>> = buffers.iter().map(|b| b.iter().collect()).collect();
    let out = exe.execute_replicated(&args).context("running")?;
    s.devices
        .iter()
        .enumerate()
        .map(|(r, d)| {
            let b = out
                .get(r)
                .and_then(|o| o.first())
                .with_context(|| format!("device {d} returned no output"))?;
            b.to_host()
                .with_context(|| format!("copying the output of device {d}"))
        })
        .collect()
}

/// The compute check: a seeded 64x64 f32 matmul, different on every device, against the
/// product computed on the host in f64.
pub fn matmul(s: &Setup) -> Check {
    match matmul_errors(s) {
        Ok(errors) => judge_matmul(
            &s.devices,
            &errors,
            matmul_tolerance(s.client.platform_name()),
        ),
        Err(e) => Check::fail("compute", format!("{e:#}")),
    }
}

fn judge_matmul(devices: &[usize], errors: &[f64], tolerance: f64) -> Check {
    let data = json!({
        "shape": [SIDE, SIDE],
        "dtype": "f32",
        "tolerance": tolerance,
        "devices": devices.iter().zip(errors).map(|(d, e)| json!({
            "device": d,
            // NaN is not JSON: a device that returned NaN shows as null.
            "max_relative_error": e.is_finite().then_some(*e),
        })).collect::<Vec<_>>(),
    });
    let bad: Vec<String> = devices
        .iter()
        .zip(errors)
        // NaN fails too.
        .filter(|(_, e)| e.is_nan() || **e > tolerance)
        .map(|(d, e)| format!("device {d}: relative error {e:.2e}"))
        .collect();
    if !bad.is_empty() {
        let detail = format!(
            "{SIDE}x{SIDE} f32 matmul differs from the host's (tolerance {tolerance:.0e}): \
             {}",
            bad.join("; ")
        );
        return Check::fail("compute", detail).with_data(data);
    }
    let (worst_device, worst) =
        devices.iter().zip(errors).fold(
            (0, 0.0f64),
            |(wd, we), (d, e)| {
                if *e > we {
                    (*d, *e)
                } else {
                    (wd, we)
                }
            },
        );
    Check::ok(
        "compute",
        format!(
            "{SIDE}x{SIDE} f32 matmul on {} agrees with the host: worst relative error \
             {worst:.1e} (device {worst_device}), tolerance {tolerance:.0e}",
            plural(devices.len(), "device")
        ),
    )
    .with_data(data)
}

/// The worst relative error of each device's product.
fn matmul_errors(s: &Setup) -> anyhow::Result<Vec<f64>> {
    let t = TensorType::new(DType::F32, vec![SIDE, SIDE]);
    let mut g = Graph::new();
    let a = g.parameter(t.clone());
    let b = g.parameter(t);
    let dot = Op::DotGeneral {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contract: vec![1],
        rhs_contract: vec![0],
    };
    let c = g.push(dot, &[a, b])?;
    g.set_outputs(&[c])?;
    let exe = compile(s, &g)?;
    let inputs: Vec<[Vec<f32>; 2]> = (0..s.devices.len())
        .map(|r| {
            let mut rng = SplitMix64::new(SEED + r as u64);
            let mut m = || -> Vec<f32> {
                (0..SIDE * SIDE)
                    .map(|_| rng.uniform(-1.0, 1.0) as f32)
                    .collect()
            };
            [m(), m()]
        })
        .collect();
    let host: Vec<Vec<HostTensor>> = inputs
        .iter()
        .map(|[a, b]| {
            Ok(vec![
                HostTensor::from_slice(a, &[SIDE, SIDE])?,
                HostTensor::from_slice(b, &[SIDE, SIDE])?,
            ])
        })
        .collect::<anyhow::Result<_>>()?;
    let outputs = run_once(s, &exe, &host)?;
    inputs
        .iter()
        .zip(&outputs)
        .zip(&s.devices)
        .map(|(([a, b], out), d)| {
            let got = out
                .to_vec::<f32>()
                .with_context(|| format!("device {d}'s output"))?;
            if got.len() != SIDE * SIDE {
                anyhow::bail!(
                    "device {d} returned {} values, not {}",
                    got.len(),
                    SIDE * SIDE
                );
            }
            Ok(max_relative_error(a, b, &got))
        })
        .collect()
}

/// The largest `|got - exact| / sum_k |a_ik * b_kj|` over the elements of `a . b` (square,
/// row-major), computed in f64; NaN when the device returned NaN.
fn max_relative_error(a: &[f32], b: &[f32], got: &[f32]) -> f64 {
    let mut worst = 0.0f64;
    for i in 0..SIDE {
        for j in 0..SIDE {
            let (mut exact, mut scale) = (0.0f64, 0.0f64);
            for k in 0..SIDE {
                let p = f64::from(a[i * SIDE + k]) * f64::from(b[k * SIDE + j]);
                exact += p;
                scale += p.abs();
            }
            let err = (f64::from(got[i * SIDE + j]) - exact).abs() / scale.max(f64::MIN_POSITIVE);
            if err.is_nan() {
                return f64::NAN;
            }
            worst = worst.max(err);
        }
    }
    worst
}

/// The collectives `doctor` checks and times, each over one group of every device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
}

impl Collective {
    pub const ALL: [Collective; 3] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
        }
    }

    /// The op over one group of `n` replicas (sums; along dimension 0).
    pub fn op(self, n: usize) -> Op {
        let replica_groups = vec![(0..n).collect()];
        match self {
            Collective::AllReduce => Op::AllReduce {
                op: ReduceOp::Sum,
                replica_groups,
            },
            Collective::AllGather => Op::AllGather {
                dim: 0,
                replica_groups,
            },
            Collective::ReduceScatter => Op::ReduceScatter {
                op: ReduceOp::Sum,
                dim: 0,
                replica_groups,
            },
        }
    }

    /// A graph of this collective alone, on a per-replica input of `dims` f32.
    pub fn graph(self, n: usize, dims: &[usize]) -> anyhow::Result<Graph> {
        let mut g = Graph::new();
        let x = g.parameter(TensorType::new(DType::F32, dims.to_vec()));
        let y = g.push(self.op(n), &[x])?;
        g.set_outputs(&[y])?;
        Ok(g)
    }
}

/// One check per collective: integer-valued f32 inputs (so sums are exact in any order), run on
/// the devices and in the reference evaluator, compared bit for bit.
pub fn collectives(s: &Setup) -> Vec<Check> {
    Collective::ALL
        .into_iter()
        .map(|c| match collective_mismatch(s, c) {
            Ok((None, what)) => Check::ok(c.name(), what),
            Ok((Some(problem), what)) => Check::fail(c.name(), format!("{what}: {problem}")),
            Err(e) => Check::fail(c.name(), format!("{e:#}")),
        })
        .collect()
}

/// Runs `c` and returns the first difference from the reference (if any) and what was run.
fn collective_mismatch(s: &Setup, c: Collective) -> anyhow::Result<(Option<String>, String)> {
    let n = s.devices.len();
    let dims = [2 * n, 16];
    let g = c.graph(n, &dims)?;
    let exe = compile(s, &g)?;
    let inputs: Vec<Vec<HostTensor>> = (0..n)
        .map(|r| {
            let mut rng = SplitMix64::new(SEED ^ ((r as u64 + 1) << 32));
            let v: Vec<f32> = (0..dims[0] * dims[1])
                .map(|_| (rng.next_u64() % 129) as f32 - 64.0)
                .collect();
            Ok(vec![HostTensor::from_slice(&v, &dims)?])
        })
        .collect::<anyhow::Result<_>>()?;
    let want = reference::evaluate_replicated(&g, &inputs).context("the reference evaluator")?;
    let got = run_once(s, &exe, &inputs)?;
    let out_dims = want
        .first()
        .and_then(|w| w.first())
        .map_or_else(Vec::new, |t| t.dims().to_vec());
    let combined = match c {
        Collective::AllGather => "concatenation",
        Collective::AllReduce | Collective::ReduceScatter => "sum",
    };
    let what = format!("{combined} of {n} x f32{dims:?} -> f32{out_dims:?} per device");
    let what = if n == 1 {
        format!("{what} (one device: trivial)")
    } else {
        format!("{what}, exact on every device")
    };
    for ((r, w), d) in want.iter().enumerate().zip(&s.devices) {
        let (Some(w), Some(g)) = (w.first(), got.get(r)) else {
            return Ok((Some(format!("device {d}: no output")), what));
        };
        if let Some(problem) = first_difference(g, w) {
            return Ok((Some(format!("device {d}: {problem}")), what));
        }
    }
    Ok((None, what))
}

/// Where `got` differs from `want` (shape, or the first differing element and how many do).
fn first_difference(got: &HostTensor, want: &HostTensor) -> Option<String> {
    if got.dims() != want.dims() || got.dtype() != want.dtype() {
        return Some(format!(
            "{}{:?} returned, {}{:?} expected",
            got.dtype(),
            got.dims(),
            want.dtype(),
            want.dims()
        ));
    }
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let differ: Vec<usize> = (0..w.len())
        .filter(|&i| g[i].to_bits() != w[i].to_bits())
        .collect();
    let &first = differ.first()?;
    Some(format!(
        "element {first} is {}, the reference says {} ({} of {} elements differ)",
        g[first],
        w[first],
        differ.len(),
        w.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::doctor::Status;

    #[test]
    fn the_relative_error_is_against_the_sum_of_absolute_products() {
        let a = vec![1.0f32; SIDE * SIDE];
        let mut b = vec![0.0f32; SIDE * SIDE];
        b[0] = 1.0;
        let mut got = vec![0.0f32; SIDE * SIDE];
        // Column 0 of the product is 1 everywhere: 1.5 in one place is an error of 0.5.
        for i in 0..SIDE {
            got[i * SIDE] = 1.0;
        }
        assert_eq!(max_relative_error(&a, &b, &got), 0.0);
        got[3 * SIDE] = 1.5;
        assert_eq!(max_relative_error(&a, &b, &got), 0.5);
        got[5] = f32::NAN;
        assert!(max_relative_error(&a, &b, &got).is_nan());
    }

    #[test]
    fn a_device_over_the_tolerance_or_nan_fails_the_compute_check() {
        let ok = judge_matmul(&[0, 1], &[1e-7, 2e-7], MATMUL_TOLERANCE);
        assert_eq!(ok.status, Status::Ok);
        assert!(ok.detail.contains("(device 1)"), "{}", ok.detail);
        // TF32's rounding (1.66e-4 on an H200) passes on a GPU only
        let tf32 = [1.66e-4];
        assert_eq!(
            judge_matmul(&[0], &tf32, MATMUL_TOLERANCE).status,
            Status::Fail
        );
        let gpu = judge_matmul(&[0], &tf32, matmul_tolerance("cuda"));
        assert_eq!(gpu.status, Status::Ok, "{}", gpu.detail);
        assert_eq!(matmul_tolerance("cpu"), MATMUL_TOLERANCE);
        let bad = judge_matmul(&[0, 1, 2], &[1e-7, 0.3, f64::NAN], matmul_tolerance("cuda"));
        assert_eq!(bad.status, Status::Fail);
        assert!(
            bad.detail.contains("device 1: relative error 3.00e-1")
                && bad.detail.contains("device 2: relative error NaN"),
            "{}",
            bad.detail
        );
        assert!(!bad.detail.contains("device 0"), "{}", bad.detail);
    }

    #[test]
    fn a_difference_names_the_first_element_and_the_count() {
        let want = HostTensor::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
        let got = HostTensor::from_slice(&[1.0f32, 5.0, 4.0], &[3]).unwrap();
        assert_eq!(first_difference(&want, &want), None);
        assert_eq!(
            first_difference(&got, &want).as_deref(),
            Some("element 1 is 5, the reference says 2 (2 of 3 elements differ)")
        );
        let short = HostTensor::from_slice(&[1.0f32], &[1]).unwrap();
        assert!(first_difference(&short, &want)
            .unwrap()
            .contains("expected"));
    }
}
