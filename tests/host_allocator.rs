//! The host allocator (`compiler/src/pjrt/malloc.rs`): a step whose program needs a temporary
//! buffer larger than the allocator's defaults would keep (here an 82 MB matmul result that is
//! only summed) reuses that memory from one step to the next instead of mapping and
//! zero-filling it anew. Measured as the process's minor page faults per step, against the same
//! step under the allocator's defaults (about one fault per 4 KiB page of the buffer): with
//! jemalloc (the default build) `MALLOC_CONF` restores jemalloc's default decay; without it,
//! `NEURON_PC_MALLOC_TUNING=0` leaves glibc's. The jemalloc check also shows that the plugin's
//! allocations go through jemalloc: were they glibc's, neither run would keep the buffer.
//!
//! No test harness (`harness = false` in Cargo.toml): glibc's settings decide which heap the
//! runtime's threads use when they start, so they must be applied before other threads exist,
//! as in a training binary that creates its device in `main`. The fault counter is per process.

use neuron_pc::compile::CacheConfig;
use neuron_pc::{DType, DeviceConfig, LazyDevice};
use neuron_pc_test_support::process::resident_kib;

/// Pages of the temporary: the `[4096, 5000]` f32 product.
const TEMP_PAGES: i64 = 4096 * 5000 * 4 / 4096;

fn minor_faults() -> i64 {
    // SAFETY: getrusage writes one plain struct that we own.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `usage` outlives the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    assert_eq!(rc, 0);
    usage.ru_minflt
}

/// A device with no compile cache (each test compiles what it measures).
fn device() -> LazyDevice {
    LazyDevice::new(DeviceConfig {
        cache: CacheConfig::disabled(),
        ..DeviceConfig::default()
    })
    .unwrap()
}

/// The median page faults of one step once the heap has grown (steps 3 to 11 of 12).
///
/// The median, not the most: now and then a step starts while the last one's temporary is still
/// held (execution is asynchronous; the read waits for the output, not for the free), and the
/// heap grows again: about 40,000 faults in that one step (as in each of the first two steps),
/// and none after it.
/// At a0e2a41 the most of steps 3 to 5 was about 40,000 in 3 of 12 runs (and in one CI run);
/// of 12 more runs printing every step, 2 had one such step and none had two. With the
/// allocator's defaults every step maps the temporary anew.
fn steady_faults_per_step() -> i64 {
    let dev = device();
    let a = dev.full(0.5, &[4096, 16], DType::F32).unwrap();
    let b = dev.full(0.25, &[16, 5000], DType::F32).unwrap();
    let mut faults = Vec::new();
    for step in 0..12 {
        let before = minor_faults();
        // Summed as integers: the conversion keeps the product out of the matmul's own fusion
        // (YNNPACK takes f32 but not i32 elementwise ops), so it is written out in full. An f32
        // sum alone is fused into the matmul by lammps-jax-pjrt-cpu's XLA: no temporary at all.
        let product = a.matmul(&b).unwrap().to_dtype(DType::I32).unwrap();
        let total = product.sum_all().unwrap();
        dev.mark_step().unwrap();
        let got = total.to_vec::<i32>().unwrap()[0];
        faults.push(minor_faults() - before);
        // 16 products of 0.5 * 0.25 in each of the 4096 x 5000 entries, each 2
        assert_eq!(got, 4096 * 5000 * 2, "step {step}");
    }
    let mut steady = faults[3..].to_vec();
    steady.sort_unstable();
    steady[steady.len() / 2]
}

/// Memory the allocator keeps after a free goes back to the kernel when released, and every
/// compile releases it (the compiler's working memory is free by then).
fn release_after_compile() {
    let dev = device();
    let released = neuron_pc_compiler::pjrt::freed_memory_releases();
    let x = dev
        .tensor(&neuron_pc::HostTensor::from_slice(&[0.5f32; 64 * 64], &[64, 64]).unwrap())
        .unwrap();
    // two different step graphs, two compiles
    let first = x.exp().unwrap().sum_all().unwrap();
    dev.mark_step().unwrap();
    first.item().unwrap();
    let second = x.matmul(&x).unwrap().sum_all().unwrap();
    dev.mark_step().unwrap();
    second.item().unwrap();
    let compiles = dev.metrics().compiles;
    assert_eq!(compiles, 2);
    let after = neuron_pc_compiler::pjrt::freed_memory_releases();
    assert_eq!(after - released, compiles, "one release per compile");
    // a process that only compiles turns it off (the `neuron-pc compile` workers)
    neuron_pc_compiler::pjrt::set_release_after_compile(false);
    let third = x.tanh().unwrap().sum_all().unwrap();
    dev.mark_step().unwrap();
    third.item().unwrap();
    assert_eq!(dev.metrics().compiles, 3);
    assert_eq!(neuron_pc_compiler::pjrt::freed_memory_releases(), after);

    // 64 MiB touched then freed stays with the process (the buffers a step reuses)...
    let block = vec![1u8; 64 << 20];
    let held = std::hint::black_box(block)
        .iter()
        .map(|&x| x as u64)
        .sum::<u64>();
    assert_eq!(held, 64 << 20);
    let kept = resident_kib();
    assert!(neuron_pc_compiler::pjrt::release_freed_memory());
    let released_kib = kept.saturating_sub(resident_kib());
    // ...until it is released
    assert!(
        released_kib > 48 << 10,
        "the release gave back {released_kib} KiB of a freed 64 MiB block"
    );
}

