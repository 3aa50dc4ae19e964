//! The rewrite of a program of several processes for one of them: which collectives stay XLA's,
//! which become a call between processes and in what order, what the lowering writes for each,
//! and the groups it refuses with one error. (Its results are checked against one process by
//! the root crate's tests with real processes.)

use neuron_pc_compiler::ir::{Graph, Op, ProcessCollective, ReduceOp, TensorType};
use neuron_pc_compiler::lower::to_stablehlo;
use neuron_pc_compiler::passes::{cross_process, ProcessLayout};
use neuron_pc_compiler::DType;

const TWO_BY_TWO: ProcessLayout = ProcessLayout {
    processes: 2,
    local: 2,
    partitioned: false,
};

fn one(op: Op) -> Graph {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![4, 8]));
    let y = g.push(op, &[x]).unwrap();
    g.set_outputs(&[y]).unwrap();
    g
}

/// An ordering edge: an `after`, or the call that orders XLA's collectives between processes.
fn is_edge(op: &Op) -> bool {
    matches!(
        op,
        Op::After
            | Op::ProcessCollective {
                collective: ProcessCollective::Ordered,
                ..
            }
    )
}

/// The ops of `g` but its parameters and its ordering edges.
fn ops(g: &Graph) -> Vec<String> {
    g.nodes()
        .iter()
        .filter(|n| !matches!(n.op, Op::Parameter { .. }) && !is_edge(&n.op))
        .map(|n| n.op.to_string())
        .collect()
}

/// Every collective of `g`, inside the process or between processes, reads the one before it:
/// as its operand, as a call's second (ordering) operand, or through an ordering call
/// ([`ProcessCollective::Ordered`]) in front of its operand. Never by an `after` alone, an
/// optimization barrier that newer XLA cpu pipelines drop before they schedule. An XLA
/// collective right after another needs nothing: XLA runs its own in one order everywhere.
fn assert_chained(g: &Graph) {
    let collectives: Vec<usize> = (g.nodes().iter().enumerate())
        .filter(|(_, n)| {
            matches!(
                n.op,
                Op::AllReduce { .. }
                    | Op::AllGather { .. }
                    | Op::ReduceScatter { .. }
                    | Op::ProcessCollective { .. }
            ) && !is_edge(&n.op)
        })
        .map(|(i, _)| i)
        .collect();
    assert!(collectives.len() > 1, "{:?}", ops(g));
    assert!(
        !g.nodes().iter().any(|n| matches!(n.op, Op::After)),
        "{:?}",
        ops(g)
    );
    for pair in collectives.windows(2) {
        let node = &g.nodes()[pair[1]];
        let operand = &g.nodes()[node.operands[0].index()];
        let reads = node.operands.iter().any(|o| o.index() == pair[0]);
        let ordered = is_edge(&operand.op) && operand.operands[1].index() == pair[0];
        let xla = |i: usize| !matches!(g.nodes()[i].op, Op::ProcessCollective { .. });
        let both_xla = xla(pair[0]) && xla(pair[1]);
        assert!(
            reads || ordered || both_xla,
            "{} after {}",
            node.op,
            operand.op
        );
    }
}

#[test]
fn groups_inside_each_process_stay_xla_collectives_renumbered_locally() {
    let g = one(Op::AllReduce {
        op: ReduceOp::Max,
        replica_groups: vec![vec![2, 3], vec![0, 1]],
    });
    let out = cross_process(&g, TWO_BY_TWO).unwrap();
    assert_eq!(
        ops(&out),
        ["all_reduce{op=reduce_max, replica_groups=[[0, 1]]}"]
    );
}

