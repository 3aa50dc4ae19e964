//! Asynchronous execution: `mark_step` launches and returns; reads wait. Results must not
//! depend on how many steps run at once, failures must surface with the launching site, and
//! many steps in flight must neither hang nor grow memory.

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::AdamW;
use neuron_pc::{grad, DType, DeviceConfig, Error, LazyDevice, Tensor};
use neuron_pc_test_support::process::resident_kib;

/// The tests of this file run one at a time: the memory test reads the process's RSS.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn device(in_flight: usize) -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        max_steps_in_flight: in_flight,
        ..DeviceConfig::default()
    })
    .expect("cpu device: run scripts/setup")
}

fn small() -> TextEncoderConfig {
    TextEncoderConfig {
        vocab: 64,
        embed: 16,
        seq_len: 8,
        mlp: vec![32],
        classes: 4,
    }
}

/// Trains `steps` steps reading nothing until the end; returns every loss and the final
/// parameters, as raw f32 bits.
fn train(in_flight: usize, steps: u64) -> (Vec<u32>, Vec<u32>) {
    let dev = device(in_flight);
    let model = TextEncoder::new(&dev, small(), 3).unwrap();
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&dev, &params, 0.01).unwrap();
    let task = SyntheticTask::new(small(), 5);
    let mut losses = Vec::new();
    for step in 0..steps {
        let b = task.batch(0, step, 8);
        let t: Vec<Tensor> = b.iter().map(|h| dev.tensor(h).unwrap()).collect();
        let lr = dev.scalar(1e-2, DType::F32).unwrap();
        let loss = model.loss(&t[0], &t[1], &t[2]).unwrap();
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = grad(&loss, &refs).unwrap();
        opt.step(&params, &grads, &lr).unwrap();
        dev.mark_step().unwrap();
        losses.push(loss);
    }
    let bits = |t: &Tensor| -> Vec<u32> {
        t.to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f32::to_bits)
            .collect()
    };
    let losses = losses.iter().flat_map(bits).collect();
    let params = params.iter().flat_map(bits).collect();
    (losses, params)
}

#[test]
fn results_are_bit_identical_whatever_the_steps_in_flight() {
    let _serial = serial();
    let (sync_losses, sync_params) = train(1, 200);
    for in_flight in [2, 4] {
        let (l, p) = train(in_flight, 200);
        assert_eq!(l, sync_losses, "losses with {in_flight} steps in flight");
        assert_eq!(
            p, sync_params,
            "parameters with {in_flight} steps in flight"
        );
    }
    // The run learned something, so equality is not of two constant streams.
    let first = f32::from_bits(sync_losses[0]);
    let last = f32::from_bits(*sync_losses.last().unwrap());
    assert!(last < first * 0.8, "loss {first} -> {last}");
}

#[test]
fn execution_time_is_measured_from_launch_to_completion() {
    let _serial = serial();
    let dev = device(2);
    let x = dev
        .from_slice(&vec![0.5f32; 512 * 512], &[512, 512])
        .unwrap();
    let mut y = x.clone();
    for _ in 0..8 {
        y = y.matmul(&x).unwrap().tanh().unwrap();
    }
    dev.mark_step().unwrap();
    let v = y.to_vec::<f32>().unwrap();
    assert!(v.iter().all(|a| a.is_finite()));
    dev.synchronize().unwrap();
    let m = dev.metrics();
    assert_eq!(m.executions, 1);
    // Measured from launch to completion by the completion callback.
    assert!(m.execute_ms > 0.0, "{m:?}");
}

#[test]
fn a_step_that_fails_while_running_is_reported_at_the_next_wait_with_its_site() {
    let _serial = serial();
    let dev = device(2);
    let w = dev.from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    // An output far larger than memory: the plugin cannot allocate it when the step runs.
    let huge = dev
        .full(1.0, &[1 << 20, 1 << 20, 64], DType::F32)
        .unwrap()
        .add(&dev.ones(&[1 << 20, 1 << 20, 64], DType::F32).unwrap())
        .unwrap();
    let doubled = w.mul_scalar(2.0).unwrap();
    let launched = dev.mark_step();
    let line = line!() - 1;
    let err = match launched {
        Err(e) => e,
        Ok(()) => huge.to_vec::<f32>().unwrap_err(),
    };
    let text = err.to_string();
    assert!(
        text.contains(&format!("async_exec.rs:{line}")),
        "the error names the mark_step that launched the step: {text}"
    );
    assert!(matches!(err, Error::StepFailed { .. }), "{err:?}");
    drop((huge, doubled));
    // The device keeps working afterwards.
    let z = w.add(&w).unwrap();
    dev.mark_step().unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
}

#[test]
fn a_thousand_steps_in_flight_keep_memory_flat_and_drop_does_not_hang() {
    let _serial = serial();
    let dev = device(2);
    let w = dev
        .from_slice(&vec![0.001f32; 256 * 256], &[256, 256])
        .unwrap();
    let x = dev
        .from_slice(&vec![1.0f32; 256 * 256], &[256, 256])
        .unwrap();
    let mut after_warmup = 0;
    for step in 0..1000 {
        w.assign(
            &w.add(&x.matmul(&w).unwrap().mul_scalar(1e-6).unwrap())
                .unwrap(),
        )
        .unwrap();
        dev.mark_step().unwrap();
        if step == 100 {
            dev.synchronize().unwrap();
            after_warmup = resident_kib();
        }
    }
    dev.synchronize().unwrap();
    let grown = resident_kib().saturating_sub(after_warmup);
    // 900 more steps of a 256 KiB parameter: a leak of one buffer per step would be 225 MiB.
    assert!(grown < 32 * 1024, "RSS grew by {grown} KiB over 900 steps");
    // Dropping the device with steps in flight returns.
    for _ in 0..3 {
        w.assign(&w.add(&x).unwrap()).unwrap();
        dev.mark_step().unwrap();
    }
    drop(dev);
    assert!(w.to_vec::<f32>().is_err(), "the device is gone");
}
