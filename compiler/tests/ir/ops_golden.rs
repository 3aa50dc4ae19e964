//! Golden StableHLO text for a few representative graphs. Regenerate after an intended change
//! with `NEURON_PC_BLESS=1 cargo test -p neuron-pc-compiler --test ir ops_golden` and review the
//! diff. Each golden program is also compiled and run on the cpu plugin against the reference.

use crate::ops_common;

use std::path::PathBuf;

use neuron_pc_compiler::ir::{BinaryOp, Graph, Literal, NodeId, Op, ReduceOp, UnaryOp};
use neuron_pc_compiler::pjrt::CompileOptions;
use neuron_pc_compiler::{lower, DType};
use ops_common::{check_graph, random_tensor, ty, Domain, Rng};

fn golden(name: &str, graph: &Graph) -> String {
    let text = lower::to_stablehlo(graph).expect("lower");
    assert_eq!(
        text,
        lower::to_stablehlo(graph).unwrap(),
        "lowering is deterministic"
    );
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.mlir"));
    if std::env::var("NEURON_PC_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &text).expect("write golden");
    } else {
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e}; run with NEURON_PC_BLESS=1 to create it",
                path.display()
            )
        });
        if want != text {
            let line = want
                .lines()
                .zip(text.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "{name}: lowering differs from {} at line {}:\n  golden: {}\n  now:    {}\n\
                 (NEURON_PC_BLESS=1 regenerates it)",
                path.display(),
                line + 1,
                want.lines().nth(line).unwrap_or("<end>"),
                text.lines().nth(line).unwrap_or("<end>")
            );
        }
    }
    text
}

fn run_against_reference(name: &str, g: &Graph, seed: u64) {
    let mut rng = Rng::new(seed);
    let inputs: Vec<_> = g
        .parameter_types()
        .iter()
        .map(|t| {
            let dom = if t.dtype.is_int() {
                Domain::Range(0.0, 9.0)
            } else {
                Domain::Range(-1.0, 1.0)
            };
            random_tensor(&mut rng, t, dom)
        })
        .collect();
    check_graph(name, g, &inputs, 1.0);
}

fn bcast(g: &mut Graph, x: NodeId, dims: &[usize], bd: &[usize]) -> NodeId {
    let op = Op::BroadcastInDim {
        dims: dims.to_vec(),
        broadcast_dimensions: bd.to_vec(),
    };
    g.push(op, &[x]).unwrap()
}

fn dot(g: &mut Graph, x: NodeId, w: NodeId) -> NodeId {
    // x [b, in] . w [out, in] -> [b, out]
    let op = Op::DotGeneral {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contract: vec![1],
        rhs_contract: vec![1],
    };
    g.push(op, &[x, w]).unwrap()
}

/// Two linear layers with a bias, a ReLU and a tanh.
fn mlp() -> Graph {
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::F32, &[4, 8]));
    let w1 = g.parameter(ty(DType::F32, &[16, 8]));
    let b1 = g.parameter(ty(DType::F32, &[16]));
    let w2 = g.parameter(ty(DType::F32, &[3, 16]));
    let h = dot(&mut g, x, w1);
    let b = bcast(&mut g, b1, &[4, 16], &[1]);
    let h = g.push(Op::Binary(BinaryOp::Add), &[h, b]).unwrap();
    let zero = g
        .push(Op::Constant(Literal::splat(DType::F32, 0.0, &[])), &[])
        .unwrap();
    let zeros = bcast(&mut g, zero, &[4, 16], &[]);
    let h = g.push(Op::Binary(BinaryOp::Max), &[h, zeros]).unwrap();
    let y = dot(&mut g, h, w2);
    let y = g.push(Op::Unary(UnaryOp::Tanh), &[y]).unwrap();
    g.set_outputs(&[y]).unwrap();
    g
}

