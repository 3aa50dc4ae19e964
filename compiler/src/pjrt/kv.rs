//! The key-value callbacks of `PJRT_Client_Create`: a multi-process client (the cuda plugin with
//! `num_nodes > 1`) exchanges its topology and NCCL ids through a store every process of the
//! run reaches. The store is the caller's ([`KeyValueStore`]); this module adapts it to the C
//! API's three callbacks, which must all be set: `get` blocks up to its timeout, `try_get`
//! answers NOT_FOUND at once, `put` stores. The client calls them lazily (at its first
//! collective, say), so the store lives as long as the client.

use std::ffi::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::sys;

/// What a store answers when a key has no value.
#[derive(Debug, PartialEq, Eq)]
pub enum KvError {
    /// No value (yet): `try_get`'s answer, and `get`'s after its timeout.
    NotFound(String),
    /// The store failed; the message names it.
    Failed(String),
}

/// A key-value store shared by every process of one run (the root crate's etcd store).
pub trait KeyValueStore: Send + Sync {
    /// The value of `key`, waiting up to `timeout` for another process to set it.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KvError>;
    /// The value of `key` if it is set now.
    fn try_get(&self, key: &str) -> Result<Vec<u8>, KvError>;
    /// Sets `key`.
    fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError>;
}

/// What the callbacks' `user_arg` points to, owned by the client for its whole life.
pub(crate) struct KvHandle(pub(crate) Arc<dyn KeyValueStore>);

impl KvHandle {
    /// Sets the three callbacks of `args` to this store.
    pub(crate) fn install(self: &KvHandle, args: &mut sys::PJRT_Client_Create_Args) {
        let arg = self as *const KvHandle as *mut std::ffi::c_void;
        args.kv_get_callback = Some(kv_get);
        args.kv_get_user_arg = arg;
        args.kv_try_get_callback = Some(kv_try_get);
        args.kv_try_get_user_arg = arg;
        args.kv_put_callback = Some(kv_put);
        args.kv_put_user_arg = arg;
    }
}

/// A value handed to the plugin: its bytes after an 8-byte length, freed by [`free_value`].
fn alloc_value(value: Vec<u8>) -> (*mut c_char, usize) {
    let len = value.len();
    let mut buf = Vec::with_capacity(8 + len);
    buf.extend_from_slice(&(len as u64).to_le_bytes());
    buf.extend_from_slice(&value);
    let raw = Box::into_raw(buf.into_boxed_slice()) as *mut u8;
    // SAFETY: `raw` points to 8 + len bytes; the value starts 8 bytes in.
    (unsafe { raw.add(8) } as *mut c_char, len)
}

/// Sets a callback's out-fields to `value`, with our deleter.
fn hand_over(
    value: Vec<u8>,
    out: &mut *mut c_char,
    size: &mut usize,
    deleter: &mut Option<unsafe extern "C" fn(*mut c_char)>,
) {
    let (ptr, len) = alloc_value(value);
    *out = ptr;
    *size = len;
    *deleter = Some(free_value);
}

/// The deleter the plugin calls once it has copied a value from [`alloc_value`].
unsafe extern "C" fn free_value(value: *mut c_char) {
    if value.is_null() {
        return;
    }
    // SAFETY: `value` came from `alloc_value`: the allocation starts 8 bytes before it with
    // the value's length, and is a boxed slice of 8 + len bytes.
    unsafe {
        let start = (value as *mut u8).sub(8);
        let len = u64::from_le_bytes(std::ptr::read_unaligned(start as *const [u8; 8])) as usize;
        drop(Box::from_raw(std::ptr::slice_from_raw_parts_mut(
            start,
            8 + len,
        )));
    }
}

/// `key` as a string (the plugin's keys are ASCII).
///
/// # Safety
/// `key` points to `size` readable bytes (or is null with `size` 0).
unsafe fn key_of(key: *const c_char, size: usize) -> String {
    if key.is_null() || size == 0 {
        return String::new();
    }
    // SAFETY: the caller guarantees `size` readable bytes at `key`.
    let bytes = unsafe { std::slice::from_raw_parts(key as *const u8, size) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// A PJRT error made by the plugin's own error constructor.
///
/// # Safety
/// `make` is the `callback_error` pointer of the callback's arguments.
unsafe fn error(
    make: *mut sys::PJRT_CallbackError,
    code: sys::PJRT_Error_Code,
    message: &str,
) -> *mut sys::PJRT_Error {
    // SAFETY: the plugin passes a valid pointer to its error constructor (or null).
    match unsafe { make.as_ref() }.copied().flatten() {
        // SAFETY: the constructor copies the message before returning.
        Some(f) => unsafe { f(code, message.as_ptr() as *const c_char, message.len()) },
        None => std::ptr::null_mut(),
    }
}

fn code_of(e: &KvError) -> (sys::PJRT_Error_Code, &str) {
    match e {
        KvError::NotFound(m) => (sys::PJRT_Error_Code_NOT_FOUND, m),
        KvError::Failed(m) => (sys::PJRT_Error_Code_UNAVAILABLE, m),
    }
}

/// Runs `f`, turning a panic into an INTERNAL error (no unwinding into C).
fn guarded(f: impl FnOnce() -> Result<(), KvError>) -> Result<(), KvError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        Err(KvError::Failed(
            "the key-value store panicked in a callback".into(),
        ))
    })
}

