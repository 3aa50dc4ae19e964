//! Step functions (`LazyDevice::step_fn`): a step traced on its first calls and replayed after
//! must compute bit for bit what tracing every step computes, on one replica, on several and
//! on a mesh (FSDP over 2 devices);
//! anything a replay cannot know (a value made anew inside the closure, a write between calls)
//! must make the step trace instead, and say why.

use neuron_pc_test_support::process::run_alone;
use std::cell::RefCell;

use neuron_pc::compile::CacheConfig;
use neuron_pc::models::{SyntheticTask, TextEncoder, TextEncoderConfig};
use neuron_pc::nn::Module;
use neuron_pc::optim::{average_gradients, AdamW, Sgd};
use neuron_pc::tensor::Reduction;
use neuron_pc::{grad, DType, DeviceConfig, LazyDevice, Metrics, Tensor};

use crate::common::replicated as device;

/// How a run lays the work out: replicas, or a mesh of 2 devices with FSDP over `data`.
#[derive(Clone, Copy, Debug)]
enum Layout {
    Replicas(usize),
    Fsdp2,
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

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

struct Run {
    losses: Vec<u32>,
    params: Vec<u32>,
    n_params: u64,
    metrics: Metrics,
}

/// Trains the small encoder data-parallel over `replicas` for `steps` steps, each step traced
/// and cut by `mark_step`, or through a step function (`replay`); the losses are read at the end.
fn train(layout: Layout, steps: u64, replay: bool) -> Run {
    let dev = match layout {
        Layout::Replicas(n) => device(n),
        Layout::Fsdp2 => LazyDevice::new(
            DeviceConfig {
                cache: CacheConfig::disabled(),
                ..DeviceConfig::default()
            }
            .with_mesh(&[("data", 2)]),
        )
        .unwrap(),
    };
    let model = TextEncoder::new(&dev, small(), 3).unwrap();
    if let Layout::Fsdp2 = layout {
        let named = model.state_tensors();
        neuron_pc::sharding::reshard(&named, &neuron_pc::sharding::Fsdp).unwrap();
    }
    let params: Vec<Tensor> = model.parameters().into_iter().map(|(_, t)| t).collect();
    let mut opt = AdamW::new(&dev, &params, 0.01).unwrap();
    let task = SyntheticTask::new(small(), 5);
    let lr = dev.scalar(1e-2, DType::F32).unwrap();
    let mut body = |a: &[Tensor]| {
        let loss = model.loss(&a[0], &a[1], &a[2])?;
        let refs: Vec<&Tensor> = params.iter().collect();
        let grads = average_gradients(&grad(&loss, &refs)?)?;
        opt.step(&params, &grads, &a[3])?;
        Ok(vec![loss.all_reduce(Reduction::Mean)?])
    };
    let mut losses = Vec::new();
    let batch = |i: u64| -> Vec<Tensor> {
        let mut b: Vec<Tensor> = task
            .batch(0, i, 8)
            .iter()
            .map(|h| dev.shard(h).unwrap())
            .collect();
        b.push(lr.clone());
        b
    };
    if replay {
        let mut step = dev.step_fn(body);
        for i in 0..steps {
            losses.push(step.call(&batch(i)).unwrap().remove(0));
        }
        assert!(step.is_replaying(), "{:?}", step.why_traced());
    } else {
        for i in 0..steps {
            losses.push(body(&batch(i)).unwrap().remove(0));
            dev.mark_step().unwrap();
        }
    }
    Run {
        losses: losses.iter().flat_map(bits).collect(),
        params: params.iter().flat_map(bits).collect(),
        n_params: params.len() as u64,
        metrics: dev.metrics(),
    }
}

#[test]
fn a_replayed_step_computes_what_a_traced_one_does_bit_for_bit() {
    for replicas in [Layout::Replicas(1), Layout::Replicas(2), Layout::Fsdp2] {
        // 40 steps read only at the end: the replays are launched back to back, each donating
        // buffers that the step before it may still be computing
        let traced = train(replicas, 40, false);
        let replayed = train(replicas, 40, true);
        assert_eq!(replayed.losses, traced.losses, "losses, {replicas:?}");
        assert_eq!(replayed.params, traced.params, "parameters, {replicas:?}");
        // the first two calls trace, the rest replay; training moved the loss
        assert_eq!(replayed.metrics.replayed_steps, 38, "{replicas:?}");
        assert_eq!(traced.metrics.replayed_steps, 0);
        assert_eq!(replayed.metrics.compiles, traced.metrics.compiles);
        assert_ne!(traced.losses[..1], traced.losses[traced.losses.len() - 1..]);
        // replays update the parameters and moments in place as the traced steps do
        assert_eq!(
            replayed.metrics.donated_buffers, traced.metrics.donated_buffers,
            "{replicas:?}"
        );
        // each step updates every parameter and its two moments in place
        assert!(traced.metrics.donated_buffers >= 40 * 3 * traced.n_params);
        if let Layout::Fsdp2 = replicas {
            // partitioned over the mesh, the moments split with their parameters
            assert_eq!(replayed.metrics.partitions, 2);
            let whole = train(Layout::Replicas(1), 1, false).metrics;
            assert!(
                replayed.metrics.optimizer_state_bytes < whole.optimizer_state_bytes * 6 / 10,
                "{} of {}",
                replayed.metrics.optimizer_state_bytes,
                whole.optimizer_state_bytes
            );
        }
    }
}

/// One training step, however it runs.
type Step<'a> = dyn FnMut(&[Tensor]) -> Vec<Tensor> + 'a;

/// A linear model `loss = mean((x w - y)^2)` trained by SGD; `w` starts at `w0`.
fn linear(dev: &LazyDevice) -> (Tensor, Tensor, Tensor) {
    let w = dev.from_slice(&[0.5f32, -0.25, 1.0], &[3, 1]).unwrap();
    let x = dev
        .from_slice(&[1.0f32, 2.0, 3.0, -1.0, 0.5, 2.0], &[2, 3])
        .unwrap();
    let y = dev.from_slice(&[1.0f32, -2.0], &[2, 1]).unwrap();
    (w, x, y)
}

fn sq_loss(x: &Tensor, w: &Tensor, y: &Tensor) -> neuron_pc::Result<Tensor> {
    let d = x.matmul(w)?.sub(y)?;
    d.mul(&d)?.mean_all()
}

/// One SGD step of the linear model on `(x, y)` at rate `lr`; returns the loss.
fn sgd_step(
    opt: &mut Sgd,
    w: &Tensor,
    x: &Tensor,
    y: &Tensor,
    lr: &Tensor,
) -> neuron_pc::Result<Tensor> {
    let loss = sq_loss(x, w, y)?;
    let g = grad(&loss, &[w])?;
    opt.step(std::slice::from_ref(w), &g, lr)?;
    Ok(loss)
}

#[test]
fn a_value_made_inside_the_closure_on_every_call_keeps_the_step_traced() {
    let dev = device(1);
    let (w, x, y) = linear(&dev);
    let mut opt = Sgd::new(&dev, std::slice::from_ref(&w), 0.0, 0.0).unwrap();
    let calls = RefCell::new(0);
    // a learning-rate schedule read on the host: a replay would keep the first rate
    let mut step = dev.step_fn(|a: &[Tensor]| {
        *calls.borrow_mut() += 1;
        let lr = dev.scalar(0.1 / *calls.borrow() as f64, DType::F32)?;
        Ok(vec![sgd_step(&mut opt, &w, &a[0], &a[1], &lr)?])
    });
    for _ in 0..5 {
        step.call(&[x.clone(), y.clone()]).unwrap();
    }
    let why = step.why_traced().expect("a reason").to_string();
    assert!(why.contains("new value on every call"), "{why}");
    assert!(!step.is_replaying());
    drop(step);
    assert_eq!(*calls.borrow(), 5, "every call ran the closure");
    assert_eq!(dev.metrics().replayed_steps, 0);

    // the same five steps by hand, on the host
    let (mut wh, xh, yh) = (
        [0.5f64, -0.25, 1.0],
        [[1.0, 2.0, 3.0], [-1.0, 0.5, 2.0]],
        [1.0, -2.0],
    );
    for k in 1..=5 {
        let d: Vec<f64> = (0..2)
            .map(|r| (0..3).map(|c| xh[r][c] * wh[c]).sum::<f64>() - yh[r])
            .collect();
        for c in 0..3 {
            let g = (0..2).map(|r| d[r] * xh[r][c]).sum::<f64>(); // d(mean of 2)/dw = 2/2
            wh[c] -= 0.1 / k as f64 * g;
        }
    }
    let got = w.to_vec::<f32>().unwrap();
    for c in 0..3 {
        assert!((got[c] as f64 - wh[c]).abs() < 1e-5, "{got:?} vs {wh:?}");
    }
}

#[test]
fn a_write_between_calls_makes_the_next_calls_trace_and_use_it() {
    // `scale` is only read by the step (a constant to a replay); `w` is trained
    let run = |replay: bool| -> (Vec<u32>, u64) {
        let dev = device(1);
        let (w, x, y) = linear(&dev);
        let scale = dev.scalar(1.0, DType::F32).unwrap();
        let lr = dev.scalar(0.05, DType::F32).unwrap();
        let mut opt = Sgd::new(&dev, std::slice::from_ref(&w), 0.0, 0.0).unwrap();
        let mut body = |a: &[Tensor]| {
            Ok(vec![sgd_step(
                &mut opt,
                &w,
                &a[0].mul(&scale)?,
                &a[1],
                &lr,
            )?])
        };
        let mut call: Box<Step<'_>> = if replay {
            let mut step = dev.step_fn(body);
            Box::new(move |a| step.call(a).unwrap())
        } else {
            let dev = dev.clone();
            Box::new(move |a| {
                let out = body(a).unwrap();
                dev.mark_step().unwrap();
                out
            })
        };
        let mut losses = Vec::new();
        for i in 0..10 {
            if i == 5 {
                // a checkpoint load would do this
                scale.assign(&dev.scalar(0.5, DType::F32).unwrap()).unwrap();
            }
            losses.extend(bits(&call(&[x.clone(), y.clone()])[0]));
        }
        drop(call);
        (losses, dev.metrics().replayed_steps)
    };
    let (traced, none) = run(false);
    let (replayed, replays) = run(true);
    assert_eq!(none, 0);
    assert_eq!(replayed, traced);
    // calls 0-1 trace, 2-4 replay; the write makes 5-6 trace, 7-9 replay
    assert_eq!(replays, 6);
}