/// A softmax-style max-subtract, a sum, and the argmax of each row.
fn reduce_argmax() -> Graph {
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::F32, &[4, 10]));
    let m = g.push(Op::Reduce(ReduceOp::Max, vec![1]), &[x]).unwrap();
    let mb = bcast(&mut g, m, &[4, 10], &[0]);
    let d = g.push(Op::Binary(BinaryOp::Sub), &[x, mb]).unwrap();
    let e = g.push(Op::Unary(UnaryOp::Exp), &[d]).unwrap();
    let s = g.push(Op::Reduce(ReduceOp::Sum, vec![1]), &[e]).unwrap();
    let a = g
        .push(
            Op::ArgMax {
                dim: 1,
                index_dtype: DType::I32,
            },
            &[x],
        )
        .unwrap();
    g.set_outputs(&[s, a]).unwrap();
    g
}

/// Embedding lookup and its gradient.
fn embedding() -> Graph {
    let mut g = Graph::new();
    let table = g.parameter(ty(DType::F32, &[10, 4]));
    let ids = g.parameter(ty(DType::I32, &[2, 3]));
    let grad = g.parameter(ty(DType::F32, &[2, 3, 4]));
    let rows = g.push(Op::Gather, &[table, ids]).unwrap();
    let zero = g
        .push(Op::Constant(Literal::splat(DType::F32, 0.0, &[10, 4])), &[])
        .unwrap();
    let dtable = g.push(Op::ScatterAdd, &[zero, ids, grad]).unwrap();
    g.set_outputs(&[rows, dtable]).unwrap();
    g
}

/// Dropout-style random bits, a u32 compare and a select; also a graph with no outputs.
fn random_mask() -> Graph {
    let mut g = Graph::new();
    let key = g.parameter(ty(DType::U32, &[2]));
    let x = g.parameter(ty(DType::BF16, &[2, 3]));
    let bits = g.push(Op::RandomBits { dims: vec![2, 3] }, &[key]).unwrap();
    let half = g
        .push(
            Op::Constant(Literal::splat(DType::U32, 2147483648.0, &[2, 3])),
            &[],
        )
        .unwrap();
    let keep = g
        .push(
            Op::Compare(neuron_pc_compiler::ir::CompareOp::Lt),
            &[bits, half],
        )
        .unwrap();
    let zero = g
        .push(Op::Constant(Literal::splat(DType::BF16, 0.0, &[2, 3])), &[])
        .unwrap();
    let y = g.push(Op::Select, &[keep, x, zero]).unwrap();
    g.set_outputs(&[y]).unwrap();
    g
}

fn collectives() -> Graph {
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::F32, &[4, 2]));
    let groups = vec![vec![0, 1]];
    let s = g
        .push(
            Op::AllReduce {
                op: ReduceOp::Sum,
                replica_groups: groups.clone(),
            },
            &[x],
        )
        .unwrap();
    let a = g
        .push(
            Op::AllGather {
                dim: 1,
                replica_groups: groups.clone(),
            },
            &[x],
        )
        .unwrap();
    let r = g
        .push(
            Op::ReduceScatter {
                op: ReduceOp::Max,
                dim: 0,
                replica_groups: groups,
            },
            &[x],
        )
        .unwrap();
    g.set_outputs(&[s, a, r]).unwrap();
    g
}

#[test]
fn mlp_forward() {
    let g = mlp();
    let text = golden("mlp_forward", &g);
    assert!(text.starts_with(
        "module @main {\n  func.func public @main(%arg0: tensor<4x8xf32>, %arg1: tensor<16x8xf32>"
    ));
    run_against_reference("mlp", &g, 1);
}

#[test]
fn reduce_and_argmax() {
    let g = reduce_argmax();
    golden("reduce_argmax", &g);
    run_against_reference("reduce_argmax", &g, 2);
}

#[test]
fn embedding_gather_scatter_add() {
    let g = embedding();
    let text = golden("embedding", &g);
    assert!(text.contains("\"stablehlo.gather\"") && text.contains("\"stablehlo.scatter\""));
    run_against_reference("embedding", &g, 3);
}

#[test]
fn random_dropout_mask() {
    let g = random_mask();
    golden("random_mask", &g);
    run_against_reference("random_mask", &g, 4);
}