unsafe extern "C" fn kv_get(args: *mut sys::PJRT_KeyValueGetCallback_Args) -> *mut sys::PJRT_Error {
    // SAFETY: the plugin passes valid arguments whose `user_arg` is the `KvHandle` installed
    // with the callback, alive as long as the client.
    let args = unsafe { &mut *args };
    // SAFETY: as above.
    let store = unsafe { &*(args.user_arg as *const KvHandle) };
    // SAFETY: the key is `key_size` bytes the plugin owns for the call.
    let key = unsafe { key_of(args.key, args.key_size) };
    let timeout = Duration::from_millis(args.timeout_in_ms.max(0) as u64);
    let result = guarded(|| {
        let value = store.0.get(&key, timeout)?;
        hand_over(
            value,
            &mut args.value,
            &mut args.value_size,
            &mut args.value_deleter_callback,
        );
        Ok(())
    });
    match result {
        Ok(()) => std::ptr::null_mut(),
        Err(e) => {
            let (code, message) = code_of(&e);
            // SAFETY: `callback_error` is the plugin's constructor.
            unsafe { error(args.callback_error, code, &format!("get {key}: {message}")) }
        }
    }
}

unsafe extern "C" fn kv_try_get(
    args: *mut sys::PJRT_KeyValueTryGetCallback_Args,
) -> *mut sys::PJRT_Error {
    // SAFETY: as in `kv_get`.
    let args = unsafe { &mut *args };
    // SAFETY: as in `kv_get`.
    let store = unsafe { &*(args.user_arg as *const KvHandle) };
    // SAFETY: as in `kv_get`.
    let key = unsafe { key_of(args.key, args.key_size) };
    let result = guarded(|| {
        let value = store.0.try_get(&key)?;
        hand_over(
            value,
            &mut args.value,
            &mut args.value_size,
            &mut args.value_deleter_callback,
        );
        Ok(())
    });
    match result {
        Ok(()) => std::ptr::null_mut(),
        Err(e) => {
            let (code, message) = code_of(&e);
            // SAFETY: `callback_error` is the plugin's constructor.
            unsafe {
                error(
                    args.callback_error,
                    code,
                    &format!("try_get {key}: {message}"),
                )
            }
        }
    }
}

unsafe extern "C" fn kv_put(args: *mut sys::PJRT_KeyValuePutCallback_Args) -> *mut sys::PJRT_Error {
    // SAFETY: as in `kv_get`.
    let args = unsafe { &mut *args };
    // SAFETY: as in `kv_get`.
    let store = unsafe { &*(args.user_arg as *const KvHandle) };
    // SAFETY: as in `kv_get`.
    let key = unsafe { key_of(args.key, args.key_size) };
    let value: &[u8] = if args.value.is_null() {
        &[]
    } else {
        // SAFETY: the value is `value_size` bytes the plugin owns for the call.
        unsafe { std::slice::from_raw_parts(args.value as *const u8, args.value_size) }
    };
    match guarded(|| store.0.put(&key, value)) {
        Ok(()) => std::ptr::null_mut(),
        Err(e) => {
            let (code, message) = code_of(&e);
            // SAFETY: `callback_error` is the plugin's constructor.
            unsafe { error(args.callback_error, code, &format!("put {key}: {message}")) }
        }
    }
}

#[cfg(test)]
mod tests {
    //! The callbacks called through their C signatures, as a plugin calls them, with an error
    //! constructor that records what it was asked to make.
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Memory(Mutex<HashMap<String, Vec<u8>>>);

