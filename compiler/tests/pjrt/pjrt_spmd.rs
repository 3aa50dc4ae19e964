//! Programs partitioned by XLA's SPMD partitioner on the cpu plugin's 4 devices: a graph lowered
//! with `mhlo.sharding` on its arguments and results, compiled with `num_partitions` and
//! `use_spmd_partitioning`, fed one block per device. The blocks it returns, put together, must
//! be the unpartitioned result computed here, and the program each device runs must be the
//! partitioned one (its parameters are the blocks, a cross-device sum is an all-reduce).

use std::sync::OnceLock;

use neuron_pc_compiler::ir::{Graph, Op, ReduceOp, TensorType};
use neuron_pc_compiler::lower::{to_stablehlo_partitioned, Partitioning};
use neuron_pc_compiler::pjrt::{
    find_plugin, ArgType, Buffer, Client, ClientOptions, CompileOptions, Device, LoadedExecutable,
    Plugin, Signature, Target,
};
use neuron_pc_compiler::sharding::{Mesh, PartitionSpec, Sharding};
use neuron_pc_compiler::{DType, HostTensor};

fn client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let plugin =
            Plugin::load(&find_plugin(Target::Cpu).expect("cpu plugin: run scripts/setup"))
                .unwrap();
        Client::new(&plugin, &ClientOptions::cpu_devices(4)).unwrap()
    })
}

/// Rows-major values of a 2-D tensor, a pure function of the position.
fn values(rows: usize, cols: usize, salt: f32) -> Vec<f32> {
    (0..rows * cols)
        .map(|i| ((i as f32 * 0.37 + salt).sin() * 0.5).round_ties_even() * 0.25 + 0.01 * i as f32)
        .collect()
}

/// Mesh position `p`'s block of `v`, a tensor of `s`'s shape.
fn block(v: &[f32], s: &Sharding, p: usize) -> HostTensor {
    s.block(&HostTensor::from_slice(v, s.dims()).unwrap(), p)
        .unwrap()
}

/// Runs `exe` over the mesh of the inputs' shardings, each device fed its block of each input
/// (whole values of the shardings' shapes); each device's outputs.
fn run_blocks(exe: &LoadedExecutable, inputs: &[(&[f32], &Sharding)]) -> Vec<Vec<Buffer>> {
    let mesh = inputs[0].1.mesh();
    let uploads: Vec<Vec<Buffer>> = (0..mesh.size())
        .map(|p| {
            let d = Device(mesh.devices()[p]);
            inputs
                .iter()
                .map(|(v, s)| client().buffer_from_host(&block(v, s, p), d).unwrap())
                .collect()
        })
        .collect();
    let args: Vec<Vec<&Buffer>> = uploads.iter().map(|a| a.iter().collect()).collect();
    exe.execute_replicated(&args).unwrap()
}

fn arg(ty: &TensorType) -> ArgType {
    ArgType {
        dtype: ty.dtype,
        dims: ty.dims.clone(),
    }
}

