//! The device's view of the persistent compile cache (placeholder until the cache crate lands).

use neuron_pc_compiler::key::{CacheKey, CompilerIdentity};

use crate::device::jit::Obtained;
use crate::error::Result;

pub(crate) struct Stored {
    pub bytes: Vec<u8>,
    pub how: Obtained,
    pub compile_ms: f64,
}

pub(crate) struct Persistent;

impl Persistent {
    pub fn open(_url: Option<&str>, _compiler: &CompilerIdentity) -> Result<Option<Persistent>> {
        Ok(None)
    }
    pub fn contains(&self, _key: &str) -> bool {
        false
    }
    pub fn get_or_compile(
        &self,
        _key: &CacheKey,
        _text: &str,
        _retry_failed: bool,
        compile: impl FnOnce() -> std::result::Result<Vec<u8>, String>,
    ) -> std::result::Result<Stored, String> {
        Ok(Stored { bytes: compile()?, how: Obtained::Compiled, compile_ms: 0.0 })
    }
    pub fn replace(&self, _key: &CacheKey, _text: &str, _bytes: Vec<u8>, _compile_ms: f64) {}
}
