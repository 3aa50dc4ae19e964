//! The plugin side of `neuron-pc cache verify`: does each stored executable take and return
//! what its stored program does? The cache crate knows nothing of programs, so `verify` asks
//! this check (see `neuron_pc_cache::ExecutableCheck`).

use std::sync::OnceLock;

use neuron_pc_cache::CacheKey;
use neuron_pc_compiler::error::Error;
use neuron_pc_compiler::flags::CompilerFlags;
use neuron_pc_compiler::pjrt::{find_plugin, Client, ClientOptions, Plugin, Signature};

/// The client of the target `NEURON_CC_FLAGS` selects, loaded on first use; `None` (with one
/// warning) when it cannot be loaded, and then nothing is judged.
fn client() -> Option<&'static Client> {
    static CLIENT: OnceLock<Option<Client>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let load = || -> anyhow::Result<Client> {
                let flags = CompilerFlags::from_env()?;
                let plugin = Plugin::load(&find_plugin(flags.target)?)?;
                Ok(Client::new(&plugin, &ClientOptions::default())?)
            };
            load()
                .map_err(|e| {
                    tracing::warn!("verify: executables not checked against their programs: {e:#}")
                })
                .ok()
        })
        .as_ref()
}

/// `Err(why)` when `executable` loads but does not take or return what `program` does.
/// Executables this plugin cannot load (another target or compiler) are not judged here:
/// their digests were checked, and the job that uses them checks them on load.
pub fn check_executable(key: &CacheKey, program: &str, executable: &[u8]) -> Result<(), String> {
    let Some(signature) = Signature::parse(program) else {
        return Ok(());
    };
    let Some(client) = client() else {
        return Ok(());
    };
    match client.deserialize(executable, Some(signature)) {
        Ok(_) => Ok(()),
        Err(e @ Error::Interface { .. }) => Err(e.to_string()),
        Err(e) => {
            tracing::debug!("verify: {key} does not load here ({e}); not judged");
            Ok(())
        }
    }
}
