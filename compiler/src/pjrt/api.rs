//! Loading a plugin library and making checked calls into its `PJRT_Api` table.

use std::collections::HashMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use super::sys::{self, Args};
use crate::error::{Error, PjrtErrorCode, Result};

/// A loaded PJRT plugin: the library (kept loaded for the process's life) and its API table.
pub struct Plugin {
    api: &'static sys::PJRT_Api,
    path: PathBuf,
    // Never dropped while the plugin is in use; plugins are not designed to be unloaded.
    _lib: libloading::Library,
}

// SAFETY: the PJRT C API is thread-safe by contract (clients, executables and buffers may be used
// from several threads); the table itself is immutable after loading.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("api_version", &self.api_version())
            .finish()
    }
}

/// Plugins already loaded in this process, by canonical path: a plugin is initialized once.
fn loaded() -> &'static Mutex<HashMap<PathBuf, Arc<Plugin>>> {
    static LOADED: OnceLock<Mutex<HashMap<PathBuf, Arc<Plugin>>>> = OnceLock::new();
    LOADED.get_or_init(Default::default)
}

impl Plugin {
    /// Loads the plugin at `path` (once per process) and initializes it. A library whose SHA-256
    /// is not the one pinned for it (or given in `NEURON_PC_PLUGIN_SHA256`) is refused before
    /// it is loaded; see [`super::integrity`].
    pub fn load(path: &Path) -> Result<Arc<Plugin>> {
        let load_err = |message: String| Error::PluginLoad {
            path: path.display().to_string(),
            message,
        };
        let canonical = path.canonicalize().map_err(|e| load_err(e.to_string()))?;
        let mut map = loaded().lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(&canonical) {
            return Ok(p.clone());
        }
        // Loading runs the library's code: its digest is checked first.
        super::integrity::verify(
            &canonical,
            &super::integrity::Expected::for_library(&canonical),
        )?;
        super::logging::quiet_plugin_logs();
        super::malloc::tune_allocator_once();
        // A JAX cuda plugin loads its CUDA libraries lazily; a missing one is named here.
        super::cuda_libs::preload(&canonical)?;
        // SAFETY: loading a shared library runs its initializers; the path names a PJRT plugin
        // the user chose. Nothing else can be checked before loading.
        let lib =
            unsafe { libloading::Library::new(&canonical) }.map_err(|e| load_err(e.to_string()))?;
        // SAFETY: `GetPjrtApi` is the documented entry point of every PJRT plugin and takes no
        // arguments; a library without it is refused below.
        let get_api: libloading::Symbol<'_, unsafe extern "C" fn() -> *const sys::PJRT_Api> =
            unsafe { lib.get(b"GetPjrtApi\0") }
                .map_err(|_| load_err("not a PJRT plugin (no GetPjrtApi symbol)".into()))?;
        // SAFETY: see above; the returned pointer is checked for null before use.
        let raw = unsafe { get_api() };
        if raw.is_null() {
            return Err(load_err("GetPjrtApi returned null".into()));
        }
        // SAFETY: non-null, and the plugin keeps its API table alive while the library is loaded;
        // the library is stored in the returned Plugin which lives in a process-wide map.
        let api: &'static sys::PJRT_Api = unsafe { &*raw };
        let plugin = Plugin {
            api,
            path: canonical.clone(),
            _lib: lib,
        };
        plugin.check_version()?;
        let mut args = sys::PJRT_Plugin_Initialize_Args::new();
        pjrt_call!(&plugin, PJRT_Plugin_Initialize, &mut args)?;
        let plugin = Arc::new(plugin);
        map.insert(canonical, plugin.clone());
        Ok(plugin)
    }

    fn check_version(&self) -> Result<()> {
        let (major, minor) = self.api_version();
        let ours = (sys::PJRT_API_MAJOR as i32, sys::PJRT_API_MINOR as i32);
        if self.api.struct_size < std::mem::offset_of!(sys::PJRT_Api, PJRT_Plugin_Initialize)
            || major != ours.0
        {
            return Err(Error::PluginLoad {
                path: self.path.display().to_string(),
                message: format!(
                    "PJRT C API {major}.{minor} is not compatible with the {}.{} this build was \
                     generated for",
                    ours.0, ours.1
                ),
            });
        }
        Ok(())
    }

    /// The plugin's PJRT C API version (major, minor).
    pub fn api_version(&self) -> (i32, i32) {
        (
            self.api.pjrt_api_version.major_version,
            self.api.pjrt_api_version.minor_version,
        )
    }

    /// The library this plugin was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn raw(&self) -> &'static sys::PJRT_Api {
        self.api
    }

    /// True when the plugin's table is long enough to hold the field at `offset`: an older
    /// plugin has a shorter table and lacks the newer functions.
    pub(crate) fn has_field(&self, offset: usize) -> bool {
        offset < self.api.struct_size
    }

    /// Turns a `PJRT_Error*` into a typed error (and frees it); null means success.
    pub(crate) fn check(&self, api_fn: &'static str, err: *mut sys::PJRT_Error) -> Result<()> {
        if err.is_null() {
            return Ok(());
        }
        let mut msg = sys::PJRT_Error_Message_Args {
            error: err,
            ..Args::new()
        };
        let mut code = sys::PJRT_Error_GetCode_Args {
            error: err,
            ..Args::new()
        };
        let mut destroy = sys::PJRT_Error_Destroy_Args {
            error: err,
            ..Args::new()
        };
        // SAFETY: `err` is a live error returned by the plugin; these three functions are part of
        // every API version. The message is copied before the error is destroyed.
        let (message, raw_code) = unsafe {
            if let Some(f) = self.api.PJRT_Error_Message {
                f(&mut msg);
            }
            let message = string_from(msg.message, msg.message_size);
            let raw_code = match self.api.PJRT_Error_GetCode {
                Some(f) if f(&mut code).is_null() => code.code as i32,
                _ => 2,
            };
            if let Some(f) = self.api.PJRT_Error_Destroy {
                f(&mut destroy);
            }
            (message, raw_code)
        };
        Err(Error::Pjrt {
            api_fn,
            code: PjrtErrorCode::from_raw(raw_code),
            message,
        })
    }
}

/// Copies a (pointer, length) string owned by the plugin.
///
/// # Safety
/// `ptr` must be null or point to `len` readable bytes.
pub(crate) unsafe fn string_from(ptr: *const std::os::raw::c_char, len: usize) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(ptr as *const u8, len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Copies a NUL-terminated string owned by the plugin.
///
/// # Safety
/// `ptr` must be null or a valid NUL-terminated string.
#[allow(dead_code)]
pub(crate) unsafe fn cstring_from(ptr: *const std::os::raw::c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}
