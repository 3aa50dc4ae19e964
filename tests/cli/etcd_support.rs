//! A real etcd (Debian's `etcd-server`) on loopback with a temporary data directory, stopped
//! by its pid; shared by the tests that need the run's store (included with `#[path]`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use neuron_pc::store::{self, KvStore, StoreUrl};
use neuron_pc_test_support::launch::free_port;

/// A running etcd; dropping it stops it (SIGTERM, SIGKILL after 10 s) and removes its data.
pub struct Etcd {
    child: Child,
    dir: PathBuf,
    pub url: String,
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
    pub fn start(tag: &str) -> Option<Etcd> {
        let Some(bin) = etcd_binary() else {
            println!(
                "skipped: etcd not found (Debian package etcd-server; scripts/setup installs it)"
            );
            return None;
        };
        let dir = std::env::temp_dir().join(format!("npc-etcd-{tag}-{}", std::process::id()));
        // The ports are free when picked but not held: another process (a test run beside this
        // one) may take one before etcd binds it. etcd then exits at once, and is started again
        // on new ports.
        for attempt in 1..=3 {
            match Etcd::try_start(&bin, &dir) {
                Ok(e) => return Some(e),
                Err(log) if attempt < 3 => {
                    println!("etcd exited at start (attempt {attempt}): {log}")
                }
                Err(log) => panic!("etcd exited at start three times; the last log:\n{log}"),
            }
        }
        unreachable!()
    }

    /// One start on new ports; the log of an etcd that exited before answering.
    fn try_start(bin: &Path, dir: &Path) -> Result<Etcd, String> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
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
            dir: dir.to_path_buf(),
            url: format!("etcd://127.0.0.1:{client}"),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if store::connect(&e.store_url(), Duration::from_millis(500)).is_ok() {
                return Ok(e);
            }
            if !matches!(e.child.try_wait(), Ok(None)) {
                let log = std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                // (dropping `e` would remove the directory: the log is read first)
                drop(e);
                return Err(tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
            }
            assert!(Instant::now() < deadline, "etcd answering within 30 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn store_url(&self) -> StoreUrl {
        StoreUrl::parse(&self.url).unwrap()
    }

    pub fn connect(&self) -> Arc<dyn KvStore> {
        store::connect(&self.store_url(), Duration::from_secs(5)).unwrap()
    }

    pub fn stop(&mut self) {
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