#[test]
fn state_moved_to_a_new_tensor_each_call_is_carried() {
    let dev = device(1);
    let count = RefCell::new(dev.zeros(&[], DType::F32).unwrap());
    dev.mark_step().unwrap();
    let mut step = dev.step_fn(|a: &[Tensor]| {
        let next = count.borrow().add(&a[0])?;
        *count.borrow_mut() = next.clone();
        Ok(vec![next.mul_scalar(2.0)?])
    });
    let one = dev.scalar(1.0, DType::F32).unwrap();
    let mut doubled = Vec::new();
    for _ in 0..7 {
        doubled.push(step.call(std::slice::from_ref(&one)).unwrap().remove(0));
    }
    assert!(step.is_replaying(), "{:?}", step.why_traced());
    drop(step);
    assert_eq!(count.borrow().item().unwrap(), 7.0);
    let got: Vec<f64> = doubled.iter().map(|t| t.item().unwrap()).collect();
    assert_eq!(got, [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]);
    assert_eq!(dev.metrics().replayed_steps, 5);
}

#[test]
fn a_closure_that_cuts_its_own_step_is_never_replayed() {
    let dev = device(1);
    let (w, x, y) = linear(&dev);
    let mut step = dev.step_fn(|a: &[Tensor]| {
        let loss = sq_loss(&a[0], &w, &a[1])?;
        dev.mark_step()?;
        Ok(vec![loss])
    });
    for _ in 0..4 {
        step.call(&[x.clone(), y.clone()]).unwrap();
    }
    assert!(step.why_traced().unwrap().contains("mark_step"));
    assert!(!step.is_replaying());
}

