//! Compiling, serializing, loading and executing programs.

use super::buffer::Buffer;
use super::client::{Client, Device};
use super::event::Event;
use super::options::CompileOptions;
use super::signature::Signature;
use super::sys::{self, Args};
use crate::error::{Error, Result};
use crate::host::HostTensor;

/// The next execution's `launch_id`: distinct for every launch in this process (never 0).
///
/// XLA's CPU client makes the launch id the run id of its collectives
/// (`PjRtCpuLoadedExecutable::Execute`), and the in-process rendezvous table is one per process,
/// keyed by run id, devices and the collective's id, not by client. With every launch at 0, two
/// clients of one process (two devices of a job, or tests on threads of one test program)
/// running the same collective on the same device numbers would share keys. All devices of one
/// launch share its id, as the rendezvous needs.
fn next_launch_id() -> std::os::raw::c_int {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    // 31 bits, skipping 0 when it wraps
    let id = NEXT.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff;
    if id == 0 {
        return next_launch_id();
    }
    id as std::os::raw::c_int
}

/// A compiled program loaded on a client's devices. Freed when dropped.
pub struct LoadedExecutable {
    client: Client,
    raw: *mut sys::PJRT_LoadedExecutable,
    num_outputs: usize,
    signature: Option<Signature>,
}

// SAFETY: loaded executables may be executed concurrently and destroyed from any thread by the
// C API's contract.
unsafe impl Send for LoadedExecutable {}
// SAFETY: as above.
unsafe impl Sync for LoadedExecutable {}

impl Drop for LoadedExecutable {
    fn drop(&mut self) {
        let mut args = sys::PJRT_LoadedExecutable_Destroy_Args {
            executable: self.raw,
            ..Args::new()
        };
        if let Err(e) = pjrt_call!(
            self.client.plugin_ref(),
            PJRT_LoadedExecutable_Destroy,
            &mut args
        ) {
            tracing::warn!("destroying a PJRT executable failed: {e}");
        }
    }
}

impl std::fmt::Debug for LoadedExecutable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoadedExecutable(outputs={})", self.num_outputs)
    }
}

/// The unloaded executable behind a loaded one; destroyed on drop.
pub(super) struct ExecutableRef<'a> {
    client: &'a Client,
    pub(super) raw: *mut sys::PJRT_Executable,
}

impl Drop for ExecutableRef<'_> {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Executable_Destroy_Args {
            executable: self.raw,
            ..Args::new()
        };
        if let Err(e) = pjrt_call!(self.client.plugin_ref(), PJRT_Executable_Destroy, &mut args) {
            tracing::warn!("destroying a PJRT executable view failed: {e}");
        }
    }
}

/// Per device: the outputs, and the completion event (none if complete at launch).
type PerDevice = (Vec<Vec<Buffer>>, Vec<Option<Event>>);

/// A launched execution: outputs now, contents when `done` is ready.
#[derive(Debug)]
pub struct Launched {
    /// The results, in the program's result order; their contents are valid once `done` is
    /// ready (at once when it is `None`).
    pub outputs: Vec<Buffer>,
    /// None when the plugin reported the work complete at launch.
    pub done: Option<Event>,
}

/// A launched SPMD execution: per replica, the outputs now; contents when every event of
/// `done` is ready (replicas the plugin reported complete at launch have none).
#[derive(Debug)]
pub struct LaunchedReplicas {
    /// Per replica (in the order of the arguments given), its results.
    pub outputs: Vec<Vec<Buffer>>,
    /// The completion events of the replicas not complete at launch; their positions do not
    /// match replica numbers.
    pub done: Vec<Event>,
}

impl Client {
    /// Compiles a StableHLO program given as MLIR text; launches check their arguments
    /// against the signature read from the text.
    pub fn compile(&self, mlir: &str, options: &CompileOptions) -> Result<LoadedExecutable> {
        self.compile_with_signature(mlir, options, Signature::parse(mlir))
    }

