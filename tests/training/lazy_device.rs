//! The lazy device end to end on the cpu plugin.

use neuron_pc::{DeviceConfig, Error, HostTensor, LazyDevice, Tensor};
use neuron_pc_test_support::process::resident_kib;
use neuron_pc_test_support::process::run_alone;

use crate::common::device;

fn t(dev: &LazyDevice, v: &[f32], dims: &[usize]) -> Tensor {
    dev.tensor(&HostTensor::from_slice(v, dims).unwrap())
        .unwrap()
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "element {i}: {x} vs {y}"
        );
    }
}

#[test]
fn nothing_runs_until_a_sync_and_results_match_host_math() {
    let dev = device();
    let a_v: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let b_v = [0.25f32, -0.5, 2.0];
    let a = t(&dev, &a_v, &[2, 3]);
    let b = t(&dev, &b_v, &[3]);
    let c = a.mul(&b).unwrap().tanh().unwrap(); // broadcast [3] over [2,3]
    let s = c.sum(&[1], false).unwrap();
    let m = a.matmul(&a.transpose(0, 1).unwrap()).unwrap();
    assert!(c.is_pending() && s.is_pending());
    assert_eq!(dev.metrics().executions, 0);
    dev.mark_step().unwrap();
    assert!(!c.is_pending());
    let metrics = dev.metrics();
    assert_eq!((metrics.executions, metrics.compiles), (1, 1));

    let want_c: Vec<f32> = (0..6).map(|i| (a_v[i] * b_v[i % 3]).tanh()).collect();
    close(&c.to_vec::<f32>().unwrap(), &want_c, 1e-6);
    let want_s: Vec<f32> = (0..2)
        .map(|r| (0..3).map(|j| want_c[r * 3 + j]).sum())
        .collect();
    close(&s.to_vec::<f32>().unwrap(), &want_s, 1e-6);
    let mut want_m = vec![0f32; 4];
    for i in 0..2 {
        for j in 0..2 {
            want_m[i * 2 + j] = (0..3).map(|k| a_v[i * 3 + k] * a_v[j * 3 + k]).sum();
        }
    }
    close(&m.to_vec::<f32>().unwrap(), &want_m, 1e-6);
    // Reading computed values is a transfer, not a new graph.
    assert_eq!(dev.metrics().executions, 1);
}

#[test]
fn the_same_step_twice_reuses_the_executable() {
    let dev = device();
    let w = t(&dev, &[1.0, 2.0, 3.0], &[3]);
    for step in 0..5 {
        let x = t(&dev, &[step as f32; 3], &[3]);
        let y = w.mul(&x).unwrap().add_scalar(1.0).unwrap();
        w.assign(&y).unwrap();
        dev.mark_step().unwrap();
    }
    let m = dev.metrics();
    assert_eq!(m.compiles, 1, "{m:?}");
    assert_eq!(m.memory_hits, 4);
    // w = ((((w*0+1)*1+1)*2+1)*3+1)*4+1
    let mut want = [1.0f32, 2.0, 3.0];
    for step in 0..5 {
        for v in want.iter_mut() {
            *v = *v * step as f32 + 1.0;
        }
    }
    assert_eq!(w.to_vec::<f32>().unwrap(), want.to_vec());
}

#[test]
fn a_buffer_read_by_one_step_is_donated_by_the_next() {
    // Gradient accumulation's pattern: one step reads w without updating it, the next updates
    // it in place, with no wait between them. The first step's trace still holds w's data
    // after its launch; it must be freed before the second step decides what to donate.
    let dev = device();
    let w = t(&dev, &[1.0, 2.0, 3.0, 4.0], &[4]);
    let mut reads = Vec::new();
    for _ in 0..3 {
        reads.push(w.mul_scalar(3.0).unwrap());
        dev.mark_step().unwrap();
        w.assign(&w.add_scalar(1.0).unwrap()).unwrap();
        dev.mark_step().unwrap();
    }
    assert_eq!(dev.metrics().donated_buffers, 3, "{:?}", dev.metrics());
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![4.0, 5.0, 6.0, 7.0]);
    for (k, r) in reads.iter().enumerate() {
        let want: Vec<f32> = [1.0f32, 2.0, 3.0, 4.0]
            .iter()
            .map(|v| 3.0 * (v + k as f32))
            .collect();
        assert_eq!(r.to_vec::<f32>().unwrap(), want);
    }
}

#[test]
fn in_place_updates_donate_buffers_only_when_nothing_else_holds_them() {
    let dev = device();
    let w = t(&dev, &[1.0, 2.0, 3.0, 4.0], &[4]);
    for _ in 0..3 {
        w.assign(&w.mul_scalar(2.0).unwrap()).unwrap();
        dev.mark_step().unwrap();
    }
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![8.0, 16.0, 24.0, 32.0]);
    assert_eq!(dev.metrics().donated_buffers, 3);

    // A second tensor sharing w's data must keep its value: no donation then.
    let snapshot = t(&dev, &[0.0; 4], &[4]);
    snapshot.assign(&w).unwrap();
    w.assign(&w.add_scalar(1.0).unwrap()).unwrap();
    dev.mark_step().unwrap();
    assert_eq!(dev.metrics().donated_buffers, 3);
    assert_eq!(
        snapshot.to_vec::<f32>().unwrap(),
        vec![8.0, 16.0, 24.0, 32.0]
    );
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![9.0, 17.0, 25.0, 33.0]);
    // Same graph as before (the alias is structural); only the launch kept the buffer.
    assert_eq!(dev.metrics().compiles, 2, "mul and add graphs");
}

