//! Issue 23 item 6: a process waiting on another host's lease on S3 backs off exponentially
//! with jitter up to a cap, and throttling (503 SlowDown) makes it wait longer, not give up
//! and compile. Against moto through the tests' fault proxy; the waiter's requests are what
//! the cache's wait metrics report and what the proxy saw.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use neuron_pc_cache::{CacheOptions, Obtained};

fn proxied() -> (Fixture, Proxy) {
    let proxy = std::cell::RefCell::new(None);
    let f = Fixture::with_endpoint(
        Backend::S3,
        Some(&|m: &Moto| {
            let p = Proxy::start(m.port);
            let e = p.endpoint();
            *proxy.borrow_mut() = Some(p);
            e
        }),
    );
    (f, proxy.into_inner().expect("proxy started"))
}

fn waiting_opts() -> CacheOptions {
    CacheOptions {
        lock_poll_first: Duration::from_millis(50),
        lock_poll_cap: Duration::from_millis(800),
        // Renewed every 2 s, so the holder's renewals meet the throttling too.
        lease_secs: 6,
        ..opts()
    }
}

/// Starts a holder that takes the lease of `k` and compiles for `secs`; returns once it
/// holds the lease.
fn holder(f: &Fixture, k: &neuron_pc_cache::EntryKey, secs: f64) -> std::thread::JoinHandle<()> {
    let c = Arc::new(f.cache(waiting_opts()));
    let (tx, rx) = std::sync::mpsc::channel();
    let k = k.clone();
    let t = std::thread::spawn(move || {
        let r = c.get_or_compile(&k, "prog", &inputs("w"), false, || {
            tx.send(()).unwrap();
            std::thread::sleep(Duration::from_secs_f64(secs));
            Ok(exe_for(&k, 400))
        });
        assert!(matches!(r, Ok(Obtained::Compiled { .. })), "{r:?}");
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("holder compiles");
    t
}

#[test]
fn a_waiter_backs_off_and_its_requests_are_in_the_metrics() {
    let (f, p) = proxied();
    let k = key("backoff waiter");
    let h = holder(&f, &k, 4.0);
    let before = p.state.requests.load(Ordering::SeqCst);
    let waiter = f.cache(waiting_opts());
    let got = waiter
        .get_or_compile(&k, "prog", &inputs("w"), false, || {
            panic!("the waiter must not compile")
        })
        .unwrap();
    h.join().unwrap();
    assert!(matches!(got, Obtained::Waited(_)), "{got:?}");
    let seen = p.state.requests.load(Ordering::SeqCst) - before;
    let m = waiter.wait_metrics();
    assert_eq!(m.waits, 1);
    assert!(m.wait_secs > 3.0, "{m:?}");
    // Pauses of 50, 100, 200, 400 ms, then 800 ms: about 9 looks in 4 s, 3 requests each.
    // The old loop polled every 50 ms with 4 requests a look: over 300 requests.
    assert!(m.requests >= 6 && m.requests <= 45, "{m:?}");
    assert!(
        m.requests_per_waiter_minute < 700.0,
        "{} requests per waiter-minute",
        m.requests_per_waiter_minute
    );
    // The metrics count the waiter's own requests: the proxy saw those and the holder's few.
    assert!(seen as u64 >= m.requests, "{seen} < {m:?}");
    assert!(seen as u64 <= m.requests + 15, "{seen} vs {m:?}");
    fault_report(
        "waiters on a remote lease (request rate)",
        1,
        &format!(
            "backs off to the cap: {:.0} requests per waiter-minute",
            m.requests_per_waiter_minute
        ),
        0,
        0,
    );
}

#[test]
fn throttling_makes_a_waiter_wait_longer_not_compile() {
    let (f, p) = proxied();
    let k = key("throttled waiter");
    let h = holder(&f, &k, 4.0);
    let waiter = Arc::new(f.cache(waiting_opts()));
    let w = waiter.clone();
    let wk = k.clone();
    let t = std::thread::spawn(move || {
        w.get_or_compile(&wk, "prog", &inputs("w"), false, || {
            Err("the waiter compiled".into())
        })
    });
    // While the holder compiles, every request is answered 503 SlowDown for 2.7 s, its lease
    // renewal at 2 s included (the old waiter gave up after its retries, 0.4 s, and compiled).
    std::thread::sleep(Duration::from_millis(300));
    let before = p.state.requests.load(Ordering::SeqCst);
    p.set_always(Some(Fault::Status(503)));
    std::thread::sleep(Duration::from_millis(2700));
    p.set_always(None);
    let throttled = p.state.requests.load(Ordering::SeqCst) - before;
    assert!(throttled > 0, "the waiter was throttled");
    h.join().unwrap();
    let got = t.join().unwrap();
    assert!(matches!(got, Ok(Obtained::Waited(_))), "{got:?}");
    assert!(
        f.cache(opts()).disabled_tiers().is_empty(),
        "throttling does not switch the tier off"
    );
    assert!(waiter.disabled_tiers().is_empty());
    // The holder's throttled renewals did not switch the tier off for it: its entry is there.
    let fresh = f.cache(opts());
    assert!(fresh.contains(&k), "the holder stored its entry in S3");
    fault_report(
        "503 SlowDown while waiting on a remote lease",
        1,
        "waits longer, one compile in all",
        0,
        0,
    );
}

/// Throttling is told from other trouble by the answer, not by digits that happen to be in a
/// message (an endpoint's port like 15031 must not read as "503").
#[test]
fn throttling_is_told_from_other_trouble() {
    let (f, p) = proxied();
    let s = f.last().clone();
    p.set_always(Some(Fault::Status(503)));
    let e = s.get("entries/ab/x.json").unwrap_err();
    assert!(e.is_throttled(), "{e}");
    p.set_always(Some(Fault::Status(500)));
    let e = s.get("entries/ab/x.json").unwrap_err();
    assert!(!e.is_throttled(), "{e}");
    p.set_always(None);
    // Nothing listens on a port whose digits contain 503.
    let port = (15030..15040)
        .find(|port| std::net::TcpListener::bind(("127.0.0.1", *port)).is_ok())
        .expect("a free port among 15030-15039");
    let dead = neuron_pc_cache::S3Store::open(
        "s3://nobody/x",
        &s3_opts(&format!("http://127.0.0.1:{port}")),
    )
    .unwrap();
    let e = neuron_pc_cache::Store::get(&dead, "entries/ab/x.json").unwrap_err();
    assert!(!e.is_throttled(), "{e}");
}

/// Requests per second of waiting that a waiter sends through its own proxy while a holder
/// (straight to the server, so the proxy sees the waiter alone) compiles for 3 s; with
/// `storm`, every request the waiter sends is answered 503 SlowDown until the holder is done.
fn waiter_request_rate(storm: bool) -> f64 {
    let m = moto();
    let bucket = common::server::new_bucket(&m, "storm");
    let url = format!("s3://{bucket}/pre/fix");
    let direct = neuron_pc_cache::S3Store::open(&url, &s3_opts(&m.endpoint())).unwrap();
    let p = Proxy::start(m.port);
    let proxied = neuron_pc_cache::S3Store::open(&url, &s3_opts(&p.endpoint())).unwrap();
    let cache = |s: neuron_pc_cache::S3Store| {
        let stores: Vec<Arc<dyn neuron_pc_cache::Store>> = vec![Arc::new(s)];
        Arc::new(neuron_pc_cache::Cache::with_stores(stores, waiting_opts()).unwrap())
    };
    let (holder, waiter) = (cache(direct), cache(proxied));
    let k = key(if storm {
        "storm waiter"
    } else {
        "quiet waiter"
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let hk = k.clone();
    let h = std::thread::spawn(move || {
        holder.get_or_compile(&hk, "prog", &inputs("w"), false, || {
            tx.send(()).unwrap();
            std::thread::sleep(Duration::from_secs(3));
            Ok(exe_for(&hk, 400))
        })
    });
    rx.recv_timeout(Duration::from_secs(20)).unwrap();
    if storm {
        p.set_always(Some(Fault::Status(503)));
    }
    let w = waiter.clone();
    let wk = k.clone();
    let t = std::thread::spawn(move || {
        w.get_or_compile(&wk, "prog", &inputs("w"), false, || {
            Err("the waiter compiled".into())
        })
    });
    assert!(matches!(h.join().unwrap(), Ok(Obtained::Compiled { .. })));
    p.set_always(None);
    let got = t.join().unwrap();
    // waited for it, or took the lease the holder had just given back and found its entry
    assert!(
        matches!(got, Ok(Obtained::Waited(_) | Obtained::Hit(_))),
        "{got:?}"
    );
    let m = waiter.wait_metrics();
    assert_eq!(m.waits, 1, "{m:?}");
    p.state.requests.load(Ordering::SeqCst) as f64 / m.wait_secs
}

#[test]
fn a_503_storm_costs_a_waiter_no_more_requests_than_a_quiet_server() {
    let quiet = waiter_request_rate(false);
    let storm = waiter_request_rate(true);
    // Before: every look retried each throttled read twice (the client's own retries under
    // the waiter's back-off), 1.76x a quiet server's requests in the chaos run.
    assert!(
        storm <= 1.1 * quiet,
        "{storm:.2} requests/s in a 503 storm against {quiet:.2} from a quiet server"
    );
    fault_report(
        "503 storm while waiting on a remote lease (request rate)",
        1,
        &format!(
            "{:.2}x a quiet server's requests per second of waiting",
            storm / quiet
        ),
        0,
        0,
    );
}
