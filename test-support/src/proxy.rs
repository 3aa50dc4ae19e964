//! A counting, fault-injecting HTTP proxy in front of the S3 server ([`crate::s3`]): it counts
//! the requests that write (PUT, POST, DELETE) and can answer with an error status, cut a
//! response in the middle of its body, drop the connection without an answer, delay, refuse
//! with 403, or drop conditional headers — the S3 troubles the cache must survive. The cache
//! crate's tests and the root crate's use it.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the proxy does to one request.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// Answer with this status and an S3 error body, without asking the server.
    Status(u16),
    /// Forward, then send the response head and half its body, and close.
    CutBody,
    /// Wait this long before forwarding.
    Delay(Duration),
    /// Forward without the conditional headers (`If-None-Match`, `If-Match`): a server that
    /// ignores conditional writes.
    StripConditional,
    /// Read the whole request, then close the connection without any answer and without
    /// asking the server: to the client, a connection dropped mid-request (the request was
    /// sent, no response came).
    Reset,
}

/// What the proxy has seen and what it is told to do; tests may set the fields directly.
#[derive(Default)]
pub struct ProxyState {
    /// Requests that write (PUT, POST, DELETE) seen so far.
    pub writes: AtomicUsize,
    /// Requests seen so far.
    pub requests: AtomicUsize,
    /// Applied to the next requests, one each (only to those `only_method` and `only_path`
    /// select).
    pub next: Mutex<VecDeque<Fault>>,
    /// Applied to every request while set, whatever `only_method` and `only_path` say.
    pub always: Mutex<Option<Fault>>,
    /// When set, only requests whose path (with its query) contains this get `next` faults;
    /// and only GETs, unless `only_method` names another method.
    pub only_path: Mutex<Option<String>>,
    /// When set, only requests with exactly this method (`"PUT"`, `"GET"`, ...) get `next`
    /// faults, whatever their path unless `only_path` is set too. When unset, `only_path`
    /// alone means GETs.
    pub only_method: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl ProxyState {
    /// Whether a request gets the next queued fault (see `only_method` and `only_path`).
    fn selects(&self, method: &str, path: &str) -> bool {
        let only_method = self.only_method.lock().unwrap().clone();
        let only_path = self.only_path.lock().unwrap().clone();
        if only_method.is_none() && only_path.is_none() {
            return true;
        }
        let path_ok = match &only_path {
            Some(p) => path.contains(p.as_str()),
            None => true,
        };
        method == only_method.as_deref().unwrap_or("GET") && path_ok
    }
}

/// The proxy, listening on loopback until dropped; one thread per connection.
pub struct Proxy {
    /// The port it listens on.
    pub port: u16,
    /// Its counters and faults, shared with the serving threads.
    pub state: Arc<ProxyState>,
}

impl Proxy {
    /// Starts a proxy to the server on `upstream` (a loopback port).
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind proxy");
        let port = listener.local_addr().expect("proxy addr").port();
        let state = Arc::new(ProxyState::default());
        let st = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.stop.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, upstream, &st);
                });
            }
        });
        Proxy { port, state }
    }

    /// The URL to give an S3 client instead of the server's.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Requests that write (PUT, POST, DELETE) seen so far.
    pub fn writes(&self) -> usize {
        self.state.writes.load(Ordering::SeqCst)
    }

    /// Queues `f` for the next `times` selected requests.
    pub fn push(&self, f: Fault, times: usize) {
        let mut q = self.state.next.lock().unwrap();
        for _ in 0..times {
            q.push_back(f.clone());
        }
    }

    /// Applies `f` to every request from now on (`None`: to none).
    pub fn set_always(&self, f: Option<Fault>) {
        *self.state.always.lock().unwrap() = f;
    }

    /// Queued faults go only to `method` requests whose path contains `path` (sets both
    /// `only_method` and `only_path`).
    pub fn only(&self, method: &str, path: &str) {
        *self.state.only_method.lock().unwrap() = Some(method.to_string());
        *self.state.only_path.lock().unwrap() = Some(path.to_string());
    }

    /// Faults still queued (pushed and not yet applied).
    pub fn pending(&self) -> usize {
        self.state.next.lock().unwrap().len()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn read_head(s: &mut TcpStream) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(p + 4);
            return Ok(Some((buf, rest)));
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_string())
    })
}

