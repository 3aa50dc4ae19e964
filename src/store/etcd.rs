//! [`KvStore`] on etcd's v3 API, through the `etcd-client` crate.
//!
//! The client is async (tonic); neuron-pc's callers are not, so the store owns a one-worker
//! tokio runtime and blocks on it. The worker keeps the HTTP/2 connection alive between calls.
//! Every call is bounded by the store's timeout, so an unreachable etcd is an error, not a hang.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, PutOptions};

use super::{KvStore, Result, StoreError};

/// An etcd cluster reached at its client endpoints.
pub struct EtcdStore {
    runtime: tokio::runtime::Runtime,
    client: Client,
    endpoints: Vec<String>,
    timeout: Duration,
}

impl EtcdStore {
    /// Connects to `endpoints` (`host:port`) and checks that etcd answers, within `timeout`
    /// (which then bounds each operation).
    pub fn connect(endpoints: &[String], timeout: Duration) -> Result<EtcdStore> {
        let store = |message: String| StoreError::Unreachable {
            store: describe(endpoints),
            secs: timeout.as_secs_f64(),
            message,
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("neuron-pc-etcd")
            .enable_all()
            .build()
            .map_err(|e| store(format!("starting its client runtime: {e}")))?;
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_timeout(timeout);
        let urls: Vec<String> = endpoints.iter().map(|e| format!("http://{e}")).collect();
        let client = runtime
            .block_on(async {
                let mut c = tokio::time::timeout(timeout, Client::connect(&urls, Some(options)))
                    .await
                    .map_err(|_| "timed out".to_string())?
                    .map_err(|e| e.to_string())?;
                // The connection is lazy: a status request proves etcd answers.
                tokio::time::timeout(timeout, c.status())
                    .await
                    .map_err(|_| "no answer to a status request".to_string())?
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(c)
            })
            .map_err(store)?;
        Ok(EtcdStore {
            runtime,
            client,
            endpoints: endpoints.to_vec(),
            timeout,
        })
    }

    /// Runs one request, bounded by the timeout.
    fn call<T, F>(&self, op: &'static str, key: &str, f: F) -> Result<T>
    where
        F: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let err = |message: String| StoreError::Op {
            store: self.describe(),
            op,
            key: key.to_string(),
            message,
        };
        match self
            .runtime
            .block_on(async { tokio::time::timeout(self.timeout, f).await })
        {
            Ok(r) => r.map_err(|e| err(e.to_string())),
            Err(_) => Err(err(format!(
                "no answer within {:.1} s",
                self.timeout.as_secs_f64()
            ))),
        }
    }
}

fn describe(endpoints: &[String]) -> String {
    format!("etcd at {}", endpoints.join(","))
}

impl KvStore for EtcdStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let mut c = self.client.clone();
        self.call("put", key, async move { c.put(key, value, None).await })
            .map(|_| ())
    }

    fn try_get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let mut c = self.client.clone();
        let resp = self.call("get", key, async move { c.get(key, None).await })?;
        Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
    }

    fn describe(&self) -> String {
        describe(&self.endpoints)
    }

    fn set_while_alive(&self, key: &str, value: &[u8], ttl: Duration) -> Result<bool> {
        let secs = ttl.as_secs().max(2) as i64;
        let mut c = self.client.clone();
        let lease = self.call("lease grant", key, async move {
            c.lease_grant(secs, None).await
        })?;
        let id = lease.id();
        let mut c = self.client.clone();
        let options = PutOptions::new().with_lease(id);
        self.call(
            "put",
            key,
            async move { c.put(key, value, Some(options)).await },
        )?;
        // Renewed a few times per period by the store's runtime while the process lives; a
        // renewal that fails (etcd gone) ends the task, and the key lapses.
        let mut c = self.client.clone();
        let every = Duration::from_secs_f64(secs as f64 / 3.0);
        self.runtime.spawn(async move {
            let Ok((mut keeper, mut answers)) = c.lease_keep_alive(id).await else {
                return;
            };
            loop {
                if keeper.keep_alive().await.is_err() {
                    return;
                }
                if !matches!(answers.message().await, Ok(Some(_))) {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        });
        Ok(true)
    }
}
