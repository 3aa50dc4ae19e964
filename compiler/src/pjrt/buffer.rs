//! Device buffers and host transfers.

use std::sync::atomic::Ordering;

use super::api::Plugin;
use super::client::{Client, Device};
use super::sys::{self, Args};
use crate::dtype::DType;
use crate::error::{Error, PjrtErrorCode, Result};
use crate::host::HostTensor;

/// A buffer on one device. Freed when dropped; keeps its client alive.
pub struct Buffer {
    client: Client,
    pub(crate) raw: *mut sys::PJRT_Buffer,
    dtype: DType,
    dims: Vec<usize>,
}

// SAFETY: PJRT buffers may be used and destroyed from any thread by the C API's contract.
unsafe impl Send for Buffer {}
// SAFETY: as above; `&Buffer` only reads.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({}{:?})", self.dtype, self.dims)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Buffer_Destroy_Args {
            buffer: self.raw,
            ..Args::new()
        };
        if let Err(e) = pjrt_call!(self.client.plugin_ref(), PJRT_Buffer_Destroy, &mut args) {
            tracing::warn!("destroying a PJRT buffer failed: {e}");
        }
    }
}

pub(crate) fn to_pjrt_type(d: DType) -> sys::PJRT_Buffer_Type {
    match d {
        DType::F32 => sys::PJRT_Buffer_Type_F32,
        DType::F64 => sys::PJRT_Buffer_Type_F64,
        DType::BF16 => sys::PJRT_Buffer_Type_BF16,
        DType::F16 => sys::PJRT_Buffer_Type_F16,
        DType::I32 => sys::PJRT_Buffer_Type_S32,
        DType::I64 => sys::PJRT_Buffer_Type_S64,
        DType::U32 => sys::PJRT_Buffer_Type_U32,
        DType::U8 => sys::PJRT_Buffer_Type_U8,
        DType::Pred => sys::PJRT_Buffer_Type_PRED,
    }
}

pub(crate) fn from_pjrt_type(t: sys::PJRT_Buffer_Type) -> Option<DType> {
    DType::ALL.into_iter().find(|d| to_pjrt_type(*d) == t)
}

/// Waits for `event` (if any), then destroys it.
pub(crate) fn await_event(plugin: &Plugin, event: *mut sys::PJRT_Event) -> Result<()> {
    if event.is_null() {
        return Ok(());
    }
    let mut wait = sys::PJRT_Event_Await_Args {
        event,
        ..Args::new()
    };
    let waited = pjrt_call!(plugin, PJRT_Event_Await, &mut wait);
    let mut destroy = sys::PJRT_Event_Destroy_Args {
        event,
        ..Args::new()
    };
    let destroyed = pjrt_call!(plugin, PJRT_Event_Destroy, &mut destroy);
    waited.and(destroyed)
}

impl Client {
    /// Copies `host` to `device`.
    pub fn buffer_from_host(&self, host: &HostTensor, device: Device) -> Result<Buffer> {
        self.buffer_from_bytes(host.dtype(), host.dims(), host.bytes(), device)
    }

    /// A buffer of zeros (false for pred) on `device`. The copy's source is a read-only
    /// anonymous mapping, every page of it the kernel's one zero page, unmapped after the
    /// copy. A zeroed heap block as the source would cost more than the memory: read and then
    /// freed, its pages stay mapped read-only in the allocator, and each allocation that
    /// reuses them takes a copy-on-write fault and a TLB shootdown per page (the small
    /// Llama's AdamW moments, 34 MB: 19-20 against 45-49 ms, and the allocations after them
    /// slower too).
    pub fn zeros_buffer(&self, dtype: DType, dims: &[usize], device: Device) -> Result<Buffer> {
        let bytes = dims.iter().product::<usize>() * dtype.size_in_bytes();
        match ZeroPages::map(bytes) {
            Some(zeros) => self.buffer_from_bytes(dtype, dims, zeros.bytes(), device),
            None => self.buffer_from_host(&HostTensor::zeros(dtype, dims), device),
        }
    }

    fn buffer_from_bytes(
        &self,
        dtype: DType,
        dims: &[usize],
        bytes: &[u8],
        device: Device,
    ) -> Result<Buffer> {
        debug_assert_eq!(
            bytes.len(),
            dims.iter().product::<usize>() * dtype.size_in_bytes()
        );
        let pjrt_dims: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let mut args = sys::PJRT_Client_BufferFromHostBuffer_Args {
            client: self.inner.raw,
            data: bytes.as_ptr().cast(),
            type_: to_pjrt_type(dtype),
            dims: pjrt_dims.as_ptr(),
            num_dims: pjrt_dims.len(),
            host_buffer_semantics: sys::PJRT_HostBufferSemantics_kImmutableOnlyDuringCall,
            device: self.raw_device(device)?,
            ..Args::new()
        };
        pjrt_call!(
            self.plugin_ref(),
            PJRT_Client_BufferFromHostBuffer,
            &mut args
        )?;
        let buffer = Buffer {
            client: self.clone(),
            raw: args.buffer,
            dtype,
            dims: dims.to_vec(),
        };
        await_event(self.plugin_ref(), args.done_with_host_buffer)?;
        Ok(buffer)
    }