#[test]
fn a_tensor_parallel_matmul_runs_partitioned_and_gives_the_whole_result() {
    let (m, k, n) = (8, 16, 32);
    let mesh = Mesh::new(&[("data", 2), ("model", 2)], &[0, 1, 2, 3]).unwrap();
    // x split by rows over `data`, w by output features over `model` (a column-parallel
    // linear layer), y by both; the sum of y is whole on every device
    let xs = Sharding::new(&mesh, &PartitionSpec::new(&[&["data"], &[]]), &[m, k]).unwrap();
    let ws = Sharding::new(&mesh, &PartitionSpec::new(&[&[], &["model"]]), &[k, n]).unwrap();
    let ys = Sharding::new(
        &mesh,
        &PartitionSpec::new(&[&["data"], &["model"]]),
        &[m, n],
    )
    .unwrap();
    let total = Sharding::new(&mesh, &PartitionSpec::replicated(), &[]).unwrap();

    let mut g = Graph::new();
    let xt = TensorType::new(DType::F32, vec![m, k]);
    let wt = TensorType::new(DType::F32, vec![k, n]);
    let x = g.parameter(xt.clone());
    let w = g.parameter(wt.clone());
    let dot = Op::DotGeneral {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contract: vec![1],
        rhs_contract: vec![0],
    };
    let y = g.push(dot, &[x, w]).unwrap();
    let s = g.push(Op::Reduce(ReduceOp::Sum, vec![0, 1]), &[y]).unwrap();
    g.set_outputs(&[y, s]).unwrap();
    let partitioning = Partitioning {
        num_partitions: 4,
        params: vec![Some(xs.hlo()), Some(ws.hlo())],
        outputs: vec![Some(ys.hlo()), Some(total.hlo())],
    };
    let program = to_stablehlo_partitioned(&g, &[], &partitioning).unwrap();
    assert!(program.contains("mhlo.num_partitions = 4"), "{program}");
    assert!(
        program.contains(&format!("mhlo.sharding = \"{}\"", ws.hlo())),
        "{program}"
    );

    // what each device takes and returns: the blocks
    let yt = TensorType::new(DType::F32, vec![m, n]);
    let st = TensorType::new(DType::F32, vec![]);
    let signature = Signature {
        params: vec![arg(&xs.shard_type(&xt)), arg(&ws.shard_type(&wt))],
        results: vec![arg(&ys.shard_type(&yt)), arg(&st)],
    };
    let exe = client()
        .compile_with_signature(
            &program,
            &CompileOptions::default().partitioned(mesh.devices()),
            Some(signature),
        )
        .unwrap();

    let xv = values(m, k, 0.3);
    let wv = values(k, n, 1.7);
    let out = run_blocks(&exe, &[(&xv, &xs), (&wv, &ws)]);

    // the whole product, in f64, and the blocks put together
    let mut want = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] = (0..k)
                .map(|t| f64::from(xv[i * k + t]) * f64::from(wv[t * n + j]))
                .sum();
        }
    }
    let shards: Vec<HostTensor> = out.iter().map(|o| o[0].to_host().unwrap()).collect();
    for (p, shard) in shards.iter().enumerate() {
        assert_eq!(shard.dims(), [m / 2, n / 2], "device {p}'s block");
    }
    let got: Vec<f64> = ys
        .assemble(&shards)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f64::from)
        .collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "y[{i}]: {g} vs {w}"
        );
    }
    let sum: f64 = want.iter().sum();
    for (p, outs) in out.iter().enumerate() {
        let s = f64::from(outs[1].to_host().unwrap().to_vec::<f32>().unwrap()[0]);
        assert!(
            (s - sum).abs() <= 1e-4 * sum.abs(),
            "device {p}'s sum {s} vs {sum}"
        );
    }

    // the program XLA made: each device's parameters are its blocks, and the sum over
    // partitions is an all-reduce the partitioner inserted
    let params = exe
        .parameter_types()
        .expect("the cpu plugin gives its optimized program");
    let dims: Vec<Vec<usize>> = params.iter().map(|a| a.dims.clone()).collect();
    assert_eq!(dims, [vec![m / 2, k], vec![k, n / 2]]);
    let opcodes = exe.optimized_entry_opcodes().unwrap();
    assert!(opcodes.iter().any(|o| o == "all-reduce"), "{opcodes:?}");
}

#[test]
fn a_partitioning_that_does_not_fit_the_graph_is_refused() {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![4]));
    g.set_outputs(&[x]).unwrap();
    let bad = Partitioning {
        num_partitions: 2,
        params: vec![],
        outputs: vec![None],
    };
    let e = to_stablehlo_partitioned(&g, &[], &bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("0 parameter and 1 output shardings") && e.contains("1 parameters"),
        "{e}"
    );
}

