//! A real S3-compatible server (moto_server from the project's venv) on a free loopback port,
//! shared by the tests of one binary and stopped when the last user drops it (also on panic).
//! A missing server (no `scripts/setup`) panics with the fix: these are test helpers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::launch::free_port;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// A running moto_server.
pub struct Moto {
    pub port: u16,
    child: Child,
    /// The watchdog stops the server when this file goes (or the test process dies).
    alive: PathBuf,
}

impl Moto {
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.alive);
        let deadline = Instant::now() + Duration::from_secs(5);
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

/// The repository's root (where `.venv` is): this crate sits in `test-support/` below it.
pub fn repo_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent()
        .expect("test-support/ has a parent")
        .to_path_buf()
}

/// A server of its own (for a test that stops it).
pub fn start() -> Moto {
    let bin = repo_root().join(".venv/bin/moto_server");
    assert!(
        bin.exists(),
        "{} is missing: run scripts/setup (it installs moto into .venv)",
        bin.display()
    );
    let port = free_port();
    let alive = std::env::temp_dir().join(format!("npc-moto-{}-{port}.alive", std::process::id()));
    std::fs::write(&alive, b"").expect("watchdog file");
    // The shell watchdog kills moto when the test process is gone (even SIGKILLed) or the
    // guard removed the file.
    let script = r#"
        "$1" -H 127.0.0.1 -p "$2" >/dev/null 2>&1 &
        m=$!
        while [ -e "$3" ] && kill -0 "$4" 2>/dev/null && kill -0 $m 2>/dev/null; do sleep 0.2; done
        kill $m 2>/dev/null; wait $m 2>/dev/null
    "#;
    let child = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(&bin)
        .arg(port.to_string())
        .arg(&alive)
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn moto_server");
    let moto = Moto { port, child, alive };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if http(port, "GET", "/", b"").is_some_and(|(s, _)| s == 200) {
            return moto;
        }
        assert!(
            Instant::now() < deadline,
            "moto_server did not answer on port {port} within 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The binary's shared server, started on first use.
pub fn moto() -> Arc<Moto> {
    static SHARED: Mutex<Weak<Moto>> = Mutex::new(Weak::new());
    let mut s = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(m) = s.upgrade() {
        return m;
    }
    let m = Arc::new(start());
    *s = Arc::downgrade(&m);
    m
}

/// One plain HTTP/1.1 request; `(status, body)`.
pub fn http(port: u16, method: &str, path: &str, body: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).ok()?;
    let text = String::from_utf8_lossy(&resp);
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body_at = resp
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(resp.len(), |p| p + 4);
    Some((status, resp[body_at..].to_vec()))
}

/// Creates a bucket with a unique name and returns it.
pub fn new_bucket(m: &Moto, tag: &str) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "npc-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
    .to_lowercase()
    .replace('_', "-");
    let (status, body) = http(m.port, "PUT", &format!("/{name}"), b"").expect("create bucket");
    assert_eq!(
        status,
        200,
        "create bucket: {}",
        String::from_utf8_lossy(&body)
    );
    name
}
