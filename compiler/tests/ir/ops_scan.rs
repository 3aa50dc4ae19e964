//! `Op::Scan`: shape inference and its errors, the reference evaluator against a loop written
//! out by hand, and the lowering (one `stablehlo.while` however many results are read) run on
//! the cpu plugin against the reference.

use crate::ops_common;

use std::sync::Arc;

use neuron_pc_compiler::ir::{
    BinaryOp, Graph, NodeId, Op, Saved, ScanBody, ScanOutput, TensorType, UnaryOp,
};
use neuron_pc_compiler::pjrt::CompileOptions;
use neuron_pc_compiler::{lower, reference, DType, HostTensor};
use ops_common::{check_graph, random_tensor, ty, Domain, Rng};

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

/// One layer: `h' = tanh(h . w + b) * s`, with `w [4, 4]` and `b [2, 4]` scanned, `s` an
/// invariant; a second carry counts `sum(h')`.
fn layer() -> (ScanBody, NodeId) {
    let mut g = Graph::new();
    let h = g.parameter(ty(DType::F32, &[2, 4]));
    let total = g.parameter(ty(DType::F32, &[]));
    let w = g.parameter(ty(DType::F32, &[4, 4]));
    let b = g.parameter(ty(DType::F32, &[2, 4]));
    let s = g.parameter(ty(DType::F32, &[2, 4]));
    let y = dot(&mut g, h, w);
    let y = g.push(Op::Binary(BinaryOp::Add), &[y, b]).unwrap();
    let t = g.push(Op::Unary(UnaryOp::Tanh), &[y]).unwrap();
    let out = g.push(Op::Binary(BinaryOp::Mul), &[t, s]).unwrap();
    let sum = g
        .push(
            Op::Reduce(neuron_pc_compiler::ir::ReduceOp::Sum, vec![0, 1]),
            &[out],
        )
        .unwrap();
    let total2 = g.push(Op::Binary(BinaryOp::Add), &[total, sum]).unwrap();
    g.set_outputs(&[out, total2]).unwrap();
    (
        ScanBody {
            graph: g,
            carries: 2,
            xs: 2,
            saved: Saved::Everything,
        },
        t,
    )
}

fn scan(body: &Arc<ScanBody>, length: usize, reverse: bool, output: ScanOutput) -> Op {
    Op::Scan {
        body: body.clone(),
        length,
        reverse,
        output,
    }
}

/// A loop body of one carry of `[2]` and one scanned slice of `x_dims`, its next carry what
/// `f` pushes (given the graph, the carry and the slice).
fn one_carry_body(
    x_dims: &[usize],
    f: impl FnOnce(&mut Graph, NodeId, NodeId) -> NodeId,
) -> Arc<ScanBody> {
    let mut g = Graph::new();
    let c = g.parameter(ty(DType::F32, &[2]));
    let x = g.parameter(ty(DType::F32, x_dims));
    let next = f(&mut g, c, x);
    g.set_outputs(&[next]).unwrap();
    Arc::new(ScanBody {
        graph: g,
        carries: 1,
        xs: 1,
        saved: Saved::Everything,
    })
}

/// A program reading the final carries and the stacked `tanh` of a 3-iteration scan.
fn program(reverse: bool) -> (Graph, NodeId) {
    let (body, t) = layer();
    let body = Arc::new(body);
    let mut g = Graph::new();
    let ops: Vec<NodeId> = [&[2, 4][..], &[], &[3, 4, 4], &[3, 2, 4], &[2, 4]]
        .iter()
        .map(|d| g.parameter(ty(DType::F32, d)))
        .collect();
    let h = g
        .push(scan(&body, 3, reverse, ScanOutput::Carry(0)), &ops)
        .unwrap();
    let total = g
        .push(scan(&body, 3, reverse, ScanOutput::Carry(1)), &ops)
        .unwrap();
    let ts = g
        .push(scan(&body, 3, reverse, ScanOutput::Stacked(t)), &ops)
        .unwrap();
    g.set_outputs(&[h, total, ts]).unwrap();
    (g, t)
}

