//! A PJRT client: the plugin's view of a set of devices, and the entry point for compiling,
//! loading executables and creating buffers.

use std::ffi::CString;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::api::{string_from, Plugin};
use super::kv::{KeyValueStore, KvHandle};
use super::sys::{self, Args};
use crate::error::{Error, Result};

/// Options for creating a client.
#[derive(Clone, Default)]
pub struct ClientOptions {
    /// CPU plugin only: how many CPU devices the client exposes (the plugin's default is 4).
    pub cpu_device_count: Option<i64>,
    /// Other plugin options by name (the cuda plugin's `node_id`, `num_nodes`,
    /// `visible_devices`, `enable_mock_nccl`): passed as they are; a plugin refuses what it
    /// does not know.
    pub named: Vec<(String, OptionValue)>,
    /// The run's key-value store, for a client of several processes (see [`super::kv`]).
    pub kv_store: Option<Arc<dyn KeyValueStore>>,
}

impl ClientOptions {
    /// A client of `n` CPU devices and nothing else set (ignored by other plugins).
    pub fn cpu_devices(n: i64) -> ClientOptions {
        ClientOptions {
            cpu_device_count: Some(n),
            ..ClientOptions::default()
        }
    }
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("cpu_device_count", &self.cpu_device_count)
            .field("named", &self.named)
            .field("kv_store", &self.kv_store.is_some())
            .finish()
    }
}

/// The value of a named client option.
#[derive(Clone, Debug, PartialEq)]
pub enum OptionValue {
    /// A 64-bit integer (`PJRT_NamedValue_kInt64`).
    Int64(i64),
    /// A list of 64-bit integers (`PJRT_NamedValue_kInt64List`).
    Int64List(Vec<i64>),
    /// A boolean (`PJRT_NamedValue_kBool`).
    Bool(bool),
    /// A string (`PJRT_NamedValue_kString`).
    String(String),
    /// A 32-bit float (`PJRT_NamedValue_kFloat`).
    Float(f32),
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Arc<Plugin>,
    pub(crate) raw: *mut sys::PJRT_Client,
    pub(crate) devices: Vec<*mut sys::PJRT_Device>,
    platform_name: String,
    platform_version: String,
    /// Whether neuron-pc's own custom-call handlers are registered for this client's platform.
    own_handlers: bool,
    /// Whether reads copy a ready buffer straight from its memory ([`Buffer::to_host`]): on
    /// cpu, where device memory is host memory, until the plugin lacks a call that needs.
    pub(crate) reads_in_place: AtomicBool,
    /// The key-value callbacks' store: the client may call them as long as it lives, so this
    /// is dropped after it (fields drop after `Drop::drop` destroyed the client).
    _kv: Option<Box<KvHandle>>,
}

// SAFETY: PJRT clients are thread-safe by the C API's contract; the raw device pointers are
// owned by the client and immutable.
unsafe impl Send for ClientInner {}
// SAFETY: as above.
unsafe impl Sync for ClientInner {}

impl Drop for ClientInner {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Client_Destroy_Args {
            client: self.raw,
            ..Args::new()
        };
        if let Err(e) = pjrt_call!(&self.plugin, PJRT_Client_Destroy, &mut args) {
            tracing::warn!("destroying the PJRT client failed: {e}");
        }
    }
}

/// A client of one plugin. Cheap to clone; buffers and executables keep it alive.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

/// One addressable device of a client, by its position in the client's device list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device(pub usize);

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("platform", &self.inner.platform_name)
            .field("version", &self.inner.platform_version)
            .field("devices", &self.inner.devices.len())
            .finish()
    }
}

