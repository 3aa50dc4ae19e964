//! The host allocator for executing XLA programs.
//!
//! The CPU plugin allocates every output and temporary buffer afresh on each execution, from
//! its C++ code through `malloc`. What the allocator does with a freed multi-MiB buffer decides
//! whether the next step finds it in the heap or maps and zero-fills it anew. The step of
//! `examples/bench_llama.rs` (a 4.2M-parameter Llama) takes an 81 MB temporary on every
//! execution, allocated by a runtime worker thread; with glibc's defaults each step mapped,
//! zero-filled and unmapped it again: about 20,000 page faults per step, 18% of the process's
//! CPU samples (`perf record`). JAX's CPU runtime pays the same faults (the same XLA allocator
//! over the same glibc).
//!
//! **jemalloc (the default, feature `jemalloc`, Linux).** The process's allocator is jemalloc
//! (`tikv-jemallocator`), for Rust's allocations and the plugin's alike: its `malloc` family is
//! linked into the binary and exported, so the plugin, loaded later, binds to it. With
//! jemalloc's defaults a freed extent that large is purged at once (`madvise(MADV_DONTNEED)`
//! from the free, seen with `strace -k`) unless dirty pages are never decayed, and each of its
//! arenas (4 per core) keeps its own freed pages, so a step run on another worker thread than
//! the last finds none. `malloc_conf` (below) sets one arena and no decay, as the glibc settings
//! below do, and jemalloc's per-thread caches keep the compiler threads off the arena's lock.
//! `MALLOC_CONF` in the environment overrides these options (jemalloc reads both before
//! `main`).
//!
//! Freed pages never decayed also means the compiler's working memory would stay in the
//! process after a compile; [`release_freed_memory`] purges every arena after each in-process
//! compile instead (`arena.<all>.purge`, 23-25 ms after the Llama step's compile): the Llama
//! run's resident memory after 10 steps fell from 525-531 MB to 299-388 MB, its step time
//! unchanged (the step's buffers fault in once more, on the next step).
//!
//! Measured on `bench_llama` (one process per configuration, interleaved, 2-3 rounds): step
//! 53.7-54.5 ms and compile 1.10-1.12 s with these options; 57-59 ms and 1.41-1.60 s with the
//! tuned glibc; 71-75 ms and 1.07-1.15 s with glibc's defaults. `tests/host_allocator.rs`
//! measures the faults per step with these options and with jemalloc's default decay.
//!
//! **glibc, tuned (feature off).** Where the binary brings its own allocator, neuron-pc is
//! built without the feature and tunes glibc when the first plugin loads: no mappings, trimming
//! only past 1 GiB, and one arena for every thread (a thread arena holds at most 64 MiB and maps
//! anything larger afresh whatever the thresholds say). Its price is compile time: XLA compiles
//! on several threads, which then share the one arena's lock (41,130 context switches against
//! 753 for one compile of the Llama step; 1.94-1.96 s against 1.07-1.12 s, alternating in one
//! process). glibc cannot give the compiler threads arenas of their own once the runtime
//! threads share one: it fixes its arena limit the first time it needs it, and hands existing
//! arenas round-robin to threads that start later. The settings reach only the threads that
//! start after them; `NEURON_PC_MALLOC_TUNING=0` leaves glibc alone. The ahead-of-time workers
//! (`neuron-pc compile`) only compile, so they run without them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Once;

/// Variable that turns the tuning off when set to `0`.
pub const MALLOC_TUNING_VAR: &str = "NEURON_PC_MALLOC_TUNING";

/// Whether this build's allocator is jemalloc (feature `jemalloc` on Linux).
pub const JEMALLOC: bool = cfg!(all(feature = "jemalloc", target_os = "linux"));

/// What this build's allocator needs: one module per allocator, the same two functions.
#[cfg(all(feature = "jemalloc", target_os = "linux"))]
mod imp {
    #[global_allocator]
    static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

    /// A C string jemalloc reads as its options.
    #[repr(transparent)]
    pub struct ConfString(*const std::ffi::c_char);

    // SAFETY: the pointer is to a string literal, immutable and alive for the whole process.
    unsafe impl Sync for ConfString {}

