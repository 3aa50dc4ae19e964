//! Allocator settings for executing XLA programs on the host.
//!
//! The CPU plugin allocates every output buffer afresh on each execution. With glibc's default
//! settings, multi-MiB buffers (an embedding table, its gradient and its optimizer moments) are
//! returned to the kernel when freed and come back as new zero-filled pages on the next step:
//! measured on the example training step, about 770 page faults per step. Keeping freed memory
//! in the heap cuts that to about 210 and the step's CPU time by about 10%
//! (`perf stat -e page-faults` on `examples/hlo_steptime`).
//!
//! Larger programs need more: the step of `examples/bench_llama.rs` (a 4.2M-parameter Llama)
//! takes an 81 MB temporary buffer on every execution, allocated by a runtime worker thread.
//! glibc serves a request that large from a fresh mapping whatever the thresholds say (a thread
//! arena's heap holds at most 64 MiB, and the mapping threshold stops at 32 MiB), so each step
//! mapped, zero-filled and unmapped it again: about 20,000 page faults per step, 18% of the
//! process's CPU samples (`perf record`). One arena and no mappings keep that buffer in the heap
//! from one step to the next: page faults over the same run fell from 2.15 M to 0.12 M and CPU
//! time by 27% (`perf stat -e page-faults,task-clock examples/bench_llama --steps 40`). JAX's
//! CPU runtime pays the same faults (the same XLA allocator over the same glibc).
//! The arena setting reaches the threads that start after it, which includes the runtime's own
//! (the client creates them); where other threads already had heaps of their own when the first
//! plugin loaded (a test harness, a data pipeline started first), runtime threads may be handed
//! one of those and large buffers are mapped anew as before. `tests/host_allocator.rs` measures
//! the faults per step with and without the settings.
//!
//! The price is paid in compile time: XLA compiles on several threads, which now share one
//! arena. The small Llama's step compiled in 1.34 s against 1.02-1.06 s (+30%; 45% more CPU
//! time), while its step ran in 55 ms against 71-72 ms (-23%), on a quiet machine: one compile
//! is paid back after about 20 steps, and a warm compile cache pays it never. The ahead-of-time
//! workers (`neuron-pc compile`) only compile, so they run without the settings. A later
//! measurement in one process, compiles alternating (`hlo_steptime --compile-only`): 1.94-1.96
//! s with the settings against 1.07-1.12 s without, 41,130 context switches against 753 (the
//! compiler threads wait on the one arena's lock); JAX's own program for the same step, through
//! the same plugin, 2.06-2.14 s against 1.10-1.22 s, and 1.06 s in jaxlib. So the compile gap
//! to JAX is this setting, not the program neuron-pc lowers.
//!
//! Why the two cannot be had together with glibc: the runtime threads that allocate the large
//! buffers start with the client and take their arena at once, the compiler threads start at
//! the first compile, and glibc fixes its arena limit the first time it needs it, so compiler
//! threads cannot get arenas of their own once the runtime threads were made to share one.
//! Raising the per-thread cache (`glibc.malloc.tcache_count`, settable only in the environment
//! before the process starts) gave back part of it (1.36-1.50 s).
//!
//! The settings are process-wide, applied once when the first plugin loads, and only on glibc;
//! `NEURON_PC_MALLOC_TUNING=0` leaves the allocator alone (for example when the process
//! links another allocator or is short of memory: freed memory stays with the process).

use std::sync::Once;

/// Variable that turns the tuning off when set to `0`.
pub const MALLOC_TUNING_VAR: &str = "NEURON_PC_MALLOC_TUNING";

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn apply() {
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

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn apply() {}

/// Applies the allocator settings once per process unless turned off.
pub fn tune_allocator_once() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var(MALLOC_TUNING_VAR).as_deref() != Ok("0") {
            apply();
        }
    });
}