impl Client {
    /// Creates a client of `plugin` with `options`.
    pub fn new(plugin: &Arc<Plugin>, options: &ClientOptions) -> Result<Client> {
        let mut all: Vec<(String, OptionValue)> = Vec::new();
        if let Some(n) = options.cpu_device_count {
            if n < 1 {
                return Err(Error::Argument {
                    message: format!("cpu_device_count must be at least 1, got {n}"),
                });
            }
            all.push(("cpu_device_count".into(), OptionValue::Int64(n)));
        }
        all.extend(options.named.iter().cloned());
        // Backing storage of the names and values: alive until the call returns.
        let names: Vec<CString> = all
            .iter()
            .map(|(n, _)| {
                CString::new(n.as_str()).map_err(|_| Error::Argument {
                    message: format!("client option name {n:?} has a NUL byte"),
                })
            })
            .collect::<Result<_>>()?;
        let named: Vec<sys::PJRT_NamedValue> = all
            .iter()
            .zip(&names)
            .map(|((_, value), name)| {
                let mut v = sys::PJRT_NamedValue { ..Args::new() };
                v.name = name.as_ptr();
                v.name_size = name.as_bytes().len();
                match value {
                    OptionValue::Int64(i) => {
                        v.type_ = sys::PJRT_NamedValue_kInt64;
                        v.__bindgen_anon_1.int64_value = *i;
                        v.value_size = 1;
                    }
                    OptionValue::Int64List(l) => {
                        v.type_ = sys::PJRT_NamedValue_kInt64List;
                        v.__bindgen_anon_1.int64_array_value = l.as_ptr();
                        v.value_size = l.len();
                    }
                    OptionValue::Bool(b) => {
                        v.type_ = sys::PJRT_NamedValue_kBool;
                        v.__bindgen_anon_1.bool_value = *b;
                        v.value_size = 1;
                    }
                    OptionValue::Float(x) => {
                        v.type_ = sys::PJRT_NamedValue_kFloat;
                        v.__bindgen_anon_1.float_value = *x;
                        v.value_size = 1;
                    }
                    OptionValue::String(t) => {
                        v.type_ = sys::PJRT_NamedValue_kString;
                        v.__bindgen_anon_1.string_value = t.as_ptr() as *const std::ffi::c_char;
                        v.value_size = t.len();
                    }
                }
                v
            })
            .collect();
        let mut args = sys::PJRT_Client_Create_Args {
            create_options: named.as_ptr(),
            num_options: named.len(),
            ..Args::new()
        };
        let kv = options
            .kv_store
            .as_ref()
            .map(|s| Box::new(KvHandle(s.clone())));
        if let Some(handle) = &kv {
            handle.install(&mut args);
        }
        pjrt_call!(plugin, PJRT_Client_Create, &mut args)?;
        let raw = args.client;
        let mut inner = ClientInner {
            plugin: plugin.clone(),
            raw,
            devices: Vec::new(),
            platform_name: String::new(),
            platform_version: String::new(),
            own_handlers: false,
            reads_in_place: AtomicBool::new(false),
            _kv: kv,
        };
        let mut pn = sys::PJRT_Client_PlatformName_Args {
            client: raw,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Client_PlatformName, &mut pn)?;
        // SAFETY: the plugin returned a (pointer, size) string it owns for the client's life.
        inner.platform_name = unsafe { string_from(pn.platform_name, pn.platform_name_size) };
        let mut pv = sys::PJRT_Client_PlatformVersion_Args {
            client: raw,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Client_PlatformVersion, &mut pv)?;
        // SAFETY: as above.
        inner.platform_version =
            unsafe { string_from(pv.platform_version, pv.platform_version_size) };
        let mut dv = sys::PJRT_Client_AddressableDevices_Args {
            client: raw,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Client_AddressableDevices, &mut dv)?;
        if !dv.addressable_devices.is_null() {
            // SAFETY: the plugin returned an array of `num_addressable_devices` device pointers
            // owned by the client.
            let devs = unsafe {
                std::slice::from_raw_parts(dv.addressable_devices, dv.num_addressable_devices)
            };
            inner.devices = devs.to_vec();
        }
        if inner.platform_name == "cpu" {
            inner.reads_in_place = AtomicBool::new(true);
            inner.own_handlers = plugin.register_own_handlers().unwrap_or_else(|e| {
                tracing::warn!(
                    "neuron-pc's own custom calls are unavailable on this plugin ({e}); \
                     scanned loops use the plain StableHLO ops (zero-filled stacks, slices)"
                );
                false
            });
        }
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    /// The plugin's platform name (`cpu`, `cuda`, `neuron`).
    pub fn platform_name(&self) -> &str {
        &self.inner.platform_name
    }

    /// Whether this client runs neuron-pc's own custom calls that need no setup (on cpu, with
    /// a plugin that has the FFI extension): what [`crate::lower::LowerOptions`] may use.
    pub fn runs_own_handlers(&self) -> bool {
        self.inner.own_handlers
    }

    /// Whether [`Buffer::to_host`](super::Buffer::to_host) copies a ready buffer straight from
    /// its memory: on cpu, unless the plugin lacks a call that needs.
    pub fn reads_in_place(&self) -> bool {
        self.inner.reads_in_place.load(Ordering::Relaxed)
    }

    /// The plugin's platform version string.
    pub fn platform_version(&self) -> &str {
        &self.inner.platform_version
    }

    /// The plugin this client uses.
    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.inner.plugin
    }

    /// Number of addressable devices.
    pub fn device_count(&self) -> usize {
        self.inner.devices.len()
    }

    /// The addressable devices, in the client's order.
    pub fn devices(&self) -> Vec<Device> {
        (0..self.inner.devices.len()).map(Device).collect()
    }

    pub(crate) fn raw_device(&self, d: Device) -> Result<*mut sys::PJRT_Device> {
        self.inner
            .devices
            .get(d.0)
            .copied()
            .ok_or_else(|| Error::Argument {
                message: format!(
                    "device {} does not exist (the client has {})",
                    d.0,
                    self.inner.devices.len()
                ),
            })
    }

    pub(crate) fn plugin_ref(&self) -> &Plugin {
        &self.inner.plugin
    }
}
