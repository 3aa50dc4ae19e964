//! The launch thread (`DeviceConfig::launch_thread`): `mark_step` hands the launch over and
//! the loop records the next step meanwhile. Values, donations and launches must be those of
//! launches made in place, and a launch that fails must still be reported with its site.

use neuron_pc::compile::CacheConfig;
use neuron_pc::timeline::{self, HOST_TRACK, LAUNCH_TRACK};
use neuron_pc::{DeviceConfig, Error, LazyDevice};

use super::async_exec::{huge_output, small, train_on};

fn device(launch_thread: bool, trace: Option<std::path::PathBuf>) -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        launch_thread,
        trace,
        ..DeviceConfig::default()
    })
    .expect("cpu device: run scripts/setup")
}

#[test]
fn launches_on_the_thread_compute_and_donate_what_launches_in_place_do() {
    let (threaded, in_place) = (device(true, None), device(false, None));
    let (losses, params, m) = train_on(&threaded, small(), 16, 12);
    let (want_losses, want_params, want) = train_on(&in_place, small(), 16, 12);
    assert_eq!(losses, want_losses, "the losses");
    assert_eq!(params, want_params, "the trained parameters");
    assert_eq!(m.executions, want.executions);
    // Every step but the first updates its parameters and moments in place, as in place: a
    // launch still queued holds its outputs weakly, so it never keeps the next step's inputs.
    assert!(want.donated_buffers > 0, "{want:?}");
    assert_eq!(m.donated_buffers, want.donated_buffers);
    // The launch calls ran off the loop's thread.
    assert_eq!(m.host_launch_ms, 0.0, "{m:?}");
    assert!(m.launch_thread_ms > 0.0, "{m:?}");
    assert!(m.report().contains("launch thread"), "{}", m.report());
    assert!(
        want.host_launch_ms > 0.0 && want.launch_thread_ms == 0.0,
        "{want:?}"
    );
}

#[test]
fn the_loop_records_the_next_step_while_the_thread_launches_the_last() {
    let path = std::env::temp_dir().join(format!("npc-launch-thread-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let dev = device(true, Some(path.clone()));
    let w = dev.from_slice(&vec![0.01f32; 32 * 32], &[32, 32]).unwrap();
    let x = dev.from_slice(&vec![1.0f32; 32 * 32], &[32, 32]).unwrap();
    for _ in 0..40 {
        // a few hundred ops to record, so each step's tracing takes a while
        let mut y = x.clone();
        for _ in 0..100 {
            y = y.matmul(&w).unwrap().tanh().unwrap();
        }
        w.assign(&w.add(&y.mul_scalar(1e-3).unwrap()).unwrap())
            .unwrap();
        dev.mark_step().unwrap();
    }
    assert!(w.to_vec::<f32>().unwrap().iter().all(|v| v.is_finite()));
    drop((w, x));
    // the last handle: the launches are made and the timeline written before drop returns
    drop(dev);
    let events = timeline::read(&path).expect("the timeline parses");
    let _ = std::fs::remove_file(&path);
    let on = |tid: u64, name: &str| -> Vec<(f64, f64)> {
        (events.iter())
            .filter(|e| e.tid == tid && e.name == name && e.ph == "X")
            .map(|e| (e.ts, e.ts + e.dur.unwrap_or(0.0)))
            .collect()
    };
    let (launches, traces) = (on(LAUNCH_TRACK, "launch"), on(HOST_TRACK, "trace"));
    assert_eq!(
        launches.len(),
        40,
        "a launch span per step, on the launch thread's track"
    );
    assert!(
        on(HOST_TRACK, "launch").is_empty(),
        "no launch on the loop's track"
    );
    // The launch of step k and the tracing of step k + 1 overlap at least once (measured: in
    // most steps; the loop returns from `mark_step` as soon as the launch is handed over).
    let overlaps = launches
        .iter()
        .filter(|(l0, l1)| traces.iter().any(|(t0, t1)| t0 < l1 && l0 < t1))
        .count();
    assert!(
        overlaps >= 1,
        "no launch overlapped the loop's tracing: {launches:?}"
    );
}

#[test]
fn a_failed_launch_is_the_error_of_the_next_step_cut_with_its_site() {
    let dev = device(true, None);
    let w = dev.from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let huge = huge_output(&dev);
    dev.mark_step().unwrap();
    let line = line!() - 1;
    // The step after it, or a read of its output, reports it with the failed step's site.
    let z = w.mul_scalar(3.0).unwrap();
    let err = match dev.mark_step() {
        Err(e) => e,
        Ok(()) => huge.to_vec::<f32>().unwrap_err(),
    };
    let text = err.to_string();
    assert!(matches!(err, Error::StepFailed { .. }), "{err:?}");
    assert!(
        text.contains(&format!("launch_thread.rs:{line}")),
        "the error names the mark_step that cut the failed step: {text}"
    );
    // Its output reports the same; the device keeps working.
    let read = huge.to_vec::<f32>().unwrap_err().to_string();
    assert!(read.contains(&format!("launch_thread.rs:{line}")), "{read}");
    drop(huge);
    dev.mark_step().unwrap();
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
}