    /// jemalloc's options for this process, read once when it initializes (before `main`): one
    /// arena for every thread, and freed pages kept in the process (never decayed back to the
    /// kernel), so a step's large buffers are reused by the next. `MALLOC_CONF` overrides
    /// either.
    #[allow(non_upper_case_globals)]
    #[no_mangle]
    pub static malloc_conf: ConfString = ConfString(c"narenas:1,dirty_decay_ms:-1".as_ptr());

    /// Nothing to tune: the options above are compiled in.
    pub fn apply() {}

    pub fn purge() -> bool {
        // `MALLCTL_ARENAS_ALL` in jemalloc.h: the command applies to every arena.
        let name = c"arena.4096.purge";
        // SAFETY: a NUL-terminated command name; the purge command reads and writes nothing,
        // so the old/new value pointers are null with zero lengths.
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        rc == 0
    }

    /// Reads one of jemalloc's options by name (`T`: its C type).
    fn option<T: Copy + Default>(name: &std::ffi::CStr) -> Option<T> {
        let mut value = T::default();
        let mut len = std::mem::size_of::<T>();
        // SAFETY: a NUL-terminated option name; `value` is writable for `len` bytes, the
        // option's size, which jemalloc checks against `len` (an error, not a write, if they
        // differ); nothing is written to jemalloc (null new value, zero length).
        let rc = unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                (&mut value as *mut T).cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        (rc == 0).then_some(value)
    }

    /// One arena and dirty pages never decayed (the options above, unless `MALLOC_CONF`
    /// changed them): a freed block's pages stay mapped for the next allocation of any thread.
    pub fn keeps_freed_pages() -> bool {
        option::<std::ffi::c_uint>(c"opt.narenas") == Some(1)
            && option::<isize>(c"opt.dirty_decay_ms") == Some(-1)
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu", not(feature = "jemalloc")))]
mod imp {
    pub fn apply() {
        use std::ffi::c_int;
        // glibc's <malloc.h> parameter numbers.
        const M_TRIM_THRESHOLD: c_int = -1;
        const M_TOP_PAD: c_int = -2;
        const M_MMAP_THRESHOLD: c_int = -3;
        const M_MMAP_MAX: c_int = -4;
        const M_ARENA_MAX: c_int = -8;
        extern "C" {
            fn mallopt(param: c_int, value: c_int) -> c_int;
        }
        for (param, value) in [
            // Serve allocations up to 32 MiB (glibc's maximum) from the heap, not fresh mappings.
            (M_MMAP_THRESHOLD, 32 << 20),
            // Give freed heap memory back to the kernel only beyond 1 GiB at the top...
            (M_TRIM_THRESHOLD, 1 << 30),
            // ...and grow the heap in 64 MiB steps.
            (M_TOP_PAD, 64 << 20),
            // Larger blocks from the heap too (no mappings at all), and one arena for every
            // thread: a thread arena cannot grow past 64 MiB and maps anything larger afresh.
            (M_MMAP_MAX, 0),
            (M_ARENA_MAX, 1),
        ] {
            // SAFETY: mallopt only changes allocator parameters; it is thread-safe in glibc and
            // takes plain integers. A rejected value returns 0 and changes nothing.
            let ok = unsafe { mallopt(param, value) };
            if ok == 0 {
                tracing::debug!(param, value, "mallopt refused a setting");
            }
        }
    }

    pub fn purge() -> bool {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::ffi::c_int;
        }
        // SAFETY: malloc_trim takes a plain size and only changes the allocator's own state.
        // It returns 0 when there was nothing to give back, which is still done.
        unsafe { malloc_trim(0) };
        true
    }

    /// The settings above, once applied, keep every freed block in the one heap (no mappings,
    /// trimming only past 1 GiB).
    pub fn keeps_freed_pages() -> bool {
        super::TUNED.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[cfg(not(any(
    all(feature = "jemalloc", target_os = "linux"),
    all(target_os = "linux", target_env = "gnu", not(feature = "jemalloc"))
)))]
mod imp {
    pub fn apply() {}

    pub fn purge() -> bool {
        false
    }

    pub fn keeps_freed_pages() -> bool {
        false
    }
}

/// Applies glibc's settings once per process unless turned off; with jemalloc there is
/// nothing left to apply, and a request to turn the settings off is answered once.
pub fn tune_allocator_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let off = std::env::var(MALLOC_TUNING_VAR).as_deref() == Ok("0");
        if JEMALLOC {
            if off {
                tracing::warn!(
                    "{MALLOC_TUNING_VAR}=0 has no effect in a jemalloc build: set MALLOC_CONF \
                     (for example dirty_decay_ms:10000) to change jemalloc's options"
                );
            }
        } else if !off {
            imp::apply();
            TUNED.store(true, Ordering::Relaxed);
        }
    });
}

