//! The PJRT layer against the real CPU plugin: hand-written StableHLO programs, results checked
//! against values computed here, serialization, several devices, and bad input.

use std::sync::OnceLock;

use half::bf16;
use neuron_pc_compiler::pjrt::{
    find_plugin, Client, ClientOptions, CompileOptions, Device, LoadedExecutable, OverrideValue,
    Plugin, Target,
};
use neuron_pc_compiler::{Error, HostTensor};

fn client() -> &'static Client {
    static CLIENT: OnceLock<Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let plugin =
            Plugin::load(&find_plugin(Target::Cpu).expect("cpu plugin: run scripts/setup"))
                .unwrap();
        Client::new(&plugin, &ClientOptions::cpu_devices(2)).unwrap()
    })
}

fn run(program: &str, inputs: &[HostTensor]) -> Vec<HostTensor> {
    let exe = client()
        .compile(program, &CompileOptions::default())
        .unwrap();
    exe.execute_host(inputs).unwrap()
}

fn f32s(v: &[f32], dims: &[usize]) -> HostTensor {
    HostTensor::from_slice(v, dims).unwrap()
}

fn seq(n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n).map(|i| i as f32 * scale + offset).collect()
}

#[test]
fn elementwise_ops_match_host_math() {
    let prog = r#"
func.func @main(%a: tensor<3x4xf32>, %b: tensor<3x4xf32>) -> tensor<3x4xf32> {
  %0 = stablehlo.multiply %a, %b : tensor<3x4xf32>
  %1 = stablehlo.tanh %0 : tensor<3x4xf32>
  %2 = stablehlo.subtract %1, %b : tensor<3x4xf32>
  return %2 : tensor<3x4xf32>
}"#;
    let a = seq(12, 0.25, -1.5);
    let b = seq(12, -0.125, 0.75);
    let out = run(prog, &[f32s(&a, &[3, 4]), f32s(&b, &[3, 4])]);
    let got = out[0].to_vec::<f32>().unwrap();
    for i in 0..12 {
        let want = (a[i] * b[i]).tanh() - b[i];
        assert!((got[i] - want).abs() < 1e-6, "{i}: {} vs {want}", got[i]);
    }
}

#[test]
fn dot_general_matches_a_plain_matmul() {
    let prog = r#"
func.func @main(%a: tensor<2x3x4xf32>, %b: tensor<2x4x5xf32>) -> tensor<2x3x5xf32> {
  %0 = stablehlo.dot_general %a, %b, batching_dims = [0] x [0], contracting_dims = [2] x [1]
      : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
  return %0 : tensor<2x3x5xf32>
}"#;
    let a = seq(24, 0.5, -3.0);
    let b = seq(40, -0.25, 2.0);
    let out = run(prog, &[f32s(&a, &[2, 3, 4]), f32s(&b, &[2, 4, 5])]);
    let got = out[0].to_vec::<f32>().unwrap();
    for n in 0..2 {
        for i in 0..3 {
            for j in 0..5 {
                let want: f32 = (0..4)
                    .map(|k| a[n * 12 + i * 4 + k] * b[n * 20 + k * 5 + j])
                    .sum();
                let g = got[n * 15 + i * 5 + j];
                assert!((g - want).abs() < 1e-4, "[{n},{i},{j}] {g} vs {want}");
            }
        }
    }
}

#[test]
fn reduce_broadcast_and_two_outputs() {
    let prog = r#"
func.func @main(%a: tensor<4x3xf32>) -> (tensor<3xf32>, tensor<4x3xf32>) {
  %zero = stablehlo.constant dense<0.0> : tensor<f32>
  %s = stablehlo.reduce(%a init: %zero) applies stablehlo.add across dimensions = [0]
      : (tensor<4x3xf32>, tensor<f32>) -> tensor<3xf32>
  %b = stablehlo.broadcast_in_dim %s, dims = [1] : (tensor<3xf32>) -> tensor<4x3xf32>
  %d = stablehlo.divide %a, %b : tensor<4x3xf32>
  return %s, %d : tensor<3xf32>, tensor<4x3xf32>
}"#;
    let a = seq(12, 1.0, 1.0);
    let out = run(prog, &[f32s(&a, &[4, 3])]);
    assert_eq!(out.len(), 2);
    let sums = out[0].to_vec::<f32>().unwrap();
    let want: Vec<f32> = (0..3).map(|j| (0..4).map(|i| a[i * 3 + j]).sum()).collect();
    assert_eq!(sums, want);
    assert_eq!(out[1].dims(), &[4, 3]);
    let d = out[1].to_vec::<f32>().unwrap();
    for i in 0..12 {
        assert!((d[i] - a[i] / want[i % 3]).abs() < 1e-6);
    }
}