#[test]
fn a_data_parallel_sum_is_one_exchange_per_process_and_a_max_one_per_device() {
    let all = vec![vec![0, 1, 2, 3]];
    let sum = cross_process(
        &one(Op::AllReduce {
            op: ReduceOp::Sum,
            replica_groups: all.clone(),
        }),
        TWO_BY_TWO,
    )
    .unwrap();
    assert_eq!(
        ops(&sum),
        [
            "all_reduce{op=reduce_sum, replica_groups=[[0, 1]]}",
            "process_all_reduce{op=reduce_sum, processes=2, tag=0, leader}",
            "all_reduce{op=reduce_sum, replica_groups=[[0, 1]]}",
        ]
    );
    assert_chained(&sum);
    let max = cross_process(
        &one(Op::AllReduce {
            op: ReduceOp::Max,
            replica_groups: all,
        }),
        TWO_BY_TWO,
    )
    .unwrap();
    assert_eq!(
        ops(&max),
        [
            "all_reduce{op=reduce_max, replica_groups=[[0, 1]]}",
            "process_all_reduce{op=reduce_max, processes=2, tag=0}",
        ]
    );
    // the call, its attributes and its pinned row-major layouts in the program's text
    let text = to_stablehlo(&max).unwrap();
    assert!(text.contains("@neuron_pc_process_all_reduce("), "{text}");
    assert!(text.contains("backend_config = {dim = 0 : i64, leader = 0 : i64, op = 2 : i64"));
    assert!(
        text.contains("operand_layouts = [dense<[1, 0]> : tensor<2xindex>]"),
        "{text}"
    );
}

#[test]
fn a_reduce_scatter_goes_between_processes_first_and_every_collective_is_chained() {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![4, 8]));
    let all = vec![vec![0, 1, 2, 3]];
    let a = g
        .push(
            Op::ReduceScatter {
                op: ReduceOp::Sum,
                dim: 1,
                replica_groups: all.clone(),
            },
            &[x],
        )
        .unwrap();
    let b = g
        .push(
            Op::AllGather {
                dim: 0,
                replica_groups: all,
            },
            &[a],
        )
        .unwrap();
    g.set_outputs(&[b]).unwrap();
    let out = cross_process(&g, TWO_BY_TWO).unwrap();
    let calls: Vec<(usize, &Op)> = out
        .nodes()
        .iter()
        .enumerate()
        .filter(|(_, n)| matches!(n.op, Op::ProcessCollective { .. }))
        .map(|(i, n)| (i, &n.op))
        .collect();
    assert_eq!(calls.len(), 2);
    assert!(matches!(
        calls[0].1,
        Op::ProcessCollective {
            collective: ProcessCollective::ReduceScatter { dim: 1, .. },
            tag: 0,
            ..
        }
    ));
    assert!(matches!(
        calls[1].1,
        Op::ProcessCollective {
            collective: ProcessCollective::AllGather { dim: 0 },
            tag: 1,
            ..
        }
    ));
    // each collective, between processes or inside one, waits for the one before it: the
    // call, XLA's reduce-scatter inside, XLA's gather inside, the call
    assert_chained(&out);
    assert_eq!(
        ops(&out),
        [
            "process_reduce_scatter{op=reduce_sum, dim=1, processes=2, tag=0}",
            "reduce_scatter{op=reduce_sum, dim=1, replica_groups=[[0, 1]]}",
            "all_gather{dim=0, replica_groups=[[0, 1]]}",
            "process_all_gather{dim=0, processes=2, tag=1}",
        ]
    );
    // types: [4, 8] -> [4, 4] between processes -> [4, 2] inside -> gathered [16, 2]
    assert_eq!(out.output_types(), g.output_types());
}

#[test]
fn the_replica_index_is_the_process_index_times_the_local_count_plus_the_local_one() {
    let mut g = Graph::new();
    let r = g.push(Op::ReplicaId, &[]).unwrap();
    g.set_outputs(&[r]).unwrap();
    let out = cross_process(&g, TWO_BY_TWO).unwrap();
    let text = to_stablehlo(&out).unwrap();
    assert!(text.contains("@neuron_pc_process_index()"), "{text}");
    assert!(text.contains("stablehlo.replica_id"), "{text}");
    assert!(
        ops(&out).iter().any(|o| o.contains("constant(u32[] 2)")),
        "{:?}",
        ops(&out)
    );
}