fn inputs(g: &Graph, seed: u64) -> Vec<HostTensor> {
    let mut rng = Rng::new(seed);
    g.parameter_types()
        .iter()
        .map(|t| random_tensor(&mut rng, t, Domain::Range(-1.0, 1.0)))
        .collect()
}

fn f32s(t: &HostTensor) -> Vec<f32> {
    t.to_vec::<f32>().unwrap()
}

/// The same loop in plain Rust.
fn by_hand(x: &[HostTensor], reverse: bool) -> (Vec<f32>, f32, Vec<f32>) {
    let (mut h, mut total) = (f32s(&x[0]), f32s(&x[1])[0]);
    let (w, b, s) = (f32s(&x[2]), f32s(&x[3]), f32s(&x[4]));
    let mut stacked = vec![0f32; 24];
    for step in 0..3 {
        let i = if reverse { 2 - step } else { step };
        let mut next = vec![0f32; 8];
        for r in 0..2 {
            for o in 0..4 {
                let mut acc = 0f64;
                for k in 0..4 {
                    acc += h[r * 4 + k] as f64 * w[i * 16 + o * 4 + k] as f64;
                }
                let y = (acc as f32 + b[i * 8 + r * 4 + o]).tanh();
                stacked[i * 8 + r * 4 + o] = y;
                next[r * 4 + o] = y * s[r * 4 + o];
            }
        }
        total += next.iter().sum::<f32>();
        h = next;
    }
    (h, total, stacked)
}

#[test]
fn the_reference_runs_the_loop_forward_and_in_reverse() {
    for reverse in [false, true] {
        let (g, _) = program(reverse);
        let x = inputs(&g, 7);
        let out = reference::evaluate(&g, &x).unwrap();
        let (h, total, stacked) = by_hand(&x, reverse);
        let close = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .all(|(p, q)| (p - q).abs() <= 1e-5 * (1.0 + q.abs()))
        };
        assert!(close(&f32s(&out[0]), &h), "reverse={reverse}");
        assert!(close(&f32s(&out[1]), &[total]), "reverse={reverse}");
        assert_eq!(out[2].dims(), &[3, 2, 4]);
        assert!(close(&f32s(&out[2]), &stacked), "reverse={reverse}");
    }
}

#[test]
fn one_while_loop_gives_every_result_on_the_cpu_plugin() {
    for reverse in [false, true] {
        let (g, _) = program(reverse);
        let text = lower::to_stablehlo(&g).unwrap();
        assert_eq!(text.matches("stablehlo.while").count(), 1, "{text}");
        assert_eq!(text, lower::to_stablehlo(&g).unwrap(), "deterministic");
        check_graph(&format!("scan reverse={reverse}"), &g, &inputs(&g, 11), 1.0);
    }
}

#[test]
fn a_scan_inside_a_scan_lowers_and_runs() {
    // inner: a carry of [2] added to each of 4 rows; outer: runs the inner loop on each of 3
    // [4, 2] slices, carrying the result
    let inner = one_carry_body(&[2], |g, c, x| {
        g.push(Op::Binary(BinaryOp::Add), &[c, x]).unwrap()
    });
    let outer = one_carry_body(&[4, 2], |g, c, x| {
        let y = g
            .push(scan(&inner, 4, false, ScanOutput::Carry(0)), &[c, x])
            .unwrap();
        g.push(Op::Unary(UnaryOp::Sin), &[y]).unwrap()
    });
    let mut g = Graph::new();
    let c = g.parameter(ty(DType::F32, &[2]));
    let xs = g.parameter(ty(DType::F32, &[3, 4, 2]));
    let out = g
        .push(scan(&outer, 3, true, ScanOutput::Carry(0)), &[c, xs])
        .unwrap();
    g.set_outputs(&[out]).unwrap();
    let text = lower::to_stablehlo(&g).unwrap();
    assert_eq!(text.matches("stablehlo.while").count(), 2);
    let x = inputs(&g, 3);
    let (mut c, xs) = (f32s(&x[0]), f32s(&x[1]));
    for i in (0..3).rev() {
        for r in 0..4 {
            for k in 0..2 {
                c[k] += xs[i * 8 + r * 2 + k];
            }
        }
        c = c.iter().map(|v| v.sin()).collect();
    }
    let got = f32s(&reference::evaluate(&g, &x).unwrap()[0]);
    assert!(
        got.iter().zip(&c).all(|(a, b)| (a - b).abs() < 1e-5),
        "{got:?} vs {c:?}"
    );
    check_graph("nested scan", &g, &x, 1.0);
}