#[test]
fn integer_and_bf16_data() {
    let prog = r#"
func.func @main(%a: tensor<5xi32>, %b: tensor<5xi64>, %c: tensor<4xbf16>, %d: tensor<3xui8>,
                %p: tensor<2xi1>)
    -> (tensor<5xi32>, tensor<5xi64>, tensor<4xbf16>, tensor<3xui8>, tensor<2xi1>) {
  %0 = stablehlo.multiply %a, %a : tensor<5xi32>
  %1 = stablehlo.negate %b : tensor<5xi64>
  %2 = stablehlo.add %c, %c : tensor<4xbf16>
  %3 = stablehlo.add %d, %d : tensor<3xui8>
  %4 = stablehlo.not %p : tensor<2xi1>
  return %0, %1, %2, %3, %4
      : tensor<5xi32>, tensor<5xi64>, tensor<4xbf16>, tensor<3xui8>, tensor<2xi1>
}"#;
    let a = [-3i32, 0, 7, 46341, 12];
    let b = [i64::MAX, -1, 0, 5, 1 << 40];
    let c: Vec<bf16> = [1.5f32, -0.25, 3.0, 1e30]
        .iter()
        .map(|&x| bf16::from_f32(x))
        .collect();
    let d = [1u8, 100, 200];
    let p = [true, false];
    let out = run(
        prog,
        &[
            HostTensor::from_slice(&a, &[5]).unwrap(),
            HostTensor::from_slice(&b, &[5]).unwrap(),
            HostTensor::from_slice(&c, &[4]).unwrap(),
            HostTensor::from_slice(&d, &[3]).unwrap(),
            HostTensor::from_slice(&p, &[2]).unwrap(),
        ],
    );
    let want_a: Vec<i32> = a.iter().map(|x| x.wrapping_mul(*x)).collect();
    assert_eq!(out[0].to_vec::<i32>().unwrap(), want_a);
    let want_b: Vec<i64> = b.iter().map(|x| x.wrapping_neg()).collect();
    assert_eq!(out[1].to_vec::<i64>().unwrap(), want_b);
    let want_c: Vec<bf16> = c.iter().map(|x| bf16::from_f32(x.to_f32() * 2.0)).collect();
    assert_eq!(out[2].to_vec::<bf16>().unwrap(), want_c);
    assert_eq!(out[3].to_vec::<u8>().unwrap(), vec![2, 200, 144]);
    assert_eq!(out[4].to_vec::<bool>().unwrap(), vec![false, true]);
}

#[test]
fn f64_and_f16_data() {
    let prog = r#"
func.func @main(%a: tensor<3xf64>, %b: tensor<3xf16>) -> (tensor<3xf64>, tensor<3xf16>) {
  %0 = stablehlo.sqrt %a : tensor<3xf64>
  %1 = stablehlo.multiply %b, %b : tensor<3xf16>
  return %0, %1 : tensor<3xf64>, tensor<3xf16>
}"#;
    let a = [2.0f64, 9.0, 1e-300];
    let b: Vec<half::f16> = [0.5f32, -3.0, 100.0]
        .iter()
        .map(|&x| half::f16::from_f32(x))
        .collect();
    let out = run(
        prog,
        &[
            HostTensor::from_slice(&a, &[3]).unwrap(),
            HostTensor::from_slice(&b, &[3]).unwrap(),
        ],
    );
    let got = out[0].to_vec::<f64>().unwrap();
    for i in 0..3 {
        assert!((got[i] - a[i].sqrt()).abs() <= a[i].sqrt() * 1e-15);
    }
    let want: Vec<f32> = vec![0.25, 9.0, 10000.0];
    let got16: Vec<f32> = out[1]
        .to_vec::<half::f16>()
        .unwrap()
        .iter()
        .map(|x| x.to_f32())
        .collect();
    assert_eq!(got16, want);
}