#[test]
fn dropped_tensors_are_not_outputs_and_reads_sync_only_what_they_need() {
    let dev = device();
    let a = t(&dev, &[1.0, 2.0], &[2]);
    let keep = a.exp().unwrap();
    let dropped = a.log().unwrap();
    drop(dropped);
    dev.mark_step().unwrap();
    assert_eq!(dev.metrics().last_step_outputs, 1);

    let x = a.mul_scalar(3.0).unwrap();
    let y = a.add_scalar(1.0).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
    let m = dev.metrics();
    assert_eq!((m.implicit_syncs, m.last_step_outputs), (1, 1));
    assert!(y.is_pending(), "reading x must not compute y");
    assert_eq!(keep.to_vec::<f32>().unwrap(), vec![1f32.exp(), 2f32.exp()]);
}

#[test]
fn a_smaller_last_batch_is_diagnosed_and_can_be_made_an_error() {
    for strict in [false, true] {
        let dev = LazyDevice::new(DeviceConfig {
            cache: neuron_pc::compile::CacheConfig::disabled(),
            fail_on_new_graph_after_warmup: strict,
            ..DeviceConfig::default()
        })
        .unwrap();
        let w = t(&dev, &vec![0.01; 128 * 4], &[128, 4]);
        let mut outcome = Ok(());
        for batch in [32usize, 32, 32, 31] {
            let x = t(&dev, &vec![1.0; batch * 128], &[batch, 128]);
            let _y = x.matmul(&w).unwrap().relu().unwrap().sum_all().unwrap();
            outcome = dev.mark_step();
            if outcome.is_err() {
                break;
            }
        }
        assert_eq!(dev.metrics().recompiles_after_warmup, 1);
        if strict {
            let msg = outcome.unwrap_err().to_string();
            assert!(msg.contains("f32[31,128] vs f32[32,128]"), "{msg}");
            assert!(
                msg.contains("lazy_device.rs"),
                "names the mark_step line: {msg}"
            );
            assert!(msg.contains("fixed-size batches"), "{msg}");
        } else {
            outcome.unwrap();
            assert_eq!(dev.metrics().compiles, 2);
        }
    }
}

#[test]
fn bad_input_is_an_error_at_the_call_site() {
    let dev = device();
    let other = device();
    let a = t(&dev, &[1.0, 2.0], &[2]);
    let b = t(&other, &[1.0, 2.0], &[2]);
    assert!(matches!(a.add(&b), Err(Error::DeviceMismatch { .. })));

    let c = t(&dev, &[1.0, 2.0, 3.0], &[3]);
    let err = a.add(&c).unwrap_err().to_string();
    assert!(
        err.contains("lazy_device.rs") && err.contains("[2]") && err.contains("[3]"),
        "{err}"
    );
    let m = t(&dev, &[1.0; 6], &[2, 3]);
    let err = m.matmul(&m).unwrap_err().to_string();
    assert!(
        // named as the user called it (issue 13), with both shapes
        err.contains("lazy_device.rs")
            && err.contains("matmul")
            && !err.contains("dot_general")
            && err.contains("f32[2,3], f32[2,3]"),
        "{err}"
    );

    let pending = a.exp().unwrap();
    drop(dev);
    assert!(matches!(pending.to_vec::<f32>(), Err(Error::DeviceGone)));
    assert!(matches!(a.exp(), Err(Error::DeviceGone)));
}

#[test]
fn memory_stays_flat_over_many_steps() {
    // alone in a process of its own: it measures the process's resident memory, which other
    // tests' allocations would move
    if !run_alone(module_path!(), "memory_stays_flat_over_many_steps") {
        return;
    }
    let dev = device();
    let w = t(&dev, &vec![0.5; 64 * 64], &[64, 64]);
    let x = t(&dev, &vec![0.01; 64 * 64], &[64, 64]);
    let mut at_300 = 0;
    for step in 0..1000 {
        let y = x.matmul(&w).unwrap().tanh().unwrap();
        w.assign(&y).unwrap();
        dev.mark_step().unwrap();
        if step == 300 {
            // Steps run asynchronously: measure with none in flight, after the allocator's
            // per-thread arenas (the plugin's completion callbacks run on its threads) warmed up.
            dev.synchronize().unwrap();
            at_300 = resident_kib();
        }
    }
    dev.synchronize().unwrap();
    let growth = resident_kib().saturating_sub(at_300);
    assert_eq!(dev.metrics().compiles, 1);
    // 700 steps each replacing a 16 KiB buffer: one kept per step would be 11 MiB.
    assert!(growth < 4 * 1024, "RSS grew by {growth} KiB over 700 steps");
}

#[test]
fn the_cpu_client_has_the_devices_the_run_uses_not_the_plugins_default() {
    // The plugin's default is 4 devices (and 4 thread pools' worth of threads).
    assert_eq!(device().client_devices(), 1);
    for (index, replicas, want) in [(0, 2, 2), (2, 1, 3), (1, 3, 4)] {
        let dev = LazyDevice::new(DeviceConfig {
            cache: neuron_pc::compile::CacheConfig::disabled(),
            device_index: index,
            replicas,
            ..DeviceConfig::default()
        })
        .unwrap();
        assert_eq!(
            dev.client_devices(),
            want,
            "device {index}, {replicas} replicas"
        );
    }
}