#[test]
fn a_result_also_kept_by_the_closure_keeps_the_step_traced() {
    let dev = device(1);
    let (w, x, y) = linear(&dev);
    let last = RefCell::new(None);
    let mut step = dev.step_fn(|a: &[Tensor]| {
        let loss = sq_loss(&a[0], &w, &a[1])?;
        *last.borrow_mut() = Some(loss.clone());
        Ok(vec![loss])
    });
    for _ in 0..4 {
        step.call(&[x.clone(), y.clone()]).unwrap();
    }
    assert!(
        step.why_traced().unwrap().contains("also kept"),
        "{:?}",
        step.why_traced()
    );
}

#[test]
fn a_trial_run_traces_every_call_and_extracts_the_step() {
    // alone in a process of its own: a trial-run device marks the whole process as a trial
    // run, and other tests' saves would be skipped
    if !run_alone(
        module_path!(),
        "a_trial_run_traces_every_call_and_extracts_the_step",
    ) {
        return;
    }
    let dir = neuron_pc_test_support::paths::fresh_path("npc", "step-fn-extract");
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        extract_dir: Some(dir.clone()),
        ..DeviceConfig::default()
    })
    .unwrap();
    let (w, x, y) = linear(&dev);
    let lr = dev.scalar(0.05, DType::F32).unwrap();
    let mut opt = Sgd::new(&dev, std::slice::from_ref(&w), 0.0, 0.0).unwrap();
    let calls = RefCell::new(0);
    let mut step = dev.step_fn(|a: &[Tensor]| {
        *calls.borrow_mut() += 1;
        Ok(vec![sgd_step(&mut opt, &w, &a[0], &a[1], &lr)?])
    });
    for _ in 0..5 {
        step.call(&[x.clone(), y.clone()]).unwrap();
    }
    assert!(!step.is_replaying());
    assert_eq!(
        step.why_traced(),
        None,
        "the trial run is not a refusal to warn about"
    );
    drop(step);
    assert_eq!(*calls.borrow(), 5);
    let m = dev.metrics();
    assert_eq!((m.replayed_steps, m.graphs_extracted), (0, 1));
    let mlir = std::fs::read_dir(&dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("mlir".as_ref()))
        .count();
    assert_eq!(mlir, 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_host_time_split_counts_tracing_for_traced_steps_and_not_for_replayed_ones() {
    let dev = device(1);
    let (w, x, y) = linear(&dev);
    let mut opt = Sgd::new(&dev, std::slice::from_ref(&w), 0.0, 0.0).unwrap();
    let lr = dev.scalar(0.01, DType::F32).unwrap();
    let run = |m: &neuron_pc::Metrics| {
        [
            m.host_trace_ms,
            m.host_key_ms,
            m.host_lookup_ms,
            m.host_marshal_ms,
            m.host_launch_ms,
            m.host_finish_ms,
        ]
    };
    // traced steps: the first compiles, the next four find it in memory
    for _ in 0..5 {
        sgd_step(&mut opt, &w, &x, &y, &lr).unwrap();
        dev.mark_step().unwrap();
    }
    dev.synchronize().unwrap();
    let m = dev.metrics();
    let traced = run(&m);
    // every part but the launch call, which the launch thread made (the default), off the loop
    assert!(
        (traced.iter().enumerate()).all(|(i, &v)| (i == 4) == (v == 0.0)),
        "every part counted: {traced:?}"
    );
    assert!(m.launch_thread_ms > 0.0, "{m:?}");
    // replayed calls: no tracing and no key; the plan's check, marshalling, launch, finish
    let mut step =
        dev.step_fn(|a: &[Tensor]| Ok(vec![sgd_step(&mut opt, &w, &a[0], &a[1], &a[2])?]));
    for _ in 0..3 {
        step.call(&[x.clone(), y.clone(), lr.clone()]).unwrap();
    }
    assert!(step.is_replaying());
    let before = run(&dev.metrics());
    let thread_before = dev.metrics().launch_thread_ms;
    for _ in 0..20 {
        step.call(&[x.clone(), y.clone(), lr.clone()]).unwrap();
    }
    dev.synchronize().unwrap();
    let after = run(&dev.metrics());
    // replayed steps launch on the caller's thread
    assert_eq!(dev.metrics().launch_thread_ms, thread_before);
    assert_eq!(after[0], before[0], "replayed steps trace nothing");
    assert_eq!(after[1], before[1], "replayed steps walk no graph");
    for i in 2..6 {
        assert!(after[i] > before[i], "part {i}: {before:?} -> {after:?}");
    }
    // the report says it
    let report = dev.metrics().report();
    assert!(report.contains("host time in steps"), "{report}");
    assert!(
        report.contains("trace ") && report.contains("launch "),
        "{report}"
    );
}