#[test]
fn bad_scans_are_one_error_naming_the_shapes() {
    let (body, t) = layer();
    let body = Arc::new(body);
    let mut g = Graph::new();
    let dims: [&[usize]; 5] = [&[2, 4], &[], &[3, 4, 4], &[3, 2, 4], &[2, 4]];
    let ops: Vec<NodeId> = dims
        .iter()
        .map(|d| g.parameter(ty(DType::F32, d)))
        .collect();
    let message = |r: neuron_pc_compiler::Result<NodeId>| r.unwrap_err().to_string();
    // a trip count of zero
    let m = message(g.push(scan(&body, 0, false, ScanOutput::Carry(0)), &ops));
    assert!(m.contains("trip count of 0"), "{m}");
    // a scanned operand of another length
    let m = message(g.push(scan(&body, 4, false, ScanOutput::Carry(0)), &ops));
    assert!(
        m.contains("operand 2 is f32[3,4,4]") && m.contains("f32[4,4,4]"),
        "{m}"
    );
    // too few operands
    let m = message(g.push(scan(&body, 3, false, ScanOutput::Carry(0)), &ops[..4]));
    assert!(
        m.contains("5 parameters") && m.contains("4 operands"),
        "{m}"
    );
    // no such result
    let m = message(g.push(scan(&body, 3, false, ScanOutput::Carry(2)), &ops));
    assert!(m.contains("carry 2"), "{m}");
    let m = message(g.push(scan(&body, 3, false, ScanOutput::Stacked(NodeId(99))), &ops));
    assert!(m.contains("stacked %99"), "{m}");
    assert!(g
        .push(scan(&body, 3, false, ScanOutput::Stacked(t)), &ops)
        .is_ok());
    // a body that changes a carry's shape
    let mut b = Graph::new();
    let c = b.parameter(ty(DType::F32, &[2]));
    let y = b
        .push(
            Op::BroadcastInDim {
                dims: vec![3, 2],
                broadcast_dimensions: vec![1],
            },
            &[c],
        )
        .unwrap();
    b.set_outputs(&[y]).unwrap();
    let grows = Arc::new(ScanBody {
        graph: b,
        carries: 1,
        xs: 0,
        saved: Saved::Everything,
    });
    let mut g = Graph::new();
    let c = g.parameter(TensorType::new(DType::F32, vec![2]));
    let m = message(g.push(scan(&grows, 2, false, ScanOutput::Carry(0)), &[c]));
    assert!(m.contains("changes carry 0 from f32[2] to f32[3,2]"), "{m}");
}

#[test]
fn the_body_is_part_of_the_program_text_the_cache_key_hashes() {
    let (a, _) = program(false);
    // the same loop with one op of the body changed (tanh to sin)
    let (layer, t) = layer();
    let mut nodes = layer.graph.nodes().to_vec();
    nodes[t.0].op = Op::Unary(UnaryOp::Sin);
    let graph = Graph::from_nodes(nodes, layer.graph.outputs().to_vec()).unwrap();
    let body = Arc::new(ScanBody { graph, ..layer });
    let mut b = Graph::new();
    let ops: Vec<NodeId> = a
        .parameter_types()
        .into_iter()
        .map(|t| b.parameter(t))
        .collect();
    let h = b
        .push(scan(&body, 3, false, ScanOutput::Carry(0)), &ops)
        .unwrap();
    let total = b
        .push(scan(&body, 3, false, ScanOutput::Carry(1)), &ops)
        .unwrap();
    let ts = b
        .push(scan(&body, 3, false, ScanOutput::Stacked(t)), &ops)
        .unwrap();
    b.set_outputs(&[h, total, ts]).unwrap();
    assert_ne!(a, b);
    let (ta, tb) = (
        lower::to_stablehlo(&a).unwrap(),
        lower::to_stablehlo(&b).unwrap(),
    );
    assert_ne!(ta, tb);
    assert!(ta.contains("stablehlo.tanh") && tb.contains("stablehlo.sine"));
}

