//! XLA's typed FFI, as far as neuron-pc's own handlers need it: registering a handler through
//! the plugin's FFI extension (`PJRT_FFI_Extension`), and reading the call frame XLA passes it.
//!
//! A `stablehlo.custom_call @name(...) {api_version = 4 : i32, backend_config = {...}}` in a
//! program runs the handler registered as `name` for the client's platform (`"Host"` on cpu).
//! XLA first calls the handler once with a metadata probe ([`answer_probe`]), then once per
//! execution of the call, on the thread executing it: the local replicas of one program call
//! it concurrently. The C structures below follow `xla/ffi/api/c_api.h` (FFI API 0.x) and
//! `xla/pjrt/c/pjrt_c_api_ffi_extension.h`; only the fields read or written here are typed.

use std::collections::HashSet;
use std::ffi::{c_char, c_void};
use std::path::PathBuf;
use std::sync::Mutex;

use super::sys;
use super::Plugin;
use crate::error::{Error, Result};
use crate::lower::{READ_ROWS_TARGET, UNINITIALIZED_TARGET, WRITE_ROWS_TARGET};

/// The platform name XLA's cpu client registers custom-call handlers under.
pub const HOST_PLATFORM: &str = "Host";

/// `XLA_FFI_Extension_Base`.
#[repr(C)]
pub struct ExtensionBase {
    struct_size: usize,
    kind: i32,
    next: *mut ExtensionBase,
}

/// `XLA_FFI_Api_Version`.
#[repr(C)]
struct ApiVersion {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    major: i32,
    minor: i32,
}

/// `XLA_FFI_Metadata`.
#[repr(C)]
struct Metadata {
    struct_size: usize,
    api_version: ApiVersion,
    traits: u32,
    state_type_id: i64,
}

/// `XLA_FFI_Metadata_Extension`.
#[repr(C)]
struct MetadataExtension {
    base: ExtensionBase,
    metadata: *mut Metadata,
}

/// `XLA_FFI_Args` and `XLA_FFI_Rets` (same layout).
#[repr(C)]
struct List {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    size: i64,
    types: *const i32,
    values: *const *mut c_void,
}

/// `XLA_FFI_Attrs`.
#[repr(C)]
struct Attrs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    size: i64,
    types: *const i32,
    names: *const *const ByteSpan,
    values: *const *mut c_void,
}

/// `XLA_FFI_ByteSpan`.
#[repr(C)]
struct ByteSpan {
    ptr: *const c_char,
    len: usize,
}

/// `XLA_FFI_Scalar`.
#[repr(C)]
struct Scalar {
    dtype: i32,
    value: *const c_void,
}

/// `XLA_FFI_Buffer`.
#[repr(C)]
struct RawBuffer {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    dtype: i32,
    data: *mut c_void,
    rank: i64,
    dims: *const i64,
}

/// `XLA_FFI_Error_Create_Args`.
#[repr(C)]
struct ErrorCreateArgs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    message: *const c_char,
    errc: i32,
}

/// `XLA_FFI_DeviceOrdinal_Get_Args`.
#[repr(C)]
struct DeviceOrdinalArgs {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    ctx: *mut c_void,
    device_ordinal: i32,
}

type Untyped = Option<unsafe extern "C" fn()>;

/// `XLA_FFI_Api`, its functions in the header's order (only two are called).
#[repr(C)]
struct ApiHead {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    api_version: ApiVersion,
    internal_api: *const c_void,
    error_create: Option<unsafe extern "C" fn(*mut ErrorCreateArgs) -> *mut FfiError>,
    // GetMessage, Destroy, Handler_Register, Stream_Get, Type_Register,
    // ExecutionContext_Get, State_Set, State_Get, DeviceMemory_Allocate, DeviceMemory_Free,
    // ThreadPool_Schedule, ThreadPool_NumThreads, Future_Create, Future_SetAvailable,
    // Future_SetError, RunId_Get
    _between: [Untyped; 16],
    device_ordinal_get: Option<unsafe extern "C" fn(*mut DeviceOrdinalArgs) -> *mut FfiError>,
}

/// `XLA_FFI_CallFrame`: what XLA passes a handler.
#[repr(C)]
pub struct CallFrame {
    struct_size: usize,
    extension_start: *mut ExtensionBase,
    api: *const ApiHead,
    ctx: *mut c_void,
    stage: i32,
    args: List,
    rets: List,
    attrs: Attrs,
}

/// XLA's opaque `XLA_FFI_Error`.
#[repr(C)]
pub struct FfiError {
    _private: [u8; 0],
}

