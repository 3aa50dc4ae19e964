//! The device's locks and the one order they are taken in.
//!
//! Every lock of [`super::DeviceInner`] is a [`Ranked`] mutex. A thread may take a lock only
//! while every lock it already holds comes earlier in this list (outermost first); two threads
//! that both follow it cannot deadlock on these locks:
//!
//! 1. `walks`: held while a step's walk runs (`trace::WalkMark`); a walk then records.
//! 2. `retired`: what launched steps left to free.
//! 3. `last_step_end`: when the last `mark_step` returned.
//! 4. `recorder`: the interner, the pending tensors and the tensor ids (one lock per op).
//! 5. `executables`: the step executables by graph.
//! 6. `sites`: the `mark_step` sites and their graphs (diagnostics).
//! 7. `index_checks`: index checks whose results are not read yet.
//! 8. `remat`: the blocks the backward pass recomputes.
//! 9. `autocast`: the dtype products are computed in.
//! 10. `optimizer_state`, `parameters`, `gradients`: what the metrics count.
//! 11. `metrics`: the counters (innermost: taken last, under any of the above).
//!
//! Debug builds, and so every test run, check each acquisition against the locks the thread
//! holds and panic naming both; release builds check nothing and pay nothing. The locks of a
//! tensor's own cell (its value, its donor, its name) are not ranked: private to `device/`
//! (`Cell`'s methods), each is taken alone, or under the recorder.

use std::sync::{Mutex, MutexGuard};

/// A lock's place in the order (earlier variants are taken first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Rank {
    Walks,
    Retired,
    LastStepEnd,
    Recorder,
    Executables,
    Sites,
    IndexChecks,
    Remat,
    Autocast,
    Tracked,
    Metrics,
}

/// A mutex with a rank in the device's lock order.
pub(crate) struct Ranked<T> {
    #[cfg(debug_assertions)]
    rank: Rank,
    mutex: Mutex<T>,
}

impl<T> Ranked<T> {
    pub(crate) fn new(rank: Rank, value: T) -> Ranked<T> {
        #[cfg(not(debug_assertions))]
        let _ = rank;
        Ranked {
            #[cfg(debug_assertions)]
            rank,
            mutex: Mutex::new(value),
        }
    }
}

/// A held [`Ranked`] lock (the thread's record of it ends with the guard).
pub(crate) struct RankedGuard<'a, T> {
    guard: MutexGuard<'a, T>,
    #[cfg(debug_assertions)]
    rank: Rank,
}

impl<T> std::ops::Deref for RankedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for RankedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cfg(debug_assertions)]
thread_local! {
    /// The ranks of the locks this thread holds, in the order taken.
    static HELD: std::cell::RefCell<Vec<Rank>> = const { std::cell::RefCell::new(Vec::new()) };
}

#[cfg(debug_assertions)]
impl<T> Drop for RankedGuard<'_, T> {
    fn drop(&mut self) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|r| *r == self.rank) {
                h.remove(i);
            }
        });
    }
}

/// Something [`super::lock`] takes: a plain mutex, or a ranked one.
pub(crate) trait Lock {
    /// What holding it gives.
    type Guard<'a>
    where
        Self: 'a;
    /// Takes the lock; a panic while it was held leaves plain data behind, so it is taken anyway.
    fn acquire(&self) -> Self::Guard<'_>;
}

impl<T> Lock for Mutex<T> {
    type Guard<'a>
        = MutexGuard<'a, T>
    where
        T: 'a;
    fn acquire(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl<L: Lock> Lock for std::sync::Arc<L> {
    type Guard<'a>
        = L::Guard<'a>
    where
        L: 'a;
    fn acquire(&self) -> L::Guard<'_> {
        (**self).acquire()
    }
}

impl<T> Lock for Ranked<T> {
    type Guard<'a>
        = RankedGuard<'a, T>
    where
        T: 'a;
    fn acquire(&self) -> RankedGuard<'_, T> {
        #[cfg(debug_assertions)]
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(last) = h.iter().max().filter(|last| **last >= self.rank) {
                panic!(
                    "lock order: the device's {:?} lock taken while this thread holds {last:?} \
                     (src/device/lock_order.rs lists the order)",
                    self.rank
                );
            }
            h.push(self.rank);
        });
        RankedGuard {
            guard: self.mutex.lock().unwrap_or_else(|p| p.into_inner()),
            #[cfg(debug_assertions)]
            rank: self.rank,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locks_in_order_are_taken_and_out_of_order_refused() {
        let (outer, inner) = (
            Ranked::new(Rank::Recorder, 1),
            Ranked::new(Rank::Metrics, 2),
        );
        {
            let a = outer.acquire();
            let b = inner.acquire();
            assert_eq!(*a + *b, 3);
        }
        // released: either alone is fine again
        drop(inner.acquire());
        let backwards = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _b = inner.acquire();
            let _a = outer.acquire();
        }));
        if cfg!(debug_assertions) {
            let message = backwards.unwrap_err();
            let text = message
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default();
            assert!(
                text.contains("Recorder lock taken while this thread holds Metrics"),
                "{text}"
            );
        }
        // the unwinding guards left no record: the right order works after the panic
        let a = outer.acquire();
        let b = inner.acquire();
        assert_eq!(*a + *b, 3);
    }
}