/// Compiles `text` on the test's cpu client and runs it on `inputs`.
fn run_text(text: &str, inputs: &[HostTensor]) -> Vec<HostTensor> {
    let exe = ops_common::client()
        .compile(text, &CompileOptions::default())
        .unwrap_or_else(|e| panic!("compile failed: {e}\n{text}"));
    exe.execute_host(inputs).expect("execute")
}

#[test]
fn stacks_and_scanned_rows_go_through_own_calls_on_cpu_with_the_values_of_plain_ops() {
    let client = ops_common::client();
    assert!(
        client.runs_own_handlers(),
        "the pinned cpu plugin has the FFI extension: its client registers neuron-pc's handlers"
    );
    let options = lower::LowerOptions { own_handlers: true };
    let call = format!("@{}()", lower::UNINITIALIZED_TARGET);
    let write = format!("@{}(", lower::WRITE_ROWS_TARGET);
    let read = format!("@{}(", lower::READ_ROWS_TARGET);
    // a loop inside a loop, each stacking: the inner loop's buffer is asked for once per
    // iteration of the outer one, inside its body
    let mut y = NodeId(0);
    let inner = one_carry_body(&[2], |g, c, x| {
        y = g.push(Op::Binary(BinaryOp::Add), &[c, x]).unwrap();
        g.push(Op::Unary(UnaryOp::Sin), &[y]).unwrap()
    });
    let mut rows = NodeId(0);
    let outer = one_carry_body(&[4, 2], |g, c, x| {
        let last = g
            .push(scan(&inner, 4, false, ScanOutput::Carry(0)), &[c, x])
            .unwrap();
        let stacked = g
            .push(scan(&inner, 4, false, ScanOutput::Stacked(y)), &[c, x])
            .unwrap();
        rows = g.push(Op::Unary(UnaryOp::Tanh), &[stacked]).unwrap();
        last
    });
    for reverse in [false, true] {
        let (flat, _) = program(reverse);
        let mut nested = Graph::new();
        let c = nested.parameter(ty(DType::F32, &[2]));
        let xs = nested.parameter(ty(DType::F32, &[3, 4, 2]));
        let op = |o| scan(&outer, 3, reverse, o);
        let last = nested.push(op(ScanOutput::Carry(0)), &[c, xs]).unwrap();
        let all = nested
            .push(op(ScanOutput::Stacked(rows)), &[c, xs])
            .unwrap();
        nested.set_outputs(&[last, all]).unwrap();
        for (what, g, buffers) in [("flat", &flat, 1), ("nested", &nested, 2)] {
            let zeros = lower::to_stablehlo(g).unwrap();
            let text = lower::to_stablehlo_with_options(g, &[], options).unwrap();
            assert!(!zeros.contains("custom_call"), "{zeros}");
            assert_eq!(text.matches(&call).count(), buffers, "{what}: {text}");
            assert_eq!(text.matches(&write).count(), buffers, "{what}: {text}");
            let slices = zeros.matches("\"stablehlo.dynamic_slice\"").count();
            assert!(slices >= buffers, "{what}: {zeros}");
            assert_eq!(text.matches(&read).count(), slices, "{what}: {text}");
            assert!(!text.contains("dynamic_update_slice"), "{what}: {text}");
            assert!(!text.contains("dynamic_slice"), "{what}: {text}");
            let x = inputs(g, 21);
            let (got, want) = (run_text(&text, &x), run_text(&zeros, &x));
            let oracle = reference::evaluate(g, &x).unwrap();
            // The rows moved are the same bits; what XLA fuses around a call differs from
            // what it fuses around a slice, so a sum may round differently (one ulp seen
            // on two of the pinned plugins).
            for (k, (a, b)) in got.iter().zip(&want).enumerate() {
                let what = format!("{what} reverse={reverse}: output {k}");
                for (x, y) in a.to_f64_vec().iter().zip(b.to_f64_vec()) {
                    assert!(
                        (x - y).abs() <= 1e-6 * y.abs().max(1.0),
                        "{what}: {x} vs {y}"
                    );
                }
                ops_common::assert_close(&what, a, &oracle[k], 1.0);
            }
        }
    }
}

