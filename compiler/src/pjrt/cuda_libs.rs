//! The CUDA libraries of a JAX cuda plugin, found the way JAX finds them.
//!
//! `jax_plugins/xla_cudaNN/xla_cuda_plugin.so` links only libc and friends: it `dlopen`s the CUDA
//! runtime, cuBLAS, cuDNN, ... by soname when a client starts. JAX's `jax_plugins/xla_cudaNN`
//! package loads them first from the `nvidia-*` wheels of the same site-packages
//! (`nvidia/<pkg>/lib/<soname>`), so the plugin's later `dlopen` by soname finds the loaded copy.
//! [`preload`] does the same before the plugin is loaded, falling back to the library path (a
//! system CUDA), and refuses the plugin with one line naming every library it did not find:
//! without them the plugin would fail later, deep inside client creation.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// One library the plugin needs: its soname, the `nvidia/<dir>/lib` it sits in, the wheel that
/// ships it, and whether a client can start without it.
struct CudaLib {
    soname: &'static str,
    dir: &'static str,
    wheel: &'static str,
    required: bool,
}

const fn lib(soname: &'static str, dir: &'static str, wheel: &'static str) -> CudaLib {
    CudaLib {
        soname,
        dir,
        wheel,
        required: true,
    }
}

const fn optional(soname: &'static str, dir: &'static str, wheel: &'static str) -> CudaLib {
    CudaLib {
        soname,
        dir,
        wheel,
        required: false,
    }
}

/// JAX's `_load_nvidia_libraries` for CUDA 13, in load order (a library before its users).
const CUDA13: &[CudaLib] = &[
    lib("libcudart.so.13", "cu13", "nvidia-cuda-runtime"),
    lib("libnvrtc.so.13", "cu13", "nvidia-cuda-nvrtc"),
    lib("libcublasLt.so.13", "cu13", "nvidia-cublas"),
    lib("libcublas.so.13", "cu13", "nvidia-cublas"),
    lib("libcusparse.so.12", "cu13", "nvidia-cusparse"),
    lib("libcusolver.so.12", "cu13", "nvidia-cusolver"),
    lib("libcufft.so.12", "cu13", "nvidia-cufft"),
    lib("libcudnn.so.9", "cudnn", "nvidia-cudnn-cu13"),
    optional("libnccl.so.2", "nccl", "nvidia-nccl-cu13"),
    optional("libcupti.so.13", "cu13", "nvidia-cuda-cupti"),
    optional("libnvshmem_host.so.3", "nvshmem", "nvidia-nvshmem-cu13"),
];

/// The same for CUDA 12 (one wheel, one directory per library).
const CUDA12: &[CudaLib] = &[
    lib(
        "libcudart.so.12",
        "cuda_runtime",
        "nvidia-cuda-runtime-cu12",
    ),
    lib("libnvrtc.so.12", "cuda_nvrtc", "nvidia-cuda-nvrtc-cu12"),
    lib("libcublasLt.so.12", "cublas", "nvidia-cublas-cu12"),
    lib("libcublas.so.12", "cublas", "nvidia-cublas-cu12"),
    lib("libcusparse.so.12", "cusparse", "nvidia-cusparse-cu12"),
    lib("libcusolver.so.11", "cusolver", "nvidia-cusolver-cu12"),
    lib("libcufft.so.11", "cufft", "nvidia-cufft-cu12"),
    lib("libcudnn.so.9", "cudnn", "nvidia-cudnn-cu12"),
    optional("libnccl.so.2", "nccl", "nvidia-nccl-cu12"),
    optional("libcupti.so.12", "cuda_cupti", "nvidia-cuda-cupti-cu12"),
    optional("libnvshmem_host.so.3", "nvshmem", "nvidia-nvshmem-cu12"),
];

/// The NVIDIA driver's library: never in a wheel.
const DRIVER: &str = "libcuda.so.1";

/// For a JAX cuda plugin (`.../site-packages/jax_plugins/xla_cudaNN/<file>`): its CUDA major
/// version and its site-packages directory. `None` for any other library.
fn jax_cuda_plugin(plugin: &Path) -> Option<(u32, PathBuf)> {
    let dir = plugin.parent()?;
    let major = match dir.file_name()?.to_str()? {
        "xla_cuda12" => 12,
        "xla_cuda13" => 13,
        _ => return None,
    };
    let jax_plugins = dir.parent()?;
    if jax_plugins.file_name()? != "jax_plugins" {
        return None;
    }
    Some((major, jax_plugins.parent()?.to_path_buf()))
}