#[test]
fn serialized_executables_reload_and_give_identical_results() {
    let prog = r#"
func.func @main(%a: tensor<16x16xf32>, %b: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]
      : (tensor<16x16xf32>, tensor<16x16xf32>) -> tensor<16x16xf32>
  %1 = stablehlo.exponential %0 : tensor<16x16xf32>
  return %1 : tensor<16x16xf32>
}"#;
    let a = f32s(&seq(256, 0.001, -0.1), &[16, 16]);
    let b = f32s(&seq(256, -0.002, 0.2), &[16, 16]);
    let exe = client().compile(prog, &CompileOptions::default()).unwrap();
    let first = exe.execute_host(&[a.clone(), b.clone()]).unwrap();
    let bytes = exe.serialize().unwrap();
    assert!(bytes.len() > 100);
    let exe_sig = exe.signature().cloned();
    assert_eq!(exe_sig.as_ref().map(|s| s.params.len()), Some(2));
    drop(exe);
    let again = client().deserialize(&bytes, exe_sig).unwrap();
    assert_eq!(again.num_outputs(), 1);
    let second = again.execute_host(&[a, b]).unwrap();
    assert_eq!(first[0].bytes(), second[0].bytes());
    // Garbage is refused by the plugin, not crashed on.
    let err = client()
        .deserialize(b"definitely not an executable", None)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Pjrt {
                api_fn: "PJRT_Executable_DeserializeAndLoad",
                ..
            }
        ),
        "{err}"
    );
}

/// A sum over two replicas, as XLA's partitioner and the data-parallel step write it.
const ALL_REDUCE: &str = r#"
func.func @main(%a: tensor<3xf32>) -> tensor<3xf32> {
  %0 = "stablehlo.all_reduce"(%a) ({
    ^bb0(%x: tensor<f32>, %y: tensor<f32>):
      %s = stablehlo.add %x, %y : tensor<f32>
      stablehlo.return %s : tensor<f32>
  }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,
      channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>}
      : (tensor<3xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}"#;

/// [`ALL_REDUCE`] on `client`'s devices 0 and 1 with `x0` and `x1`: each replica's result.
fn all_reduce_on(client: &Client, exe: &LoadedExecutable, x0: &[f32], x1: &[f32]) -> Vec<Vec<f32>> {
    let b0 = client.buffer_from_host(&f32s(x0, &[3]), Device(0)).unwrap();
    let b1 = client.buffer_from_host(&f32s(x1, &[3]), Device(1)).unwrap();
    let out = exe.execute_replicated(&[vec![&b0], vec![&b1]]).unwrap();
    out.iter()
        .map(|replica| replica[0].to_host().unwrap().to_vec::<f32>().unwrap())
        .collect()
}

fn two_replicas() -> CompileOptions {
    CompileOptions {
        num_replicas: 2,
        ..CompileOptions::default()
    }
}

#[test]
fn two_devices_run_replicas_with_an_all_reduce() {
    assert_eq!(client().device_count(), 2);
    let exe = client().compile(ALL_REDUCE, &two_replicas()).unwrap();
    let out = all_reduce_on(client(), &exe, &[1.0, 2.0, 3.0], &[10.0, 20.0, 30.0]);
    assert_eq!(out, vec![vec![11.0, 22.0, 33.0]; 2]);
}

/// Two clients of one process (two devices of a job, or two tests of one test program) running
/// the same collective program at once, each summing its own values 150 times: XLA's in-process
/// rendezvous table is one per process, so replicas of one client must never meet another's.
#[test]
fn two_clients_at_once_keep_their_all_reduces_apart() {
    let path = find_plugin(Target::Cpu).expect("cpu plugin: run scripts/setup");
    std::thread::scope(|s| {
        for k in 0..2u8 {
            let path = &path;
            s.spawn(move || {
                let plugin = Plugin::load(path).unwrap();
                let client = Client::new(&plugin, &ClientOptions::cpu_devices(2)).unwrap();
                let exe = client.compile(ALL_REDUCE, &two_replicas()).unwrap();
                for i in 0..150u16 {
                    let a = f32::from(k) * 1000.0 + f32::from(i);
                    let out = all_reduce_on(&client, &exe, &[a; 3], &[2.0 * a; 3]);
                    assert_eq!(out, vec![vec![3.0 * a; 3]; 2], "client {k}, launch {i}");
                }
            });
        }
    });
}

#[test]
fn backend_options_apply_per_compilation() {
    let prog = "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  \
                %0 = stablehlo.abs %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}";
    let ok = CompileOptions::default()
        .with_override("xla_backend_optimization_level", OverrideValue::Int(0));
    let exe = client().compile(prog, &ok).unwrap();
    let out = exe
        .execute_host(&[f32s(&[-1.0, 2.0, -3.5, 0.0], &[4])])
        .unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.5, 0.0]);
    let bad =
        CompileOptions::default().with_override("xla_not_an_option", OverrideValue::Bool(true));
    let err = client().compile(prog, &bad).unwrap_err().to_string();
    assert!(err.contains("xla_not_an_option"), "{err}");
}

