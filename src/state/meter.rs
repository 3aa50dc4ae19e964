//! How far a checkpoint's save has got, read by the training loop while a thread writes it
//! ([`super::Checkpoints::writing`]): for a progress bar, or a line when it ends.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The progress of a save: the bytes of this process's files written so far, of how many.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SaveProgress {
    /// The step being saved.
    pub step: u64,
    /// Bytes of tensor data written (this process's files).
    pub written: u64,
    /// Bytes of tensor data to write (0 until the files are laid out).
    pub total: u64,
    /// The save has ended, saved or failed.
    pub done: bool,
    /// It has ended, and its checkpoint is committed (when it failed,
    /// [`super::Checkpoints::wait`] says why).
    pub saved: bool,
    /// Since the save began (until it ended, once it has).
    pub elapsed: Duration,
}

/// What the writer updates.
pub(crate) struct Meter {
    step: u64,
    written: AtomicU64,
    total: AtomicU64,
    /// The save's length in µs once it has ended, else `u64::MAX`.
    ended_us: AtomicU64,
    done: AtomicBool,
    saved: AtomicBool,
    started: Instant,
}

impl Meter {
    pub fn new(step: u64) -> Meter {
        Meter {
            step,
            written: AtomicU64::new(0),
            total: AtomicU64::new(0),
            ended_us: AtomicU64::new(u64::MAX),
            done: AtomicBool::new(false),
            saved: AtomicBool::new(false),
            started: Instant::now(),
        }
    }

    pub fn set_total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }

    pub fn add(&self, bytes: u64) {
        self.written.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The save has ended, `saved` or not.
    pub fn finish(&self, saved: bool) {
        let us = self.started.elapsed().as_micros() as u64;
        self.ended_us.store(us, Ordering::Relaxed);
        self.saved.store(saved, Ordering::Relaxed);
        self.done.store(true, Ordering::Release);
    }

    pub fn read(&self) -> SaveProgress {
        let done = self.done.load(Ordering::Acquire);
        SaveProgress {
            step: self.step,
            written: self.written.load(Ordering::Relaxed),
            total: self.total.load(Ordering::Relaxed),
            done,
            saved: done && self.saved.load(Ordering::Relaxed),
            elapsed: match done {
                true => Duration::from_micros(self.ended_us.load(Ordering::Relaxed)),
                false => self.started.elapsed(),
            },
        }
    }
}

/// The saves of one `Checkpoints` not yet handed out as ended, oldest first (at most
/// [`Meters::KEPT`]: a loop that never asks keeps no more).
#[derive(Default)]
pub(crate) struct Meters(Vec<Arc<Meter>>);

impl Meters {
    const KEPT: usize = 16;

    /// The meter of a new save, of `step`.
    pub fn start(&mut self, step: u64) -> Arc<Meter> {
        if self.0.len() == Self::KEPT {
            self.0.remove(0);
        }
        let meter = Arc::new(Meter::new(step));
        self.0.push(meter.clone());
        meter
    }

    /// The newest save, while it is being written.
    pub fn writing(&self) -> Option<SaveProgress> {
        self.0.last().map(|m| m.read()).filter(|p| !p.done)
    }

    /// The saves that have ended, oldest first, no longer kept.
    pub fn ended(&mut self) -> Vec<SaveProgress> {
        let ended: Vec<SaveProgress> = self
            .0
            .iter()
            .map(|m| m.read())
            .take_while(|p| p.done)
            .collect();
        self.0.drain(..ended.len());
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_are_shown_while_written_and_handed_out_once_ended_in_order() {
        let mut m = Meters::default();
        assert_eq!(m.writing(), None);
        let a = m.start(3);
        a.set_total(100);
        a.add(40);
        let w = m.writing().unwrap();
        assert_eq!((w.step, w.written, w.total, w.done), (3, 40, 100, false));
        assert!(m.ended().is_empty());
        a.add(60);
        a.finish(true);
        let b = m.start(6);
        // step 6 is written; step 3 has ended, saved, and is handed out once
        assert_eq!(m.writing().unwrap().step, 6);
        let ended = m.ended();
        assert_eq!(ended.len(), 1);
        assert_eq!(
            (ended[0].step, ended[0].written, ended[0].saved),
            (3, 100, true)
        );
        assert!(m.ended().is_empty());
        b.finish(false);
        assert_eq!(m.writing(), None);
        let ended = m.ended();
        assert_eq!(
            (ended[0].step, ended[0].done, ended[0].saved),
            (6, true, false)
        );
        // a loop that never asks keeps the last 16
        for step in 0..40 {
            m.start(step).finish(true);
        }
        let kept: Vec<u64> = m.ended().iter().map(|p| p.step).collect();
        assert_eq!(kept, (24..40).collect::<Vec<_>>());
    }
}
