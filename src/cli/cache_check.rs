//! The plugin side of `neuron-pc cache verify`: does each stored executable load, and take and
//! return what its stored program does? The cache crate knows nothing of programs, so `verify`
//! asks this check (see `neuron_pc_cache::ExecutableCheck`).

use std::sync::OnceLock;

use neuron_pc_cache::{EntryKey, EntryRecord, Judged};
use neuron_pc_compiler::error::Error;
use neuron_pc_compiler::flags::CompilerFlags;
use neuron_pc_compiler::key::CompilerIdentity;
use neuron_pc_compiler::pjrt::{find_plugin, Client, ClientOptions, Plugin, Signature};

/// The client of the target `NEURON_CC_FLAGS` selects and its identity, loaded on first use;
/// `None` (with one warning) when it cannot be loaded, and then nothing is loaded.
fn client() -> Option<&'static (Client, CompilerIdentity)> {
    static CLIENT: OnceLock<Option<(Client, CompilerIdentity)>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            let load = || -> anyhow::Result<(Client, CompilerIdentity)> {
                let flags = CompilerFlags::from_env()?;
                let plugin = Plugin::load(&find_plugin(flags.target)?)?;
                // it only loads executables, maybe beside a running job: memory as needed
                let options = ClientOptions {
                    named: neuron_pc::distributed::allocator_options(flags.target, true)?,
                    ..ClientOptions::default()
                };
                let client = Client::new(&plugin, &options)?;
                let identity = CompilerIdentity::of(&client)?;
                Ok((client, identity))
            };
            load()
                .map_err(|e| tracing::warn!("verify: executables not loaded, digests only: {e:#}"))
                .ok()
        })
        .as_ref()
}

/// Which compiler wrote an entry, from its key inputs; `None` when it does not differ from
/// `mine`, else what differs.
fn other_compiler(record: &EntryRecord, mine: &CompilerIdentity) -> Option<String> {
    let fields = [
        ("compiler.platform_name", &mine.platform_name),
        ("compiler.platform_version", &mine.platform_version),
        ("compiler.plugin_fingerprint", &mine.plugin_fingerprint),
    ];
    fields
        .iter()
        .find_map(|(name, value)| match record.key_inputs.get(*name) {
            Some(v) if v == *value => None,
            Some(_) => Some("written by another compiler".to_string()),
            None => Some("the record names no compiler".to_string()),
        })
}

/// Loads `executable` with this host's plugin when this compiler wrote it: one that does not
/// load, or does not take or return what `program` does, is bad (`Err`). Executables of
/// another compiler (another target or plugin build) cannot be judged here; their digests were
/// checked, and that is what the report says of them.
pub fn check_executable(
    key: &EntryKey,
    record: &EntryRecord,
    program: &str,
    executable: &[u8],
) -> Result<Judged, String> {
    let Some((client, identity)) = client() else {
        return Ok(Judged::NotLoaded("no plugin could be loaded".into()));
    };
    if let Some(why) = other_compiler(record, identity) {
        return Ok(Judged::NotLoaded(why));
    }
    let signature = Signature::parse(program);
    let against_program = signature.is_some();
    match client.deserialize(executable, signature) {
        Ok(_) => Ok(Judged::Loaded { against_program }),
        Err(e @ Error::Interface { .. }) => {
            Err(format!("executable does not match its program: {e}"))
        }
        Err(e) => {
            tracing::debug!("verify: {key} does not load: {e}");
            Err(format!(
                "executable does not load with the compiler that wrote it: {e}"
            ))
        }
    }
}