/// `tensor<2x3xf32>` for `el` `f32` and `dims` `[2, 3]`.
fn tensor_text(el: &str, dims: &[usize]) -> String {
    let dims: Vec<String> = dims.iter().map(|x| x.to_string()).collect();
    format!("tensor<{}x{el}>", dims.join("x"))
}

/// A program writing `update` (`[k, ..]`) into `stack` (`[n, ..]`) from row `%r`, by
/// `dynamic_update_slice` or by the write-rows call; `el` is the element type's name.
fn row_write_program(by_call: bool, el: &str, stack: &[usize], update: &[usize]) -> String {
    let shape = |d: &[usize]| tensor_text(el, d);
    let (s, u) = (shape(stack), shape(update));
    let write = if by_call {
        format!(
            "%o = stablehlo.custom_call @{}(%s, %u, %r) {{api_version = 4 : i32, \
             output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = \
             [], operand_index = 0, operand_tuple_indices = []>]}} : ({s}, {u}, tensor<i32>) \
             -> {s}",
            lower::WRITE_ROWS_TARGET
        )
    } else {
        let mut at = vec!["%r"];
        at.extend(std::iter::repeat_n("%z", stack.len() - 1));
        let tys = vec!["tensor<i32>"; stack.len()].join(", ");
        format!(
            "%o = \"stablehlo.dynamic_update_slice\"(%s, %u, {}) : ({s}, {u}, {tys}) -> {s}",
            at.join(", ")
        )
    };
    format!(
        "func.func @main(%s: {s}, %u: {u}, %r: tensor<i32>) -> {s} {{\n  %z = stablehlo.constant \
         dense<0> : tensor<i32>\n  {write}\n  return %o : {s}\n}}"
    )
}

#[test]
fn the_write_rows_call_writes_what_dynamic_update_slice_writes_clamped_alike() {
    let mut rng = Rng::new(5);
    let shapes = [
        (DType::F32, vec![4, 3, 2], vec![1, 3, 2]),
        (DType::F32, vec![5, 3], vec![2, 3]),
        (DType::F32, vec![4], vec![1]),
        (DType::BF16, vec![2, 5], vec![2, 5]),
    ];
    let every_type = DType::ALL.map(|d| (d, vec![3, 4], vec![1, 4]));
    for (dtype, stack, update) in shapes.into_iter().chain(every_type) {
        let el = dtype.mlir_name();
        let by_call = row_write_program(true, el, &stack, &update);
        let plain = row_write_program(false, el, &stack, &update);
        // rows written are told from rows kept: the stack's values are negative (false), the
        // update's positive (true)
        let s = match dtype {
            DType::Pred => HostTensor::zeros(dtype, &stack),
            _ => random_tensor(&mut rng, &ty(dtype, &stack), Domain::Range(-4.0, -1.0)),
        };
        let u = random_tensor(&mut rng, &ty(dtype, &update), Domain::Range(1.0, 4.0));
        // in range, the last row that fits, past the end and before the start (both clamped)
        for row in [0, 1, stack[0] as i32 - update[0] as i32, 7, -3] {
            let r = HostTensor::from_slice(&[row], &[]).unwrap();
            let x = [s.clone(), u.clone(), r];
            let (got, want) = (run_text(&by_call, &x), run_text(&plain, &x));
            assert_eq!(got[0].bytes(), want[0].bytes(), "{el}{stack:?} row {row}");
            assert_ne!(
                got[0].bytes(),
                s.bytes(),
                "{el}{stack:?} row {row}: nothing written"
            );
        }
    }
}