#[test]
fn groups_over_some_processes_or_out_of_order_are_one_error() {
    let four_of_one = ProcessLayout {
        processes: 4,
        local: 1,
        partitioned: false,
    };
    for (layout, groups) in [
        // replica 0 with replica 3: another local device in each process
        (TWO_BY_TWO, vec![vec![0, 3], vec![1, 2]]),
        // pairs of processes out of 4: a subset of the processes
        (four_of_one, vec![vec![0, 1], vec![2, 3]]),
    ] {
        let g = one(Op::AllReduce {
            op: ReduceOp::Sum,
            replica_groups: groups.clone(),
        });
        let e = match cross_process(&g, layout) {
            Ok(_) => panic!("{groups:?} accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            e.contains("not supported across processes yet"),
            "{groups:?}: {e}"
        );
        assert_eq!(e.lines().count(), 1, "{e}");
    }
}

#[test]
fn in_a_partitioned_program_the_call_runs_in_a_manual_region_of_the_operand_layout() {
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![4, 8]));
    let c = g
        .push(
            Op::ShardingConstraint {
                sharding: "{devices=[1,2]0,1}".into(),
            },
            &[x],
        )
        .unwrap();
    let y = g
        .push(
            Op::AllReduce {
                op: ReduceOp::Sum,
                replica_groups: vec![vec![0, 1]],
            },
            &[c],
        )
        .unwrap();
    g.set_outputs(&[y]).unwrap();
    let layout = ProcessLayout {
        processes: 2,
        local: 1,
        partitioned: true,
    };
    let out = cross_process(&g, layout).unwrap();
    let text = to_stablehlo(&out).unwrap();
    // each device's [4, 4] block of the [4, 8] value
    assert!(
        text.contains("@SPMDFullToShardShape") && text.contains("-> tensor<4x4xf32>"),
        "{text}"
    );
    assert!(text.contains("@SPMDShardToFullShape"), "{text}");
    assert!(
        text.contains("mhlo.sharding = \"{devices=[1,2]0,1}\""),
        "{text}"
    );
}

#[test]
fn a_gather_between_processes_along_a_split_dimension_runs_on_whole_copies() {
    // [4, 8] split into [4, 4] columns over 2 devices, gathered over 2 processes along the
    // rows (each device's block: [8, 4]) and along the split columns (whole copies: [4, 16])
    let gathered = |dim: usize| {
        let mut g = Graph::new();
        let x = g.parameter(TensorType::new(DType::F32, vec![4, 8]));
        let op = Op::ShardingConstraint {
            sharding: "{devices=[1,2]0,1}".into(),
        };
        let c = g.push(op, &[x]).unwrap();
        let op = Op::AllGather {
            dim,
            replica_groups: vec![vec![0, 1]],
        };
        let y = g.push(op, &[c]).unwrap();
        g.set_outputs(&[y]).unwrap();
        let layout = ProcessLayout {
            processes: 2,
            local: 1,
            partitioned: true,
        };
        to_stablehlo(&cross_process(&g, layout).unwrap()).unwrap()
    };
    let call = |text: &str| -> String {
        let line = text
            .lines()
            .find(|l| l.contains("@neuron_pc_process_all_gather("));
        line.unwrap_or_else(|| panic!("{text}")).to_string()
    };
    let rows = gathered(0);
    assert!(
        call(&rows).contains("(tensor<4x4xf32>) -> tensor<8x4xf32>"),
        "{rows}"
    );
    let columns = gathered(1);
    assert!(
        call(&columns).contains("(tensor<4x8xf32>) -> tensor<4x16xf32>"),
        "{columns}"
    );
    assert!(
        columns.contains("mhlo.sharding = \"{replicated}\""),
        "{columns}"
    );
}

