//! An all-reduce between processes, timed: one process of a run of several (launched with
//! torchrun's variables and `NEURON_PC_STORE`, as `scripts/bench collectives` does), one cpu
//! device each. For each size it records a step that is only `x.assign(&x.all_reduce(Sum))`
//! of a device tensor of that many bytes of f32 (in place: `assign` donates the old buffer, as
//! a gradient bucket's would be), runs it a few times to warm up, then times `--reps` steps one
//! by one (launch to completion) and prints, on rank 0, one line per size:
//! `RESULT <bytes> <median seconds>`. The sum is checked once per size. With `--op
//! reduce-scatter` the step is `x.reduce_scatter(Sum, 0)` instead (each process keeping its
//! block of the sum), timed the same way.
//!
//! `bench_collectives [--sizes-mib 1,4,16,64,256] [--reps 10] [--op all-reduce|reduce-scatter]`

use std::time::Instant;

use neuron_pc::tensor::Reduction;
use neuron_pc::{DType, HostTensor, LazyDevice};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let mut sizes = vec![1usize, 4, 16, 64, 256];
    let mut reps = 10usize;
    let mut scatter = false;
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        match (pair[0].as_str(), pair.get(1)) {
            ("--sizes-mib", Some(v)) => {
                sizes = v.split(',').map(str::parse).collect::<Result<_, _>>()?
            }
            ("--reps", Some(v)) => reps = v.parse()?,
            ("--op", Some(v)) => {
                scatter = match v.as_str() {
                    "all-reduce" => false,
                    "reduce-scatter" => true,
                    _ => anyhow::bail!("--op {v}: use all-reduce or reduce-scatter"),
                }
            }
            (flag, _) => anyhow::bail!("unknown flag {flag} (use --sizes-mib, --reps, --op)"),
        }
    }
    let device = LazyDevice::from_env()?;
    let rank = device.replica_offset();
    let world = device.global_replicas();
    for mib in sizes {
        let n = mib * (1 << 20) / 4;
        // every process's value: rank + 1 everywhere, so the sum is world * (world + 1) / 2
        let host = HostTensor::from_slice(&vec![(rank + 1) as f32; n], &[n])?;
        let x = device.tensor(&host)?;
        let mut times = Vec::with_capacity(reps);
        for i in 0..reps + 3 {
            let started = Instant::now();
            let sum = if scatter {
                let block = x.reduce_scatter(Reduction::Sum, 0)?;
                device.mark_step()?;
                block
            } else {
                // in place (`assign` donates the old buffer to the new value), as XLA reduces
                // a gradient bucket the step has just computed
                x.assign(&x.all_reduce(Reduction::Sum)?)?;
                device.mark_step()?;
                x.clone()
            };
            device.synchronize()?;
            if i >= 3 {
                times.push(started.elapsed().as_secs_f64());
            }
            if i == 0 {
                let first = sum.narrow(0, 0, 1)?.to_dtype(DType::F32)?.to_host()?;
                let want = (world * (world + 1) / 2) as f32;
                anyhow::ensure!(first.to_vec::<f32>()? == [want], "wrong sum {first:?}");
            }
        }
        if rank == 0 {
            println!("RESULT {} {:.6}", n * 4, median(times));
        }
    }
    Ok(())
}
