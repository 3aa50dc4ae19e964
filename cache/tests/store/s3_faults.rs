//! S3 trouble through a fault-injecting proxy in front of moto_server: 5xx and throttling,
//! responses cut mid-body, timeouts, refused credentials, a server that is down at start or
//! goes away mid-run; and a read-only client that must send zero writes.

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use neuron_pc_cache::{Cache, CacheOptions, Error, Lookup, Obtained, PutOutcome, Tier};

/// A fixture whose S3 requests pass through a proxy.
fn proxied(b: Backend) -> (Fixture, Proxy) {
    let proxy = std::cell::RefCell::new(None);
    let f = Fixture::with_endpoint(
        b,
        Some(&|m: &Moto| {
            let p = Proxy::start(m.port);
            let e = p.endpoint();
            *proxy.borrow_mut() = Some(p);
            e
        }),
    );
    let p = proxy.into_inner().expect("proxy started");
    (f, p)
}

fn quick() -> CacheOptions {
    CacheOptions {
        retry_down_after: Duration::from_millis(300),
        ..opts()
    }
}

#[test]
fn transient_errors_are_retried() {
    let (f, p) = proxied(Backend::S3);
    let c = f.cache(quick());
    let k = key("transient");
    let exe = exe_for(&k, 50_000);
    p.push(Fault::Status(503), 1);
    p.push(Fault::Status(500), 1);
    assert_eq!(c.put(&k, &exe, "", &inputs("t"), 1.0), PutOutcome::Stored);
    for code in [500, 503] {
        p.push(Fault::Status(code), 2);
        assert_eq!(
            hit_bytes(&c, &k),
            Some(exe.clone()),
            "{code} twice is within the retry bound"
        );
    }
    assert!(
        p.state.next.lock().unwrap().is_empty(),
        "every injected fault was met"
    );
}

#[test]
fn persistent_errors_are_a_bounded_miss_and_the_tier_comes_back() {
    let (f, p) = proxied(Backend::S3);
    let c = f.cache(quick());
    let k = key("persistent");
    let exe = exe_for(&k, 1000);
    c.put(&k, &exe, "", &inputs("p"), 1.0);
    p.set_always(Some(Fault::Status(500)));
    let before = p.state.requests.load(Ordering::SeqCst);
    let t = Instant::now();
    assert!(matches!(c.get(&k), Lookup::Miss));
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "retries are bounded: {:?}",
        t.elapsed()
    );
    let used = p.state.requests.load(Ordering::SeqCst) - before;
    assert!(
        (2..=4).contains(&used),
        "one request plus at most 2 retries, got {used}"
    );
    // While down, the tier is skipped: no request, no wait.
    let t = Instant::now();
    let got = c
        .get_or_compile(&k, "", &inputs("p"), false, || Ok(exe.clone()))
        .unwrap();
    assert!(matches!(got, Obtained::Compiled { .. }));
    assert!(t.elapsed() < Duration::from_millis(250));
    assert_eq!(c.disabled_tiers().len(), 1);
    p.set_always(None);
    std::thread::sleep(Duration::from_millis(350));
    assert_eq!(
        hit_bytes(&c, &k),
        Some(exe),
        "the tier is retried after the outage window"
    );
    fault_report(
        "S3 answering 500 on every request",
        1,
        &format!("bounded miss ({used} requests), tier skipped, back after the window"),
        0,
        0,
    );
}

#[test]
fn responses_cut_mid_body_never_give_a_wrong_executable() {
    let (f, p) = proxied(Backend::S3);
    let c = f.cache(quick());
    let k = key("cut");
    let exe = exe_for(&k, 300_000);
    c.put(&k, &exe, "", &inputs("c"), 1.0);
    *p.state.only_path.lock().unwrap() = Some(".exe".into());
    let mut hits = 0;
    for n in [1, 1, 2, 3, 5] {
        p.push(Fault::CutBody, n);
        let fresh = f.cache(quick());
        if let Some(b) = hit_bytes(&fresh, &k) {
            assert_eq!(b, exe, "a cut body must never be returned");
            hits += 1;
        }
        p.state.next.lock().unwrap().clear();
    }
    assert!(hits >= 1, "a single cut is retried into a hit");
    fault_report(
        "S3 response cut mid-body",
        5,
        &format!("{hits} retried into a verified hit, {} misses", 5 - hits),
        0,
        0,
    );
}

