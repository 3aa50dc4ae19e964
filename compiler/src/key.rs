//! Cache keys: what makes two compilations interchangeable.
//!
//! The key is SHA-256 over every input that can change the executable, each as a named,
//! length-prefixed component in a fixed order: the format version, the program text, the
//! serialized compile options, the target, the flags that change code generation, and the
//! compiler's identity (platform name and version, PJRT API version, plugin library fingerprint,
//! and the `XLA_FLAGS` the plugin read at start).
//! A wrong key silently hands users someone else's executable, so each component has a test
//! showing that changing it changes the key, and the components are kept (hex digests) so
//! `neuron-pc cache show` can explain why two graphs got different keys.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};
use crate::flags::CompilerFlags;
use crate::pjrt::{Client, CompileOptions};

/// Change this when any key input changes (what enters the key, or how it is encoded), so that
/// entries written under the old rules are never served.
pub const CACHE_FORMAT_VERSION: u32 = 2;

/// Bytes read from each end of the plugin library for its fingerprint.
const FINGERPRINT_SAMPLE: u64 = 1 << 20;

/// Who compiles: two plugins that differ in any of these may produce different executables.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CompilerIdentity {
    /// The plugin's platform name (`cpu`, `cuda`, `neuron`).
    pub platform_name: String,
    /// The plugin's platform version string, as the plugin reports it.
    pub platform_version: String,
    /// PJRT C API version of the plugin, "major.minor".
    pub api_version: String,
    /// See [`plugin_fingerprint`].
    pub plugin_fingerprint: String,
    /// `XLA_FLAGS` as the plugin read it when the process started (XLA parses it once, into
    /// the defaults of every compilation): `--xla_gpu_deterministic_ops=true` and the like
    /// change the executable. Empty when unset; absent from records written before it.
    #[serde(default)]
    pub xla_flags: String,
}

impl CompilerIdentity {
    /// The identity of the plugin behind `client`.
    pub fn of(client: &Client) -> Result<CompilerIdentity> {
        let (major, minor) = client.plugin().api_version();
        Ok(CompilerIdentity {
            platform_name: client.platform_name().to_string(),
            platform_version: client.platform_version().to_string(),
            api_version: format!("{major}.{minor}"),
            plugin_fingerprint: plugin_fingerprint(client.plugin().path())?,
            xla_flags: std::env::var("XLA_FLAGS")
                .unwrap_or_default()
                .trim()
                .to_string(),
        })
    }

    /// One string for failure records and messages.
    pub fn version_string(&self) -> String {
        format!(
            "{} {} pjrt {} lib {}",
            self.platform_name,
            self.platform_version,
            self.api_version,
            &self.plugin_fingerprint[..16.min(self.plugin_fingerprint.len())]
        )
    }
}