    /// Wraps a buffer the plugin returned (an execution output), reading its type and shape.
    pub(crate) fn adopt_buffer(&self, raw: *mut sys::PJRT_Buffer) -> Result<Buffer> {
        // The buffer is owned from here on, so even a failed query below frees it.
        let mut buffer = Buffer {
            client: self.clone(),
            raw,
            dtype: DType::F32,
            dims: Vec::new(),
        };
        let mut ty = sys::PJRT_Buffer_ElementType_Args {
            buffer: raw,
            ..Args::new()
        };
        pjrt_call!(self.plugin_ref(), PJRT_Buffer_ElementType, &mut ty)?;
        buffer.dtype = from_pjrt_type(ty.type_).ok_or_else(|| Error::Argument {
            message: format!(
                "the plugin returned a buffer of unsupported element type {}",
                ty.type_
            ),
        })?;
        let mut dims = sys::PJRT_Buffer_Dimensions_Args {
            buffer: raw,
            ..Args::new()
        };
        pjrt_call!(self.plugin_ref(), PJRT_Buffer_Dimensions, &mut dims)?;
        if !dims.dims.is_null() {
            // SAFETY: the plugin returned `num_dims` dimensions owned by the buffer.
            let d = unsafe { std::slice::from_raw_parts(dims.dims, dims.num_dims) };
            buffer.dims = d.iter().map(|&x| x as usize).collect();
        }
        Ok(buffer)
    }
}

impl Buffer {
    /// The element type of the buffer's data.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The buffer's shape (empty for a scalar).
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Size of the buffer's data in host layout.
    pub fn size_in_bytes(&self) -> usize {
        self.dims.iter().product::<usize>() * self.dtype.size_in_bytes()
    }