#[test]
fn no_outputs_and_passthrough_outputs() {
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::I64, &[3]));
    let _unused = g.parameter(ty(DType::Pred, &[]));
    let text = golden("no_outputs", &g);
    assert!(text.contains("    return\n"));
    let inputs = [
        neuron_pc_compiler::HostTensor::from_slice(&[1i64, -2, 3], &[3]).unwrap(),
        neuron_pc_compiler::HostTensor::from_slice(&[true], &[]).unwrap(),
    ];
    assert!(ops_common::run_device(&g, &inputs).is_empty());
    g.set_outputs(&[x, x]).unwrap();
    let out = ops_common::run_device(&g, &inputs);
    assert_eq!(out, vec![inputs[0].clone(), inputs[0].clone()]);
    run_against_reference("passthrough", &g, 5);
}

/// Collectives are checked as text here and compiled for two replicas; executing them across
/// devices belongs to the data-parallel tests.
#[test]
fn collectives_lower_and_compile_for_two_replicas() {
    let g = collectives();
    let text = golden("collectives", &g);
    for op in [
        "stablehlo.all_reduce",
        "stablehlo.all_gather",
        "stablehlo.reduce_scatter",
    ] {
        assert!(text.contains(op), "{op}");
    }
    let options = CompileOptions {
        num_replicas: 2,
        ..CompileOptions::default()
    };
    ops_common::client()
        .compile(&text, &options)
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
}

/// The collectives run on two CPU devices: values computed here by hand.
#[test]
fn collectives_execute_on_two_devices() {
    use neuron_pc_compiler::pjrt::Device;
    use neuron_pc_compiler::HostTensor;
    let text = lower::to_stablehlo(&collectives()).unwrap();
    let client = ops_common::client();
    assert!(
        client.device_count() >= 2,
        "the cpu plugin exposes several devices"
    );
    let options = CompileOptions {
        num_replicas: 2,
        ..CompileOptions::default()
    };
    let exe = client.compile(&text, &options).unwrap();
    let x0: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let x1: Vec<f32> = (0..8).map(|i| 10.0 - 2.0 * i as f32).collect();
    let b0 = client
        .buffer_from_host(&HostTensor::from_slice(&x0, &[4, 2]).unwrap(), Device(0))
        .unwrap();
    let b1 = client
        .buffer_from_host(&HostTensor::from_slice(&x1, &[4, 2]).unwrap(), Device(1))
        .unwrap();
    let out = exe.execute_replicated(&[vec![&b0], vec![&b1]]).unwrap();
    let host = |r: usize, k: usize| out[r][k].to_host().unwrap().to_vec::<f32>().unwrap();
    let sum: Vec<f32> = x0.iter().zip(&x1).map(|(a, b)| a + b).collect();
    let max: Vec<f32> = x0.iter().zip(&x1).map(|(a, b)| a.max(*b)).collect();
    let gathered: Vec<f32> = (0..4)
        .flat_map(|r| [x0[2 * r], x0[2 * r + 1], x1[2 * r], x1[2 * r + 1]])
        .collect();
    // The reference agrees when it runs the two replicas in lockstep.
    let inputs = [
        vec![HostTensor::from_slice(&x0, &[4, 2]).unwrap()],
        vec![HostTensor::from_slice(&x1, &[4, 2]).unwrap()],
    ];
    let want = neuron_pc_compiler::reference::evaluate_replicated(&collectives(), &inputs).unwrap();
    for (r, outs) in want.iter().enumerate() {
        for (k, w) in outs.iter().enumerate() {
            assert_eq!(&out[r][k].to_host().unwrap(), w, "replica {r} output {k}");
        }
    }
    for r in 0..2 {
        assert_eq!(host(r, 0), sum, "all_reduce on replica {r}");
        assert_eq!(host(r, 1), gathered, "all_gather on replica {r}");
        assert_eq!(
            host(r, 2),
            max[4 * r..4 * r + 4].to_vec(),
            "reduce_scatter on replica {r}"
        );
    }
}

