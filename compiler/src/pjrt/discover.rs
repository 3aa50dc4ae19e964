//! Where a target's PJRT plugin library is found (the target's variable, a virtual
//! environment, the active Python), and the probe `neuron-pc targets` reports.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::api::Plugin;
use super::client::{Client, ClientOptions};
use super::pins::pins_for;
use super::target::Target;
use crate::error::{Error, Result};

/// A target's plugin library: its facts come from the pinned packages
/// (`compiler/plugins.tsv`), which name their target, so they live here and not in
/// `target.rs` (which the pins use).
impl Target {
    /// The file name of the target's default plugin library.
    pub fn library(self) -> &'static str {
        if let Some(pin) = pins_for(self).next() {
            return pin.library.rsplit('/').next().unwrap_or(pin.library);
        }
        match self {
            Target::Cpu => "libpjrt_cpu.so",
            Target::Cuda => "xla_cuda12_pjrt.so",
            Target::Trn1 | Target::Trn2 => "libneuronpjrt.so",
        }
    }

    /// Where the plugin sits inside a Python environment's site-packages, in order of
    /// preference: the pinned packages of `compiler/plugins.tsv` (the default first), then
    /// packages neuron-pc does not pin (`xla-cuda12-pjrt`, `libneuronxla`).
    fn site_packages_paths(self) -> Vec<&'static str> {
        let unpinned: &[&str] = match self {
            Target::Cpu => &[],
            Target::Cuda => &["xla_plugins/xla_cuda12_pjrt/xla_cuda12_pjrt.so"],
            Target::Trn1 | Target::Trn2 => &["libneuronxla/libneuronpjrt.so"],
        };
        let mut paths: Vec<&'static str> = Vec::new();
        // versions of one package share a path: each path once
        for p in pins_for(self)
            .map(|p| p.library)
            .chain(unpinned.iter().copied())
        {
            if !paths.contains(&p) {
                paths.push(p);
            }
        }
        paths
    }
}

/// Finds the plugin library of `target`: the target's variable if set, else the project's or
/// the active Python environment.
pub fn find_plugin(target: Target) -> Result<PathBuf> {
    let not_found = || Error::PluginNotFound {
        target: target.name().to_string(),
        library: target.library().to_string(),
        env_var: target.env_var().to_string(),
    };
    if let Some(p) = std::env::var_os(target.env_var()).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(Error::PluginLoad {
                path: p.display().to_string(),
                message: format!("{} names a file that does not exist", target.env_var()),
            })
        };
    }
    let find_in = |dirs: Vec<PathBuf>| {
        dirs.iter()
            .flat_map(|sp| {
                target
                    .site_packages_paths()
                    .into_iter()
                    .map(move |rel| sp.join(rel))
            })
            .find(|p| p.is_file())
    };
    // Asking python3 costs ~0.1 s (a process start): only when no virtual environment has it.
    find_in(venv_site_packages_dirs())
        .or_else(|| find_in(python_site_packages()))
        .ok_or_else(not_found)
}

/// Candidate site-packages directories of virtual environments, most specific first.
fn venv_site_packages_dirs() -> Vec<PathBuf> {
    let mut venvs: Vec<PathBuf> = Vec::new();
    for var in ["NEURON_PC_VENV", "VIRTUAL_ENV"] {
        if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            venvs.push(PathBuf::from(v));
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        venvs.extend(cwd.ancestors().map(|a| a.join(".venv")));
    }
    // The checkout this binary was built from: lets `cargo run` and tests work from anywhere.
    venvs.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv"));
    venvs.iter().flat_map(|v| venv_site_packages(v)).collect()
}

fn venv_site_packages(venv: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(venv.join("lib")) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path().join("site-packages")))
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    found
}

/// The active `python3`'s site-packages, asked only when nothing closer had the plugin.
fn python_site_packages() -> Vec<PathBuf> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import site\nfor p in site.getsitepackages()+[site.getusersitepackages()]: print(p)",
        ])
        .stderr(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout)
            .lines()
            .map(PathBuf::from)
            .collect(),
        _ => Vec::new(),
    }
}

/// What `neuron-pc targets` reports for one target.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TargetStatus {
    /// The target probed.
    pub target: Target,
    /// The file name of its default plugin library ([`Target::library`]).
    pub library: String,
    /// The variable that names the library's path explicitly ([`Target::env_var`]).
    pub env_var: String,
    /// Where the library was found, if it was.
    pub path: Option<PathBuf>,
    /// PJRT C API version of the loaded plugin, as "major.minor".
    pub api_version: Option<String>,
    /// The client's platform name (e.g. `cpu`, `cuda`), if a client could be opened.
    pub platform_name: Option<String>,
    /// The client's platform version string, if a client could be opened.
    pub platform_version: Option<String>,
    /// How many addressable devices the client has, if a client could be opened.
    pub devices: Option<usize>,
    /// Why the target is not usable, if it is not.
    pub error: Option<String>,
}

impl TargetStatus {
    /// Finds, loads and opens a client for `target`, recording how far it got.
    pub fn probe(target: Target) -> TargetStatus {
        let mut s = TargetStatus {
            target,
            library: target.library().to_string(),
            env_var: target.env_var().to_string(),
            path: None,
            api_version: None,
            platform_name: None,
            platform_version: None,
            devices: None,
            error: None,
        };
        let result = (|| -> Result<()> {
            let path = find_plugin(target)?;
            s.path = Some(path.clone());
            let plugin: Arc<Plugin> = Plugin::load(&path)?;
            let (major, minor) = plugin.api_version();
            s.api_version = Some(format!("{major}.{minor}"));
            let client = Client::new(&plugin, &ClientOptions::default())?;
            s.platform_name = Some(client.platform_name().to_string());
            s.platform_version = Some(client.platform_version().to_string());
            s.devices = Some(client.device_count());
            Ok(())
        })();
        if let Err(e) = result {
            s.error = Some(e.to_string());
        }
        s
    }
}
