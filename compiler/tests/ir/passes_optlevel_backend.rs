//! Every backend option the opt-level table sets is accepted by the real CPU plugin (it refuses
//! unknown `DebugOptions` names), and the program still computes the right values.

use neuron_pc_compiler::flags::{CompilerFlags, OptLevel};
use neuron_pc_compiler::optlevel::{backend_options, compile_options};
use neuron_pc_compiler::pjrt::{
    find_plugin, Client, ClientOptions, CompileOptions, OverrideValue, Plugin, Target,
};
use neuron_pc_compiler::HostTensor;

const PROGRAM: &str = r#"
func.func @main(%a: tensor<4x8xf32>, %b: tensor<8x3xf32>) -> tensor<4x3xf32> {
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0]
      : (tensor<4x8xf32>, tensor<8x3xf32>) -> tensor<4x3xf32>
  %1 = stablehlo.tanh %0 : tensor<4x3xf32>
  return %1 : tensor<4x3xf32>
}"#;

#[test]
fn every_level_compiles_and_computes_the_same_values() {
    let plugin =
        Plugin::load(&find_plugin(Target::Cpu).expect("cpu plugin: run scripts/setup")).unwrap();
    let client = Client::new(&plugin, &ClientOptions::cpu_devices(1)).unwrap();
    let a: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.05).collect();
    let b: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
    let inputs = [
        HostTensor::from_slice(&a, &[4, 8]).unwrap(),
        HostTensor::from_slice(&b, &[8, 3]).unwrap(),
    ];
    let mut want = vec![0f32; 12];
    for i in 0..4 {
        for j in 0..3 {
            let s: f64 = (0..8)
                .map(|k| a[i * 8 + k] as f64 * b[k * 3 + j] as f64)
                .sum();
            want[i * 3 + j] = s.tanh() as f32;
        }
    }
    let mut levels_with_options = 0;
    for level in OptLevel::ALL {
        let flags = CompilerFlags {
            opt_level: *level,
            ..CompilerFlags::default()
        };
        levels_with_options += !backend_options(&flags).is_empty() as usize;
        let opts = compile_options(&flags, CompileOptions::default());
        let exe = client
            .compile(PROGRAM, &opts)
            .unwrap_or_else(|e| panic!("{level}: {e}"));
        let got = exe.execute_host(&inputs).unwrap()[0]
            .to_vec::<f32>()
            .unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() < 1e-5, "{level}: {g} vs {w}");
        }
    }
    assert!(
        levels_with_options > 0,
        "the table sets backend options for some level"
    );
    // The check above means something only if the plugin does refuse unknown names.
    let bogus =
        CompileOptions::default().with_override("xla_no_such_option", OverrideValue::Bool(true));
    let err = match client.compile(PROGRAM, &bogus) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("unknown option must be refused"),
    };
    assert!(err.contains("xla_no_such_option"), "{err}");
}