/// Loads the CUDA libraries a JAX cuda plugin at `plugin` needs, from its site-packages'
/// `nvidia-*` wheels or else the library path, and keeps them loaded for the process's life.
/// Nothing to do for another plugin. One library missing: one line naming every missing one.
pub(crate) fn preload(plugin: &Path) -> Result<()> {
    let Some((major, site)) = jax_cuda_plugin(plugin) else {
        return Ok(());
    };
    let libs = if major == 13 { CUDA13 } else { CUDA12 };
    let mut missing: Vec<String> = Vec::new();
    for l in libs {
        let in_wheel = site.join("nvidia").join(l.dir).join("lib").join(l.soname);
        if !open_forever(&in_wheel) && !open_forever(Path::new(l.soname)) {
            if l.required {
                missing.push(format!("{} ({})", l.soname, l.wheel));
            } else {
                tracing::debug!("optional CUDA library {} not found", l.soname);
            }
        }
    }
    if !open_forever(Path::new(DRIVER)) {
        missing.push(format!("{DRIVER} (the NVIDIA driver)"));
    }
    if missing.is_empty() {
        return Ok(());
    }
    Err(Error::PluginLoad {
        path: plugin.display().to_string(),
        message: format!(
            "the CUDA {major} libraries it needs are missing: {}; looked in {} and the library \
             path; install them (NEURON_PC_TARGET=cuda scripts/setup) or the NVIDIA driver",
            missing.join(", "),
            site.join("nvidia/*/lib").display()
        ),
    })
}

/// `dlopen`s `path` (a file, or a bare soname searched on the library path) and never closes
/// it: the plugin's own `dlopen` of the soname then finds this copy. False when it cannot.
fn open_forever(path: &Path) -> bool {
    if path.components().count() > 1 && !path.is_file() {
        return false;
    }
    // SAFETY: loading a CUDA library runs its initializers, as JAX's own preload does; the file
    // sits in the plugin's site-packages or on the system's library path.
    match unsafe { libloading::os::unix::Library::new(path) } {
        Ok(lib) => {
            // Kept loaded: the raw handle is never closed.
            let _ = lib.into_raw();
            true
        }
        Err(e) => {
            tracing::debug!("cannot load {}: {e}", path.display());
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_jax_cuda_plugins_are_recognised_with_their_site_packages() {
        let sp = Path::new("/v/lib/python3.12/site-packages");
        for (rel, want) in [
            ("jax_plugins/xla_cuda13/xla_cuda_plugin.so", Some(13)),
            ("jax_plugins/xla_cuda12/xla_cuda_plugin.so", Some(12)),
            ("fastatomstruct_xla_cpu/libpjrt_cpu.so", None),
            ("other/xla_cuda13/xla_cuda_plugin.so", None),
        ] {
            let got = jax_cuda_plugin(&sp.join(rel));
            assert_eq!(got.as_ref().map(|g| g.0), want, "{rel}");
            if let Some((_, site)) = got {
                assert_eq!(site, sp);
            }
        }
    }

    #[test]
    fn a_plugin_without_its_cuda_libraries_is_refused_in_one_line_naming_them() {
        let dir = std::env::temp_dir().join(format!("npc-cudalibs-{}", std::process::id()));
        let plugin = dir.join("site-packages/jax_plugins/xla_cuda13/xla_cuda_plugin.so");
        std::fs::create_dir_all(plugin.parent().unwrap()).unwrap();
        std::fs::write(&plugin, b"never loaded").unwrap();
        // Where this machine has a CUDA install, nothing is missing and nothing can be checked.
        if let Err(e) = preload(&plugin) {
            let e = e.to_string();
            assert!(!e.contains('\n'), "{e}");
            assert!(e.contains("libcudart.so.13 (nvidia-cuda-runtime)"), "{e}");
            assert!(
                e.contains("nvidia/*/lib") && e.contains("scripts/setup"),
                "{e}"
            );
            assert!(
                !e.contains("libnccl"),
                "optional libraries are not demanded: {e}"
            );
        }
        // Another plugin is left alone.
        assert!(preload(&dir.join("libpjrt_cpu.so")).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
