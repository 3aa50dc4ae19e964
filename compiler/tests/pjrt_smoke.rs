use neuron_pc_compiler::pjrt::{find_plugin, Client, ClientOptions, CompileOptions, Plugin, Target};
use neuron_pc_compiler::HostTensor;

#[test]
fn smoke() {
    let plugin = Plugin::load(&find_plugin(Target::Cpu).unwrap()).unwrap();
    let client = Client::new(&plugin, &ClientOptions::default()).unwrap();
    eprintln!("{client:?} api {:?}", plugin.api_version());
    let prog = r#"
func.func @main(%a: tensor<2x2xf32>, %b: tensor<2x2xf32>) -> tensor<2x2xf32> {
  %0 = stablehlo.add %a, %b : tensor<2x2xf32>
  return %0 : tensor<2x2xf32>
}"#;
    let t = std::time::Instant::now();
    let exe = client.compile(prog, &CompileOptions::default()).unwrap();
    eprintln!("compile {:?}", t.elapsed());
    let a = HostTensor::from_slice(&[1f32, 2., 3., 4.], &[2, 2]).unwrap();
    let out = exe.execute_host(&[a.clone(), a]).unwrap();
    eprintln!("{:?}", out[0].to_vec::<f32>());
    let bytes = exe.serialize().unwrap();
    let t = std::time::Instant::now();
    let exe2 = client.deserialize(&bytes).unwrap();
    eprintln!("deser {:?} {} bytes", t.elapsed(), bytes.len());
    drop(exe2);
}