#[test]
fn a_connection_dropped_mid_put_is_retried_into_a_complete_entry() {
    let (f, p) = proxied(Backend::S3);
    let c = f.cache(quick());
    let mut stored = 0;
    for (i, what) in ["exe", "record"].into_iter().enumerate() {
        let k = key(&format!("reset {what}"));
        let exe = exe_for(&k, 50_000 + i);
        // The PUT of this one object is read in full, then its connection closes unanswered.
        let obj = match what {
            "exe" => exe_obj(&k, &exe),
            _ => record_obj(&k),
        };
        p.only("PUT", &obj);
        p.push(Fault::Reset, 1);
        let writes = p.writes();
        let out = c.put(&k, &exe, "", &inputs("reset"), 1.0);
        assert_eq!(p.pending(), 0, "{what}: the PUT of {obj} met the reset");
        assert!(
            p.writes() > writes,
            "{what}: the proxy counts the dropped PUT"
        );
        // The reset request never reached the server, so a retry writes it; whatever the
        // outcome, a reader never gets a wrong executable.
        match hit_bytes(&f.cache(quick()), &k) {
            Some(b) => {
                assert_eq!(
                    b, exe,
                    "{what}: a dropped PUT must never give a wrong executable"
                );
                stored += 1;
            }
            None => assert_ne!(out, PutOutcome::Stored, "{what}: stored yet missing"),
        }
        assert_eq!(
            out,
            PutOutcome::Stored,
            "{what}: one dropped connection is retried"
        );
    }
    fault_report(
        "S3 connection dropped mid-PUT (request sent, no answer)",
        2,
        &format!("{stored} retried into a complete entry"),
        0,
        0,
    );
}

#[test]
fn timeouts_are_bounded() {
    let (f, p) = proxied(Backend::S3);
    let c = f.cache(quick());
    let k = key("slow");
    let exe = exe_for(&k, 1000);
    c.put(&k, &exe, "", &inputs("s"), 1.0);
    // One slow answer: retried.
    p.push(Fault::Delay(Duration::from_secs(3)), 1);
    assert_eq!(hit_bytes(&f.cache(quick()), &k), Some(exe.clone()));
    // Always slow: a miss within the bound (2 s per try, 4 s of retries).
    p.set_always(Some(Fault::Delay(Duration::from_secs(5))));
    let t = Instant::now();
    assert!(matches!(f.cache(quick()).get(&k), Lookup::Miss));
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    p.set_always(None);
}

#[test]
fn refused_credentials_are_an_error_at_open() {
    let (f, p) = proxied(Backend::Tiered);
    p.set_always(Some(Fault::Status(403)));
    let (url, o) = f.url_and_opts(opts());
    let err = Cache::open(&url, o)
        .err()
        .expect("403 at open must be an error");
    assert!(matches!(err, Error::Denied { .. }), "{err}");
    // Revoked later: a miss with a warning, never a crash.
    p.set_always(None);
    let (url, o) = f.url_and_opts(opts());
    let c = Cache::open(
        &url,
        CacheOptions {
            local_tier: false,
            ..o
        },
    )
    .unwrap();
    p.set_always(Some(Fault::Status(403)));
    assert!(matches!(c.get(&key("revoked")), Lookup::Miss));
}

#[test]
fn a_server_down_at_start_is_skipped_with_the_local_tier_still_working() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts();
    o.s3 = s3_opts(&format!("http://127.0.0.1:{port}"));
    o.local_dir = Some(dir.path().to_path_buf());
    let t = Instant::now();
    let c = Cache::open("s3://nobody-home/x", o).expect("an unreachable server is not fatal");
    let k = key("down at start");
    assert!(matches!(c.get(&k), Lookup::Miss));
    assert_eq!(
        c.put(&k, &[7; 100], "", &inputs("d"), 1.0),
        PutOutcome::Stored
    );
    let Lookup::Hit(h) = c.get(&k) else {
        panic!("local tier serves")
    };
    assert_eq!((h.executable, h.tier), (vec![7; 100], Tier::Local));
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
}

