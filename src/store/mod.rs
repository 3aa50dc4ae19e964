//! A key-value store the processes of one run share, from an existing engine.
//!
//! The processes of a multi-node run need a place to publish small values and wait for each
//! other's (the PJRT client's distributed key-value callbacks, the rank-agreement check). The
//! launchers already run one: TorchElastic's etcd rendezvous on Kubernetes uses etcd, so etcd is
//! the engine here (`NEURON_PC_STORE=etcd://HOST:PORT[,HOST:PORT...]`), behind the small
//! [`KvStore`] trait so another engine is one more implementation.
//!
//! Every key is namespaced by the run and its attempt ([`RunScope`]):
//! `/neuron-pc/<run id>/<attempt>/<key>`. A restarted attempt (torchrun's restart count, a
//! requeued Slurm job, an AWS Batch retry) thus never reads a value an earlier attempt left.
//!
//! A job gets its store with [`from_env`]; another engine implements [`KvStore`] and is seen
//! through a [`ScopedStore`] the same way (here a map in memory):
//!
//! ```
//! use std::collections::HashMap;
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use neuron_pc::store::{self, KvStore, RunScope, ScopedStore};
//!
//! #[derive(Default)]
//! struct MemoryStore(Mutex<HashMap<String, Vec<u8>>>);
//!
//! impl KvStore for MemoryStore {
//!     fn set(&self, key: &str, value: &[u8]) -> store::Result<()> {
//!         self.0.lock().unwrap().insert(key.to_string(), value.to_vec());
//!         Ok(())
//!     }
//!     fn try_get(&self, key: &str) -> store::Result<Option<Vec<u8>>> {
//!         Ok(self.0.lock().unwrap().get(key).cloned())
//!     }
//!     fn describe(&self) -> String {
//!         "memory".into()
//!     }
//! }
//!
//! # fn main() -> store::Result<()> {
//! // The run torchrun started as `--rdzv-id job7`, restarted once.
//! let vars = [("TORCHELASTIC_RUN_ID", "job7"), ("TORCHELASTIC_RESTART_COUNT", "1")];
//! let get = |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string());
//! let scope = RunScope::from_vars(get)?;
//! let store = ScopedStore::new(Arc::new(MemoryStore::default()), scope);
//! assert_eq!(store.full_key("port"), "/neuron-pc/torchelastic-job7/1/port");
//!
//! store.set("port", b"29500")?;
//! assert_eq!(store.get("port", Duration::from_secs(1))?, b"29500");
//! assert!(store.try_get("missing")?.is_none());
//! # Ok(()) }
//! ```

#[cfg(feature = "etcd")]
mod etcd;

use std::sync::Arc;
use std::time::{Duration, Instant};

#[cfg(feature = "etcd")]
pub use etcd::EtcdStore;

/// Selects the store: `etcd://HOST:PORT[,HOST:PORT...]`.
pub const STORE_ENV: &str = "NEURON_PC_STORE";
/// Names the run explicitly (over the launcher's run id).
pub const RUN_ID_ENV: &str = "NEURON_PC_RUN_ID";
/// The time one store operation (connecting included) may take.
pub const STORE_TIMEOUT_ENV: &str = "NEURON_PC_STORE_TIMEOUT";
/// Default for [`STORE_TIMEOUT_ENV`], in seconds.
pub const DEFAULT_TIMEOUT_SECS: f64 = 10.0;

/// A store error; every message names the store and, where there is one, the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// `NEURON_PC_STORE` is not a valid store URL (`etcd://HOST:PORT[,HOST:PORT...]`).
    #[error("{STORE_ENV}={url}: {message}")]
    Url {
        /// The variable's value.
        url: String,
        /// What is wrong with it.
        message: String,
    },
    /// A store is set but no run id names the namespace (see [`RunScope::from_vars`]).
    #[error(
        "{STORE_ENV} is set but this run has no id: set {RUN_ID_ENV} (or start it with \
         torchrun --rdzv-id, Slurm or AWS Batch, which name their runs)"
    )]
    NoRunId,
    /// A variable the store reads does not parse (a restart count, the timeout).
    #[error("{var}={value:?}: {message}")]
    Var {
        /// The variable's name.
        var: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        message: String,
    },
    /// Connecting to the store failed, or it did not answer within the timeout.
    #[error("{store}: cannot connect within {secs:.1} s: {message}")]
    Unreachable {
        /// The store, as [`KvStore::describe`] names it.
        store: String,
        /// The timeout, in seconds.
        secs: f64,
        /// The client's error.
        message: String,
    },
    /// One operation failed or got no answer within the timeout.
    #[error("{store}: {op} {key}: {message}")]
    Op {
        /// The store, as [`KvStore::describe`] names it.
        store: String,
        /// The engine's operation (`put`, `get`).
        op: &'static str,
        /// The key as the engine saw it (through a [`ScopedStore`], with the run's prefix).
        key: String,
        /// The client's error.
        message: String,
    },
    /// [`KvStore::get`] waited its whole timeout and no process set the key.
    #[error("{store}: {key} was not set within {secs:.1} s")]
    Timeout {
        /// The store, as [`KvStore::describe`] names it.
        store: String,
        /// The key as the engine saw it (through a [`ScopedStore`], with the run's prefix).
        key: String,
        /// How long it waited, in seconds.
        secs: f64,
    },
}