    /// Compiles a program whose signature the caller knows (from the IR it was lowered from).
    pub fn compile_with_signature(
        &self,
        mlir: &str,
        options: &CompileOptions,
        signature: Option<Signature>,
    ) -> Result<LoadedExecutable> {
        let format = "mlir";
        // The text is passed with a NUL after its last byte (not counted in `code_size`): MLIR's
        // lexer reads the byte after the text to see where it ends, as a C++ caller's
        // std::string provides. Without it, a program cut inside a token (a string literal) is
        // read past its end: garbage errors from some plugins, a SIGSEGV from
        // lammps-jax-pjrt-cpu (docs/plugins.md).
        let mut code = Vec::with_capacity(mlir.len() + 1);
        code.extend_from_slice(mlir.as_bytes());
        code.push(0);
        let program = sys::PJRT_Program {
            code: code.as_ptr() as *mut _,
            code_size: mlir.len(),
            format: format.as_ptr().cast(),
            format_size: format.len(),
            ..Args::new()
        };
        let proto = options.to_proto();
        let mut args = sys::PJRT_Client_Compile_Args {
            client: self.inner.raw,
            program: &program,
            compile_options: proto.as_ptr().cast(),
            compile_options_size: proto.len(),
            ..Args::new()
        };
        let compiled = pjrt_call!(self.plugin_ref(), PJRT_Client_Compile, &mut args);
        // The compiler's working memory is free now; without this the allocator would keep it
        // for the rest of the run (`malloc.rs`).
        if super::malloc::release_after_compile() {
            super::malloc::release_freed_memory();
        }
        compiled?;
        self.wrap_executable(args.executable, signature)
    }

    /// Loads an executable produced by [`LoadedExecutable::serialize`] with the same plugin.
    /// `signature` (from the program text) lets every launch check its arguments, and the
    /// executable must take and return what it says ([`Error::Interface`] otherwise: the bytes
    /// belong to another program).
    pub fn deserialize(
        &self,
        bytes: &[u8],
        signature: Option<Signature>,
    ) -> Result<LoadedExecutable> {
        let mut args = sys::PJRT_Executable_DeserializeAndLoad_Args {
            client: self.inner.raw,
            serialized_executable: bytes.as_ptr().cast(),
            serialized_executable_size: bytes.len(),
            ..Args::new()
        };
        pjrt_call!(
            self.plugin_ref(),
            PJRT_Executable_DeserializeAndLoad,
            &mut args
        )?;
        let exe = self.wrap_executable(args.loaded_executable, signature)?;
        if let Some(sig) = exe.signature() {
            exe.check_asked(&exe.interface_from(bytes)?, sig)?;
        }
        Ok(exe)
    }

    fn wrap_executable(
        &self,
        raw: *mut sys::PJRT_LoadedExecutable,
        signature: Option<Signature>,
    ) -> Result<LoadedExecutable> {
        let mut exe = LoadedExecutable {
            client: self.clone(),
            raw,
            num_outputs: 0,
            signature,
        };
        let view = exe.executable()?;
        let mut n = sys::PJRT_Executable_NumOutputs_Args {
            executable: view.raw,
            ..Args::new()
        };
        pjrt_call!(self.plugin_ref(), PJRT_Executable_NumOutputs, &mut n)?;
        drop(view);
        exe.num_outputs = n.num_outputs;
        Ok(exe)
    }
}

/// One device's memory for one execution of a program, in bytes (`xla::CompiledMemoryStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// The arguments.
    pub arguments: u64,
    /// The results, including those written over donated arguments.
    pub outputs: u64,
    /// Of the outputs, the bytes written over donated arguments.
    pub aliased: u64,
    /// Temporary buffers (activations kept for the backward pass, gradients used within the
    /// step, workspaces).
    pub temp: u64,
    /// The program's generated code.
    pub code: u64,
}

impl MemoryStats {
    /// Everything an execution holds at once: arguments, outputs that are not written over an
    /// argument, temporaries and code.
    pub fn total(&self) -> u64 {
        self.arguments + self.outputs.saturating_sub(self.aliased) + self.temp + self.code
    }
}

impl LoadedExecutable {
    /// Sets the signature every launch checks its arguments against (after the caller has
    /// checked the interface: `LoadedExecutable::checked_against`).
    pub(crate) fn set_signature(&mut self, signature: Signature) {
        self.signature = Some(signature);
    }