#[test]
fn in_a_partitioned_program_the_means_recorded_together_are_one_exchange() {
    // two values, each in its own layout, reduced between processes one after the other (as
    // `average_gradients` records the gradients' means), then a third that reads the first
    // reduction: the first two share one call, the third waits for it
    let mut g = Graph::new();
    let a = g.parameter(TensorType::new(DType::F32, vec![4, 8]));
    let b = g.parameter(TensorType::new(DType::F32, vec![6]));
    let constrain = |g: &mut Graph, x, sharding: &str| {
        let op = Op::ShardingConstraint {
            sharding: sharding.into(),
        };
        g.push(op, &[x]).unwrap()
    };
    let ca = constrain(&mut g, a, "{devices=[1,2]0,1}");
    let cb = constrain(&mut g, b, "{devices=[2]0,1}");
    let sum = || Op::AllReduce {
        op: ReduceOp::Sum,
        replica_groups: vec![vec![0, 1]],
    };
    let ra = g.push(sum(), &[ca]).unwrap();
    let rb = g.push(sum(), &[cb]).unwrap();
    let rc = g.push(sum(), &[ra]).unwrap();
    g.set_outputs(&[ra, rb, rc]).unwrap();
    let layout = ProcessLayout {
        processes: 2,
        local: 1,
        partitioned: true,
    };
    let out = cross_process(&g, layout).unwrap();
    let names = ops(&out);
    let buckets: Vec<&String> = names
        .iter()
        .filter(|n| n.starts_with("process_all_reduce_bucket"))
        .collect();
    assert_eq!(buckets.len(), 2, "{names:?}");
    for (k, n) in buckets.iter().enumerate() {
        assert!(n.contains(&format!("tag=0, output={k}")), "{n}");
        assert!(
            n.contains("layouts=[{devices=[1,2]0,1}, {devices=[2]0,1}]"),
            "{n}"
        );
    }
    // the third reads the first's result, so it cannot join: a call of its own, tag 1
    assert_eq!(
        names
            .iter()
            .filter(|n| n.starts_with("process_all_reduce{"))
            .count(),
        1,
        "{names:?}"
    );
    assert!(names.iter().any(|n| n.contains("tag=1")), "{names:?}");
    let text = to_stablehlo(&out).unwrap();
    // one call for both: blocks of 4x4 and 3 elements, joined into 19
    let calls = text.matches("@neuron_pc_process_all_reduce(").count();
    assert_eq!(calls, 2, "{text}");
    assert!(text.contains("-> tensor<19xf32>"), "{text}");
    assert!(text.contains("-> tensor<4x4xf32>"), "{text}");
    assert!(text.contains("-> tensor<3xf32>"), "{text}");
    // each member leaves the manual region as a value of its own, in its own layout
    for (k, (block, full)) in [("4x4", "4x8"), ("3", "6")].iter().enumerate() {
        let leaves = format!("_o{k} = stablehlo.custom_call @SPMDShardToFullShape(%v");
        let typed = format!("(tensor<{block}xf32>) -> tensor<{full}xf32>");
        assert!(
            text.lines()
                .any(|l| l.contains(&leaves) && l.contains(&typed)),
            "{text}"
        );
    }
}