/// A typed FFI handler: null on success, else an error made with [`error`].
pub type Handler = unsafe extern "C" fn(*mut CallFrame) -> *mut FfiError;

/// XLA FFI's element type numbers (`XLA_FFI_DataType`) of the types neuron-pc records.
pub mod dtype {
    #![allow(missing_docs)]
    pub const PRED: i32 = 1;
    pub const S8: i32 = 2;
    pub const S16: i32 = 3;
    pub const S32: i32 = 4;
    pub const S64: i32 = 5;
    pub const U8: i32 = 6;
    pub const U16: i32 = 7;
    pub const U32: i32 = 8;
    pub const U64: i32 = 9;
    pub const F16: i32 = 10;
    pub const F32: i32 = 11;
    pub const F64: i32 = 12;
    pub const BF16: i32 = 16;
}

const EXTENSION_METADATA: i32 = 1;
const ATTR_SCALAR: i32 = 3;
const ERROR_INTERNAL: i32 = 13;
/// The FFI API version neuron-pc's handlers are written against (`XLA_FFI_API_MAJOR/MINOR`).
const FFI_API: (i32, i32) = (0, 1);

/// `PJRT_FFI_Register_Handler_Args` (the layout without `api_version`: every handler is typed).
#[repr(C)]
struct RegisterHandlerArgs {
    struct_size: usize,
    target_name: *const c_char,
    target_name_size: usize,
    // `void*` in the header, holding an `XLA_FFI_Handler*`: a function pointer of the same size
    handler: Option<Handler>,
    platform_name: *const c_char,
    platform_name_size: usize,
    traits: u32,
}

/// `PJRT_FFI_Extension`.
#[repr(C)]
struct FfiExtension {
    base: sys::PJRT_Extension_Base,
    type_id_register: *mut c_void,
    user_data_add: *mut c_void,
    register_handler:
        Option<unsafe extern "C" fn(*mut RegisterHandlerArgs) -> *mut sys::PJRT_Error>,
}

impl Plugin {
    /// Whether the plugin offers the FFI extension (custom calls to handlers of one's own).
    pub fn has_ffi(&self) -> bool {
        self.ffi_extension().is_some()
    }

    fn ffi_extension(&self) -> Option<&'static FfiExtension> {
        let mut next = self.raw().extension_start;
        while !next.is_null() {
            // SAFETY: the plugin's extension chain is a list of live, immutable structs, each
            // starting with `PJRT_Extension_Base`.
            let base = unsafe { &*next };
            if base.type_ == sys::PJRT_Extension_Type_FFI
                && base.struct_size >= std::mem::size_of::<FfiExtension>()
            {
                // SAFETY: an FFI extension of at least this size has this layout.
                return Some(unsafe { &*(next as *const FfiExtension) });
            }
            next = base.next;
        }
        None
    }

    /// Registers `handler` as the custom-call target `name` on `platform` (`"Host"` for cpu).
    /// Must come before the first compile of a program calling it; registering a name again
    /// fails in XLA, so callers register once per process.
    pub fn register_ffi_handler(&self, name: &str, platform: &str, handler: Handler) -> Result<()> {
        let register = self
            .ffi_extension()
            .and_then(|e| e.register_handler)
            .ok_or_else(|| Error::PluginLoad {
                path: self.path().display().to_string(),
                message: "the plugin has no FFI extension: it cannot run custom calls of \
                          neuron-pc's own (cross-process collectives on cpu)"
                    .into(),
            })?;
        let mut args = RegisterHandlerArgs {
            struct_size: std::mem::size_of::<RegisterHandlerArgs>(),
            target_name: name.as_ptr().cast(),
            target_name_size: name.len(),
            handler: Some(handler),
            platform_name: platform.as_ptr().cast(),
            platform_name_size: platform.len(),
            traits: 0,
        };
        // SAFETY: the arguments point at live strings of the given lengths and a handler
        // with XLA's typed-FFI signature; the plugin copies the names.
        let err = unsafe { register(&mut args) };
        self.check("PJRT_FFI_Register_Handler", err)
    }

    /// [`Plugin::register_ffi_handler`] for the cpu client's platform ([`HOST_PLATFORM`]),
    /// unless this process already registered `name` with this plugin library (XLA refuses a
    /// second registration, and every client of the library shares the first).
    pub fn register_host_handler_once(&self, name: &str, handler: Handler) -> Result<()> {
        static DONE: Mutex<Option<HashSet<(PathBuf, String)>>> = Mutex::new(None);
        let mut done = DONE.lock().unwrap_or_else(|p| p.into_inner());
        let done = done.get_or_insert_with(HashSet::new);
        let key = (self.path().to_path_buf(), name.to_string());
        if !done.contains(&key) {
            self.register_ffi_handler(name, HOST_PLATFORM, handler)?;
            done.insert(key);
        }
        Ok(())
    }

    /// Registers the handlers every cpu client has ([`UNINITIALIZED_TARGET`],
    /// [`WRITE_ROWS_TARGET`], [`READ_ROWS_TARGET`]). False where the plugin has no FFI
    /// extension.
    pub(crate) fn register_own_handlers(&self) -> Result<bool> {
        if !self.has_ffi() {
            return Ok(false);
        }
        self.register_host_handler_once(UNINITIALIZED_TARGET, uninitialized)?;
        self.register_host_handler_once(WRITE_ROWS_TARGET, write_rows)?;
        self.register_host_handler_once(READ_ROWS_TARGET, read_rows)?;
        Ok(true)
    }
}