/// A block mapped ahead and freed ([`prefault`], what a first step does while it waits for its
/// executable) is reused by the next allocation of that size: writing every page of it then
/// faults next to nothing. Where the allocator does not keep freed pages nothing is mapped.
/// Prints whether freed pages are kept, the faults of the prefault and of the allocation.
///
/// [`prefault`]: neuron_pc_compiler::pjrt::prefault
fn prefault_then_allocate() {
    use neuron_pc_compiler::pjrt::{keeps_freed_pages, prefault, prefaulted_bytes};
    // the first plugin load applies glibc's settings in a build without jemalloc
    let _dev = device();
    let keeps = keeps_freed_pages();
    // a size no hint should name (all the physical memory there is) is refused at once
    let everything = usize::try_from(
        // SAFETY: sysconf only reads system values.
        unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) * libc::sysconf(libc::_SC_PAGESIZE) },
    )
    .unwrap();
    assert!(!prefault(everything));
    assert_eq!(prefaulted_bytes(), 0);
    let before = minor_faults();
    let done = prefault(BLOCK);
    let mapping = minor_faults() - before;
    assert_eq!(
        done, keeps,
        "mapped ahead exactly where freed pages are kept"
    );
    assert_eq!(prefaulted_bytes(), if done { BLOCK as u64 } else { 0 });
    let before = minor_faults();
    let mut block = Vec::<u8>::with_capacity(BLOCK);
    block.extend((0..BLOCK).map(|i| (i / 4096) as u8));
    let sum: u64 = std::hint::black_box(&block)
        .iter()
        .step_by(4096)
        .map(|&b| b as u64)
        .sum();
    let faults = minor_faults() - before;
    assert_eq!(
        sum,
        (0..BLOCK / 4096).map(|p| (p % 256) as u64).sum::<u64>()
    );
    println!("{keeps} {mapping} {faults}");
}

/// The block [`prefault_then_allocate`] maps.
const BLOCK: usize = 64 << 20;

/// Runs this test binary again as a child in `mode`, with the allocator's variables cleared
/// and `env` set; returns its standard output, failing on its failure.
fn child(mode: &str, env: Option<(&str, &str)>) -> String {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.env("HOST_ALLOCATOR_CHILD", mode)
        .env_remove("MALLOC_CONF")
        .env_remove("NEURON_PC_MALLOC_TUNING");
    if let Some((name, value)) = env {
        cmd.env(name, value);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn main() {
    match std::env::var("HOST_ALLOCATOR_CHILD").as_deref() {
        Ok("release") => {
            release_after_compile();
            return;
        }
        Ok("prefault") => {
            prefault_then_allocate();
            return;
        }
        Ok("faults") => {
            println!("{}", steady_faults_per_step());
            return;
        }
        _ => {}
    }
    // The allocator's own defaults: with jemalloc's default decay a freed extent that large is
    // purged at once; glibc's defaults map it afresh.
    let (allocator, defaults) = if neuron_pc_compiler::pjrt::JEMALLOC {
        ("jemalloc", ("MALLOC_CONF", "dirty_decay_ms:10000"))
    } else {
        ("glibc", ("NEURON_PC_MALLOC_TUNING", "0"))
    };
    let run = |tuned: bool| -> i64 {
        let env = if tuned { None } else { Some(defaults) };
        child("faults", env).trim().parse().unwrap()
    };
    let (tuned, plain) = (run(true), run(false));
    println!("page faults per step: {tuned} as configured, {plain} with {allocator}'s defaults");
    // the allocator's defaults map or purge the temporary every step: a fault per page
    assert!(
        plain > TEMP_PAGES / 2,
        "{plain} faults: the check cannot tell"
    );
    assert!(
        tuned < TEMP_PAGES / 10,
        "{tuned} page faults per step (a temporary of {TEMP_PAGES} pages): mapped anew"
    );
    println!("test a_large_temporary_is_not_mapped_anew_on_every_step ... ok");

    child("release", None);
    println!("test freed_memory_goes_back_after_each_compile ... ok");

    let pages = (BLOCK / 4096) as i64;
    let parse = |out: String| -> (bool, i64, i64) {
        let f: Vec<&str> = out.split_whitespace().collect();
        (f[0] == "true", f[1].parse().unwrap(), f[2].parse().unwrap())
    };
    let (keeps, mapping, faults) = parse(child("prefault", None));
    println!("prefault as configured: kept {keeps}, {mapping} faults mapping, {faults} after");
    assert!(keeps, "{allocator} as configured keeps freed pages");
    assert!(
        mapping > pages / 2,
        "the prefault mapped the block: {mapping} faults"
    );
    assert!(
        faults < pages / 10,
        "{faults} faults writing a {pages}-page block after it was mapped ahead"
    );
    let (keeps, _, faults) = parse(child("prefault", Some(defaults)));
    println!("prefault with {allocator}'s defaults: kept {keeps}, {faults} faults after");
    assert!(!keeps, "{allocator}'s defaults give freed pages back");
    assert!(faults > pages / 2, "{faults} faults: the check cannot tell");
    println!("test a_block_mapped_ahead_is_reused_where_freed_pages_are_kept ... ok");
}
