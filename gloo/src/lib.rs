//! Collectives between processes over gloo, the collective library behind torch.distributed's
//! and JAX's cpu backends (Debian's `libgloo-dev`, linked, not vendored).
//!
//! neuron-pc's cpu target runs its cross-process collectives through these: XLA's cpu client
//! keeps its own collectives inside one process, so the device lowers a collective whose
//! replicas live in several processes to a custom call whose handler calls a [`Group`] (see
//! `docs/design.md`, "Collectives between processes"). A group is one process's member of a
//! gloo context over TCP; its members find each other through the run's key-value store
//! ([`Rendezvous`]), so no address is configured by hand.
//!
//! Several threads may use one group at once as long as their operations carry different tags
//! (gloo matches messages by tag); operations of one tag must run in the same order on every
//! member.

#![warn(missing_docs)]

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;
use std::time::Duration;

/// A failure of gloo (a peer gone, a timeout, an address that does not resolve) or of the
/// store, as one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

/// The key-value store the members of a group meet through (the run's etcd, for neuron-pc).
/// Keys are distinct per group: the caller's implementation namespaces them.
pub trait Rendezvous: Sync {
    /// Publishes `value` under `key`.
    fn set(&self, key: &str, value: &[u8]) -> Result<(), String>;
    /// The value of `key`, waiting up to `timeout` for some member to publish it.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, String>;
}

/// Element types a reduction understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Element {
    F32,
    F64,
    /// bfloat16, combined in f32 and rounded to nearest even.
    Bf16,
    /// IEEE half, combined in f32 and rounded to nearest even.
    F16,
    S8,
    S16,
    S32,
    S64,
    U8,
    U16,
    U32,
    U64,
}

impl Element {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            Element::S8 | Element::U8 => 1,
            Element::Bf16 | Element::F16 | Element::S16 | Element::U16 => 2,
            Element::F32 | Element::S32 | Element::U32 => 4,
            Element::F64 | Element::S64 | Element::U64 => 8,
        }
    }

    // the shim's numbering (`enum Dtype` in shim.cc)
    fn code(self) -> c_int {
        self as c_int
    }
}

/// How a reduction combines the members' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Reduce {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
}

/// Where a member listens for its peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// The address of this network interface (torch's `GLOO_SOCKET_IFNAME`).
    Interface(String),
    /// The address this host name or IP resolves to (`127.0.0.1` for one machine).
    Host(String),
    /// The address the machine's own host name resolves to (gloo's default).
    HostName,
}

#[repr(C)]
struct StoreVtable {
    ctx: *mut c_void,
    set: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        usize,
        *const c_char,
        usize,
        *mut c_void,
    ) -> c_int,
    get: unsafe extern "C" fn(
        *mut c_void,
        *const c_char,
        usize,
        i64,
        *mut c_void,
        *mut c_void,
    ) -> c_int,
}

extern "C" {
    fn npc_gloo_string_assign(string: *mut c_void, data: *const c_char, len: usize);
    fn npc_gloo_free_message(text: *mut c_char);
    fn npc_gloo_connect(
        store: *const StoreVtable,
        rank: c_int,
        size: c_int,
        iface: *const c_char,
        hostname: *const c_char,
        timeout_ms: i64,
        group: *mut *mut c_void,
    ) -> *mut c_char;
    fn npc_gloo_close(group: *mut c_void);
    fn npc_gloo_allreduce(
        group: *mut c_void,
        data: *mut c_void,
        count: usize,
        dtype: c_int,
        op: c_int,
        tag: u32,
        timeout_ms: i64,
    ) -> *mut c_char;
    fn npc_gloo_reduce_scatter(
        group: *mut c_void,
        input: *const c_void,
        output: *mut c_void,
        count: usize,
        dtype: c_int,
        op: c_int,
        tag: u32,
        timeout_ms: i64,
    ) -> *mut c_char;
    fn npc_gloo_allgather(
        group: *mut c_void,
        input: *const c_void,
        output: *mut c_void,
        bytes: usize,
        tag: u32,
        timeout_ms: i64,
    ) -> *mut c_char;
}