/// A program reading `rows` rows of `stack` from row `%r`, by `dynamic_slice` or by the
/// read-rows call; `el` is the element type's name.
fn row_read_program(by_call: bool, el: &str, stack: &[usize], rows: usize) -> String {
    let shape = |d: &[usize]| tensor_text(el, d);
    let mut part = stack.to_vec();
    part[0] = rows;
    let (s, p) = (shape(stack), shape(&part));
    let read = if by_call {
        format!(
            "%o = stablehlo.custom_call @{}(%s, %r) {{api_version = 4 : i32}} : ({s}, \
             tensor<i32>) -> {p}",
            lower::READ_ROWS_TARGET
        )
    } else {
        let mut at = vec!["%r"];
        at.extend(std::iter::repeat_n("%z", stack.len() - 1));
        let tys = vec!["tensor<i32>"; stack.len()].join(", ");
        let sizes: Vec<String> = part.iter().map(|d| d.to_string()).collect();
        format!(
            "%o = \"stablehlo.dynamic_slice\"(%s, {}) {{slice_sizes = array<i64: {}>}} : ({s}, \
             {tys}) -> {p}",
            at.join(", "),
            sizes.join(", ")
        )
    };
    format!(
        "func.func @main(%s: {s}, %r: tensor<i32>) -> {p} {{\n  %z = stablehlo.constant \
         dense<0> : tensor<i32>\n  {read}\n  return %o : {p}\n}}"
    )
}

#[test]
fn the_read_rows_call_reads_what_dynamic_slice_reads_clamped_alike() {
    let mut rng = Rng::new(6);
    let shapes = [
        (DType::F32, vec![4, 3, 2], 1),
        (DType::F32, vec![5, 3], 2),
        (DType::F32, vec![4], 1),
        (DType::BF16, vec![2, 5], 2),
    ];
    let every_type = DType::ALL.map(|d| (d, vec![3, 4], 1));
    for (dtype, stack, rows) in shapes.into_iter().chain(every_type) {
        let el = dtype.mlir_name();
        let by_call = row_read_program(true, el, &stack, rows);
        let plain = row_read_program(false, el, &stack, rows);
        let s = random_tensor(&mut rng, &ty(dtype, &stack), Domain::Range(-4.0, 4.0));
        for row in [0, 1, stack[0] as i32 - rows as i32, 7, -3] {
            let r = HostTensor::from_slice(&[row], &[]).unwrap();
            let x = [s.clone(), r];
            let (got, want) = (run_text(&by_call, &x), run_text(&plain, &x));
            assert_eq!(got[0].dims(), want[0].dims(), "{el}{stack:?} row {row}");
            assert_eq!(got[0].bytes(), want[0].bytes(), "{el}{stack:?} row {row}");
        }
    }
}

#[test]
fn the_row_calls_refuse_rows_of_another_shape_with_one_error_line() {
    let stack = HostTensor::zeros(DType::F32, &[4, 3]);
    let row = HostTensor::from_slice(&[0i32], &[]).unwrap();
    let read =
        row_read_program(true, "f32", &[4, 3], 1).replace("tensor<1x3xf32>", "tensor<1x2xf32>");
    let write = row_write_program(true, "f32", &[4, 3], &[1, 2]);
    let update = HostTensor::zeros(DType::F32, &[1, 2]);
    for (text, inputs, want) in [
        (
            read,
            vec![stack.clone(), row.clone()],
            "neuron_pc_read_rows: the result is not whole rows of the stack",
        ),
        (
            write,
            vec![stack, update, row],
            "neuron_pc_write_rows: the update is not whole rows of the stack",
        ),
    ] {
        let exe = ops_common::client()
            .compile(&text, &CompileOptions::default())
            .unwrap();
        let err = exe.execute_host(&inputs).unwrap_err().to_string();
        assert!(err.contains(want), "{err}");
    }
}
