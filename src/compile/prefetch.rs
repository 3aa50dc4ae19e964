//! Loading the executables a job's first steps will ask for while the job initialises.
//!
//! The key of a step graph is known only once the step is traced, after the model is built
//! and its parameters uploaded; loading the executable then waits for all of that. So a job
//! leaves a hint in the local tier of its cache (`hints/<id>.json`, the keys its first graphs
//! had; `id` names the program and the compile options), and the next run of the same
//! program starts loading those entries on a thread as soon as its compiler exists. A step
//! whose key is among them takes the loaded executable; any other key ignores the prefetch.
//!
//! The hint also says how many bytes of temporary buffers each of those executables allocates
//! when it runs. The first execution otherwise faults every page of them in while it runs
//! (the small Llama's step: an 81 MB temporary, about 20 ms of its first execution); a step
//! that has to wait for its executable spends the wait mapping that much memory and freeing it
//! again, so the execution reuses pages already mapped (`neuron_pc_compiler::pjrt::prefault`,
//! only where the allocator keeps freed pages).
//!
//! A hint is only advice: the entries it names are read and verified like any other (the
//! cache checks the digest and the signature), and a prefetched executable is checked against
//! the program's signature before it is used, as a loaded one is. A missing, stale or garbled
//! hint costs at most a wasted background load (and memory mapped ahead for nothing, never more
//! than half the free physical memory, until the next compile gives freed memory back).

use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use neuron_pc_cache::{Cache, EntryKey, Lookup};
use neuron_pc_compiler::pjrt::{Client, Interface, LoadedExecutable};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{ms_since, ProgramKey};

/// How many of a job's first graphs a hint names.
pub(crate) const HINT_GRAPHS: usize = 4;

/// A prefetched executable (none: its entry did not load) with its interface (asked on the
/// thread too, off the step's path; none: to ask again), and the milliseconds it took.
pub(crate) type Loaded = (Option<(LoadedExecutable, Option<Interface>)>, f64);

