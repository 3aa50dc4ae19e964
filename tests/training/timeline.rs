//! `NEURON_PC_TRACE`: the device's phases per step as Chrome trace-event JSON. The file must
//! parse, events on the host track must nest (never overlap partially), executions must start
//! at their launch, and the graph's key must be on the graph phases.

use neuron_pc::compile::CacheConfig;
use neuron_pc::timeline::{self, TraceEvent, DEVICE_TRACK, HOST_TRACK};
use neuron_pc::{DeviceConfig, LazyDevice};

fn spans<'a>(events: &'a [TraceEvent], name: &str) -> Vec<&'a TraceEvent> {
    events.iter().filter(|e| e.name == name).collect()
}

/// True when no two events of `track` overlap without one containing the other.
fn nested(events: &[TraceEvent], track: u64) -> Result<(), String> {
    let mut xs: Vec<&TraceEvent> = events
        .iter()
        .filter(|e| e.ph == "X" && e.tid == track)
        .collect();
    xs.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    let eps = 0.5; // µs of rounding
    for (i, a) in xs.iter().enumerate() {
        let a_end = a.ts + a.dur.unwrap_or(0.0);
        for b in &xs[i + 1..] {
            if b.ts >= a_end - eps {
                break;
            }
            let b_end = b.ts + b.dur.unwrap_or(0.0);
            if b_end > a_end + eps {
                return Err(format!(
                    "{} [{}, {a_end}] and {} [{}, {b_end}] overlap",
                    a.name, a.ts, b.name, b.ts
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn a_job_timeline_parses_nests_and_names_its_graphs() {
    let path = std::env::temp_dir().join(format!("npc-timeline-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let dev = LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        trace: Some(path.clone()),
        ..DeviceConfig::default()
    })
    .unwrap();
    let w = dev.from_slice(&vec![0.01f32; 64 * 64], &[64, 64]).unwrap();
    let mut losses = Vec::new();
    for _ in 0..4 {
        let x = dev.from_slice(&vec![1.0f32; 64 * 64], &[64, 64]).unwrap();
        let y = x.matmul(&w).unwrap().tanh().unwrap();
        let loss = y.sum_all().unwrap();
        w.assign(&w.mul_scalar(0.99).unwrap()).unwrap();
        dev.mark_step().unwrap();
        losses.push(loss);
    }
    let last = losses.last().unwrap().item().unwrap();
    assert!(last.is_finite());
    drop((w, losses));
    drop(dev);

    let events = timeline::read(&path).expect("the timeline parses");
    for name in [
        "trace", "step cut", "lower", "compile", "launch", "execute", "wait",
    ] {
        assert!(!spans(&events, name).is_empty(), "no {name:?} event");
    }
    // the host's split of each step: the cut's key and lookup inside it, then the marshalling
    for name in ["key", "lookup", "marshal"] {
        assert_eq!(spans(&events, name).len(), 4, "{name}");
    }
    // One compile for the one graph; four launches and four executions.
    assert_eq!(spans(&events, "compile").len(), 1);
    assert_eq!(spans(&events, "launch").len(), 4);
    assert_eq!(spans(&events, "execute").len(), 4);
    let key = spans(&events, "compile")[0].args["graph"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(key.len(), 12);
    assert!(key.chars().all(|c| c.is_ascii_hexdigit()), "{key}");
    for e in spans(&events, "launch")
        .into_iter()
        .chain(spans(&events, "execute"))
    {
        assert_eq!(e.args["graph"], key.as_str(), "{e:?}");
    }
    assert!(spans(&events, "execute")
        .iter()
        .all(|e| e.tid == DEVICE_TRACK));
    nested(&events, HOST_TRACK).unwrap();
    // Each execution starts when its launch does (same step order).
    let launches = spans(&events, "launch");
    let execs = spans(&events, "execute");
    for (l, x) in launches.iter().zip(&execs) {
        assert!(
            x.ts + 1.0 >= l.ts,
            "execution before its launch: {l:?} {x:?}"
        );
    }
    // Tracks are named for viewers.
    assert!(events.iter().any(|e| e.ph == "M" && e.tid == DEVICE_TRACK));
    let _ = std::fs::remove_file(&path);
}