/// The store's `Result`.
pub type Result<T> = std::result::Result<T, StoreError>;

/// The operations the processes of a run need: set, read if present, and wait for a key.
pub trait KvStore: Send + Sync {
    /// Sets `key` to `value`, replacing any value.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// The value of `key`, or `None` when it is not set.
    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>>;

    /// The value of `key`, waiting until another process sets it, at most `timeout`.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let started = Instant::now();
        // Polling, 5 ms growing to 100 ms: a value set a moment later is seen within 100 ms,
        // and a wait of minutes costs a few requests per second.
        let mut pause = Duration::from_millis(5);
        loop {
            if let Some(v) = self.try_get(key)? {
                return Ok(v);
            }
            let waited = started.elapsed();
            if waited >= timeout {
                return Err(StoreError::Timeout {
                    store: self.describe(),
                    key: key.to_string(),
                    secs: waited.as_secs_f64(),
                });
            }
            std::thread::sleep(pause.min(timeout - waited));
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }

    /// The engine and where it is, for messages (`etcd at 127.0.0.1:2379`).
    fn describe(&self) -> String;

    /// Sets `key` to `value` for as long as this process lives: the store keeps it while the
    /// process renews it, and drops it within `ttl` of the process's death (an etcd lease, as
    /// TorchElastic's etcd rendezvous keeps its members'). `false` where the engine has no
    /// such keys (the caller then cannot tell a dead process from a slow one).
    fn set_while_alive(&self, key: &str, value: &[u8], ttl: Duration) -> Result<bool> {
        let _ = (key, value, ttl);
        Ok(false)
    }
}

/// One attempt of one run: the namespace its keys live in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunScope {
    /// The run's id: `NEURON_PC_RUN_ID`, or the launcher's id with a prefix naming the launcher
    /// (`torchelastic-`, `slurm-`, `aws-batch-`, `sagemaker-`).
    pub run_id: String,
    /// 0 for the first attempt, counting the restarts.
    pub attempt: u64,
}

impl RunScope {
    /// The scope the variables `get` returns describe (`None`: unset or empty), first match:
    /// `NEURON_PC_RUN_ID`; torchrun's `TORCHELASTIC_RUN_ID` (its default `none` is no id) with
    /// `TORCHELASTIC_RESTART_COUNT`; Slurm's `SLURM_JOB_ID` and `SLURM_STEP_ID` with
    /// `SLURM_RESTART_COUNT`; AWS Batch's `AWS_BATCH_JOB_ID` (a node's `#N` suffix dropped)
    /// with `AWS_BATCH_JOB_ATTEMPT` (1-based); SageMaker's `TRAINING_JOB_NAME`. The attempt of
    /// an explicit run id is `NEURON_PC_RUN_ATTEMPT`, else the launcher's, else 0.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<RunScope> {
        let get = |name: &str| {
            get(name)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let num = |var: &'static str| -> Result<Option<u64>> {
            get(var)
                .map(|v| {
                    v.parse().map_err(|_| StoreError::Var {
                        var,
                        value: v.clone(),
                        message: "expected a whole number".into(),
                    })
                })
                .transpose()
        };
        let torch = get("TORCHELASTIC_RUN_ID").filter(|v| v != "none");
        let slurm = get("SLURM_JOB_ID");
        let batch = get("AWS_BATCH_JOB_ID");
        // The launcher's attempt counts for an explicit id too: a restart under the same id
        // must still get a fresh namespace.
        let launcher_attempt = if torch.is_some() {
            num("TORCHELASTIC_RESTART_COUNT")?
        } else if slurm.is_some() {
            num("SLURM_RESTART_COUNT")?
        } else if batch.is_some() {
            num("AWS_BATCH_JOB_ATTEMPT")?.map(|a| a.saturating_sub(1))
        } else {
            None
        };
        let (run_id, attempt) = if let Some(id) = get(RUN_ID_ENV) {
            (id, num("NEURON_PC_RUN_ATTEMPT")?.or(launcher_attempt))
        } else if let Some(id) = torch {
            (format!("torchelastic-{id}"), launcher_attempt)
        } else if let Some(job) = slurm {
            let step = get("SLURM_STEP_ID").map_or(String::new(), |s| format!(".{s}"));
            (format!("slurm-{job}{step}"), launcher_attempt)
        } else if let Some(job) = batch {
            let job = job.split('#').next().unwrap_or(&job).to_string();
            (format!("aws-batch-{job}"), launcher_attempt)
        } else if let Some(name) = get("TRAINING_JOB_NAME") {
            (format!("sagemaker-{name}"), None)
        } else {
            return Err(StoreError::NoRunId);
        };
        Ok(RunScope {
            run_id,
            attempt: attempt.unwrap_or(0),
        })
    }

    /// The prefix of every key of this attempt; `/` in the run id is escaped so that the run
    /// id and the attempt stay separate path components.
    pub fn prefix(&self) -> String {
        format!(
            "/neuron-pc/{}/{}/",
            self.run_id.replace('%', "%25").replace('/', "%2F"),
            self.attempt
        )
    }
}