    pub(super) fn executable(&self) -> Result<ExecutableRef<'_>> {
        let mut args = sys::PJRT_LoadedExecutable_GetExecutable_Args {
            loaded_executable: self.raw,
            ..Args::new()
        };
        pjrt_call!(
            self.client.plugin_ref(),
            PJRT_LoadedExecutable_GetExecutable,
            &mut args
        )?;
        Ok(ExecutableRef {
            client: &self.client,
            raw: args.executable,
        })
    }

    /// Number of results per device.
    pub fn num_outputs(&self) -> usize {
        self.num_outputs
    }

    /// The bytes of temporary buffers one execution allocates (besides its arguments and
    /// results), as the plugin's buffer assignment says; `None` when the plugin does not report
    /// its memory use.
    pub fn temp_bytes(&self) -> Option<u64> {
        self.memory_stats().map(|m| m.temp)
    }

    /// What one execution needs on each device, as the compiler's buffer assignment says
    /// (`PJRT_Executable_GetCompiledMemoryStats`); `None` when the plugin does not report it.
    pub fn memory_stats(&self) -> Option<MemoryStats> {
        let view = self.executable().ok()?;
        let mut args = sys::PJRT_Executable_GetCompiledMemoryStats_Args {
            executable: view.raw,
            ..Args::new()
        };
        pjrt_call!(
            self.client.plugin_ref(),
            PJRT_Executable_GetCompiledMemoryStats,
            &mut args
        )
        .ok()?;
        let bytes = |v: i64| u64::try_from(v).ok();
        Some(MemoryStats {
            arguments: bytes(args.argument_size_in_bytes)?,
            outputs: bytes(args.output_size_in_bytes)?,
            aliased: bytes(args.alias_size_in_bytes)?,
            temp: bytes(args.temp_size_in_bytes)?,
            code: bytes(args.generated_code_size_in_bytes)?,
        })
    }

    /// Parameter and result types, when the program text could be read.
    pub fn signature(&self) -> Option<&Signature> {
        self.signature.as_ref()
    }

    /// Checks one device's arguments against the signature: count, dtype and shape.
    fn check_args(&self, args: &[&Buffer]) -> Result<()> {
        let Some(sig) = &self.signature else {
            return Ok(());
        };
        if args.len() != sig.params.len() {
            return Err(Error::Argument {
                message: format!(
                    "the program takes {} arguments, {} given",
                    sig.params.len(),
                    args.len()
                ),
            });
        }
        for (i, (b, want)) in args.iter().zip(&sig.params).enumerate() {
            if b.dtype() != want.dtype || b.dims() != want.dims.as_slice() {
                return Err(Error::Argument {
                    message: format!(
                        "argument {i} is {}{:?}, the program expects {want}",
                        b.dtype(),
                        b.dims()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The client this executable is loaded on.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The plugin's serialized form of this executable, loadable with [`Client::deserialize`].
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let view = self.executable()?;
        let mut args = sys::PJRT_Executable_Serialize_Args {
            executable: view.raw,
            ..Args::new()
        };
        pjrt_call!(
            self.client.plugin_ref(),
            PJRT_Executable_Serialize,
            &mut args
        )?;
        let bytes = if args.serialized_bytes.is_null() {
            Vec::new()
        } else {
            // SAFETY: the plugin returned `serialized_bytes_size` bytes that stay valid until the
            // deleter below is called.
            unsafe {
                std::slice::from_raw_parts(
                    args.serialized_bytes as *const u8,
                    args.serialized_bytes_size,
                )
            }
            .to_vec()
        };
        if let Some(deleter) = args.serialized_executable_deleter {
            // SAFETY: the deleter and the object it frees come from the same call; called once.
            unsafe { deleter(args.serialized_executable) };
        }
        Ok(bytes)
    }

    /// Runs on one device with `args` (which must live on that device); returns the results.
    /// Arguments the program marks as aliased to an output are not donated (see
    /// [`LoadedExecutable::execute_donating`]).
    pub fn execute(&self, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        let all: Vec<usize> = (0..args.len()).collect();
        self.execute_donating(args, &all)
    }

    /// Like [`LoadedExecutable::execute`], but arguments not listed in `keep` may be donated:
    /// where the program aliases them to an output, their buffers are reused for it and must
    /// not be used afterwards.
    pub fn execute_donating(&self, args: &[&Buffer], keep: &[usize]) -> Result<Vec<Buffer>> {
        let launched = self.launch(args, keep)?;
        if let Some(done) = &launched.done {
            done.wait()?;
        }
        Ok(launched.outputs)
    }

    /// Starts running on one device and returns at once: the outputs (valid buffers whose
    /// contents are ready when `done` is) and the completion event. `keep` is as for
    /// [`LoadedExecutable::execute_donating`]. An error found while running is `done`'s.
    pub fn launch(&self, args: &[&Buffer], keep: &[usize]) -> Result<Launched> {
        let (mut outputs, mut events) = self.launch_inner(&[args.to_vec()], keep)?;
        Ok(Launched {
            outputs: outputs.pop().unwrap_or_default(),
            done: events.pop().flatten(),
        })
    }

    /// Starts one replica per entry of `per_device` (a program compiled with that many
    /// replicas; entry `r` holds replica `r`'s arguments, on its device) and returns at once.
    /// `keep` is as for [`LoadedExecutable::execute_donating`], the same for every replica.
    pub fn launch_replicated(
        &self,
        per_device: &[Vec<&Buffer>],
        keep: &[usize],
    ) -> Result<LaunchedReplicas> {
        let (outputs, events) = self.launch_inner(per_device, keep)?;
        Ok(LaunchedReplicas {
            outputs,
            done: events.into_iter().flatten().collect(),
        })
    }

    /// Runs one replica per entry of `per_device` (a program compiled with that many replicas).
    pub fn execute_replicated(&self, per_device: &[Vec<&Buffer>]) -> Result<Vec<Vec<Buffer>>> {
        let all: Vec<usize> = (0..per_device.first().map_or(0, |a| a.len())).collect();
        let (outputs, events) = self.launch_inner(per_device, &all)?;
        let mut waited = Ok(());
        for e in events.iter().flatten() {
            let r = e.wait();
            if waited.is_ok() {
                waited = r;
            }
        }
        waited.map(|()| outputs)
    }

    fn launch_inner(&self, per_device: &[Vec<&Buffer>], keep: &[usize]) -> Result<PerDevice> {
        for args in per_device {
            self.check_args(args)?;
        }
        let num_args = per_device.first().map_or(0, |a| a.len());
        if per_device.iter().any(|a| a.len() != num_args) {
            return Err(Error::Argument {
                message: "every device needs the same number of arguments".into(),
            });
        }
        let raw_args: Vec<Vec<*mut sys::PJRT_Buffer>> = per_device
            .iter()
            .map(|a| a.iter().map(|b| b.raw).collect())
            .collect();
        let arg_ptrs: Vec<*const *mut sys::PJRT_Buffer> =
            raw_args.iter().map(|a| a.as_ptr()).collect();
        let mut raw_out: Vec<Vec<*mut sys::PJRT_Buffer>> = per_device
            .iter()
            .map(|_| vec![std::ptr::null_mut(); self.num_outputs])
            .collect();
        let out_ptrs: Vec<*mut *mut sys::PJRT_Buffer> =
            raw_out.iter_mut().map(|o| o.as_mut_ptr()).collect();
        let mut events: Vec<*mut sys::PJRT_Event> = vec![std::ptr::null_mut(); per_device.len()];
        let keep: Vec<i64> = keep.iter().map(|&i| i as i64).collect();
        let mut options = sys::PJRT_ExecuteOptions {
            non_donatable_input_indices: keep.as_ptr(),
            num_non_donatable_input_indices: keep.len(),
            launch_id: next_launch_id(),
            ..Args::new()
        };
        let mut args = sys::PJRT_LoadedExecutable_Execute_Args {
            executable: self.raw,
            options: &mut options,
            argument_lists: arg_ptrs.as_ptr(),
            num_devices: per_device.len(),
            num_args,
            output_lists: out_ptrs.as_ptr(),
            device_complete_events: events.as_mut_ptr(),
            ..Args::new()
        };
        pjrt_call!(
            self.client.plugin_ref(),
            PJRT_LoadedExecutable_Execute,
            &mut args
        )?;
        // Adopt every output and event first so that all are freed even if one step fails.
        let events: Vec<Option<Event>> = events
            .into_iter()
            .map(|e| Event::adopt(&self.client, e))
            .collect();
        let adopted: Vec<Vec<Result<Buffer>>> = raw_out
            .iter()
            .map(|outs| {
                outs.iter()
                    .filter(|p| !p.is_null())
                    .map(|&p| self.client.adopt_buffer(p))
                    .collect()
            })
            .collect();
        let outputs: Vec<Vec<Buffer>> = adopted
            .into_iter()
            .map(|outs| outs.into_iter().collect())
            .collect::<Result<_>>()?;
        Ok((outputs, events))
    }

    /// Convenience for tests and tools: copies `inputs` to device 0, runs, copies results back.
    pub fn execute_host(&self, inputs: &[HostTensor]) -> Result<Vec<HostTensor>> {
        let bufs: Vec<Buffer> = inputs
            .iter()
            .map(|h| self.client.buffer_from_host(h, Device(0)))
            .collect::<Result<_>>()?;
        let refs: Vec<&Buffer> = bufs.iter().collect();
        self.execute(&refs)?.iter().map(Buffer::to_host).collect()
    }
}
