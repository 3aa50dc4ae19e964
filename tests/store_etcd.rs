//! The run's key-value store on a real etcd (Debian's `etcd-server`), started here on loopback
//! with a temporary data directory and stopped by its pid.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use neuron_pc::store::{self, KvStore, RunScope, ScopedStore, StoreError, StoreUrl};

/// A running etcd; dropping it stops it (SIGTERM, SIGKILL after 10 s) and removes its data.
struct Etcd {
    child: Child,
    dir: PathBuf,
    url: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn etcd_binary() -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/bin", "/usr/local/bin"])
        .map(|d| Path::new(d).join("etcd"))
        .find(|p| p.is_file());
    found
}

impl Etcd {
    /// Starts etcd; `None` (after one printed line) where it is not installed.
    fn start(tag: &str) -> Option<Etcd> {
        let Some(bin) = etcd_binary() else {
            println!(
                "skipped: etcd not found (Debian package etcd-server; scripts/setup installs it)"
            );
            return None;
        };
        let dir = std::env::temp_dir().join(format!("npc-etcd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (client, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
        let child = Command::new(bin)
            .arg("--name=npc")
            .arg(format!("--data-dir={}", dir.join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=npc={peer_url}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let mut e = Etcd {
            child,
            dir,
            url: format!("etcd://127.0.0.1:{client}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if store::connect(&e.store_url(), Duration::from_millis(500)).is_ok() {
                return Some(e);
            }
            assert!(
                matches!(e.child.try_wait(), Ok(None)),
                "etcd exited; see {}",
                e.dir.join("etcd.log").display()
            );
            assert!(Instant::now() < deadline, "etcd answering within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn store_url(&self) -> StoreUrl {
        StoreUrl::parse(&self.url).unwrap()
    }

    fn connect(&self) -> Arc<dyn KvStore> {
        store::connect(&self.store_url(), Duration::from_secs(5)).unwrap()
    }

    fn stop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

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