/// A store seen through one attempt's namespace.
#[derive(Clone)]
pub struct ScopedStore {
    inner: Arc<dyn KvStore>,
    scope: RunScope,
    prefix: String,
}

impl ScopedStore {
    /// `inner` seen through `scope`: every key gets the scope's [`RunScope::prefix`].
    pub fn new(inner: Arc<dyn KvStore>, scope: RunScope) -> ScopedStore {
        let prefix = scope.prefix();
        ScopedStore {
            inner,
            scope,
            prefix,
        }
    }

    /// The run and attempt whose namespace this is.
    pub fn scope(&self) -> &RunScope {
        &self.scope
    }

    /// The key in the engine for this attempt's `key`.
    pub fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
}

impl KvStore for ScopedStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        self.inner.set(&self.full_key(key), value)
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        self.inner.try_get(&self.full_key(key))
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        self.inner.get(&self.full_key(key), timeout)
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn set_while_alive(&self, key: &str, value: &[u8], ttl: Duration) -> Result<bool> {
        self.inner.set_while_alive(&self.full_key(key), value, ttl)
    }
}

/// Where `NEURON_PC_STORE` points.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// etcd's gRPC endpoints, `host:port` each.
    Etcd(Vec<String>),
}

impl StoreUrl {
    /// Parses `etcd://HOST:PORT[,HOST:PORT...]`.
    pub fn parse(url: &str) -> Result<StoreUrl> {
        let bad = |message: &str| StoreError::Url {
            url: url.to_string(),
            message: message.to_string(),
        };
        let rest = url
            .trim()
            .strip_prefix("etcd://")
            .ok_or_else(|| bad("expected etcd://HOST:PORT[,HOST:PORT...]"))?;
        let mut endpoints = Vec::new();
        for ep in rest.trim_end_matches('/').split(',') {
            let (host, port) = ep
                .rsplit_once(':')
                .ok_or_else(|| bad(&format!("{ep:?}: expected HOST:PORT")))?;
            if host.is_empty() || host.contains('/') {
                return Err(bad(&format!("{ep:?}: expected HOST:PORT")));
            }
            if port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(&format!("{ep:?}: {port:?} is not a port")));
            }
            endpoints.push(ep.to_string());
        }
        Ok(StoreUrl::Etcd(endpoints))
    }
}

/// The time one store operation may take: `NEURON_PC_STORE_TIMEOUT` seconds or the default.
pub fn timeout_from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Duration> {
    match get(STORE_TIMEOUT_ENV).filter(|v| !v.trim().is_empty()) {
        None => Ok(Duration::from_secs_f64(DEFAULT_TIMEOUT_SECS)),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s < 1e6 => Ok(Duration::from_secs_f64(s)),
            _ => Err(StoreError::Var {
                var: STORE_TIMEOUT_ENV,
                value: v,
                message: "expected seconds, a positive number".into(),
            }),
        },
    }
}

/// Opens the store `url` names.
pub fn connect(url: &StoreUrl, timeout: Duration) -> Result<Arc<dyn KvStore>> {
    match url {
        #[cfg(feature = "etcd")]
        StoreUrl::Etcd(endpoints) => Ok(Arc::new(EtcdStore::connect(endpoints, timeout)?)),
        #[cfg(not(feature = "etcd"))]
        StoreUrl::Etcd(endpoints) => {
            let _ = timeout;
            Err(StoreError::Url {
                url: format!("etcd://{}", endpoints.join(",")),
                message: "this build has no etcd client: build neuron-pc with its `etcd` \
                          feature (the neuron-pc binary has it)"
                    .into(),
            })
        }
    }
}