#[test]
fn malformed_program_reports_the_parser_message() {
    let err = client()
        .compile(
            "func.func @main(%a: tensor<2xf32>) -> tensor<2xf32> {\n  \
             %0 = stablehlo.frobnicate %a\n}",
            &CompileOptions::default(),
        )
        .unwrap_err();
    match &err {
        Error::Pjrt {
            api_fn, message, ..
        } => {
            assert_eq!(*api_fn, "PJRT_Client_Compile");
            assert!(message.contains("error:"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn wrong_inputs_are_errors_not_crashes() {
    let prog = "func.func @main(%a: tensor<2xf32>, %b: tensor<2xf32>) -> tensor<2xf32> {\n  \
                %0 = stablehlo.add %a, %b : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}";
    let exe = client().compile(prog, &CompileOptions::default()).unwrap();
    let two = f32s(&[1.0, 2.0], &[2]);
    assert!(
        exe.execute_host(std::slice::from_ref(&two)).is_err(),
        "one input for two parameters"
    );
    let three = f32s(&[1.0, 2.0, 3.0], &[3]);
    assert!(
        exe.execute_host(&[two.clone(), three]).is_err(),
        "wrong shape"
    );
    let ints = HostTensor::from_slice(&[1i32, 2], &[2]).unwrap();
    let err = exe
        .execute_host(&[two.clone(), ints])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("argument 1 is i32[2], the program expects f32[2]"),
        "{err}"
    );
    assert_eq!(
        exe.execute_host(&[two.clone(), two]).unwrap()[0]
            .to_vec::<f32>()
            .unwrap(),
        vec![2.0, 4.0]
    );
    let err = client()
        .buffer_from_host(&f32s(&[1.0], &[1]), Device(7))
        .unwrap_err();
    assert!(err.to_string().contains("device 7"), "{err}");
}

#[test]
fn a_library_that_is_not_a_plugin_is_refused() {
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/usr/lib/x86_64-linux-gnu/libc.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libc");
    let err = Plugin::load(std::path::Path::new(libc))
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a PJRT plugin"), "{err}");
    let err = Plugin::load(std::path::Path::new("/nonexistent/xla_cpu_pjrt.so"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/xla_cpu_pjrt.so"), "{err}");
}

/// Issue 14 A: an executable loaded for a program must take and return what that program
/// does. Bytes of another program (a planted or misfiled cache entry) are refused at load, by
/// results (count, dtype, shape) and by parameters (count, dtype, shape), before any launch.
#[test]
fn an_executable_of_another_program_is_refused_at_load() {
    let two_in = r#"
func.func @main(%a: tensor<4x3xf32>, %b: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %0 = stablehlo.add %a, %b : tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}"#;
    // Same result, one parameter fewer.
    let one_in = r#"
func.func @main(%a: tensor<4x3xf32>) -> tensor<4x3xf32> {
  %0 = stablehlo.exponential %a : tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}"#;
    // Same parameters, two results of another dtype.
    let two_out = r#"
func.func @main(%a: tensor<4x3xf32>, %b: tensor<4x3xf32>) -> (tensor<4x3xi32>, tensor<3xf32>) {
  %0 = stablehlo.convert %a : (tensor<4x3xf32>) -> tensor<4x3xi32>
  %z = stablehlo.constant dense<0.0> : tensor<f32>
  %1 = stablehlo.reduce(%b init: %z) applies stablehlo.add across dimensions = [0]
      : (tensor<4x3xf32>, tensor<f32>) -> tensor<3xf32>
  return %0, %1 : tensor<4x3xi32>, tensor<3xf32>
}"#;
    let compiled = |p: &str| {
        client()
            .compile(p, &CompileOptions::default())
            .unwrap()
            .serialize()
            .unwrap()
    };
    let bytes = compiled(two_in);
    let sig = |p: &str| neuron_pc_compiler::pjrt::Signature::parse(p);

    let ok = client().deserialize(&bytes, sig(two_in)).unwrap();
    let types = ok.output_types().unwrap();
    assert_eq!(types, sig(two_in).unwrap().results);
    assert_eq!(
        ok.parameter_types(),
        Some(sig(two_in).unwrap().params),
        "the plugin's optimized program names the parameters"
    );

    // The same parameter types, read from the serialized bytes without asking the plugin.
    assert_eq!(
        neuron_pc_compiler::pjrt::parameter_types_in(&bytes),
        Some(sig(two_in).unwrap().params)
    );
    let read = ok.interface_from(&bytes).unwrap();
    assert_eq!(
        read.params,
        neuron_pc_compiler::pjrt::parameter_types_in(&bytes)
    );
    let asked = ok.interface().unwrap();
    assert_eq!(read, asked, "the bytes say what the plugin says");
    // Bytes laid out otherwise are not read (the plugin is asked), and parameters misread from
    // the bytes are asked of the plugin before the executable is rejected...
    assert_eq!(
        neuron_pc_compiler::pjrt::parameter_types_in(b"\x0a\x02\x08\x01"),
        None
    );
    let misread = neuron_pc_compiler::pjrt::Interface {
        params: Some(sig(one_in).unwrap().params),
        ..read.clone()
    };
    ok.check_asked(&misread, &sig(two_in).unwrap()).unwrap();
    // ...which refuses it when they really differ.
    let err = ok.check_asked(&read, &sig(one_in).unwrap()).unwrap_err();
    assert!(err.to_string().contains("takes"), "{err}");

    for (other, what) in [(one_in, "takes"), (two_out, "returns")] {
        let err = client().deserialize(&bytes, sig(other)).unwrap_err();
        assert!(matches!(err, Error::Interface { .. }), "{err}");
        assert!(err.to_string().contains(what), "{err}");
    }
    // And the other way round: two_out's executable for two_in's program.
    let err = client()
        .deserialize(&compiled(two_out), sig(two_in))
        .unwrap_err();
    assert!(err.to_string().contains("returns 2 values"), "{err}");
}

/// `Client::zeros_buffer` (copied from zero pages, not a heap block) holds zeros of its dtype
/// and shape on the device asked for, scalars and empty shapes included, and a program takes
/// it as any other buffer.
#[test]
fn zero_buffers_hold_zeros_and_run_like_uploads() {
    use neuron_pc_compiler::DType;
    for (dtype, dims) in [
        (DType::F32, vec![]),
        (DType::F32, vec![0, 3]),
        (DType::BF16, vec![7]),
        (DType::I64, vec![2, 3]),
        (DType::Pred, vec![5]),
        (DType::U8, vec![3, 4099]),
        // 4 MiB: many pages
        (DType::F32, vec![1024, 1024]),
    ] {
        for device in [Device(0), Device(1)] {
            let b = client().zeros_buffer(dtype, &dims, device).unwrap();
            assert_eq!((b.dtype(), b.dims()), (dtype, dims.as_slice()));
            let host = b.to_host().unwrap();
            assert_eq!(host, HostTensor::zeros(dtype, &dims), "{dtype}{dims:?}");
        }
    }
    let prog = "func.func @main(%a: tensor<3x4xf32>, %b: tensor<3x4xf32>) -> tensor<3x4xf32> \
                {\n  %0 = stablehlo.add %a, %b : tensor<3x4xf32>\n  \
                return %0 : tensor<3x4xf32>\n}";
    let exe = client().compile(prog, &CompileOptions::default()).unwrap();
    let zeros = client()
        .zeros_buffer(DType::F32, &[3, 4], Device(0))
        .unwrap();
    let b = seq(12, 0.5, -2.0);
    let x = client()
        .buffer_from_host(&f32s(&b, &[3, 4]), Device(0))
        .unwrap();
    let out = exe.execute(&[&zeros, &x]).unwrap();
    assert_eq!(out[0].to_host().unwrap().to_vec::<f32>().unwrap(), b);
}

/// On cpu a read copies a ready buffer from its own memory: the same bytes as the plugin's
/// transfer for every dtype, scalars, empty and odd shapes, uploads and a program's outputs
/// (read as soon as the call returns, so the read waits for the program), on both devices.
#[test]
fn reads_in_place_match_the_plugins_transfer() {
    use neuron_pc_compiler::DType;
    assert!(
        client().reads_in_place(),
        "the cpu client reads through its transfer"
    );
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for dtype in DType::ALL {
        for dims in [vec![], vec![0], vec![7], vec![3, 5], vec![2, 3, 4]] {
            let n = dims.iter().product::<usize>() * dtype.size_in_bytes();
            let bytes: Vec<u8> = (0..n)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let b = (state >> 56) as u8;
                    // pred holds 0 or 1
                    if dtype == DType::Pred {
                        b & 1
                    } else {
                        b
                    }
                })
                .collect();
            let host = HostTensor::from_bytes(dtype, &dims, bytes).unwrap();
            for device in [Device(0), Device(1)] {
                let b = client().buffer_from_host(&host, device).unwrap();
                assert_eq!(b.to_host().unwrap(), host, "{dtype}{dims:?}");
                assert_eq!(b.transfer_to_host().unwrap(), host, "{dtype}{dims:?}");
            }
        }
    }
    // outputs: a transpose and a product, read at once
    let prog = "func.func @main(%a: tensor<3x4xf32>, %b: tensor<3x4xf32>) -> \
                (tensor<4x3xf32>, tensor<3x4xf32>) {\n  \
                %0 = stablehlo.transpose %a, dims = [1, 0] : \
                (tensor<3x4xf32>) -> tensor<4x3xf32>\n  \
                %1 = stablehlo.multiply %a, %b : tensor<3x4xf32>\n  \
                return %0, %1 : tensor<4x3xf32>, tensor<3x4xf32>\n}";
    let exe = client().compile(prog, &CompileOptions::default()).unwrap();
    let (a, b) = (seq(12, 0.5, -2.0), seq(12, -0.25, 1.0));
    let ins = [f32s(&a, &[3, 4]), f32s(&b, &[3, 4])];
    let bufs: Vec<_> = ins
        .iter()
        .map(|h| client().buffer_from_host(h, Device(0)).unwrap())
        .collect();
    for _ in 0..20 {
        let out = exe.execute(&[&bufs[0], &bufs[1]]).unwrap();
        let t = out[0].to_host().unwrap();
        let p = out[1].to_host().unwrap();
        let want_t: Vec<f32> = (0..12).map(|k| a[(k % 3) * 4 + k / 3]).collect();
        let want_p: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x * y).collect();
        assert_eq!(
            (t.dims(), t.to_vec::<f32>().unwrap()),
            (&[4, 3][..], want_t)
        );
        assert_eq!(p.to_vec::<f32>().unwrap(), want_p);
        assert_eq!(out[0].transfer_to_host().unwrap(), t);
    }
}

/// `LoadedExecutable::temp_bytes`: a matmul whose product is only reduced (converted to i32
/// first, so that the sum of a product is neither rewritten into a smaller one nor fused into
/// the matmul's YNNPACK fusion, which takes f32 elementwise ops such as tanh but not i32 ones)
/// needs the product as a temporary (at least its 1 MiB), an elementwise program next to
/// nothing; a deserialized executable says the same as the compiled one.
#[test]
fn executables_report_their_temporary_bytes() {
    let prog = r#"
func.func @main(%a: tensor<64x16xf32>, %b: tensor<16x4096xf32>) -> tensor<i32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]
    : (tensor<64x16xf32>, tensor<16x4096xf32>) -> tensor<64x4096xf32>
  %t = stablehlo.convert %0 : (tensor<64x4096xf32>) -> tensor<64x4096xi32>
  %z = stablehlo.constant dense<0> : tensor<i32>
  %1 = stablehlo.reduce(%t init: %z) applies stablehlo.add across dimensions = [0, 1]
    : (tensor<64x4096xi32>, tensor<i32>) -> tensor<i32>
  return %1 : tensor<i32>
}"#;
    let exe = client().compile(prog, &CompileOptions::default()).unwrap();
    let temp = exe
        .temp_bytes()
        .expect("the cpu plugin reports memory stats");
    assert!(temp >= 64 * 4096 * 4, "{temp} bytes of temporaries");
    let again = client()
        .deserialize(&exe.serialize().unwrap(), None)
        .unwrap();
    assert_eq!(again.temp_bytes(), Some(temp));
    let small = "func.func @main(%a: tensor<4xf32>) -> tensor<4xf32> {\n  \
                 %0 = stablehlo.abs %a : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}";
    let exe = client().compile(small, &CompileOptions::default()).unwrap();
    let temp = exe.temp_bytes().unwrap();
    assert!(
        temp < 1024,
        "{temp} bytes of temporaries for an elementwise program"
    );
}

/// A step of two linear layers under a squared error, the weights donated as an optimizer step
/// donates them: `h = x.w1`, `dy = h.w2 - t`, `g2 = h^T.dy`, `dh = dy.w2^T`, `g1 = x^T.dh`,
/// `w' = 0.9 w - 0.1 g`. The product `dh` reads `w2` but is no ancestor of `w2'`; with
/// `ordered`, both updates read their weight through [`Op::After`] every gradient.
fn two_layer_update(ordered: bool) -> neuron_pc_compiler::ir::Graph {
    use neuron_pc_compiler::ir::{BinaryOp, Graph, Literal, Op, TensorType};
    use neuron_pc_compiler::DType;
    let ty = |d: &[usize]| TensorType::new(DType::F32, d.to_vec());
    let dot = |lc: usize, rc: usize| Op::DotGeneral {
        lhs_batch: vec![],
        rhs_batch: vec![],
        lhs_contract: vec![lc],
        rhs_contract: vec![rc],
    };
    let (n, k) = (64, 512);
    let mut g = Graph::new();
    let w1 = g.parameter(ty(&[k, k]));
    let w2 = g.parameter(ty(&[k, k]));
    let x = g.parameter(ty(&[n, k]));
    let t = g.parameter(ty(&[n, k]));
    let h = g.push(dot(1, 0), &[x, w1]).unwrap();
    let y = g.push(dot(1, 0), &[h, w2]).unwrap();
    let dy = g.push(Op::Binary(BinaryOp::Sub), &[y, t]).unwrap();
    let dh = g.push(dot(1, 1), &[dy, w2]).unwrap();
    let g2 = g.push(dot(0, 0), &[h, dy]).unwrap();
    let g1 = g.push(dot(0, 0), &[x, dh]).unwrap();
    let keep = g
        .push(Op::Constant(Literal::splat(DType::F32, 0.9, &[k, k])), &[])
        .unwrap();
    let rate = g
        .push(Op::Constant(Literal::splat(DType::F32, 0.1, &[k, k])), &[])
        .unwrap();
    let mut updated = Vec::new();
    for (w, grad) in [(w1, g1), (w2, g2)] {
        let read = if ordered {
            g.push(Op::After, &[w, g1, g2]).unwrap()
        } else {
            w
        };
        let decayed = g.push(Op::Binary(BinaryOp::Mul), &[read, keep]).unwrap();
        let step = g.push(Op::Binary(BinaryOp::Mul), &[grad, rate]).unwrap();
        updated.push(g.push(Op::Binary(BinaryOp::Sub), &[decayed, step]).unwrap());
    }
    g.set_outputs(&updated).unwrap();
    g
}

#[test]
fn an_update_read_after_every_gradient_is_made_in_place_not_on_a_copy() {
    use neuron_pc_compiler::lower::to_stablehlo_with_aliases;
    let inputs: Vec<HostTensor> = [(512, 512, 1e-3), (512, 512, -2e-3), (64, 512, 1e-2)]
        .iter()
        .chain(&[(64, 512, 5e-3)])
        .map(|&(r, c, s)| f32s(&seq(r * c, s / (r * c) as f32, s), &[r, c]))
        .collect();
    let mut copies = Vec::new();
    let mut results = Vec::new();
    for ordered in [false, true] {
        let graph = two_layer_update(ordered);
        let text = to_stablehlo_with_aliases(&graph, &[(0, 0), (1, 1)]).unwrap();
        assert_eq!(text.contains("optimization_barrier"), ordered);
        let exe = client().compile(&text, &CompileOptions::default()).unwrap();
        let ops = exe
            .optimized_entry_opcodes()
            .expect("the cpu plugin gives its program");
        assert!(ops.iter().filter(|o| *o == "dot" || *o == "fusion").count() >= 5);
        copies.push(ops.iter().filter(|o| *o == "copy").count());
        let got = exe.execute_host(&inputs).unwrap();
        let want = neuron_pc_compiler::reference::evaluate(&graph, &inputs).unwrap();
        for (g, w) in got.iter().zip(&want) {
            let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
            let worst = g
                .iter()
                .zip(&w)
                .map(|(a, b)| (a - b).abs() / b.abs().max(1e-3))
                .fold(0f32, f32::max);
            assert!(
                worst < 1e-4,
                "ordered {ordered}: off by {worst} from the reference"
            );
        }
        results.push(got);
    }
    // the same values either way...
    assert_eq!(results[0], results[1]);
    // ...but unordered, XLA copies a weight before updating it in place (`w2`, which `dh`
    // reads). The default plugin's XLA drops that copy once the update is ordered; the older
    // XLA of the other pinned plugins keeps it either way (docs/plugins.md). `copy` also names
    // layout changes, which either program may have.
    let path = find_plugin(Target::Cpu).unwrap();
    let package = neuron_pc_compiler::pjrt::pins::pin_for_library(&path).map(|p| p.package);
    let why = format!("copies in the entry computation, unordered and ordered: {copies:?}");
    if package == Some("lammps-jax-pjrt-cpu") {
        assert!(copies[0] > copies[1], "{why}");
    } else {
        assert!(copies[0] >= copies[1], "{why}");
    }
}

#[test]
fn step_loop_feeds_aliased_outputs_back() {
    use neuron_pc_compiler::pjrt::StepLoop;
    let program = r#"
func.func public @main(%arg0: tensor<2xf32> {tf.aliasing_output = 0 : i32}, %arg1: tensor<f32>)
    -> (tensor<2xf32>, tensor<f32>) {
  %one = stablehlo.constant dense<1.0> : tensor<2xf32>
  %0 = stablehlo.add %arg0, %one : tensor<2xf32>
  %1 = stablehlo.multiply %arg1, %arg1 : tensor<f32>
  return %0, %1 : tensor<2xf32>, tensor<f32>
}
"#;
    let options = CompileOptions::default();
    let mut run = StepLoop::new(client(), program, &options, true).unwrap();
    assert_eq!(run.donated(), (1, 2));
    run.set_input(0, &f32s(&[1.0, 2.0], &[2])).unwrap();
    run.set_input(1, &f32s(&[3.0], &[])).unwrap();
    // a value of another type is refused and changes nothing
    assert!(run.set_input(0, &f32s(&[1.0], &[1])).is_err());
    run.synced().unwrap();
    run.synced().unwrap();
    run.pipelined(3).unwrap();
    // five steps, each reading the previous one's output
    let state = run.inputs()[0].to_host().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(state, vec![6.0, 7.0]);
    // the input that is not aliased stays as it was
    let kept = run.inputs()[1].to_host().unwrap().to_vec::<f32>().unwrap();
    assert_eq!(kept, vec![3.0]);

    // Without donation every launch reads the same inputs.
    let mut copied = StepLoop::new(client(), program, &options, false).unwrap();
    assert_eq!(copied.donated(), (0, 2));
    copied.pipelined(3).unwrap();
    let state = copied.inputs()[0]
        .to_host()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(state, vec![0.0, 0.0]);

    // A text without a readable @main is one error, not a panic.
    assert!(StepLoop::new(client(), "module {}", &options, true).is_err());
}