/// Whether glibc's settings were applied in this process.
static TUNED: AtomicBool = AtomicBool::new(false);
static RELEASES: AtomicU64 = AtomicU64::new(0);
static PREFAULTED: AtomicU64 = AtomicU64::new(0);
static RELEASE_AFTER_COMPILE: AtomicBool = AtomicBool::new(true);

/// Whether each compile releases the freed memory when it returns (on by default). A process
/// that only compiles and then exits (a `neuron-pc compile` worker) turns it off: it would add
/// the purge (about 25 ms for the small Llama) to every compile and keep nothing for later.
pub fn set_release_after_compile(on: bool) {
    RELEASE_AFTER_COMPILE.store(on, Ordering::Relaxed);
}

/// See [`set_release_after_compile`].
pub fn release_after_compile() -> bool {
    RELEASE_AFTER_COMPILE.load(Ordering::Relaxed)
}

/// Gives the memory the allocator holds freed back to the kernel: jemalloc purges every arena,
/// glibc trims its heaps. Called after each compile, whose working memory is free by then;
/// the next step maps its own buffers in again once. Returns whether the allocator did it.
pub fn release_freed_memory() -> bool {
    let done = imp::purge();
    if done {
        RELEASES.fetch_add(1, Ordering::Relaxed);
    }
    done
}

/// How many times [`release_freed_memory`] has released memory in this process.
pub fn freed_memory_releases() -> u64 {
    RELEASES.load(Ordering::Relaxed)
}

/// Whether a block freed now stays mapped in the process for the next allocation of any
/// thread (jemalloc with one arena and no decay, or glibc tuned as above).
pub fn keeps_freed_pages() -> bool {
    imp::keeps_freed_pages()
}

/// Maps `bytes` of memory into the process and frees them again, so that the allocations of
/// an execution about to start (its temporary buffer) reuse pages already faulted in instead
/// of faulting each in while the step runs. Worth it only while the caller would otherwise
/// wait (the first step waiting for its executable to load: `src/compile/prefetch.rs`), and
/// only where freed pages stay mapped ([`keeps_freed_pages`]); returns whether it was done.
/// A later [`release_freed_memory`] gives the pages back like any other freed memory. A size
/// over half the physical memory free right now is refused: the size comes from a hint on
/// disk, and a stale or garbled one must not push the job out of memory.
pub fn prefault(bytes: usize) -> bool {
    // Touching one byte per 4 KiB faults in every page (a larger page is touched repeatedly).
    const PAGE: usize = 4096;
    if bytes == 0 || !keeps_freed_pages() || free_physical_bytes().is_none_or(|f| bytes > f / 2) {
        return false;
    }
    let Ok(layout) = std::alloc::Layout::from_size_align(bytes, PAGE) else {
        return false;
    };
    // SAFETY: the layout has a non-zero size.
    let block = unsafe { std::alloc::alloc(layout) };
    if block.is_null() {
        return false;
    }
    for offset in (0..bytes).step_by(PAGE) {
        // SAFETY: `offset < bytes`, inside the block just allocated; a volatile write so the
        // touch is not optimised away with the otherwise unread block.
        unsafe { block.add(offset).write_volatile(0) };
    }
    // SAFETY: allocated above with this layout, not yet freed.
    unsafe { std::alloc::dealloc(block, layout) };
    PREFAULTED.fetch_add(bytes as u64, Ordering::Relaxed);
    true
}

/// The physical memory free right now (not counting the page cache), where the platform says.
fn free_physical_bytes() -> Option<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf only reads system values.
        let (pages, size) = unsafe {
            (
                libc::sysconf(libc::_SC_AVPHYS_PAGES),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        usize::try_from(pages)
            .ok()?
            .checked_mul(usize::try_from(size).ok()?)
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// How many bytes [`prefault`] has mapped in this process.
pub fn prefaulted_bytes() -> u64 {
    PREFAULTED.load(Ordering::Relaxed)
}