/// `tanh(x . w)` with `w` and the result split by columns over 4 devices; `constrain` lays
/// `x . w` out whole inside the program. Device 0's result block, and what it should be.
fn constrained(constrain: bool) -> (Vec<String>, Vec<f32>, Vec<f32>) {
    let (m, k, n) = (4, 8, 16);
    let mesh = Mesh::new(&[("model", 4)], &[0, 1, 2, 3]).unwrap();
    let ws = Sharding::new(&mesh, &PartitionSpec::new(&[&[], &["model"]]), &[k, n]).unwrap();
    let whole = Sharding::new(&mesh, &PartitionSpec::replicated(), &[m, n]).unwrap();
    let ys = Sharding::new(&mesh, &PartitionSpec::new(&[&[], &["model"]]), &[m, n]).unwrap();
    let xs = Sharding::new(&mesh, &PartitionSpec::replicated(), &[m, k]).unwrap();
    let xt = TensorType::new(DType::F32, vec![m, k]);
    let wt = TensorType::new(DType::F32, vec![k, n]);
    let mut g = Graph::new();
    let x = g.parameter(xt.clone());
    let w = g.parameter(wt.clone());
    let dot = Op::DotGeneral {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contract: vec![1],
        rhs_contract: vec![0],
    };
    let mut y = g.push(dot, &[x, w]).unwrap();
    if constrain {
        let c = Op::ShardingConstraint {
            sharding: whole.hlo(),
        };
        y = g.push(c, &[y]).unwrap();
    }
    let y = g
        .push(Op::Unary(neuron_pc_compiler::ir::UnaryOp::Tanh), &[y])
        .unwrap();
    g.set_outputs(&[y]).unwrap();
    let partitioning = Partitioning {
        num_partitions: 4,
        params: vec![Some(xs.hlo()), Some(ws.hlo())],
        outputs: vec![Some(ys.hlo())],
    };
    let program = to_stablehlo_partitioned(&g, &[], &partitioning).unwrap();
    let exe = client()
        .compile_with_signature(
            &program,
            &CompileOptions::default().partitioned(mesh.devices()),
            None,
        )
        .unwrap();
    let xv = values(m, k, 0.9);
    let wv = values(k, n, 2.3);
    let out = run_blocks(&exe, &[(&xv, &xs), (&wv, &ws)]);
    let first = out[0][0].to_host().unwrap().to_vec::<f32>().unwrap();
    // device 0 holds columns 0 .. n / 4
    let want: Vec<f32> = (0..m * n / 4)
        .map(|i| {
            let (r, c) = (i / (n / 4), i % (n / 4));
            (0..k)
                .map(|t| xv[r * k + t] * wv[t * n + c])
                .sum::<f32>()
                .tanh()
        })
        .collect();
    (exe.optimized_entry_opcodes().unwrap(), first, want)
}

#[test]
fn a_sharding_constraint_lays_an_intermediate_out_as_asked() {
    let close = |got: &[f32], want: &[f32]| {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() < 1e-5, "y[{i}]: {g} vs {w}");
        }
    };
    // free, the product stays split like w and its result: nothing moves between devices
    let (free, got, want) = constrained(false);
    assert!(!free.iter().any(|o| o.starts_with("all-")), "{free:?}");
    close(&got, &want);
    // constrained whole, it is gathered on every device inside the program
    let (gathered, got, want) = constrained(true);
    assert!(gathered.iter().any(|o| o == "all-gather"), "{gathered:?}");
    close(&got, &want);
}

#[test]
fn a_sharding_constraint_in_a_program_of_one_device_is_its_operand() {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![4]));
    let c = Op::ShardingConstraint {
        sharding: "{replicated}".into(),
    };
    let y = g.push(c, &[x]).unwrap();
    g.set_outputs(&[y]).unwrap();
    let program = neuron_pc_compiler::lower::to_stablehlo(&g).unwrap();
    assert!(program.contains("@Sharding"), "{program}");
    let exe = client()
        .compile(&program, &CompileOptions::default())
        .unwrap();
    let input = HostTensor::from_slice(&[1f32, -2.0, 3.5, 0.25], &[4]).unwrap();
    let out = exe.execute_host(std::slice::from_ref(&input)).unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), [1.0, -2.0, 3.5, 0.25]);
}
