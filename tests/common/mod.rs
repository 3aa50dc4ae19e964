//! Helpers every test program of this folder shares: the devices tests open, and the PyTorch
//! fixture. Each program includes this module (`#[path = "../common/mod.rs"] mod common;`); a
//! program that does not use a helper leaves it dead, hence the `allow` there.

pub mod torch_fixture;

use neuron_pc::compile::CacheConfig;
use neuron_pc::{DeviceConfig, LazyDevice};

/// The test devices' configuration: the cpu target, no compile cache (a test compiles what it
/// runs, and leaves nothing behind in the user's cache).
pub fn config() -> DeviceConfig {
    DeviceConfig {
        cache: CacheConfig::disabled(),
        ..DeviceConfig::default()
    }
}

/// One cpu device, no compile cache.
pub fn device() -> LazyDevice {
    LazyDevice::new(config()).expect("cpu device: run scripts/setup")
}

/// A data-parallel device of `replicas` cpu devices, no compile cache.
pub fn replicated(replicas: usize) -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        replicas,
        ..config()
    })
    .expect("cpu device: run scripts/setup")
}