/// The handler of [`UNINITIALIZED_TARGET`]: answers the probe and writes nothing, so its
/// result is the buffer XLA allocated for it, as it was.
unsafe extern "C" fn uninitialized(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA's call frame.
    let _ = unsafe { answer_probe(frame) };
    std::ptr::null_mut()
}

/// Bytes of one element of XLA FFI's element type `dtype`, for the types a stack holds.
fn element_bytes(dtype: i32) -> Option<usize> {
    match dtype {
        dtype::PRED | dtype::S8 | dtype::U8 => Some(1),
        dtype::S16 | dtype::U16 | dtype::F16 | dtype::BF16 => Some(2),
        dtype::S32 | dtype::U32 | dtype::F32 => Some(4),
        dtype::S64 | dtype::U64 | dtype::F64 => Some(8),
        _ => None,
    }
}

/// The handler of [`WRITE_ROWS_TARGET`]: `(stack, update, row)` to the stack with the update's
/// rows written from `row` on (clamped as `dynamic_update_slice` clamps), the result aliased
/// to the stack by the call's `output_operand_aliases`, so one `memcpy` of the update's bytes.
/// Where XLA gave the result a buffer of its own anyway, the stack is copied into it first.
unsafe extern "C" fn write_rows(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA's call frame.
    unsafe { row_call(frame, WRITE_ROWS_TARGET, write_rows_of) }
}

/// Answers XLA's probe, or runs `body` on a row call's operands and results; a refusal
/// fails the execution with one line naming `target`.
///
/// # Safety
/// `frame` is the call frame XLA passed the handler; `body` may trust the buffers' sizes.
unsafe fn row_call(
    frame: *mut CallFrame,
    target: &str,
    body: unsafe fn(&[BufferRef], &[BufferRef]) -> std::result::Result<(), &'static str>,
) -> *mut FfiError {
    // SAFETY: the caller's contract.
    if unsafe { answer_probe(frame) } {
        return std::ptr::null_mut();
    }
    // SAFETY: a call frame of an execution, not the probe; its buffers are live for the call.
    match unsafe { body(&args(frame), &rets(frame)) } {
        Ok(()) => std::ptr::null_mut(),
        // SAFETY: the frame is live.
        Err(m) => unsafe { error(frame, &format!("{target}: {m}")) },
    }
}

/// [`write_rows`] on its buffers.
///
/// # Safety
/// The buffers of a live call: each has the bytes its dimensions say.
unsafe fn write_rows_of(
    args: &[BufferRef],
    rets: &[BufferRef],
) -> std::result::Result<(), &'static str> {
    let ([stack, update, row], [out]) = (args, rets) else {
        return Err("expects (stack, update, row) and one result");
    };
    let taken = update.dims.first().map_or(0, |&d| d.max(0) as usize);
    let fits = whole_rows(update, stack) && out.dtype == stack.dtype && out.dims == stack.dims;
    // SAFETY: the caller's contract.
    let Some((row_bytes, start)) = unsafe { rows_of(stack, row, taken) }.filter(|_| fits) else {
        return Err("the update is not whole rows of the stack");
    };
    let rows = stack.dims[0] as usize;
    // SAFETY: the buffers have the sizes their dimensions say; `out` and `stack` are the same
    // buffer or do not overlap, and the update is another value's buffer.
    unsafe {
        if out.data != stack.data {
            std::ptr::copy_nonoverlapping(stack.data, out.data, rows * row_bytes);
        }
        std::ptr::copy_nonoverlapping(
            update.data,
            out.data.add(start * row_bytes),
            taken * row_bytes,
        );
    }
    Ok(())
}