/// The shim's result: `Ok` for a null message, else the message, freed.
///
/// # Safety
/// `text` is null or a message the shim allocated and nobody freed.
unsafe fn check(text: *mut c_char) -> Result<(), Error> {
    if text.is_null() {
        return Ok(());
    }
    // SAFETY: a non-null message is a NUL-terminated string from the shim's `message()`.
    let line = unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: allocated by the shim with malloc, freed once here.
    unsafe { npc_gloo_free_message(text) };
    Err(Error(
        line.lines()
            .next()
            .unwrap_or("gloo failed")
            .trim()
            .to_string(),
    ))
}

/// Writes `text` into the shim's string at `sink`.
///
/// # Safety
/// `sink` is the `std::string*` the shim passed to a store callback.
unsafe fn assign(sink: *mut c_void, text: &[u8]) {
    // SAFETY: the caller's contract; the shim copies the bytes before this returns.
    unsafe { npc_gloo_string_assign(sink, text.as_ptr().cast(), text.len()) }
}

/// # Safety
/// Called by the shim only, with `ctx` the `&dyn Rendezvous` of `Group::connect`, valid
/// pointers of the given lengths and two `std::string*` sinks.
unsafe extern "C" fn store_set(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    value: *const c_char,
    value_len: usize,
    error: *mut c_void,
) -> c_int {
    // SAFETY: see the function's contract.
    let store = unsafe { &**(ctx as *const &dyn Rendezvous) };
    // SAFETY: the shim passes a key and a value of these lengths, alive for the call.
    let (key, value) = unsafe {
        (
            std::slice::from_raw_parts(key.cast::<u8>(), key_len),
            std::slice::from_raw_parts(value.cast::<u8>(), value_len),
        )
    };
    match store.set(&String::from_utf8_lossy(key), value) {
        Ok(()) => 0,
        Err(e) => {
            // SAFETY: `error` is the shim's sink.
            unsafe { assign(error, e.as_bytes()) };
            1
        }
    }
}

/// # Safety
/// As [`store_set`]; `value` and `error` are the shim's sinks.
unsafe extern "C" fn store_get(
    ctx: *mut c_void,
    key: *const c_char,
    key_len: usize,
    timeout_ms: i64,
    value: *mut c_void,
    error: *mut c_void,
) -> c_int {
    // SAFETY: see the function's contract.
    let store = unsafe { &**(ctx as *const &dyn Rendezvous) };
    // SAFETY: the shim passes a key of this length, alive for the call.
    let key = unsafe { std::slice::from_raw_parts(key.cast::<u8>(), key_len) };
    let timeout = Duration::from_millis(timeout_ms.max(0) as u64);
    match store.get(&String::from_utf8_lossy(key), timeout) {
        Ok(v) => {
            // SAFETY: `value` is the shim's sink.
            unsafe { assign(value, &v) };
            0
        }
        Err(e) => {
            // SAFETY: `error` is the shim's sink.
            unsafe { assign(error, e.as_bytes()) };
            1
        }
    }
}

/// One process's member of a group of processes (a gloo context over TCP).
pub struct Group {
    raw: NonNull<c_void>,
    rank: usize,
    size: usize,
    timeout: Duration,
}

// SAFETY: a gloo context may be used from any thread, and from several at once with distinct
// tags (the module's contract, which torch.distributed's gloo backend relies on too).
unsafe impl Send for Group {}
// SAFETY: as above.
unsafe impl Sync for Group {}

impl Drop for Group {
    fn drop(&mut self) {
        // SAFETY: `raw` came from `npc_gloo_connect` and is closed once, here.
        unsafe { npc_gloo_close(self.raw.as_ptr()) }
    }
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "gloo member {} of {}", self.rank, self.size)
    }
}

fn c_string(what: &str, s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error(format!("{what} {s:?} holds a NUL byte")))
}