/// Serves one connection, one request per connection (answers carry `Connection: close`).
fn serve(mut client: TcpStream, upstream: u16, st: &ProxyState) -> std::io::Result<()> {
    let Some((head, mut body)) = read_head(&mut client)? else {
        return Ok(());
    };
    let head_text = String::from_utf8_lossy(&head).into_owned();
    let len: usize = header(&head_text, "content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while body.len() < len {
        let mut chunk = vec![0u8; (len - body.len()).min(1 << 16)];
        let n = client.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let mut first = head_text.lines().next().unwrap_or("").split_whitespace();
    let method = first.next().unwrap_or("").to_string();
    let path = first.next().unwrap_or("").to_string();
    st.requests.fetch_add(1, Ordering::SeqCst);
    if matches!(method.as_str(), "PUT" | "POST" | "DELETE") {
        st.writes.fetch_add(1, Ordering::SeqCst);
    }
    let fault = {
        let always = st.always.lock().unwrap().clone();
        let applies = st.selects(&method, &path);
        always.or_else(|| {
            if applies {
                st.next.lock().unwrap().pop_front()
            } else {
                None
            }
        })
    };
    match &fault {
        Some(Fault::Status(code)) => {
            let (code_name, reason) = match code {
                403 => ("AccessDenied", "Forbidden"),
                503 => ("SlowDown", "Service Unavailable"),
                _ => ("InternalError", "Internal Server Error"),
            };
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>{code_name}</Code>\
                 <Message>injected</Message></Error>"
            );
            let resp = format!(
                "HTTP/1.1 {code} {reason}\r\nContent-Type: application/xml\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{xml}",
                xml.len()
            );
            client.write_all(resp.as_bytes())?;
            return Ok(());
        }
        Some(Fault::Reset) => {
            // The request is read in full; no answer, the connection just goes away.
            let _ = client.shutdown(Shutdown::Both);
            drop(client);
            return Ok(());
        }
        Some(Fault::Delay(d)) => std::thread::sleep(*d),
        _ => {}
    }
    // Forward with `Connection: close` so the response ends at EOF.
    let mut up = TcpStream::connect(("127.0.0.1", upstream))?;
    let mut new_head = String::new();
    for line in head_text.split("\r\n").filter(|l| !l.is_empty()) {
        let lower = line.to_ascii_lowercase();
        let conditional = lower.starts_with("if-none-match:") || lower.starts_with("if-match:");
        if fault == Some(Fault::StripConditional) && conditional {
            continue;
        }
        if !lower.starts_with("connection:") {
            new_head.push_str(line);
            new_head.push_str("\r\n");
        }
    }
    new_head.push_str("Connection: close\r\n\r\n");
    up.write_all(new_head.as_bytes())?;
    up.write_all(&body)?;
    let mut resp = Vec::new();
    up.read_to_end(&mut resp)?;
    let Some(p) = resp.windows(4).position(|w| w == b"\r\n\r\n") else {
        client.write_all(&resp)?;
        return Ok(());
    };
    let resp_head = String::from_utf8_lossy(&resp[..p]).into_owned();
    let resp_body = &resp[p + 4..];
    let mut out = String::new();
    for line in resp_head.split("\r\n") {
        if !line.to_ascii_lowercase().starts_with("connection:") {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    client.write_all(out.as_bytes())?;
    if fault == Some(Fault::CutBody) && !resp_body.is_empty() {
        client.write_all(&resp_body[..resp_body.len() / 2])?;
        client.flush()?;
        let _ = client.shutdown(Shutdown::Both);
        return Ok(());
    }
    client.write_all(resp_body)
}