/// Checks `stack` and a row index `row` for a call that moves `taken` whole rows of it:
/// the bytes of one row and the first row moved (clamped as `dynamic_slice` and
/// `dynamic_update_slice` clamp their start).
///
/// # Safety
/// `row` is a buffer of a live call (read once it is checked to be an `s32` scalar).
unsafe fn rows_of(stack: &BufferRef, row: &BufferRef, taken: usize) -> Option<(usize, usize)> {
    let width = element_bytes(stack.dtype)?;
    let rows = usize::try_from(*stack.dims.first()?).ok()?;
    if taken > rows || row.dtype != dtype::S32 || !row.dims.is_empty() {
        return None;
    }
    let row_bytes = stack.elements().checked_div(rows).unwrap_or(0) * width;
    // SAFETY: the caller's contract: an s32 scalar in host memory (the cpu client's buffers).
    let at = i64::from(unsafe { *(row.data as *const i32) });
    Some((row_bytes, at.clamp(0, (rows - taken) as i64) as usize))
}

/// Whether `part` is whole rows of `stack`: same element type, same rank, same dimensions
/// after the first.
fn whole_rows(part: &BufferRef, stack: &BufferRef) -> bool {
    part.dtype == stack.dtype
        && !stack.dims.is_empty()
        && part.dims.len() == stack.dims.len()
        && part.dims[1..] == stack.dims[1..]
}

/// The handler of [`READ_ROWS_TARGET`]: `(stack, row)` to as many of the stack's rows from
/// `row` on (clamped as `dynamic_slice` clamps) as the result has: one `memcpy`.
unsafe extern "C" fn read_rows(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA's call frame.
    unsafe { row_call(frame, READ_ROWS_TARGET, read_rows_of) }
}

/// [`read_rows`] on its buffers.
///
/// # Safety
/// As [`write_rows_of`].
unsafe fn read_rows_of(
    args: &[BufferRef],
    rets: &[BufferRef],
) -> std::result::Result<(), &'static str> {
    let ([stack, row], [out]) = (args, rets) else {
        return Err("expects (stack, row) and one result");
    };
    let taken = out.dims.first().map_or(0, |&d| d.max(0) as usize);
    // SAFETY: the caller's contract.
    let moved = unsafe { rows_of(stack, row, taken) };
    let Some((row_bytes, start)) = moved.filter(|_| whole_rows(out, stack)) else {
        return Err("the result is not whole rows of the stack");
    };
    // SAFETY: the buffers have the sizes their dimensions say and do not overlap.
    unsafe {
        std::ptr::copy_nonoverlapping(
            stack.data.add(start * row_bytes),
            out.data,
            taken * row_bytes,
        );
    }
    Ok(())
}

/// If this call is XLA's metadata probe, answers it (the FFI version, no traits) and returns
/// true: the handler must then return null without touching any buffer.
///
/// # Safety
/// `frame` is the call frame XLA passed the handler.
pub unsafe fn answer_probe(frame: *mut CallFrame) -> bool {
    // SAFETY: the caller's contract.
    let mut next = unsafe { (*frame).extension_start };
    while !next.is_null() {
        // SAFETY: XLA's extension chain holds live structs starting with the base.
        let base = unsafe { &*next };
        if base.kind == EXTENSION_METADATA {
            // SAFETY: an extension of the metadata kind has this layout.
            let ext = unsafe { &*(next as *const MetadataExtension) };
            // SAFETY: XLA passes a writable metadata struct with the probe.
            let m = unsafe { &mut *ext.metadata };
            m.api_version.major = FFI_API.0;
            m.api_version.minor = FFI_API.1;
            m.traits = 0;
            return true;
        }
        next = base.next;
    }
    false
}

/// One buffer of a call: element type, data and dimensions.
#[derive(Debug)]
pub struct BufferRef {
    /// XLA FFI's element type number (see [`dtype`]).
    pub dtype: i32,
    /// The first byte.
    pub data: *mut u8,
    /// The dimensions.
    pub dims: Vec<i64>,
}

impl BufferRef {
    /// Elements in the buffer.
    pub fn elements(&self) -> usize {
        self.dims.iter().product::<i64>().max(0) as usize
    }
}

/// # Safety
/// `list` is an argument or result list of a live call frame.
unsafe fn buffers(list: &List) -> Vec<BufferRef> {
    (0..list.size.max(0) as usize)
        .map(|i| {
            // SAFETY: XLA passes `size` buffers (custom calls take and give only buffers).
            let b = unsafe { &*(*list.values.add(i) as *const RawBuffer) };
            let dims = if b.rank > 0 {
                // SAFETY: `dims` has `rank` entries.
                unsafe { std::slice::from_raw_parts(b.dims, b.rank as usize) }.to_vec()
            } else {
                Vec::new()
            };
            BufferRef {
                dtype: b.dtype,
                data: b.data.cast(),
                dims,
            }
        })
        .collect()
}