/// The store `NEURON_PC_STORE` selects, in this attempt's namespace; `None` when it is unset.
pub fn from_env() -> Result<Option<ScopedStore>> {
    let var = |name: &str| std::env::var(name).ok();
    let Some(url) = var(STORE_ENV).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let url = StoreUrl::parse(&url)?;
    let scope = RunScope::from_vars(var)?;
    let store = connect(&url, timeout_from_vars(var)?)?;
    Ok(Some(ScopedStore::new(store, scope)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn run_scopes_come_from_the_launcher() {
        type Vars<'a> = &'a [(&'a str, &'a str)];
        let cases: &[(Vars<'_>, &str, u64)] = &[
            (
                &[
                    ("TORCHELASTIC_RUN_ID", "job7"),
                    ("TORCHELASTIC_RESTART_COUNT", "2"),
                ],
                "torchelastic-job7",
                2,
            ),
            // torchrun's default id is no id: Slurm's is used.
            (
                &[
                    ("TORCHELASTIC_RUN_ID", "none"),
                    ("SLURM_JOB_ID", "41"),
                    ("SLURM_STEP_ID", "0"),
                    ("SLURM_RESTART_COUNT", "1"),
                ],
                "slurm-41.0",
                1,
            ),
            (&[("SLURM_JOB_ID", "41")], "slurm-41", 0),
            (
                &[
                    ("AWS_BATCH_JOB_ID", "ab-12#3"),
                    ("AWS_BATCH_JOB_ATTEMPT", "2"),
                ],
                "aws-batch-ab-12",
                1,
            ),
            (&[("TRAINING_JOB_NAME", "tj")], "sagemaker-tj", 0),
            (
                &[
                    ("NEURON_PC_RUN_ID", "mine"),
                    ("TORCHELASTIC_RUN_ID", "j"),
                    ("TORCHELASTIC_RESTART_COUNT", "3"),
                ],
                "mine",
                3,
            ),
            (
                &[("NEURON_PC_RUN_ID", "mine"), ("NEURON_PC_RUN_ATTEMPT", "5")],
                "mine",
                5,
            ),
        ];
        for (v, id, attempt) in cases {
            let s = RunScope::from_vars(vars(v)).unwrap();
            assert_eq!((s.run_id.as_str(), s.attempt), (*id, *attempt), "{v:?}");
        }
        assert!(matches!(
            RunScope::from_vars(vars(&[("TORCHELASTIC_RUN_ID", "none")])),
            Err(StoreError::NoRunId)
        ));
        let e = RunScope::from_vars(vars(&[
            ("TORCHELASTIC_RUN_ID", "j"),
            ("TORCHELASTIC_RESTART_COUNT", "x"),
        ]))
        .unwrap_err();
        assert!(
            e.to_string().contains("TORCHELASTIC_RESTART_COUNT=\"x\""),
            "{e}"
        );
    }

    #[test]
    fn prefixes_separate_runs_and_attempts() {
        let p = |id: &str, attempt| {
            RunScope {
                run_id: id.into(),
                attempt,
            }
            .prefix()
        };
        assert_eq!(p("slurm-41.0", 1), "/neuron-pc/slurm-41.0/1/");
        assert_ne!(p("a", 0), p("a", 1));
        // A run id holding a slash cannot reach into another run's attempt.
        assert_ne!(p("a/1", 0), p("a", 1));
        assert_eq!(p("a/1", 0), "/neuron-pc/a%2F1/0/");
        assert_ne!(p("a%2F1", 0), p("a/1", 0));
    }

    #[test]
    fn store_urls() {
        assert_eq!(
            StoreUrl::parse("etcd://127.0.0.1:2379").unwrap(),
            StoreUrl::Etcd(vec!["127.0.0.1:2379".into()])
        );
        assert_eq!(
            StoreUrl::parse("etcd://a:1,b:2/").unwrap(),
            StoreUrl::Etcd(vec!["a:1".into(), "b:2".into()])
        );
        for bad in [
            "redis://a:1",
            "etcd://a",
            "etcd://a:x",
            "etcd://:1",
            "etcd://a:0",
            "a:1",
        ] {
            let e = StoreUrl::parse(bad).unwrap_err().to_string();
            assert!(e.starts_with(&format!("NEURON_PC_STORE={bad}: ")), "{e}");
        }
    }

    #[test]
    fn timeouts() {
        let t = |v: Option<&str>| timeout_from_vars(|_| v.map(String::from));
        assert_eq!(t(None).unwrap(), Duration::from_secs(10));
        assert_eq!(t(Some("0.5")).unwrap(), Duration::from_millis(500));
        for bad in ["0", "-1", "x", "inf"] {
            assert!(t(Some(bad))
                .unwrap_err()
                .to_string()
                .contains(STORE_TIMEOUT_ENV));
        }
    }
}
