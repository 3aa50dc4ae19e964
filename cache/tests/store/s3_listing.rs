//! Issue 23 item 3: on S3 the timeout bounds each request (each page of a listing), not a whole
//! listing. A cache of 1,002 objects (two pages) behind a proxy that delays every listing page
//! by 2 s, with a budget of 3.3 s per request: `ls`, `stats` and `verify` succeed, where the
//! old single budget over the whole listing (two pages, over 4 s) failed them all.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use neuron_pc_cache::{Cache, CacheOptions, S3Options, S3Store, Store};

const ENTRIES: usize = 334; // 3 objects each: 1,002 objects, two pages

fn slow_pages_opts(endpoint: &str) -> S3Options {
    S3Options {
        timeout: Duration::from_millis(3000),
        retry_timeout: Duration::from_millis(300),
        ..s3_opts(endpoint)
    }
}

#[test]
fn ls_stats_and_verify_over_many_pages_each_page_within_the_budget() {
    let m = moto();
    let bucket = server::new_bucket(&m, "pages");
    let url = format!("s3://{bucket}/c");
    // Fill directly (four writers), not through the slow proxy.
    let fillers: Vec<_> = (0..4)
        .map(|w| {
            let (url, endpoint) = (url.clone(), m.endpoint());
            std::thread::spawn(move || {
                let s: Arc<dyn Store> = Arc::new(S3Store::open(&url, &s3_opts(&endpoint)).unwrap());
                let c = Cache::with_stores(vec![s], opts()).unwrap();
                for i in (w..ENTRIES).step_by(4) {
                    let k = key(&format!("page entry {i}"));
                    c.put(&k, &exe_for(&k, 64), "p", &inputs("pages"), 1.0);
                }
            })
        })
        .collect();
    for f in fillers {
        f.join().unwrap();
    }
    let p = Proxy::start(m.port);
    *p.state.only_path.lock().unwrap() = Some("list-type".into());
    p.push(Fault::Delay(Duration::from_secs(2)), 100);
    let opts = slow_pages_opts(&p.endpoint());
    assert!(
        opts.budget() < Duration::from_secs(4),
        "two pages exceed one budget"
    );
    let s: Arc<dyn Store> = Arc::new(S3Store::open(&url, &opts).unwrap());
    let c = Cache::with_stores(vec![s], CacheOptions { ..common::opts() }).unwrap();

    let listed = c.list().expect("ls over two slow pages");
    assert_eq!(listed.len(), ENTRIES);
    assert!(listed.iter().all(|e| e.problem.is_none()));
    let stats = c.stats().expect("stats over two slow pages");
    assert_eq!(stats.entries, ENTRIES);
    let r = c.verify(false).expect("verify over two slow pages");
    assert_eq!((r.checked, r.bad.len()), (ENTRIES, 0));
    assert!(c.disabled_tiers().is_empty());

    // A page slower than the per-request bound still fails, within about one budget.
    let s: Arc<dyn Store> = Arc::new(S3Store::open(&url, &opts).unwrap());
    *p.state.next.lock().unwrap() = [Fault::Delay(Duration::from_secs(6))].into();
    let t = std::time::Instant::now();
    let e = s.list("entries/").unwrap_err().to_string();
    assert!(e.contains("unavailable"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    fault_report(
        "S3 listing of many pages, each slow (1,002 objects)",
        1,
        "budget per page: ls, stats, verify succeed",
        0,
        0,
    );
}
