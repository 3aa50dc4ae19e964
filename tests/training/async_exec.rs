//! Asynchronous execution: `mark_step` launches and returns; reads wait. Results must not
//! depend on how many steps run at once, failures must surface with the launching site, and
//! many steps in flight must neither hang nor grow memory.

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::AdamW;
use neuron_pc::tensor::Reduction;
use neuron_pc::{grad, DType, DeviceConfig, Error, HostTensor, LazyDevice, Tensor};
use neuron_pc_test_support::process::resident_kib;
use neuron_pc_test_support::process::run_alone;

/// The tests of this file run one at a time: the memory test reads the process's RSS.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn device(in_flight: usize) -> LazyDevice {
    bounded(in_flight, DeviceConfig::default().max_bytes_in_flight)
}

fn bounded(steps: usize, bytes: u64) -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        max_steps_in_flight: steps,
        max_bytes_in_flight: bytes,
        ..DeviceConfig::default()
    })
    .expect("cpu device: run scripts/setup")
}

pub(super) fn small() -> TextEncoderConfig {
    TextEncoderConfig {
        vocab: 64,
        embed: 16,
        seq_len: 8,
        mlp: vec![32],
        classes: 4,
    }
}

/// A model whose step's program takes longer to run than its recording, so that a host that
/// does not wait runs ahead of the device on any machine: with `small()` the two were close,
/// and which was faster depended on the machine's load. With a hidden layer of 512,
/// `xla-cpu-pjrt` ran the step fast enough that 1 run in 3 had no two steps in flight.
fn wide() -> TextEncoderConfig {
    TextEncoderConfig {
        embed: 64,
        mlp: vec![1024],
        ..small()
    }
}

/// Trains `steps` traced steps (parameters and moments donated, updated in place) reading
/// nothing until the end; returns every loss and the final parameters, as raw f32 bits, and
/// the most steps that were in flight at once.
fn train(in_flight: usize, steps: u64) -> (Vec<u32>, Vec<u32>, u64) {
    let (losses, params, m) = train_on(&device(in_flight), wide(), 64, steps);
    (losses, params, m.peak_steps_in_flight)
}

