//! The run's key-value store on a real etcd (Debian's `etcd-server`), started here on loopback
//! with a temporary data directory and stopped by its pid.

use crate::etcd_support as etcd_common;

use std::time::{Duration, Instant};

use etcd_common::Etcd;
use neuron_pc::store::{self, KvStore, RunScope, ScopedStore, StoreError};

fn scope(run: &str, attempt: u64) -> RunScope {
    RunScope {
        run_id: run.into(),
        attempt,
    }
}

#[test]
fn etcd_sets_reads_and_waits_for_keys() {
    let Some(etcd) = Etcd::start("kv") else {
        return;
    };
    let s = etcd.connect();
    assert_eq!(s.describe(), etcd.url.replace("etcd://", "etcd at "));
    assert_eq!(s.try_get("/t/absent").unwrap(), None);
    s.set("/t/a", b"one").unwrap();
    assert_eq!(s.try_get("/t/a").unwrap().as_deref(), Some(&b"one"[..]));
    s.set("/t/a", b"two").unwrap();
    assert_eq!(s.try_get("/t/a").unwrap().as_deref(), Some(&b"two"[..]));

    // Another process's connection sets the key 300 ms later: the wait ends with its value.
    let other = etcd.connect();
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        other.set("/t/late", &[0, 255, 7]).unwrap();
    });
    let started = Instant::now();
    let v = s.get("/t/late", Duration::from_secs(10)).unwrap();
    let waited = started.elapsed();
    setter.join().unwrap();
    assert_eq!(v, vec![0, 255, 7]);
    assert!(waited >= Duration::from_millis(250), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");

    // A key nobody sets: an error naming it once the wait is over, not a hang.
    let started = Instant::now();
    let e = s.get("/t/never", Duration::from_millis(600)).unwrap_err();
    let waited = started.elapsed();
    assert!(matches!(e, StoreError::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("/t/never was not set within"), "{e}");
    assert!(waited >= Duration::from_millis(600) && waited < Duration::from_secs(3));
}

#[test]
fn a_restarted_attempt_and_another_run_never_read_stale_values() {
    let Some(etcd) = Etcd::start("scope") else {
        return;
    };
    let raw = etcd.connect();
    let first = ScopedStore::new(raw.clone(), scope("job7", 0));
    let restarted = ScopedStore::new(raw.clone(), scope("job7", 1));
    let other_run = ScopedStore::new(raw.clone(), scope("job8", 0));
    first.set("rank0/addr", b"10.0.0.1:5000").unwrap();
    assert_eq!(restarted.try_get("rank0/addr").unwrap(), None);
    assert_eq!(other_run.try_get("rank0/addr").unwrap(), None);
    let e = restarted
        .get("rank0/addr", Duration::from_millis(300))
        .unwrap_err();
    assert!(matches!(e, StoreError::Timeout { .. }), "{e}");
    restarted.set("rank0/addr", b"10.0.0.2:5000").unwrap();
    assert_eq!(
        first.try_get("rank0/addr").unwrap().as_deref(),
        Some(&b"10.0.0.1:5000"[..])
    );
    // The keys in etcd are /neuron-pc/<run>/<attempt>/<key>.
    assert_eq!(
        raw.try_get("/neuron-pc/job7/1/rank0/addr")
            .unwrap()
            .as_deref(),
        Some(&b"10.0.0.2:5000"[..])
    );
    assert_eq!(
        raw.try_get("/neuron-pc/job7/0/rank0/addr")
            .unwrap()
            .as_deref(),
        Some(&b"10.0.0.1:5000"[..])
    );
}

#[test]
fn an_etcd_that_is_gone_is_one_error_within_the_timeout() {
    let Some(mut etcd) = Etcd::start("gone") else {
        return;
    };
    let s = store::connect(&etcd.store_url(), Duration::from_secs(1)).unwrap();
    s.set("k", b"v").unwrap();
    etcd.stop();
    let started = Instant::now();
    let e = s.set("k", b"w").unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let text = e.to_string();
    assert!(
        text.starts_with(&format!("{}: put k: ", s.describe())),
        "{text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");

    let started = Instant::now();
    let e = match store::connect(&etcd.store_url(), Duration::from_secs(1)) {
        Ok(_) => panic!("connected to a stopped etcd"),
        Err(e) => e,
    };
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(matches!(e, StoreError::Unreachable { .. }), "{e}");
    assert!(e.to_string().contains("cannot connect within 1.0 s"), "{e}");
}
