//! Compile once across processes: [`Cache::get_or_compile`] takes the most shared tier's lease
//! for a key, or waits (backing off) for the process that holds it.

use std::collections::BTreeMap;
use std::time::Instant;

use super::{lock_name, recorded, Cache, Lookup, Obtained, TierState};
use crate::error::{Error, Result};
use crate::key::EntryKey;
use crate::lease::{try_acquire, Attempt, Backoff};

impl Cache {
    /// The tier whose locks coordinate everyone sharing the cache: the most shared one.
    fn lock_tier(&self) -> Option<&TierState> {
        self.live_tiers().last()
    }

    /// Returns the executable of `key`: from the cache, from another process that is
    /// compiling it (waiting up to the lock bound), or by running `compile` here and storing
    /// the result. A recorded failure of this compiler is returned as `Err` unless
    /// `retry_failed`. Only a compile failure is an error; storage trouble never is.
    pub fn get_or_compile(
        &self,
        key: &EntryKey,
        program: &str,
        key_inputs: &BTreeMap<String, String>,
        retry_failed: bool,
        compile: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
    ) -> Result<Obtained> {
        match self.get(key) {
            Lookup::Hit(h) => return Ok(Obtained::Hit(h)),
            Lookup::Failed(f) if !retry_failed => return Err(recorded(&f)),
            _ => {}
        }
        let mut guard = None;
        if let (false, Some(tier)) = (self.opts.read_only, self.lock_tier()) {
            let started = Instant::now();
            let requests_before = crate::s3::thread_requests();
            let mut backoff = Backoff::new(self.opts.lock_poll_first, self.opts.lock_poll_cap);
            let mut announced = false;
            let mut waited = false;
            let done_waiting = |waited: bool| {
                if waited {
                    self.waiting.record(
                        started.elapsed(),
                        crate::s3::thread_requests() - requests_before,
                    );
                }
            };
            loop {
                if tier.is_down() {
                    break;
                }
                // a look: its throttled reads slow this loop down instead of being retried
                let look = crate::s3::polling(|| {
                    try_acquire(
                        &tier.store,
                        &tier.health,
                        &lock_name(key),
                        self.opts.lease_secs,
                    )
                });
                match look {
                    Ok(Attempt::Acquired(g)) => {
                        guard = Some(g);
                        break;
                    }
                    Ok(Attempt::Held(holder)) => {
                        waited = true;
                        if !announced {
                            announced = true;
                            let who = holder.map_or_else(
                                || "another process".to_string(),
                                |l| format!("pid {} on {}", l.pid, l.host),
                            );
                            tracing::warn!(
                                "compile cache: {who} is compiling {key}; waiting for it \
                                 (up to {:.0} s)",
                                self.opts.lock_wait.as_secs_f64()
                            );
                        }
                    }
                    // Throttled: the store is there and asks us to slow down; wait longer.
                    Err(e) if e.is_throttled() => {
                        waited = true;
                        self.storage_trouble(tier, &e);
                        backoff.slow_down();
                    }
                    Err(e) => {
                        self.storage_trouble(tier, &e);
                        break;
                    }
                }
                std::thread::sleep(backoff.pause());
                match crate::s3::polling(|| self.get(key)) {
                    Lookup::Hit(h) => {
                        tracing::warn!(
                            "compile cache: {key} arrived after waiting {:.1} s",
                            started.elapsed().as_secs_f64()
                        );
                        done_waiting(waited);
                        return Ok(Obtained::Waited(h));
                    }
                    // The holder failed: its failure stands for ours.
                    Lookup::Failed(f) if !retry_failed => {
                        done_waiting(waited);
                        return Err(recorded(&f));
                    }
                    _ => {}
                }
                if started.elapsed() > self.opts.lock_wait {
                    self.warn_once(
                        &format!("wait:{key}"),
                        &format!(
                            "gave up waiting for another process to compile {key}; compiling here"
                        ),
                    );
                    break;
                }
            }
            done_waiting(waited);
            // Someone may have finished between our miss and taking the lock: after a wait,
            // the holder we waited for, whose lease ended between our last look and this one.
            if guard.is_some() {
                match self.get(key) {
                    Lookup::Hit(h) if waited => return Ok(Obtained::Waited(h)),
                    Lookup::Hit(h) => return Ok(Obtained::Hit(h)),
                    Lookup::Failed(f) if !retry_failed => return Err(recorded(&f)),
                    _ => {}
                }
            }
        }
        let started = Instant::now();
        let result = compile();
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        let outcome = match result {
            Ok(executable) => {
                let stored = self.put(key, &executable, program, key_inputs, compile_ms);
                Ok(Obtained::Compiled {
                    executable,
                    compile_ms,
                    stored,
                })
            }
            Err(message) => {
                self.put_failure(key, &message);
                Err(Error::Compile(message))
            }
        };
        drop(guard);
        outcome
    }
}