impl Group {
    /// Connects member `rank` of `size`: publishes its address through `store`, reads every
    /// peer's and connects to each, all within `timeout`, which also bounds every later
    /// operation (a peer that is gone fails it after that long at most).
    pub fn connect(
        store: &dyn Rendezvous,
        rank: usize,
        size: usize,
        listen: &Listen,
        timeout: Duration,
    ) -> Result<Group, Error> {
        if rank >= size {
            return Err(Error(format!(
                "gloo: rank {rank} is not below the size {size}"
            )));
        }
        let (iface, host) = match listen {
            Listen::Interface(i) => (c_string("interface", i)?, CString::default()),
            Listen::Host(h) => (CString::default(), c_string("host", h)?),
            Listen::HostName => (CString::default(), CString::default()),
        };
        let mut ctx: &dyn Rendezvous = store;
        let vtable = StoreVtable {
            ctx: (&mut ctx as *mut &dyn Rendezvous).cast(),
            set: store_set,
            get: store_get,
        };
        let mut raw = std::ptr::null_mut();
        // SAFETY: the vtable and its context outlive the call (the shim does not keep them),
        // the strings are NUL-terminated and `raw` is written only on success.
        let result = unsafe {
            check(npc_gloo_connect(
                &vtable,
                rank as c_int,
                size as c_int,
                iface.as_ptr(),
                host.as_ptr(),
                millis(timeout),
                &mut raw,
            ))
        };
        result.map_err(|e| Error(format!("gloo: connecting rank {rank} of {size}: {e}")))?;
        let raw = NonNull::new(raw).ok_or_else(|| Error("gloo: no group returned".into()))?;
        Ok(Group {
            raw,
            rank,
            size,
            timeout,
        })
    }

    /// This member's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Members in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Reduces `data` (elements of type `element`) over the group in place.
    pub fn all_reduce(
        &self,
        data: &mut [u8],
        element: Element,
        op: Reduce,
        tag: u32,
    ) -> Result<(), Error> {
        let count = elements(data.len(), element)?;
        if count == 0 {
            return Ok(());
        }
        // SAFETY: `data` holds `count` elements of `element` and is borrowed mutably for the
        // call, which blocks until the reduction is done.
        unsafe {
            check(npc_gloo_allreduce(
                self.raw.as_ptr(),
                data.as_mut_ptr().cast(),
                count,
                element.code(),
                op as c_int,
                tag,
                millis(self.timeout),
            ))
        }
        .map_err(|e| self.failed("all-reduce", e))
    }

    /// Every member's `input` in rank order into `output` (`size` times `input`'s length).
    pub fn all_gather(&self, input: &[u8], output: &mut [u8], tag: u32) -> Result<(), Error> {
        if output.len() != input.len() * self.size {
            return Err(Error(format!(
                "gloo all-gather: {} bytes out for {} in over {} members",
                output.len(),
                input.len(),
                self.size
            )));
        }
        if input.is_empty() {
            return Ok(());
        }
        // SAFETY: the lengths are checked above; the call blocks until the gather is done.
        unsafe {
            check(npc_gloo_allgather(
                self.raw.as_ptr(),
                input.as_ptr().cast(),
                output.as_mut_ptr().cast(),
                input.len(),
                tag,
                millis(self.timeout),
            ))
        }
        .map_err(|e| self.failed("all-gather", e))
    }

    /// Reduces `input` over the group and leaves this member block `rank` of the result
    /// (`output` is `input`'s length over the group's size).
    ///
    /// One all-to-all of the blocks and a local combine: each member sends and receives
    /// `(size - 1) / size` of `input`, half of what an all-reduce moves.
    pub fn reduce_scatter(
        &self,
        input: &[u8],
        output: &mut [u8],
        element: Element,
        op: Reduce,
        tag: u32,
    ) -> Result<(), Error> {
        if input.len() != output.len() * self.size {
            return Err(Error(format!(
                "gloo reduce-scatter: {} bytes in for {} out over {} members",
                input.len(),
                output.len(),
                self.size
            )));
        }
        let count = elements(input.len(), element)?;
        if count == 0 {
            return Ok(());
        }
        // SAFETY: `input` holds `count` elements and `output` `count / size` (checked above);
        // the call blocks until the reduction is done.
        unsafe {
            check(npc_gloo_reduce_scatter(
                self.raw.as_ptr(),
                input.as_ptr().cast(),
                output.as_mut_ptr().cast(),
                count,
                element.code(),
                op as c_int,
                tag,
                millis(self.timeout),
            ))
        }
        .map_err(|e| self.failed("reduce-scatter", e))
    }

    fn failed(&self, what: &str, e: Error) -> Error {
        Error(format!(
            "gloo {what} (rank {} of {}): {e}",
            self.rank, self.size
        ))
    }
}

fn elements(bytes: usize, element: Element) -> Result<usize, Error> {
    if !bytes.is_multiple_of(element.size()) {
        return Err(Error(format!(
            "{bytes} bytes are not whole {element:?} elements"
        )));
    }
    Ok(bytes / element.size())
}

fn millis(d: Duration) -> i64 {
    d.as_millis().min(i64::MAX as u128) as i64
}
