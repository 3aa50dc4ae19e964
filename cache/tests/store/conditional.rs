//! Issue 23 item 5: an S3-compatible server that ignores `If-None-Match: *` on PUT (the tests'
//! proxy drops the header in front of moto). The cache asks once per process, says so, and
//! falls back to compare-after-write, so racing processes still compile each graph once and
//! leave no orphan executables.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use neuron_pc_cache::{Cache, Obtained, S3Store, Store};

/// moto behind a proxy, optionally one that drops conditional headers; the URL and endpoint.
fn server(strip: bool) -> (Arc<Moto>, Proxy, String) {
    let m = moto();
    let bucket = server::new_bucket(&m, "cond");
    let p = Proxy::start(m.port);
    if strip {
        p.set_always(Some(Fault::StripConditional));
    }
    (m, p, format!("s3://{bucket}/c"))
}

fn store(url: &str, p: &Proxy) -> Arc<dyn Store> {
    Arc::new(S3Store::open(url, &s3_opts(&p.endpoint())).unwrap())
}

#[test]
fn the_probe_tells_a_server_that_ignores_conditional_put_and_asks_once() {
    for (strip, honoured) in [(false, true), (true, false)] {
        let (_m, p, url) = server(strip);
        let s = S3Store::open(&url, &s3_opts(&p.endpoint())).unwrap();
        assert_eq!(s.conditional_put().unwrap(), honoured, "strip {strip}");
        let asked = p.state.requests.load(Ordering::SeqCst);
        assert_eq!(s.conditional_put().unwrap(), honoured);
        assert_eq!(
            p.state.requests.load(Ordering::SeqCst),
            asked,
            "asked once per store"
        );
        let c = Cache::with_stores(vec![Arc::new(s)], opts()).unwrap();
        let without = c.without_conditional_put().unwrap();
        assert_eq!(without.is_empty(), honoured, "{without:?}");
        // The probe object is gone.
        let probe = c.probe(&key(&format!("doctor {strip}")), b"x");
        assert_eq!(probe[0].conditional_put, Some(honoured));
        assert!(c.stats().unwrap().locks == 0, "the probe object is deleted");
    }
}

/// Four processes (each its own store and cache) race on two graphs: two compiles in all,
/// one executable per key, `verify` clean. Without the fallback every process took the lease
/// and the record's create-only PUT: eight compiles and orphan executables.
#[test]
fn racing_processes_compile_each_graph_once_without_conditional_put() {
    let (_m, p, url) = server(true);
    let compiles = Arc::new(AtomicUsize::new(0));
    let keys = [key("cond race a"), key("cond race b")];
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let (url, endpoint) = (url.clone(), p.endpoint());
            let (compiles, keys) = (compiles.clone(), keys.clone());
            std::thread::spawn(move || {
                let s: Arc<dyn Store> = Arc::new(S3Store::open(&url, &s3_opts(&endpoint)).unwrap());
                let c = Cache::with_stores(vec![s], opts()).unwrap();
                for j in 0..2 {
                    let k = &keys[(i + j) % 2];
                    let got = c
                        .get_or_compile(k, "prog", &inputs("race"), false, || {
                            compiles.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(600));
                            Ok(exe_for(k, 300 + i))
                        })
                        .unwrap();
                    let exe = match got {
                        Obtained::Hit(h) | Obtained::Waited(h) => h.executable,
                        Obtained::Compiled { executable, .. } => executable,
                    };
                    assert_eq!(&exe[..32], &exe_for(k, 32)[..], "the key's own executable");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(compiles.load(Ordering::SeqCst), 2, "one compile per graph");
    let s = store(&url, &p);
    for k in &keys {
        let exes: Vec<_> = s
            .list(&format!("entries/{}/{k}.", &k.as_str()[..2]))
            .unwrap()
            .into_iter()
            .filter(|o| o.name.ends_with(".exe"))
            .collect();
        assert_eq!(exes.len(), 1, "no orphan executables: {exes:?}");
    }
    let c = Cache::with_stores(vec![s], opts()).unwrap();
    let r = c.verify(false).unwrap();
    assert_eq!((r.checked, r.bad.len()), (2, 0), "{r:?}");
    fault_report(
        "S3 server ignoring If-None-Match (4 processes, 2 graphs)",
        1,
        "detected once; compare-after-write: 2 compiles",
        0,
        0,
    );
}