/// Four replicas in two interleaved groups: device results equal the lockstep reference.
#[test]
fn collectives_with_interleaved_groups_match_the_reference() {
    use neuron_pc_compiler::pjrt::Device;
    let client = ops_common::client();
    if client.device_count() < 4 {
        panic!(
            "the cpu plugin should expose 4 devices, has {}",
            client.device_count()
        );
    }
    let groups = vec![vec![0, 2], vec![1, 3]];
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::I32, &[4, 3]));
    let s = g
        .push(
            Op::AllReduce {
                op: ReduceOp::Sum,
                replica_groups: groups.clone(),
            },
            &[x],
        )
        .unwrap();
    let a = g
        .push(
            Op::AllGather {
                dim: 0,
                replica_groups: groups.clone(),
            },
            &[x],
        )
        .unwrap();
    let r = g
        .push(
            Op::ReduceScatter {
                op: ReduceOp::Min,
                dim: 0,
                replica_groups: groups,
            },
            &[x],
        )
        .unwrap();
    g.set_outputs(&[s, a, r]).unwrap();
    let text = lower::to_stablehlo(&g).unwrap();
    let exe = client
        .compile(
            &text,
            &CompileOptions {
                num_replicas: 4,
                ..CompileOptions::default()
            },
        )
        .unwrap();
    let mut rng = Rng::new(9);
    let inputs: Vec<Vec<_>> = (0..4)
        .map(|_| {
            vec![random_tensor(
                &mut rng,
                &ty(DType::I32, &[4, 3]),
                Domain::Range(-50.0, 50.0),
            )]
        })
        .collect();
    let bufs: Vec<_> = inputs
        .iter()
        .enumerate()
        .map(|(d, i)| client.buffer_from_host(&i[0], Device(d)).unwrap())
        .collect();
    let args: Vec<Vec<_>> = bufs.iter().map(|b| vec![b]).collect();
    let out = exe.execute_replicated(&args).unwrap();
    let want = neuron_pc_compiler::reference::evaluate_replicated(&g, &inputs).unwrap();
    for (r, outs) in want.iter().enumerate() {
        for (k, w) in outs.iter().enumerate() {
            assert_eq!(&out[r][k].to_host().unwrap(), w, "replica {r} output {k}");
        }
    }
}

/// The device assignment is honoured: replica `r` runs on `devices[r]`, reports `r` as its
/// replica id, and takes the arguments at position `r` (which live on that device).
#[test]
fn replica_ids_follow_the_device_assignment() {
    use neuron_pc_compiler::pjrt::Device;
    use neuron_pc_compiler::HostTensor;
    let client = ops_common::client();
    let mut g = Graph::new();
    let x = g.parameter(ty(DType::F32, &[2]));
    let id = g.push(Op::ReplicaId, &[]).unwrap();
    let sum = g
        .push(
            Op::AllReduce {
                op: ReduceOp::Sum,
                replica_groups: vec![vec![0, 1, 2]],
            },
            &[x],
        )
        .unwrap();
    g.set_outputs(&[id, sum]).unwrap();
    let text = lower::to_stablehlo(&g).unwrap();
    assert!(text.contains("stablehlo.replica_id"), "{text}");
    let devices = [2, 0, 1];
    let exe = client
        .compile(&text, &CompileOptions::default().replicated(&devices))
        .unwrap();
    let inputs: Vec<Vec<HostTensor>> = (0..3)
        .map(|r| vec![HostTensor::from_slice(&[r as f32, 10.0 * r as f32], &[2]).unwrap()])
        .collect();
    let bufs: Vec<_> = inputs
        .iter()
        .zip(devices)
        .map(|(i, d)| client.buffer_from_host(&i[0], Device(d)).unwrap())
        .collect();
    let args: Vec<Vec<_>> = bufs.iter().map(|b| vec![b]).collect();
    let out = exe.execute_replicated(&args).unwrap();
    let want = neuron_pc_compiler::reference::evaluate_replicated(&g, &inputs).unwrap();
    for (r, outs) in out.iter().enumerate() {
        assert_eq!(
            outs[0].to_host().unwrap().to_vec::<u32>().unwrap(),
            [r as u32]
        );
        assert_eq!(
            outs[1].to_host().unwrap().to_vec::<f32>().unwrap(),
            [3.0, 30.0]
        );
        assert_eq!(outs[0].to_host().unwrap(), want[r][0], "replica {r}");
        assert_eq!(outs[1].to_host().unwrap(), want[r][1], "replica {r}");
    }
    // A different assignment is a different compile request.
    assert_ne!(
        CompileOptions::default().replicated(&devices).to_proto(),
        CompileOptions::default().replicated(&[0, 1, 2]).to_proto()
    );
}