/// [`train`] on `dev`, the model of `config` on batches of `batch`: the losses and final
/// parameters as raw f32 bits, and the metrics once they are read.
pub(super) fn train_on(
    dev: &LazyDevice,
    config: TextEncoderConfig,
    batch: usize,
    steps: u64,
) -> (Vec<u32>, Vec<u32>, neuron_pc::Metrics) {
    let model = TextEncoder::new(dev, config.clone(), 3).unwrap();
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(dev, &params, 0.01).unwrap();
    let task = SyntheticTask::new(config, 5);
    let mut losses = Vec::new();
    for step in 0..steps {
        let b = task.batch(0, step, batch);
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
    (losses, params, dev.metrics())
}

#[test]
fn results_are_bit_identical_whatever_the_steps_in_flight() {
    let _serial = serial();
    let (sync_losses, sync_params, sync_peak) = train(1, 200);
    assert_eq!(sync_peak, 1);
    for in_flight in [2, 4, DeviceConfig::default().max_steps_in_flight] {
        let (l, p, peak) = train(in_flight, 200);
        // a traced step launches while the step computing the parameters it donates still
        // runs: the host runs ahead up to the bound
        assert!(
            peak >= 2 && peak <= in_flight as u64,
            "{peak} steps in flight, bound {in_flight}"
        );
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

/// `x`, 256x1024 of 0.001, and `w`, 1024x1024 of 0.002.
fn matmul_inputs(dev: &LazyDevice) -> (Tensor, Tensor) {
    let x = dev
        .from_slice(&vec![0.001f32; 256 * 1024], &[256, 1024])
        .unwrap();
    let w = dev
        .from_slice(&vec![0.002f32; 1024 * 1024], &[1024, 1024])
        .unwrap();
    (x, w)
}

/// Launches `steps` steps that each compute a new 1 MiB value from a 1024x1024 matmul (a few
/// ms of device time against microseconds of host time, so launches run ahead), reading
/// nothing until the end; returns the device's metrics and every value.
fn new_outputs(dev: &LazyDevice, steps: usize) -> (neuron_pc::Metrics, Vec<Vec<f32>>) {
    let (x, w) = matmul_inputs(dev);
    let mut ys = Vec::new();
    for step in 0..steps {
        let shift = dev.scalar(step as f64, DType::F32).unwrap();
        ys.push(x.add(&shift).unwrap().matmul(&w).unwrap());
        dev.mark_step().unwrap();
    }
    let values = ys.iter().map(|y| y.to_vec::<f32>().unwrap()).collect();
    (dev.metrics(), values)
}

#[test]
fn the_bytes_in_flight_bound_holds_back_steps_whose_outputs_are_new() {
    let _serial = serial();
    const MIB: u64 = 1 << 20;
    // A budget of 2.5 MiB: two 1 MiB outputs fit, a third waits for the oldest.
    let (tight, tight_values) = new_outputs(&bounded(64, 5 * MIB / 2), 12);
    assert!(
        tight.peak_steps_in_flight <= 2 && tight.peak_bytes_in_flight <= 5 * MIB / 2,
        "{} steps, {} bytes in flight",
        tight.peak_steps_in_flight,
        tight.peak_bytes_in_flight
    );
    // The default budget (1 GiB) lets them run ahead, up to the step bound.
    let (free, free_values) = new_outputs(
        &bounded(64, DeviceConfig::default().max_bytes_in_flight),
        12,
    );
    assert!(
        free.peak_steps_in_flight >= 6,
        "{} steps in flight",
        free.peak_steps_in_flight
    );
    assert_eq!(free.peak_bytes_in_flight, free.peak_steps_in_flight * MIB);
    // A step's output counts its bytes however many steps wait.
    assert_eq!(tight.peak_bytes_in_flight % MIB, 0);
    assert!(tight.peak_bytes_in_flight >= MIB);
    assert_eq!(tight_values, free_values);
    let expected = 1024.0 * 0.002 * 0.001;
    assert!(
        (tight_values[0][0] - expected).abs() < 1e-6,
        "{}",
        tight_values[0][0]
    );
    let eleventh = 1024.0 * 0.002 * (11.0 + 0.001);
    assert!(
        (tight_values[11][0] - eleventh).abs() < 1e-3,
        "{}",
        tight_values[11][0]
    );
}

#[test]
fn steps_that_update_in_place_are_held_back_by_the_step_bound_alone() {
    let _serial = serial();
    // The budget is smaller than the updated value: outputs that reuse a donated input
    // allocate nothing, so only the bound of 4 steps holds launches back.
    let dev = bounded(4, 1024);
    let (x, w) = matmul_inputs(&dev);
    let mut step = dev.step_fn(|a: &[Tensor]| {
        let (x, w) = (&a[0], &a[1]);
        let g = x.transpose(0, 1)?.matmul(&x.matmul(w)?)?;
        w.assign(&w.sub(&g.mul_scalar(1e-3)?)?)?;
        Ok(vec![])
    });
    for _ in 0..12 {
        step.call(&[x.clone(), w.clone()]).unwrap();
    }
    let m = dev.metrics();
    assert!(m.replayed_steps >= 9, "{m:?}");
    assert_eq!(m.peak_steps_in_flight, 4, "{m:?}");
    assert_eq!(m.peak_bytes_in_flight, 0, "{m:?}");
    // w - 1e-3 x^T x w, twelve times: every column sum of x^T x is 256 * 1024 * 1e-6.
    let shrink: f64 = 1.0 - 1e-3 * 256.0 * 1024.0 * 1e-6;
    let expected = 0.002 * shrink.powi(12);
    let got = w.to_vec::<f32>().unwrap()[0] as f64;
    assert!((got - expected).abs() < 1e-7, "{got} vs {expected}");
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

/// A device that keeps at most `in_flight` steps in flight and writes a timeline, and the
/// timeline's path (written when the device is dropped).
fn timed_device(in_flight: usize, name: &str) -> (LazyDevice, std::path::PathBuf) {
    let path = std::env::temp_dir().join(format!("npc-{name}-{}.json", std::process::id()));
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        max_steps_in_flight: in_flight,
        trace: Some(path.clone()),
        ..DeviceConfig::default()
    })
    .unwrap();
    (dev, path)
}

/// The timeline's `name` spans, as (start, end) in µs, by start.
fn timeline_spans(path: &std::path::Path, name: &str) -> Vec<(f64, f64)> {
    let events = neuron_pc::timeline::read(path).unwrap();
    let mut v: Vec<(f64, f64)> = (events.iter())
        .filter(|e| e.name == name)
        .map(|e| (e.ts, e.ts + e.dur.unwrap_or(0.0)))
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

#[test]
fn a_step_launches_only_once_fewer_than_the_bound_are_in_flight() {
    let _serial = serial();
    let (dev, path) = timed_device(2, "bound");
    let (m, _) = new_outputs(&dev, 6);
    assert_eq!(m.peak_steps_in_flight, 2, "{m:?}");
    drop(dev);
    let (launches, executions) = (
        timeline_spans(&path, "launch"),
        timeline_spans(&path, "execute"),
    );
    let _ = std::fs::remove_file(&path);
    assert_eq!((launches.len(), executions.len()), (6, 6));
    // Step k launches after step k - 2 completed: with 2 in flight, the oldest is waited for
    // before the launch, not after it (a launch past XLA's cpu client's own bound of 32
    // executions blocked inside the call, and counted the device's time as the host's).
    for k in 2..6 {
        assert!(
            launches[k].0 + 1.0 >= executions[k - 2].1,
            "step {k} launched at {} µs, step {} completed at {} µs",
            launches[k].0,
            k - 2,
            executions[k - 2].1
        );
    }
}

#[test]
fn queued_steps_count_the_device_time_once() {
    let _serial = serial();
    // The same 8 matmul steps, launched one at a time and queued 8 deep.
    let run = |dev: LazyDevice| {
        let started = std::time::Instant::now();
        let (m, values) = new_outputs(&dev, 8);
        (m, started.elapsed().as_secs_f64() * 1e3, values)
    };
    let (one, _, one_values) = run(device(1));
    let (deep, deep_wall_ms, deep_values) = run(bounded(64, 1 << 30));
    assert_eq!(one_values, deep_values);
    assert!(deep.peak_steps_in_flight >= 4, "{deep:?}");
    assert_eq!((one.executions, deep.executions), (8, 8));
    // Launch to completion counts each queued step's wait for the ones before it; the
    // device's time counts each step once, within the run's wall time.
    assert!(
        deep.execute_ms > 2.0 * deep.device_busy_ms,
        "launch to completion {} ms, busy {} ms",
        deep.execute_ms,
        deep.device_busy_ms
    );
    assert!(
        deep.device_busy_ms > 0.0 && deep.device_busy_ms <= deep_wall_ms + 1.0,
        "busy {} ms in a run of {deep_wall_ms} ms",
        deep.device_busy_ms
    );
    // and about what the steps took one at a time
    assert!(
        deep.device_busy_ms > 0.4 * one.device_busy_ms,
        "busy {} ms queued, {} ms one at a time",
        deep.device_busy_ms,
        one.device_busy_ms
    );
    assert!(one.report().contains("the device busy"), "{}", one.report());
}

#[test]
fn a_reads_own_time_is_its_part_of_the_host_split_not_the_loops_tracing() {
    let _serial = serial();
    let dev = device(4);
    // a 16 MiB value: each read copies it, milliseconds of the host's time
    let big = dev
        .from_slice(&vec![0.5f32; 2048 * 2048], &[2048, 2048])
        .unwrap()
        .exp()
        .unwrap();
    dev.mark_step().unwrap();
    dev.synchronize().unwrap();
    let before = dev.metrics();
    let mut sum = 0.0;
    for _ in 0..8 {
        sum += f64::from(big.to_vec::<f32>().unwrap()[2048 * 2048 - 1]);
    }
    // a cut ends the loop's tracing window that held the reads
    let next = big.mul_scalar(2.0).unwrap().sum_all().unwrap();
    dev.mark_step().unwrap();
    let m = dev.metrics();
    assert!((next.item().unwrap() - 2.0 * 0.5f64.exp() * 2048.0 * 2048.0).abs() < 1e3);
    assert!((sum - 8.0 * 0.5f64.exp()).abs() < 1e-4, "{sum}");
    let read = m.host_read_ms - before.host_read_ms;
    let trace = m.host_trace_ms - before.host_trace_ms;
    assert_eq!(m.transfers_to_host - before.transfers_to_host, 8);
    assert!(read > 0.0, "{m:?}");
    // the reads found their value ready: their time is the host's, not a wait
    assert!(
        m.read_wait_ms - before.read_wait_ms < read,
        "read wait {} ms, reads {read} ms",
        m.read_wait_ms - before.read_wait_ms
    );
    assert!(
        trace < read / 4.0,
        "trace {trace} ms against {read} ms of reads"
    );
    assert!(m.report().contains(", reads "), "{}", m.report());
}

#[test]
fn a_loop_that_reads_every_step_waits_on_the_device_not_in_its_tracing() {
    let _serial = serial();
    let (dev, path) = timed_device(4, "reads");
    let (x, w) = matmul_inputs(&dev);
    // Each step: tens of ms of matmuls on the device, a few ops recorded, its value read back.
    let step = |i: usize| {
        let shift = dev.scalar(i as f64, DType::F32).unwrap();
        let mut y = x.add(&shift).unwrap();
        for _ in 0..8 {
            y = y.matmul(&w).unwrap().tanh().unwrap();
        }
        let s = y.sum_all().unwrap();
        dev.mark_step().unwrap();
        assert!(s.item().unwrap().is_finite());
    };
    // the first step's window holds the device's setup and the inputs' upload
    step(0);
    let before = dev.metrics();
    for i in 1..6 {
        step(i);
    }
    dev.mark_step().unwrap(); // nothing pending: no step
    dev.synchronize().unwrap();
    let m = dev.metrics();
    assert_eq!(m.executions - before.executions, 5, "{m:?}");
    // Before, the time a read waited for its step counted as the next step's tracing, so
    // the loop's tracing read as long as the device's work.
    let waits = m.read_wait_ms - before.read_wait_ms;
    let trace = m.host_trace_ms - before.host_trace_ms;
    assert!(
        trace > 0.0 && trace < waits / 4.0,
        "trace {trace} ms against {waits} ms of waits for reads"
    );
    assert!(m.report().contains("read wait"), "{}", m.report());
    // The timeline's tracing is the metric's: its spans leave the reads' waits out.
    drop(dev);
    let (traces, waits) = (
        timeline_spans(&path, "trace"),
        timeline_spans(&path, "wait"),
    );
    let _ = std::fs::remove_file(&path);
    assert!(waits.len() >= 6, "{} waits", waits.len());
    let traced_us: f64 = traces.iter().map(|(a, b)| b - a).sum();
    assert!(
        (traced_us / 1e3 - m.host_trace_ms).abs() < 0.05 * m.host_trace_ms + 0.05,
        "trace spans {traced_us} µs, host_trace_ms {}",
        m.host_trace_ms
    );
    for (t0, t1) in &traces {
        for (w0, w1) in &waits {
            assert!(
                t1 - 1.0 <= *w0 || *w1 <= t0 + 1.0,
                "trace [{t0}, {t1}] over wait [{w0}, {w1}]"
            );
        }
    }
}

/// An output far larger than memory: the plugin cannot allocate it when the step runs.
pub(super) fn huge_output(dev: &LazyDevice) -> Tensor {
    dev.full(1.0, &[1 << 20, 1 << 20, 64], DType::F32)
        .unwrap()
        .add(&dev.ones(&[1 << 20, 1 << 20, 64], DType::F32).unwrap())
        .unwrap()
}

#[test]
fn a_step_that_fails_while_running_is_reported_at_the_next_wait_with_its_site() {
    let _serial = serial();
    let dev = device(2);
    let w = dev.from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let huge = huge_output(&dev);
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

/// XLA's cpu client runs 32 executions of a device at once; a launch past that waits for its
/// turn on a thread of its pool, which has max(cores, devices) threads (2 here). A step's
/// all-reduce needs a thread for each replica at once, so with 64 steps allowed in flight that
/// wait starved the step before it of its second thread, and XLA aborted the process after
/// 40 s ("not all of them arrived"): the flake of the replayed steps in `step_fn.rs`, which
/// queue up whenever the machine is busy. With this test's 200 steps, a bound of 32 (the
/// default then) aborted (as did 64) and 31 passed, with a peak of 31: the launch is made
/// before the bound waits, so 32 in flight make the 33rd execution. Over several cpu devices
/// the steps in flight are held to 16 whatever is asked: 200 steps of a matmul and an
/// all-reduce, launched back to back with 64 asked for, finish with the values they compute.
#[test]
fn steps_with_an_all_reduce_queued_deep_over_two_replicas_finish() {
    // alone in a process of its own: the failure it guards against aborts the process
    if !run_alone(
        module_path!(),
        "steps_with_an_all_reduce_queued_deep_over_two_replicas_finish",
    ) {
        return;
    }
    let _serial = serial();
    let dev = LazyDevice::new(DeviceConfig {
        replicas: 2,
        max_steps_in_flight: 64,
        ..crate::common::config()
    })
    .unwrap();
    let (rows, cols) = (128, 1024);
    let fill = |v: f32| HostTensor::from_slice(&vec![v; rows * cols], &[rows, cols]).unwrap();
    let x = dev.from_replicas(&[fill(0.001), fill(0.003)]).unwrap();
    let w = dev
        .from_slice(&vec![0.002f32; cols * cols], &[cols, cols])
        .unwrap();
    let steps = 200;
    let mut totals = Vec::new();
    for step in 0..steps {
        let shift = dev.scalar(step as f64, DType::F32).unwrap();
        let local = x
            .add(&shift)
            .unwrap()
            .matmul(&w)
            .unwrap()
            .sum_all()
            .unwrap();
        totals.push(local.all_reduce(Reduction::Sum).unwrap());
        dev.mark_step().unwrap();
    }
    let peak = dev.metrics().peak_steps_in_flight;
    eprintln!("peak steps in flight: {peak}");
    assert!((3..=16).contains(&peak), "peak steps in flight {peak}");
    for (step, t) in totals.iter().enumerate() {
        // each entry of (x_r + step) w is cols * (x_r + step) * 0.002, summed over both replicas
        let entries = (rows * cols) as f64;
        let want: f64 = [0.001, 0.003]
            .iter()
            .map(|x_r| entries * cols as f64 * (x_r + step as f64) * 0.002)
            .sum();
        let got = t.item().unwrap();
        assert!(
            (got - want).abs() <= 1e-3 * want,
            "step {step}: {got} vs {want}"
        );
    }
}

#[test]
fn a_thousand_steps_in_flight_keep_memory_flat_and_drop_does_not_hang() {
    // alone in a process of its own: it measures the process's resident memory, which other
    // tests' allocations would move
    if !run_alone(
        module_path!(),
        "a_thousand_steps_in_flight_keep_memory_flat_and_drop_does_not_hang",
    ) {
        return;
    }
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
