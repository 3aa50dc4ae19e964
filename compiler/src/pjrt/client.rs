//! A PJRT client: the plugin's view of a set of devices, and the entry point for compiling,
//! loading executables and creating buffers.

use std::ffi::CString;
use std::sync::Arc;

use super::api::{string_from, Plugin};
use super::sys::{self, Args};
use crate::error::{Error, Result};

/// Options for creating a client.
#[derive(Clone, Debug, Default)]
pub struct ClientOptions {
    /// CPU plugin only: how many CPU devices the client exposes (the plugin's default is 4).
    pub cpu_device_count: Option<i64>,
}

pub(crate) struct ClientInner {
    pub(crate) plugin: Arc<Plugin>,
    pub(crate) raw: *mut sys::PJRT_Client,
    pub(crate) devices: Vec<*mut sys::PJRT_Device>,
    platform_name: String,
    platform_version: String,
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
        let name = CString::new("cpu_device_count").expect("literal has no NUL");
        let mut named = Vec::new();
        if let Some(n) = options.cpu_device_count {
            if n < 1 {
                return Err(Error::Argument {
                    message: format!("cpu_device_count must be at least 1, got {n}"),
                });
            }
            let mut v = sys::PJRT_NamedValue { ..Args::new() };
            v.name = name.as_ptr();
            v.name_size = name.as_bytes().len();
            v.type_ = sys::PJRT_NamedValue_kInt64;
            v.__bindgen_anon_1.int64_value = n;
            v.value_size = 1;
            named.push(v);
        }
        let mut args = sys::PJRT_Client_Create_Args {
            create_options: named.as_ptr(),
            num_options: named.len(),
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Client_Create, &mut args)?;
        let raw = args.client;
        let mut inner = ClientInner {
            plugin: plugin.clone(),
            raw,
            devices: Vec::new(),
            platform_name: String::new(),
            platform_version: String::new(),
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
        Ok(Client {
            inner: Arc::new(inner),
        })
    }

    /// The plugin's platform name (`cpu`, `cuda`, `neuron`).
    pub fn platform_name(&self) -> &str {
        &self.inner.platform_name
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
