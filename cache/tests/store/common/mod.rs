//! Shared test fixtures: the three backends (local, S3 on a loopback moto_server, tiered), keys
//! and executables whose bytes are a function of their key (so a wrong executable is
//! detectable), and the object layout the cache promises.

#![allow(dead_code)]

pub mod server;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use neuron_pc_cache::{Cache, CacheOptions, EntryKey, LocalStore, S3Options, S3Store, Store};
use sha2::{Digest, Sha256};

/// The fault-injecting S3 proxy, from the workspace's test-support crate (the root crate's
/// tests use it too).
#[allow(unused_imports)]
pub use neuron_pc_test_support::proxy::{self, Fault, Proxy};
pub use server::{moto, Moto};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Local,
    S3,
    Tiered,
}

pub const ALL: [Backend; 3] = [Backend::Local, Backend::S3, Backend::Tiered];

/// One cache location with handles on its raw stores, for tampering.
pub struct Fixture {
    pub backend: Backend,
    pub dir: tempfile::TempDir,
    pub bucket: Option<String>,
    pub endpoint: Option<String>,
    pub moto: Option<Arc<Moto>>,
    /// The stores, fastest first, exactly as the cache sees them.
    pub stores: Vec<Arc<dyn Store>>,
}

/// Test timeouts (short, so fault tests stay fast) and explicit credentials (moto accepts
/// any), so no test depends on or changes the process environment.
pub fn s3_opts(endpoint: &str) -> S3Options {
    S3Options {
        timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(1),
        max_retries: 2,
        retry_timeout: Duration::from_secs(4),
        initial_backoff: Duration::from_millis(20),
        endpoint: Some(endpoint.to_string()),
        credentials: Some(("testing".into(), "testing".into())),
        ..S3Options::default()
    }
}

impl Fixture {
    pub fn new(backend: Backend) -> Fixture {
        Fixture::with_endpoint(backend, None)
    }

    /// With `via` set, S3 requests go to the endpoint it returns (a proxy) instead of the
    /// server's.
    pub fn with_endpoint(backend: Backend, via: Option<&dyn Fn(&Moto) -> String>) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let local = dir.path().join("local");
        let mut f = Fixture {
            backend,
            dir,
            bucket: None,
            endpoint: None,
            moto: None,
            stores: Vec::new(),
        };
        if backend != Backend::S3 {
            f.stores
                .push(Arc::new(LocalStore::open(&local).expect("local store")));
        }
        if backend != Backend::Local {
            let m = moto();
            let bucket = server::new_bucket(&m, "t");
            let endpoint = match via {
                Some(v) => v(&m),
                None => m.endpoint(),
            };
            let s3 = S3Store::open(&format!("s3://{bucket}/pre/fix"), &s3_opts(&endpoint))
                .expect("s3 store");
            f.stores.push(Arc::new(s3));
            f.bucket = Some(bucket);
            f.endpoint = Some(endpoint);
            f.moto = Some(m);
        }
        f
    }

    /// A new cache over the same storage (another "process").
    pub fn cache(&self, opts: CacheOptions) -> Cache {
        Cache::with_stores(self.stores.clone(), opts).expect("cache")
    }

    pub fn local_root(&self) -> PathBuf {
        self.dir.path().join("local")
    }

    /// The URL and options a user would give for this location.
    pub fn url_and_opts(&self, mut opts: CacheOptions) -> (String, CacheOptions) {
        match self.backend {
            Backend::Local => (self.local_root().display().to_string(), opts),
            Backend::S3 | Backend::Tiered => {
                opts.s3 = s3_opts(self.endpoint.as_deref().unwrap_or_default());
                opts.local_tier = self.backend == Backend::Tiered;
                opts.local_dir = Some(self.local_root());
                (
                    format!(
                        "s3://{}/pre/fix",
                        self.bucket.as_deref().unwrap_or_default()
                    ),
                    opts,
                )
            }
        }
    }

    /// The store furthest from the reader (the shared one).
    pub fn last(&self) -> &Arc<dyn Store> {
        self.stores.last().expect("a store")
    }
}

pub fn opts() -> CacheOptions {
    CacheOptions {
        lock_wait: Duration::from_secs(30),
        compiler_version: "test-compiler 1".into(),
        ..CacheOptions::default()
    }
}

/// A key derived from a label.
pub fn key(label: &str) -> EntryKey {
    EntryKey::parse(&hex::encode(Sha256::digest(label.as_bytes()))).expect("hex key")
}

/// Executable bytes that belong to `key` alone.
pub fn exe_for(key: &EntryKey, len: usize) -> Vec<u8> {
    let seed = Sha256::digest(key.as_str().as_bytes());
    (0..len).map(|i| seed[i % 32] ^ (i / 32) as u8).collect()
}

pub fn inputs(label: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("program".to_string(), label.to_string()),
        ("target".to_string(), "cpu".to_string()),
    ])
}

pub fn sha16(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))[..16].to_string()
}

/// Object names of an entry (the layout documented in the README).
pub fn record_obj(k: &EntryKey) -> String {
    format!("entries/{}/{k}.json", &k.as_str()[..2])
}
pub fn exe_obj(k: &EntryKey, exe: &[u8]) -> String {
    format!("entries/{}/{k}.{}.exe", &k.as_str()[..2], sha16(exe))
}
pub fn program_obj(k: &EntryKey) -> String {
    format!("entries/{}/{k}.mlir", &k.as_str()[..2])
}
pub fn lock_obj(k: &EntryKey) -> String {
    format!("locks/{k}.lock")
}
pub fn failure_obj(k: &EntryKey) -> String {
    format!("failures/{k}.json")
}

/// Every file under `dir` whose name starts with `.tmp.`.
pub fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if e.file_name().to_string_lossy().starts_with(".tmp.") {
                out.push(p);
            }
        }
    }
    out
}

/// A hit's bytes, or `None` for a miss; panics on a recorded failure.
pub fn hit_bytes(c: &Cache, k: &EntryKey) -> Option<Vec<u8>> {
    match c.get(k) {
        neuron_pc_cache::Lookup::Hit(h) => Some(h.executable),
        neuron_pc_cache::Lookup::Miss => None,
        neuron_pc_cache::Lookup::Failed(f) => panic!("unexpected failure record: {f:?}"),
    }
}

/// One line of the fault report (`scripts/fault-report` collects them from the test output):
/// a fault class, how many trials, what happened, entries lost and wrong executables served.
pub fn fault_report(class: &str, trials: usize, outcome: &str, lost: usize, wrong: usize) {
    println!("FAULT-REPORT\t{class}\t{trials}\t{outcome}\t{lost}\t{wrong}");
}

/// A small xorshift generator: reproducible randomness without a dependency.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