#[test]
fn a_call_between_processes_reads_the_collective_before_it_as_an_ordering_operand() {
    // ZeRO-1's shape: the loss's sum (one exchange, spread inside the process), then the
    // gradients' reduce-scatter, whose operand does not depend on the sum
    let mut g = Graph::new();
    let loss = g.parameter(TensorType::new(DType::F32, vec![]));
    let grads = g.parameter(TensorType::new(DType::F32, vec![8]));
    let all = vec![vec![0, 1, 2, 3]];
    let sum = Op::AllReduce {
        op: ReduceOp::Sum,
        replica_groups: all.clone(),
    };
    let s = g.push(sum, &[loss]).unwrap();
    let scatter = Op::ReduceScatter {
        op: ReduceOp::Sum,
        dim: 0,
        replica_groups: all,
    };
    let r = g.push(scatter, &[grads]).unwrap();
    g.set_outputs(&[s, r]).unwrap();
    let out = cross_process(&g, TWO_BY_TWO).unwrap();
    assert_chained(&out);
    let nodes = out.nodes();
    let call = (nodes.iter())
        .find(|n| {
            matches!(
                n.op,
                Op::ProcessCollective {
                    collective: ProcessCollective::ReduceScatter { .. },
                    ..
                }
            )
        })
        .unwrap();
    // its second operand is the all-reduce inside the process that spreads the loss's sum
    assert_eq!(call.operands.len(), 2, "{:?}", ops(&out));
    let edge = &nodes[call.operands[1].index()];
    assert_eq!(
        edge.op.to_string(),
        "all_reduce{op=reduce_sum, replica_groups=[[0, 1]]}"
    );
    assert!(matches!(
        nodes[edge.operands[0].index()].op,
        Op::ProcessCollective { leader: true, .. }
    ));
    // the types are the reduce-scatter's alone: [8] -> [4] between processes -> [2] inside
    assert_eq!(out.output_types(), g.output_types());
    // in the program: the call with both operands, each with its row-major layout
    let text = to_stablehlo(&out).unwrap();
    let line = (text.lines())
        .find(|l| l.contains("@neuron_pc_process_reduce_scatter("))
        .unwrap();
    let args = &line[line.find('(').unwrap()..line.find(')').unwrap()];
    assert_eq!(args.split(", ").count(), 2, "{line}");
    assert!(
        line.contains(
            "operand_layouts = [dense<[0]> : tensor<1xindex>, dense<[]> : tensor<0xindex>]"
        ),
        "{line}"
    );
}

#[test]
fn an_xla_collective_after_a_call_between_processes_reads_it_through_an_ordering_call() {
    // a maximum over every replica (XLA's inside, then the call), then a sum inside each
    // process of a value that does not depend on it
    let mut g = Graph::new();
    let x = g.parameter(TensorType::new(DType::F32, vec![4, 8]));
    let y = g.parameter(TensorType::new(DType::F32, vec![4, 8]));
    let max = Op::AllReduce {
        op: ReduceOp::Max,
        replica_groups: vec![vec![0, 1, 2, 3]],
    };
    let m = g.push(max, &[x]).unwrap();
    let inside = Op::AllReduce {
        op: ReduceOp::Sum,
        replica_groups: vec![vec![0, 1], vec![2, 3]],
    };
    let s = g.push(inside, &[y]).unwrap();
    g.set_outputs(&[m, s]).unwrap();
    let out = cross_process(&g, TWO_BY_TWO).unwrap();
    assert_chained(&out);
    let nodes = out.nodes();
    let ordered: Vec<&neuron_pc_compiler::ir::Node> =
        nodes.iter().filter(|n| is_edge(&n.op)).collect();
    assert_eq!(ordered.len(), 1, "{:?}", ops(&out));
    // it passes y on, after the call
    let (value, after) = (ordered[0].operands[0], ordered[0].operands[1]);
    assert!(matches!(nodes[value.index()].op, Op::Parameter { .. }));
    assert_eq!(
        nodes[after.index()].op.to_string(),
        "process_all_reduce{op=reduce_max, processes=2, tag=0}"
    );
    assert_eq!(out.output_types(), g.output_types());
    // in the program: a custom call that gives its first operand back in place
    let text = to_stablehlo(&out).unwrap();
    let line = (text.lines())
        .find(|l| l.contains("@neuron_pc_process_ordered("))
        .unwrap();
    assert!(line.contains("operand_index = 0"), "{line}");
    assert!(
        line.contains("(tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>"),
        "{line}"
    );
}
