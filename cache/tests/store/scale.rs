//! Issue 23 item 2: eviction, `prune` and `verify` do work linear in the number of entries,
//! and a put at the size bound does a bounded amount of it. Asserted on operation counts of a
//! counting store (never on time): the old `prune` listed the store once more per evicted
//! entry and the old bound listed the whole tier on every put.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use neuron_pc_cache::{
    Cache, CacheOptions, LocalStore, ObjectMeta, PutMode, PutOutcome, Result, Store, Tier,
};

/// A local store that counts what is asked of it.
struct Counting {
    inner: LocalStore,
    lists: AtomicUsize,
    listed: AtomicUsize,
    deletes: AtomicUsize,
    gets: AtomicUsize,
}

impl Counting {
    fn new(root: &std::path::Path) -> Arc<Counting> {
        Arc::new(Counting {
            inner: LocalStore::open(root).unwrap(),
            lists: AtomicUsize::new(0),
            listed: AtomicUsize::new(0),
            deletes: AtomicUsize::new(0),
            gets: AtomicUsize::new(0),
        })
    }

    /// `(list calls, objects listed, deletes, gets)` since the last call.
    fn take(&self) -> (usize, usize, usize, usize) {
        (
            self.lists.swap(0, Ordering::SeqCst),
            self.listed.swap(0, Ordering::SeqCst),
            self.deletes.swap(0, Ordering::SeqCst),
            self.gets.swap(0, Ordering::SeqCst),
        )
    }
}

impl Store for Counting {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn tier(&self) -> Tier {
        Tier::Local
    }
    fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(name)
    }
    fn get_max(&self, name: &str, max: u64) -> Result<Option<Vec<u8>>> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get_max(name, max)
    }
    fn put(&self, name: &str, bytes: &[u8], mode: PutMode) -> Result<bool> {
        self.inner.put(name, bytes, mode)
    }
    fn delete(&self, name: &str) -> Result<()> {
        self.deletes.fetch_add(1, Ordering::SeqCst);
        self.inner.delete(name)
    }
    fn list(&self, prefix: &str) -> Result<Vec<ObjectMeta>> {
        let out = self.inner.list(prefix)?;
        self.lists.fetch_add(1, Ordering::SeqCst);
        self.listed.fetch_add(out.len(), Ordering::SeqCst);
        Ok(out)
    }
    fn touch(&self, name: &str) {
        self.inner.touch(name)
    }
    fn foreign_objects(&self) -> Vec<(String, String)> {
        self.inner.foreign_objects()
    }
    fn clean_leftovers(&self) -> usize {
        self.inner.clean_leftovers()
    }
}

const ENTRIES: usize = 300;
const EXE: usize = 1000;

/// A cache of `ENTRIES` entries (3 objects each) over a counting store; the bytes it holds.
fn filled(root: &std::path::Path) -> (Arc<Counting>, u64) {
    let store = Counting::new(root);
    let c = Cache::with_stores(vec![store.clone()], opts()).unwrap();
    for i in 0..ENTRIES {
        let k = key(&format!("scale {i}"));
        assert_eq!(
            c.put(&k, &exe_for(&k, EXE), "prog", &inputs("s"), 1.0),
            PutOutcome::Stored
        );
    }
    let bytes = store
        .inner
        .list("entries/")
        .unwrap()
        .iter()
        .map(|o| o.size)
        .sum();
    store.take();
    (store, bytes)
}

#[test]
fn prune_lists_once_and_deletes_only_what_it_evicts() {
    let dir = tempfile::tempdir().unwrap();
    let (store, bytes) = filled(&dir.path().join("c"));
    let c = Cache::with_stores(vec![store.clone()], opts()).unwrap();
    let removed = c.prune(bytes / 2).unwrap();
    assert!(
        (ENTRIES / 2 - 2..=ENTRIES / 2 + 2).contains(&removed),
        "{removed}"
    );
    let (lists, listed, deletes, gets) = store.take();
    // The old prune listed once more per evicted entry (151 lists here).
    assert_eq!(lists, 1, "one listing, whatever the number evicted");
    assert_eq!(listed, 3 * ENTRIES);
    assert_eq!(
        deletes,
        3 * removed,
        "record, program, executable of each evicted entry"
    );
    assert_eq!(gets, 0);
    let left: u64 = store
        .inner
        .list("entries/")
        .unwrap()
        .iter()
        .map(|o| o.size)
        .sum();
    assert!(left <= bytes / 2, "{left} > {}", bytes / 2);
}

#[test]
fn puts_at_the_bound_do_bounded_eviction_work() {
    let dir = tempfile::tempdir().unwrap();
    let (store, bytes) = filled(&dir.path().join("c"));
    // The bound reached, as in the issue: every new entry must evict.
    let bounded = CacheOptions {
        max_local_bytes: Some(bytes),
        ..opts()
    };
    let c = Cache::with_stores(vec![store.clone()], bounded).unwrap();
    let mut max_deletes = 0;
    let mut lists = 0;
    let puts = 60;
    for i in 0..puts {
        let k = key(&format!("new {i}"));
        c.put(&k, &exe_for(&k, EXE), "prog", &inputs("n"), 1.0);
        let (l, listed, deletes, _) = store.take();
        lists += l;
        assert!(
            listed <= 3 * (ENTRIES + puts),
            "one listing at most per put: {listed}"
        );
        max_deletes = max_deletes.max(deletes);
    }
    // The old bound listed the whole tier on every put (60 listings here), plus one per
    // evicted entry.
    assert!(lists <= 2, "{lists} listings for {puts} puts");
    // At most 32 entries of 3 objects, and the put's own delete of a failure record.
    assert!(
        max_deletes <= 3 * 32 + 1,
        "{max_deletes} deletes in one put"
    );
    let left: u64 = store
        .inner
        .list("entries/")
        .unwrap()
        .iter()
        .map(|o| o.size)
        .sum();
    assert!(left <= bytes, "the bound holds: {left} > {bytes}");
    // The newest entries are there; the oldest went.
    assert!(c.contains(&key(&format!("new {}", puts - 1))));
    assert!(!c.contains(&key("scale 0")));
}

#[test]
fn verify_fix_lists_a_constant_number_of_times_however_many_entries_are_bad() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("c");
    let (store, _) = filled(&root);
    let bad = 50;
    for i in 0..bad {
        let k = key(&format!("scale {i}"));
        std::fs::write(root.join(exe_obj(&k, &exe_for(&k, EXE))), vec![0u8; EXE]).unwrap();
    }
    let c = Cache::with_stores(vec![store.clone()], opts()).unwrap();
    let r = c.verify(true).unwrap();
    assert_eq!((r.checked, r.bad.len(), r.removed), (ENTRIES, bad, bad));
    let (lists, _, deletes, gets) = store.take();
    // entries/ and locks/; the old verify listed once more per bad entry.
    assert_eq!(lists, 2);
    assert_eq!(deletes, 3 * bad);
    assert_eq!(
        gets,
        2 * ENTRIES,
        "record and executable of each entry, once"
    );
}