#[test]
fn a_server_stopped_mid_run_is_skipped() {
    let m = server::start();
    let bucket = server::new_bucket(&m, "mid");
    let dir = tempfile::tempdir().unwrap();
    let mut o = quick();
    o.s3 = s3_opts(&m.endpoint());
    o.local_dir = Some(dir.path().to_path_buf());
    let c = Cache::open(&format!("s3://{bucket}/x"), o).unwrap();
    let (a, b) = (key("mid a"), key("mid b"));
    c.put(&a, &exe_for(&a, 100), "", &inputs("m"), 1.0);
    drop(m);
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    assert!(matches!(c.get(&b), Lookup::Miss));
    assert_eq!(
        hit_bytes(&c, &a),
        Some(exe_for(&a, 100)),
        "the local tier still serves"
    );
    let got = c
        .get_or_compile(&b, "", &inputs("m"), false, || Ok(vec![3]))
        .unwrap();
    assert!(matches!(got, Obtained::Compiled { .. }));
    assert!(t.elapsed() < Duration::from_secs(15));
}

#[test]
fn a_read_only_client_sends_zero_writes() {
    for b in [Backend::S3, Backend::Tiered] {
        let (f, p) = proxied(b);
        let k = key("ro hit");
        let exe = exe_for(&k, 2000);
        f.cache(opts()).put(&k, &exe, "prog", &inputs("r"), 1.0);
        f.cache(opts()).put_failure(&key("ro failed"), "boom");
        let before = p.writes();
        assert!(before > 0, "the proxy counts writes");
        // A fresh consumer (empty local tier) in read-only mode.
        let (url, o) = f.url_and_opts(CacheOptions {
            read_only: true,
            ..opts()
        });
        let o = CacheOptions {
            local_dir: Some(f.dir.path().join("consumer")),
            ..o
        };
        let ro = Cache::open(&url, o).unwrap();
        let reads = p.state.requests.load(Ordering::SeqCst);
        assert_eq!(hit_bytes(&ro, &k), Some(exe.clone()), "{b:?}");
        assert!(matches!(ro.get(&key("ro failed")), Lookup::Failed(_)));
        let miss = key("ro miss");
        let got = ro
            .get_or_compile(&miss, "", &inputs("r"), false, || Ok(vec![1]))
            .unwrap();
        assert!(matches!(got, Obtained::Compiled { .. }));
        assert_eq!(
            ro.put(&miss, &[1], "", &inputs("r"), 1.0),
            PutOutcome::ReadOnly
        );
        ro.put_failure(&miss, "x");
        let _ = ro.list().unwrap();
        let _ = ro.stats().unwrap();
        let _ = ro.verify(true).unwrap();
        let _ = ro.program(&k);
        assert!(
            p.state.requests.load(Ordering::SeqCst) > reads,
            "{b:?}: the consumer did talk to the server"
        );
        assert_eq!(p.writes(), before, "{b:?}: a read-only client sent writes");
        fault_report(
            &format!("read-only consumer ({b:?})"),
            1,
            "zero writes sent",
            0,
            0,
        );
    }
}

#[test]
fn racing_writers_on_s3_leave_one_complete_entry() {
    let f = Arc::new(Fixture::new(Backend::S3));
    let k = key("s3 race");
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let (f, k) = (f.clone(), k.clone());
            std::thread::spawn(move || {
                let c = f.cache(opts());
                let exe = exe_for(&key(&format!("variant {i}")), 5000);
                assert_eq!(c.put(&k, &exe, "", &inputs("r"), 1.0), PutOutcome::Stored);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let c = f.cache(opts());
    let won = hit_bytes(&c, &k).expect("one entry won");
    assert!((0..16).any(|i| won == exe_for(&key(&format!("variant {i}")), 5000)));
    let exes = f
        .last()
        .list(&format!("entries/{}/{k}.", &k.as_str()[..2]))
        .unwrap();
    let exes: Vec<_> = exes.iter().filter(|o| o.name.ends_with(".exe")).collect();
    assert_eq!(
        exes.len(),
        1,
        "losers removed their executables: {:?}",
        exes.iter().map(|o| &o.name).collect::<Vec<_>>()
    );
}
