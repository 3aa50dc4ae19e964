//! Compiles a small StableHLO program on the cpu target, runs it, and checks the result against
//! the same arithmetic done on the host.

use neuron_pc_compiler::pjrt::{
    find_plugin, Client, ClientOptions, CompileOptions, Plugin, Target,
};
use neuron_pc_compiler::HostTensor;

const PROGRAM: &str = r#"
func.func @main(%x: tensor<2x3xf32>, %w: tensor<3x2xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.dot_general %x, %w, contracting_dims = [1] x [0]
      : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
  %1 = stablehlo.tanh %0 : tensor<2x2xf32>
  return %1 : tensor<2x2xf32>
}"#;

fn main() -> anyhow::Result<()> {
    let plugin = Plugin::load(&find_plugin(Target::Cpu)?)?;
    let client = Client::new(&plugin, &ClientOptions::default())?;
    let x = [0.5f32, -1.0, 2.0, 1.5, 0.25, -0.75];
    let w = [0.1f32, 0.2, -0.3, 0.4, 0.5, -0.6];
    let started = std::time::Instant::now();
    let exe = client.compile(PROGRAM, &CompileOptions::default())?;
    let compiled = started.elapsed();
    let out = exe.execute_host(&[
        HostTensor::from_slice(&x, &[2, 3])?,
        HostTensor::from_slice(&w, &[3, 2])?,
    ])?;
    let got = out[0].to_vec::<f32>()?;
    let mut want = [0f32; 4];
    for i in 0..2 {
        for j in 0..2 {
            want[i * 2 + j] = (0..3)
                .map(|k| x[i * 3 + k] * w[k * 2 + j])
                .sum::<f32>()
                .tanh();
        }
    }
    println!(
        "target: {} ({} devices), compiled in {:.1} ms",
        client.platform_name(),
        client.device_count(),
        compiled.as_secs_f64() * 1e3
    );
    println!("tanh(x @ w) = {got:?}");
    println!("host check  = {want:?}");
    let ok = got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6);
    anyhow::ensure!(ok, "device result differs from the host computation");
    println!("ok: device and host agree");
    Ok(())
}