    /// The client this buffer belongs to.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Copies the buffer to host memory (waits for pending computation first).
    ///
    /// On cpu ([`Client::reads_in_place`]) a ready buffer is copied from its own memory on
    /// this thread, under an external reference: the plugin's transfer
    /// ([`Buffer::transfer_to_host`]) hands even a ready buffer's copy to its thread pool and
    /// waits for it, two thread switches a read (18 µs for a scalar on the 2-core CI machine,
    /// under 1 µs in place).
    pub fn to_host(&self) -> Result<HostTensor> {
        let inner = &self.client.inner;
        if inner.reads_in_place.load(Ordering::Relaxed) {
            match self.read_in_place() {
                Ok(Some(host)) => return Ok(host),
                Ok(None) => {}
                Err(Error::Pjrt {
                    api_fn,
                    code: PjrtErrorCode::Unimplemented,
                    ..
                }) => {
                    if inner.reads_in_place.swap(false, Ordering::Relaxed) {
                        tracing::debug!("reads go through the plugin's transfer: no {api_fn}");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        self.transfer_to_host()
    }

    /// Copies the buffer to host memory through the plugin's own device-to-host transfer,
    /// whatever the platform (what [`Buffer::to_host`] does off cpu).
    pub fn transfer_to_host(&self) -> Result<HostTensor> {
        let mut data = vec![0u8; self.size_in_bytes()];
        let mut args = sys::PJRT_Buffer_ToHostBuffer_Args {
            src: self.raw,
            dst: data.as_mut_ptr().cast(),
            dst_size: data.len(),
            ..Args::new()
        };
        pjrt_call!(
            self.client.plugin_ref(),
            PJRT_Buffer_ToHostBuffer,
            &mut args
        )?;
        await_event(self.client.plugin_ref(), args.event)?;
        HostTensor::from_bytes(self.dtype, &self.dims, data)
    }

    /// Where device memory is host memory: waits for the buffer's data (a failed step's error
    /// comes back here, as from a transfer), then copies it from the buffer's memory under an
    /// external reference, which keeps the runtime from freeing or reusing that memory
    /// meanwhile (what NumPy views of jaxlib's cpu arrays rely on). `None` where the memory is
    /// not laid out as a [`HostTensor`] is (dense, row-major): the caller transfers instead.
    fn read_in_place(&self) -> Result<Option<HostTensor>> {
        let plugin = self.client.plugin_ref();
        let mut ready = sys::PJRT_Buffer_ReadyEvent_Args {
            buffer: self.raw,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Buffer_ReadyEvent, &mut ready)?;
        await_event(plugin, ready.event)?;
        let held = ExternalReference::take(self)?;
        if !self.is_dense_row_major()? {
            return Ok(None);
        }
        let mut at = sys::PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args {
            buffer: self.raw,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Buffer_OpaqueDeviceMemoryDataPointer, &mut at)?;
        let len = self.size_in_bytes();
        if at.device_memory_ptr.is_null() && len > 0 {
            return Ok(None);
        }
        let data = if len == 0 {
            Vec::new()
        } else {
            // SAFETY: on a client whose device memory is host memory, the pointer is the start
            // of the buffer's `len` bytes (its on-device size, checked above); the external
            // reference held keeps them allocated and unmoved until it is released, and the
            // ready event awaited above means no execution still writes them.
            unsafe { std::slice::from_raw_parts(at.device_memory_ptr.cast::<u8>(), len) }.to_vec()
        };
        drop(held);
        HostTensor::from_bytes(self.dtype, &self.dims, data).map(Some)
    }

    /// Whether the buffer's memory holds exactly its elements in row-major order: its
    /// on-device size is the host size, and its layout untiled with dimensions major to minor.
    fn is_dense_row_major(&self) -> Result<bool> {
        let plugin = self.client.plugin_ref();
        let mut size = sys::PJRT_Buffer_OnDeviceSizeInBytes_Args {
            buffer: self.raw,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Buffer_OnDeviceSizeInBytes, &mut size)?;
        if size.on_device_size_in_bytes != self.size_in_bytes() {
            return Ok(false);
        }
        let mut layout = sys::PJRT_Buffer_GetMemoryLayout_Args {
            buffer: self.raw,
            ..Args::new()
        };
        pjrt_call!(plugin, PJRT_Buffer_GetMemoryLayout, &mut layout)?;
        let layout = &layout.layout;
        if layout.type_ != sys::PJRT_Buffer_MemoryLayout_Type_Tiled {
            return Ok(false);
        }
        // SAFETY: a tiled layout's description, owned by the buffer (alive: `self`).
        let tiled = unsafe { &layout.__bindgen_anon_1.tiled };
        if tiled.num_tiles != 0 || tiled.minor_to_major_size != self.dims.len() {
            return Ok(false);
        }
        if self.dims.is_empty() {
            return Ok(true);
        }
        // SAFETY: `minor_to_major_size` entries owned by the buffer, as above.
        let order =
            unsafe { std::slice::from_raw_parts(tiled.minor_to_major, tiled.minor_to_major_size) };
        Ok(order.iter().rev().enumerate().all(|(i, &d)| d == i as i64))
    }
}

/// An external reference to a buffer's memory ([`Buffer::read_in_place`]), released on drop.
struct ExternalReference<'a>(&'a Buffer);

impl<'a> ExternalReference<'a> {
    fn take(buffer: &'a Buffer) -> Result<ExternalReference<'a>> {
        let mut args = sys::PJRT_Buffer_IncreaseExternalReferenceCount_Args {
            buffer: buffer.raw,
            ..Args::new()
        };
        pjrt_call!(
            buffer.client.plugin_ref(),
            PJRT_Buffer_IncreaseExternalReferenceCount,
            &mut args
        )?;
        Ok(ExternalReference(buffer))
    }
}

impl Drop for ExternalReference<'_> {
    fn drop(&mut self) {
        let mut args = sys::PJRT_Buffer_DecreaseExternalReferenceCount_Args {
            buffer: self.0.raw,
            ..Args::new()
        };
        let plugin = self.0.client.plugin_ref();
        if let Err(e) = pjrt_call!(
            plugin,
            PJRT_Buffer_DecreaseExternalReferenceCount,
            &mut args
        ) {
            tracing::warn!("releasing a buffer's external reference failed: {e}");
        }
    }
}

/// Zero bytes in a private read-only anonymous mapping (see [`Client::zeros_buffer`]).
struct ZeroPages {
    ptr: *mut u8,
    len: usize,
}

impl ZeroPages {
    /// `None` for an empty block, off Unix, or when the mapping fails (the caller then uses a
    /// heap block).
    #[cfg(unix)]
    fn map(len: usize) -> Option<ZeroPages> {
        if len == 0 {
            return None;
        }
        // SAFETY: a new private anonymous mapping (no address hint, no file); the kernel
        // returns fresh zero-filled pages or MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (ptr != libc::MAP_FAILED).then(|| ZeroPages {
            ptr: ptr.cast(),
            len,
        })
    }

    #[cfg(not(unix))]
    fn map(_len: usize) -> Option<ZeroPages> {
        None
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is a live readable mapping of `len` bytes, owned by `self` and never
        // written (PROT_READ).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for ZeroPages {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: the mapping made in `map`, unmapped once; no slice of it outlives `self`.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}