/// The call's operands.
///
/// # Safety
/// `frame` is the call frame XLA passed the handler (not the metadata probe).
pub unsafe fn args(frame: *mut CallFrame) -> Vec<BufferRef> {
    // SAFETY: the caller's contract.
    unsafe { buffers(&(*frame).args) }
}

/// The call's results.
///
/// # Safety
/// As [`args`].
pub unsafe fn rets(frame: *mut CallFrame) -> Vec<BufferRef> {
    // SAFETY: the caller's contract.
    unsafe { buffers(&(*frame).rets) }
}

/// The integer attribute `name` of the call's `backend_config` dictionary (`{name = 3 : i64}`,
/// any integer width), if present.
///
/// # Safety
/// As [`args`].
pub unsafe fn int_attr(frame: *mut CallFrame, name: &str) -> Option<i64> {
    // SAFETY: the caller's contract.
    let attrs = unsafe { &(*frame).attrs };
    for i in 0..attrs.size.max(0) as usize {
        // SAFETY: `size` entries in each of the three arrays.
        let (kind, span, value) = unsafe {
            (
                *attrs.types.add(i),
                &**attrs.names.add(i),
                *attrs.values.add(i),
            )
        };
        // SAFETY: a name span points at `len` bytes.
        let key = unsafe { std::slice::from_raw_parts(span.ptr.cast::<u8>(), span.len) };
        if key != name.as_bytes() || kind != ATTR_SCALAR {
            continue;
        }
        // SAFETY: a scalar attribute is an `XLA_FFI_Scalar` whose value has its dtype.
        let s = unsafe { &*(value as *const Scalar) };
        // SAFETY: as above, read at the scalar's own width.
        return unsafe {
            match s.dtype {
                dtype::S8 => Some(*(s.value as *const i8) as i64),
                dtype::S16 => Some(*(s.value as *const i16) as i64),
                dtype::S32 => Some(*(s.value as *const i32) as i64),
                dtype::S64 => Some(*(s.value as *const i64)),
                dtype::U8 => Some(*(s.value as *const u8) as i64),
                dtype::U16 => Some(*(s.value as *const u16) as i64),
                dtype::U32 => Some(*(s.value as *const u32) as i64),
                dtype::U64 => Some(*(s.value as *const u64) as i64),
                _ => None,
            }
        };
    }
    None
}

/// The ordinal of the device running this call (on cpu: its index among the client's
/// devices), when the runtime says.
///
/// # Safety
/// As [`args`].
pub unsafe fn device_ordinal(frame: *mut CallFrame) -> Option<usize> {
    // SAFETY: the caller's contract: the frame and its API table are XLA's.
    let (api, ctx) = unsafe { (&*(*frame).api, (*frame).ctx) };
    let end = std::mem::offset_of!(ApiHead, device_ordinal_get) + std::mem::size_of::<Untyped>();
    if api.struct_size < end {
        return None;
    }
    let get = api.device_ordinal_get?;
    let mut args = DeviceOrdinalArgs {
        struct_size: std::mem::size_of::<DeviceOrdinalArgs>(),
        extension_start: std::ptr::null_mut(),
        ctx,
        device_ordinal: -1,
    };
    // SAFETY: a live execution context; the function writes the ordinal.
    let err = unsafe { get(&mut args) };
    (err.is_null() && args.device_ordinal >= 0).then_some(args.device_ordinal as usize)
}

/// An error for XLA to report (the execution fails with `message`).
///
/// # Safety
/// As [`args`].
pub unsafe fn error(frame: *mut CallFrame, message: &str) -> *mut FfiError {
    let text = std::ffi::CString::new(message.replace('\0', " ")).unwrap_or_default();
    let mut args = ErrorCreateArgs {
        struct_size: std::mem::size_of::<ErrorCreateArgs>(),
        extension_start: std::ptr::null_mut(),
        message: text.as_ptr(),
        errc: ERROR_INTERNAL,
    };
    // SAFETY: the frame's API table is XLA's; `Error_Create` copies the message.
    unsafe {
        match (*(*frame).api).error_create {
            Some(create) => create(&mut args),
            // no way to report: XLA's table always has it
            None => std::ptr::null_mut(),
        }
    }
}
