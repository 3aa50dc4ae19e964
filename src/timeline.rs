//! A timeline of what a process did, as Chrome trace-event JSON (the "JSON array" format that
//! Perfetto and chrome://tracing open): one complete event (`"ph": "X"`) per phase, on a named
//! track. Set `NEURON_PC_TRACE=FILE` for a job (the device's phases per step: tracing, step
//! cut, lowering, compile or cache load, launch, execution until its event completes,
//! transfers, waits) or pass `neuron-pc compile --trace FILE` (the trial run and every
//! worker's compiles in one file).
//!
//! Timestamps are microseconds since the Unix epoch, so files of several processes merge into
//! one timeline.
//!
//! ```
//! use std::time::Instant;
//! use neuron_pc::timeline::{self, Timeline, HOST_TRACK};
//! # fn main() -> std::io::Result<()> {
//! let path = std::env::temp_dir().join(format!("timeline-{}.json", std::process::id()));
//! let t = Timeline::new(&path);
//! t.name_track(HOST_TRACK, "host");
//! let start = Instant::now();
//! // ... load a batch ...
//! t.span(HOST_TRACK, "load batch", start, Instant::now(), &[("step", 3.into())]);
//! t.write()?; // open it in Perfetto (ui.perfetto.dev) or chrome://tracing
//!
//! let events = timeline::read(&path)?;
//! assert_eq!(events.len(), 2);
//! assert!(events.iter().any(|e| e.name == "load batch" && e.ph == "X"));
//! # std::fs::remove_file(&path)?;
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The variable naming the file a job's timeline is written to.
pub const TRACE_ENV: &str = "NEURON_PC_TRACE";

/// Track (thread id) of the host side of a device: tracing, step cuts, compiles, waits.
pub const HOST_TRACK: u64 = 1;
/// Track of the device's executions (launch to completion).
pub const DEVICE_TRACK: u64 = 2;
/// Track of the device's launch thread: the runtime's launch calls, off the loop's thread (see
/// [`crate::DeviceConfig::launch_thread`]).
pub const LAUNCH_TRACK: u64 = 3;

/// One trace event (complete events and track-name metadata).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TraceEvent {
    /// The phase (`trace`, `execute`, ...), or `thread_name` for a track's name.
    pub name: String,
    /// The category: `neuron-pc` for phases, empty for metadata.
    #[serde(default)]
    pub cat: String,
    /// The event type: `X` (a complete event) or `M` (metadata).
    pub ph: String,
    /// Start, µs since the Unix epoch.
    #[serde(default)]
    pub ts: f64,
    /// Duration in µs (complete events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dur: Option<f64>,
    /// The process that recorded it (its OS process id).
    pub pid: u64,
    /// The track within the process ([`HOST_TRACK`], [`DEVICE_TRACK`], ...).
    pub tid: u64,
    /// Details viewers show on the event (the graph, the step); a track's `name`.
    #[serde(default)]
    pub args: serde_json::Map<String, serde_json::Value>,
}

/// Events of one process, written to a file when finished.
#[derive(Debug)]
pub struct Timeline {
    path: PathBuf,
    base: Instant,
    base_unix_us: f64,
    pid: u64,
    events: Mutex<Vec<TraceEvent>>,
}

impl Timeline {
    /// A timeline to be written to `path`.
    pub fn new(path: impl Into<PathBuf>) -> Timeline {
        let base_unix_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1e6);
        Timeline {
            path: path.into(),
            base: Instant::now(),
            base_unix_us,
            pid: u64::from(std::process::id()),
            events: Mutex::new(Vec::new()),
        }
    }

    /// Where it will be written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn us(&self, at: Instant) -> f64 {
        self.base_unix_us + at.saturating_duration_since(self.base).as_secs_f64() * 1e6
    }

    /// Records `name` on track `tid` from `start` to `end`, with `args` (e.g. the graph).
    pub fn span(
        &self,
        tid: u64,
        name: &str,
        start: Instant,
        end: Instant,
        args: &[(&str, serde_json::Value)],
    ) {
        let event = TraceEvent {
            name: name.to_string(),
            cat: "neuron-pc".into(),
            ph: "X".into(),
            ts: self.us(start),
            dur: Some(end.saturating_duration_since(start).as_secs_f64() * 1e6),
            pid: self.pid,
            tid,
            args: args
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        };
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event);
    }

    /// Names track `tid` in viewers.
    pub fn name_track(&self, tid: u64, name: &str) {
        let mut args = serde_json::Map::new();
        args.insert("name".into(), name.into());
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(TraceEvent {
                name: "thread_name".into(),
                cat: String::new(),
                ph: "M".into(),
                ts: 0.0,
                dur: None,
                pid: self.pid,
                tid,
                args,
            });
    }

    /// Adds events recorded elsewhere (another process's file).
    pub fn extend(&self, events: Vec<TraceEvent>) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(events);
    }

    /// Writes the events (sorted by start) to the file, atomically.
    pub fn write(&self) -> std::io::Result<()> {
        let mut events = self
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        events.sort_by(|a, b| a.ts.total_cmp(&b.ts));
        let bytes = serde_json::to_vec(&events).map_err(std::io::Error::other)?;
        crate::state_dict::write_atomic(&self.path, &bytes)
    }
}

/// Reads a timeline file written by [`Timeline::write`].
pub fn read(path: &Path) -> std::io::Result<Vec<TraceEvent>> {
    let bytes = std::fs::read(path)?;
    serde_json::from_slice(&bytes).map_err(std::io::Error::other)
}