    impl KeyValueStore for Memory {
        fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>, KvError> {
            let deadline = std::time::Instant::now() + timeout;
            loop {
                if let Some(v) = self.0.lock().unwrap().get(key) {
                    return Ok(v.clone());
                }
                if std::time::Instant::now() >= deadline {
                    return Err(KvError::NotFound(format!("not set within {timeout:?}")));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        fn try_get(&self, key: &str) -> Result<Vec<u8>, KvError> {
            self.0
                .lock()
                .unwrap()
                .get(key)
                .cloned()
                .ok_or_else(|| KvError::NotFound("not set".into()))
        }
        fn put(&self, key: &str, value: &[u8]) -> Result<(), KvError> {
            if key == "refuse" {
                return Err(KvError::Failed("store down".into()));
            }
            self.0.lock().unwrap().insert(key.into(), value.to_vec());
            Ok(())
        }
    }

    static MADE: Mutex<Vec<(u32, String)>> = Mutex::new(Vec::new());

    unsafe extern "C" fn record_error(
        code: sys::PJRT_Error_Code,
        message: *const c_char,
        size: usize,
    ) -> *mut sys::PJRT_Error {
        // SAFETY: the callbacks pass a message of `size` bytes.
        let m = unsafe { std::slice::from_raw_parts(message as *const u8, size) };
        MADE.lock()
            .unwrap()
            .push((code, String::from_utf8_lossy(m).into_owned()));
        // a distinct non-null pointer standing for "an error was returned"
        std::ptr::NonNull::<sys::PJRT_Error>::dangling().as_ptr()
    }

    #[test]
    fn callbacks_put_get_and_try_get_through_the_c_signatures() {
        let handle = KvHandle(Arc::new(Memory::default()));
        let mut create = sys::PJRT_Client_Create_Args::default();
        handle.install(&mut create);
        let mut make: sys::PJRT_CallbackError = Some(record_error);
        let (get, try_get, put) = (
            create.kv_get_callback.unwrap(),
            create.kv_try_get_callback.unwrap(),
            create.kv_put_callback.unwrap(),
        );
        let key = "cuda:nccl_id";
        let mut p = sys::PJRT_KeyValuePutCallback_Args {
            key: key.as_ptr() as *const c_char,
            key_size: key.len(),
            value: b"\x00\x01id".as_ptr() as *const c_char,
            value_size: 4,
            callback_error: &mut make,
            user_arg: create.kv_put_user_arg,
            ..Default::default()
        };
        // SAFETY: valid arguments, as a plugin passes them.
        assert!(unsafe { put(&mut p) }.is_null());
        let mut g = sys::PJRT_KeyValueGetCallback_Args {
            key: key.as_ptr() as *const c_char,
            key_size: key.len(),
            timeout_in_ms: 1000,
            callback_error: &mut make,
            user_arg: create.kv_get_user_arg,
            ..Default::default()
        };
        // SAFETY: as above.
        assert!(unsafe { get(&mut g) }.is_null());
        // SAFETY: the callback set a value of `value_size` bytes.
        let got = unsafe { std::slice::from_raw_parts(g.value as *const u8, g.value_size) };
        assert_eq!(got, b"\x00\x01id");
        // SAFETY: the plugin frees the value with the deleter it was given, once.
        unsafe { g.value_deleter_callback.unwrap()(g.value) };

        // try_get of a missing key: NOT_FOUND at once, through the plugin's constructor
        let missing = "cuda:missing";
        let mut t = sys::PJRT_KeyValueTryGetCallback_Args {
            key: missing.as_ptr() as *const c_char,
            key_size: missing.len(),
            callback_error: &mut make,
            user_arg: create.kv_try_get_user_arg,
            ..Default::default()
        };
        let started = std::time::Instant::now();
        // SAFETY: as above.
        assert!(!unsafe { try_get(&mut t) }.is_null());
        assert!(started.elapsed() < Duration::from_millis(500));
        // get of a missing key waits for its timeout, then fails
        let mut g2 = sys::PJRT_KeyValueGetCallback_Args {
            key: missing.as_ptr() as *const c_char,
            key_size: missing.len(),
            timeout_in_ms: 50,
            callback_error: &mut make,
            user_arg: create.kv_get_user_arg,
            ..Default::default()
        };
        let started = std::time::Instant::now();
        // SAFETY: as above.
        assert!(!unsafe { get(&mut g2) }.is_null());
        assert!(started.elapsed() >= Duration::from_millis(50));
        // a failing store is UNAVAILABLE with its message
        let refuse = "refuse";
        let mut p2 = sys::PJRT_KeyValuePutCallback_Args {
            key: refuse.as_ptr() as *const c_char,
            key_size: refuse.len(),
            callback_error: &mut make,
            user_arg: create.kv_put_user_arg,
            ..Default::default()
        };
        // SAFETY: as above.
        assert!(!unsafe { put(&mut p2) }.is_null());
        let made = MADE.lock().unwrap().clone();
        assert_eq!(made.len(), 3, "{made:?}");
        assert_eq!(made[0].0, sys::PJRT_Error_Code_NOT_FOUND);
        assert!(made[0].1.contains("try_get cuda:missing"), "{made:?}");
        assert_eq!(made[1].0, sys::PJRT_Error_Code_NOT_FOUND);
        assert!(made[1].1.contains("get cuda:missing"), "{made:?}");
        assert_eq!(made[2].0, sys::PJRT_Error_Code_UNAVAILABLE);
        assert!(made[2].1.contains("store down"), "{made:?}");
    }

    #[test]
    fn values_of_any_size_round_trip_through_the_deleter() {
        for n in [0usize, 1, 7, 8, 4096] {
            let v: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let (ptr, len) = alloc_value(v.clone());
            assert_eq!(len, n);
            // SAFETY: `ptr` holds `len` bytes until freed.
            let got = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
            assert_eq!(got, &v[..]);
            // SAFETY: freed once, with its own deleter.
            unsafe { free_value(ptr) };
        }
    }
}