/// SHA-256 of the library's size, its first and its last MiB. Hashing all of a 260 MB plugin
/// would cost most of a second at every process start; the sampled ends hold the ELF headers,
/// the GNU build-id note and the section table, which differ between any two builds.
pub fn plugin_fingerprint(path: &Path) -> Result<String> {
    let io = |e: std::io::Error| Error::PluginLoad {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let size = f.metadata().map_err(io)?.len();
    let mut h = Sha256::new();
    h.update(size.to_le_bytes());
    let mut buf = Vec::new();
    (&mut f)
        .take(FINGERPRINT_SAMPLE)
        .read_to_end(&mut buf)
        .map_err(io)?;
    h.update(&buf);
    if size > FINGERPRINT_SAMPLE {
        buf.clear();
        f.seek(SeekFrom::Start(
            size.saturating_sub(FINGERPRINT_SAMPLE)
                .max(FINGERPRINT_SAMPLE),
        ))
        .map_err(io)?;
        f.take(FINGERPRINT_SAMPLE)
            .read_to_end(&mut buf)
            .map_err(io)?;
        h.update(&buf);
    }
    Ok(hex::encode(h.finalize()))
}

/// The key of an executable: the SHA-256 of everything that can change what compiling a program
/// gives, and the named components it was computed from. (The cache crate stores it as an
/// `EntryKey`; the root crate's `compile::ProgramKey` holds both forms.)
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecutableKey {
    /// 64 lowercase hex characters.
    pub hex: String,
    /// Component name → value (digests for large inputs), in key order.
    pub components: BTreeMap<String, String>,
}

/// Computes the key of compiling `program` with `options` under `flags` by `compiler`.
pub fn cache_key(
    program: &str,
    options: &CompileOptions,
    flags: &CompilerFlags,
    compiler: &CompilerIdentity,
) -> ExecutableKey {
    let mut parts: Vec<(String, String)> = vec![
        ("format_version".into(), CACHE_FORMAT_VERSION.to_string()),
        ("program_sha256".into(), sha256_hex(program.as_bytes())),
        (
            "compile_options_sha256".into(),
            sha256_hex(&options.to_proto()),
        ),
    ];
    for (name, value) in flags.key_fields() {
        parts.push((format!("flag.{name}"), value));
    }
    parts.extend([
        (
            "compiler.platform_name".into(),
            compiler.platform_name.clone(),
        ),
        (
            "compiler.platform_version".into(),
            compiler.platform_version.clone(),
        ),
        (
            "compiler.pjrt_api_version".into(),
            compiler.api_version.clone(),
        ),
        (
            "compiler.plugin_fingerprint".into(),
            compiler.plugin_fingerprint.clone(),
        ),
        ("compiler.xla_flags".into(), compiler.xla_flags.clone()),
    ]);
    let mut h = Sha256::new();
    for (name, value) in &parts {
        for field in [name.as_bytes(), value.as_bytes()] {
            h.update((field.len() as u64).to_le_bytes());
            h.update(field);
        }
    }
    ExecutableKey {
        hex: hex::encode(h.finalize()),
        components: parts.into_iter().collect(),
    }
}

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The old name of [`ExecutableKey`] (until 0.2).
#[deprecated(since = "0.1.1", note = "renamed `ExecutableKey`")]
pub type CacheKey = ExecutableKey;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pjrt::OverrideValue;

    fn compiler() -> CompilerIdentity {
        CompilerIdentity {
            platform_name: "cpu".into(),
            platform_version: "cpu".into(),
            api_version: "0.81".into(),
            plugin_fingerprint: "ab".repeat(32),
            xla_flags: String::new(),
        }
    }

    fn base() -> (String, CompileOptions, CompilerFlags, CompilerIdentity) {
        (
            "func.func @main() {}".into(),
            CompileOptions::default(),
            CompilerFlags::parse("").unwrap(),
            compiler(),
        )
    }

    #[test]
    fn the_key_is_stable_and_well_formed() {
        let (p, o, f, c) = base();
        let a = cache_key(&p, &o, &f, &c);
        assert_eq!(a, cache_key(&p, &o, &f, &c));
        assert_eq!(a.hex.len(), 64);
        assert!(a
            .hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_eq!(
            a.components["format_version"],
            CACHE_FORMAT_VERSION.to_string()
        );
    }

    #[test]
    fn every_input_changes_the_key() {
        let (p, o, f, c) = base();
        let k0 = cache_key(&p, &o, &f, &c).hex;
        let mut variants: Vec<(&str, String)> = Vec::new();
        variants.push((
            "program",
            cache_key("func.func @main() { }", &o, &f, &c).hex,
        ));
        let o2 = CompileOptions::default()
            .with_override("xla_backend_optimization_level", OverrideValue::Int(1));
        variants.push(("options", cache_key(&p, &o2, &f, &c).hex));
        let o3 = CompileOptions {
            num_replicas: 2,
            ..CompileOptions::default()
        };
        variants.push(("replicas", cache_key(&p, &o3, &f, &c).hex));
        for flag in [
            "--optlevel O1",
            "--optlevel O3",
            "--auto-cast matmult",
            "--auto-cast all --auto-cast-type fp16",
            "--model-type transformer",
            "--target trn1",
            "--target trn1 --distribution-strategy llm-training",
            "--target trn1 --distribution-strategy nemo",
            "--target trn1 --enable-saturate-infinity",
            "--target trn1 --enable-mixed-precision-accumulation",
            "--target trn1 --enable-fast-context-switch",
            "--target trn1 --enable-fast-loading-neuron-binaries",
            "--target trn1 --logical-nc-config 2",
        ] {
            let fl = CompilerFlags::parse(flag).unwrap();
            variants.push((flag, cache_key(&p, &o, &fl, &c).hex));
        }
        for field in 0..5 {
            let mut c2 = compiler();
            match field {
                0 => c2.platform_name = "cuda".into(),
                1 => c2.platform_version = "cpu 2".into(),
                2 => c2.api_version = "0.82".into(),
                3 => c2.xla_flags = "--xla_gpu_deterministic_ops=true".into(),
                _ => c2.plugin_fingerprint = "cd".repeat(32),
            }
            variants.push(("compiler", cache_key(&p, &o, &f, &c2).hex));
        }
        let mut seen = std::collections::HashSet::new();
        seen.insert(k0.clone());
        for (what, k) in &variants {
            assert_ne!(*k, k0, "changing {what} must change the key");
            assert!(
                seen.insert(k.clone()),
                "{what} collided with another variant"
            );
        }
    }

    #[test]
    fn flags_that_do_not_change_the_executable_do_not_change_the_key() {
        let (p, o, f, c) = base();
        let k0 = cache_key(&p, &o, &f, &c).hex;
        let f2 = CompilerFlags::parse("--retry_failed_compilation --cache_dir /tmp/x").unwrap();
        assert_eq!(cache_key(&p, &o, &f2, &c).hex, k0);
        // neuronx-cc flags mean nothing on cpu; on trn only code-changing ones count.
        let f3 = CompilerFlags::parse("--distribution-strategy llm-training --logfile l").unwrap();
        assert_eq!(cache_key(&p, &o, &f3, &c).hex, k0);
        let trn = CompilerFlags::parse("--target trn1").unwrap();
        let trn_log = CompilerFlags::parse("--target trn1 --logfile l --framework XLA").unwrap();
        assert_eq!(
            cache_key(&p, &o, &trn, &c).hex,
            cache_key(&p, &o, &trn_log, &c).hex
        );
    }

    #[test]
    fn fingerprint_sees_both_ends_and_the_size() {
        let dir = std::env::temp_dir().join(format!("npc-fp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("lib.so");
        let mut data = vec![7u8; 3 << 20];
        std::fs::write(&file, &data).unwrap();
        let a = plugin_fingerprint(&file).unwrap();
        data[10] = 8;
        std::fs::write(&file, &data).unwrap();
        let b = plugin_fingerprint(&file).unwrap();
        let n = data.len();
        data[n - 10] = 9;
        std::fs::write(&file, &data).unwrap();
        let c = plugin_fingerprint(&file).unwrap();
        data.push(0);
        std::fs::write(&file, &data).unwrap();
        let d = plugin_fingerprint(&file).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let all = [a, b, c, d];
        for i in 0..4 {
            for j in i + 1..4 {
                assert_ne!(all[i], all[j]);
            }
        }
    }
}