/// Executables being loaded by the background thread, in the hint's order.
pub(crate) struct Prefetch {
    keys: Vec<String>,
    rx: Receiver<(String, Loaded)>,
    arrived: HashMap<String, Loaded>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Prefetch {
    /// Stops the thread (it stops at its next send once the receiver is gone) and waits for
    /// it, so no load is inside the plugin when the client goes or the process exits.
    fn drop(&mut self) {
        drop(std::mem::replace(&mut self.rx, channel().1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One graph a hint names: the key of its cache entry, and the temporary bytes one execution
/// of it allocates (none: the plugin does not say, or the hint predates the field).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Named {
    pub(crate) key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) temp_bytes: Option<u64>,
}

/// A hint's element as written: a bare key (hints of earlier versions) or a [`Named`].
#[derive(Deserialize)]
#[serde(untagged)]
enum Said {
    Key(String),
    Named(Named),
}

/// The hint's state in one process: what it said, and the graphs this run obtained first.
#[derive(Default)]
pub(crate) struct Hints {
    id: Option<EntryKey>,
    read: Vec<Named>,
    obtained: Vec<Named>,
    /// Whether a step has already spent a wait mapping the temporaries in.
    prefaulted: bool,
    pub(crate) prefetch: Option<Prefetch>,
}

/// The hint's name for this program under these compile options.
pub(crate) fn hint_id(options_key: &str) -> Option<EntryKey> {
    let exe = std::env::current_exe().ok()?;
    let mut h = Sha256::new();
    h.update(b"neuron-pc first-steps hint 1\n");
    h.update(exe.to_string_lossy().as_bytes());
    h.update(b"\n");
    h.update(options_key.as_bytes());
    EntryKey::parse(&hex::encode(h.finalize())).ok()
}

fn parse(bytes: &[u8]) -> Vec<Named> {
    let said: Vec<Said> = serde_json::from_slice(bytes).unwrap_or_default();
    said.into_iter()
        .map(|s| match s {
            Said::Key(key) => Named {
                key,
                temp_bytes: None,
            },
            Said::Named(n) => n,
        })
        .filter(|n| EntryKey::parse(&n.key).is_ok())
        .take(HINT_GRAPHS)
        .collect()
}

impl Hints {
    /// Reads the hint `id` and starts loading the entries it names on a thread.
    pub(crate) fn start(id: Option<EntryKey>, cache: &Arc<Cache>, client: &Client) -> Hints {
        let mut hints = Hints {
            id,
            ..Hints::default()
        };
        let Some(id) = &hints.id else {
            return hints;
        };
        hints.read = cache.hint(id).map(|b| parse(&b)).unwrap_or_default();
        if hints.read.is_empty() {
            return hints;
        }
        let (tx, rx) = channel();
        let keys: Vec<String> = hints.read.iter().map(|n| n.key.clone()).collect();
        let (thread_keys, cache, client) = (keys.clone(), cache.clone(), client.clone());
        let spawned = std::thread::Builder::new()
            .name("neuron-pc-prefetch".into())
            .spawn(move || {
                for hex in thread_keys {
                    let started = Instant::now();
                    let exe = match EntryKey::parse(&hex).map(|k| cache.get(&k)) {
                        Ok(Lookup::Hit(hit)) => {
                            client.deserialize(&hit.executable, None).ok().map(|exe| {
                                let interface = exe.interface_from(&hit.executable).ok();
                                (exe, interface)
                            })
                        }
                        _ => None,
                    };
                    if tx.send((hex, (exe, ms_since(started)))).is_err() {
                        return;
                    }
                }
            });
        if let Ok(thread) = spawned {
            hints.prefetch = Some(Prefetch {
                keys,
                rx,
                arrived: HashMap::new(),
                thread: Some(thread),
            });
        }
        hints
    }

    /// The prefetched executable of `key` (waiting for it if it is still loading), if the
    /// hint named it and it loaded.
    pub(crate) fn take(&mut self, key: &ProgramKey) -> Option<Loaded> {
        let p = self.prefetch.as_mut()?;
        let hex = key.hex();
        if !p.keys.iter().any(|k| k == hex) {
            return None;
        }
        while let Ok((k, loaded)) = p.rx.try_recv() {
            p.arrived.insert(k, loaded);
        }
        if !p.arrived.contains_key(hex) && !self.prefaulted {
            // about to wait: map the memory the execution will allocate in the meantime
            self.prefaulted = true;
            let bytes = self.read.iter().filter_map(|n| n.temp_bytes).max();
            if let Some(bytes) = bytes.and_then(|b| usize::try_from(b).ok()) {
                let started = Instant::now();
                if neuron_pc_compiler::pjrt::prefault(bytes) {
                    tracing::debug!(
                        "mapped {bytes} bytes for the first execution while its executable \
                         loads ({:.1} ms)",
                        ms_since(started)
                    );
                }
            }
        }
        while !p.arrived.contains_key(hex) {
            let Ok((k, loaded)) = p.rx.recv() else {
                break;
            };
            p.arrived.insert(k, loaded);
        }
        p.arrived.remove(hex)
    }

    /// Notes that this run obtained `key`, whose execution allocates `temp_bytes()` of
    /// temporaries (asked only when the hint does not already say); the hint is rewritten when
    /// this run's first graphs are not the ones it said.
    pub(crate) fn obtained(
        &mut self,
        key: &ProgramKey,
        cache: &Cache,
        temp_bytes: impl FnOnce() -> Option<u64>,
    ) {
        let hex = key.hex();
        if self.obtained.len() >= HINT_GRAPHS || self.obtained.iter().any(|n| n.key == hex) {
            return;
        }
        let n = self.obtained.len();
        let temp_bytes = match self.read.get(n) {
            Some(said) if said.key == hex && said.temp_bytes.is_some() => said.temp_bytes,
            _ => temp_bytes(),
        };
        self.obtained.push(Named {
            key: hex.to_string(),
            temp_bytes,
        });
        let agrees = self.read.len() > n && self.read[..=n] == self.obtained[..];
        if let (false, Some(id)) = (agrees, &self.id) {
            if let Ok(bytes) = serde_json::to_vec(&self.obtained) {
                cache.put_hint(id, &bytes);
                self.read = self.obtained.clone();
            }
        }
    }
}
