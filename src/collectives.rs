//! Collectives between processes on the cpu target, through gloo.
//!
//! XLA's cpu client runs collectives only among the devices of its own process. For a run of
//! several processes on cpu, each process compiles its programs over its own replicas and the
//! compiler rewrites every collective that reaches other processes
//! ([`neuron_pc_compiler::passes::cross_process`]) into XLA's collective inside the process
//! plus a custom call between processes. The calls run the XLA FFI handlers of this module,
//! registered with the plugin before the first compile ([`register`]); each calls gloo on the
//! group of its local replica: local replica `l` of every process forms group `l`
//! ([`connect`]), whose members meet through the run's store (`NEURON_PC_STORE`).
//!
//! gloo is the collective library of torch.distributed's and JAX's cpu backends, and Debian
//! packages it (`libgloo-dev`); its rendezvous takes any key-value store, which is what a run
//! already has. MPI would need its own launcher (`mpirun`) under torchrun or Slurm, which
//! start the processes here. On cuda and Neuron the runtime's collectives cross processes
//! themselves and none of this is used.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use neuron_pc_compiler::ir::ProcessCollective;
use neuron_pc_compiler::ir::ReduceOp;
use neuron_pc_compiler::lower::{process_target, PROCESS_INDEX_TARGET};
use neuron_pc_compiler::pjrt::ffi::{self, dtype, BufferRef, CallFrame, FfiError};
use neuron_pc_compiler::pjrt::Plugin;
use neuron_pc_gloo::{Element, Group, Listen, Reduce, Rendezvous};

use crate::error::{Error, Result};
use crate::store::{KvStore, ScopedStore};
use crate::topology::Topology;

/// How long one collective between processes (and the groups' first connection) may wait
/// for its peers, in seconds: a peer that died is seen at once (its connections close), one
/// that hangs after this long.
pub const COLLECTIVE_TIMEOUT_ENV: &str = "NEURON_PC_COLLECTIVE_TIMEOUT";
/// Default of [`COLLECTIVE_TIMEOUT_ENV`], in seconds: ranks may be minutes apart when one
/// compiles a graph the others load from the cache.
pub const DEFAULT_COLLECTIVE_TIMEOUT_SECS: u64 = 900;
/// The network interface gloo listens on, as torch.distributed's gloo backend reads it.
pub const SOCKET_IFNAME_ENV: &str = "GLOO_SOCKET_IFNAME";

/// This process's groups: `groups[l]` joins the `l`-th device (replica or mesh position) of
/// every process; the device a call runs on is its ordinal less `first_device`.
struct Groups {
    rank: usize,
    world: usize,
    first_device: usize,
    groups: Vec<Group>,
    /// The run's store, where each rank's key lives as long as the rank ([`ALIVE_TTL`]), or
    /// `None` when the store cannot keep such keys.
    store: Option<ScopedStore>,
}

/// How soon after a rank's death the store drops its key: the wait before a failed collective
/// names the ranks that are gone.
const ALIVE_TTL: Duration = Duration::from_secs(4);

fn alive_key(rank: usize) -> String {
    format!("gloo/alive/{rank}")
}

impl Groups {
    /// The failure of a collective, with the ranks found gone: a dead rank's key lapses
    /// within [`ALIVE_TTL`], so this waits up to twice that for it.
    fn failure(&self, what: String) -> String {
        let Some(store) = &self.store else {
            return what;
        };
        let started = std::time::Instant::now();
        loop {
            let gone: Vec<String> = (0..self.world)
                .filter(|&r| r != self.rank)
                .filter(|&r| matches!(store.try_get(&alive_key(r)), Ok(None)))
                .map(|r| r.to_string())
                .collect();
            if !gone.is_empty() {
                let s = if gone.len() == 1 { "" } else { "s" };
                return format!(
                    "lost rank{s} {} of {} (gone from the run's store): {what}",
                    gone.join(", "),
                    self.world
                );
            }
            if started.elapsed() > 2 * ALIVE_TTL {
                return format!("{what} (every rank is still in the run's store)");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

fn current() -> &'static RwLock<Option<Arc<Groups>>> {
    static CURRENT: RwLock<Option<Arc<Groups>>> = RwLock::new(None);
    &CURRENT
}

/// Registers the cross-process handlers with `plugin` (once per plugin and process).
pub fn register(plugin: &Plugin) -> Result<()> {
    let handlers: [(&str, ffi::Handler); 5] = [
        (PROCESS_INDEX_TARGET, process_index),
        (process_target(&ProcessCollective::Ordered), ordered),
        (
            process_target(&ProcessCollective::AllReduce(ReduceOp::Sum)),
            all_reduce,
        ),
        (
            process_target(&ProcessCollective::AllGather { dim: 0 }),
            all_gather,
        ),
        (
            process_target(&ProcessCollective::ReduceScatter {
                op: ReduceOp::Sum,
                dim: 0,
            }),
            reduce_scatter,
        ),
    ];
    for (name, handler) in handlers {
        plugin.register_host_handler_once(name, handler)?;
    }
    Ok(())
}

/// The timeout [`COLLECTIVE_TIMEOUT_ENV`] sets.
pub fn timeout_from_env() -> Result<Duration> {
    match std::env::var(COLLECTIVE_TIMEOUT_ENV) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                Error::Config(format!(
                    "{COLLECTIVE_TIMEOUT_ENV}={v:?}: expected a positive number of seconds"
                ))
            }),
        _ => Ok(Duration::from_secs(DEFAULT_COLLECTIVE_TIMEOUT_SECS)),
    }
}

/// The run's store, as gloo's rendezvous sees it.
struct StoreRendezvous<'a> {
    store: &'a ScopedStore,
    prefix: String,
}

impl Rendezvous for StoreRendezvous<'_> {
    fn set(&self, key: &str, value: &[u8]) -> std::result::Result<(), String> {
        let key = format!("{}{key}", self.prefix);
        self.store.set(&key, value).map_err(|e| e.to_string())
    }

    fn get(&self, key: &str, timeout: Duration) -> std::result::Result<Vec<u8>, String> {
        let key = format!("{}{key}", self.prefix);
        self.store.get(&key, timeout).map_err(|e| e.to_string())
    }
}

/// Publishes this rank's `layout` under `layout/<rank>` and compares every rank's: the same
/// error on every rank when they differ, listing each rank's.
fn agree_on_layout(
    store: &ScopedStore,
    topology: &Topology,
    layout: &str,
    timeout: Duration,
) -> Result<()> {
    let key = |r: usize| format!("layout/{r}");
    let failed = |e: crate::store::StoreError| {
        Error::Config(format!(
            "collectives between processes: the ranks' layouts: {e}"
        ))
    };
    store
        .set(&key(topology.rank), layout.as_bytes())
        .map_err(failed)?;
    let mut all = Vec::with_capacity(topology.world_size);
    for r in 0..topology.world_size {
        let theirs = match r == topology.rank {
            true => layout.to_string(),
            false => {
                String::from_utf8_lossy(&store.get(&key(r), timeout).map_err(failed)?).into_owned()
            }
        };
        all.push(theirs);
    }
    if all.iter().all(|l| *l == all[0]) {
        return Ok(());
    }
    let each: Vec<String> = (all.iter().enumerate())
        .map(|(r, l)| format!("rank {r}: {l}"))
        .collect();
    Err(Error::Config(format!(
        "the ranks' devices disagree ({}): every process of a run needs the same devices and \
         mesh (--devices, --fsdp, --tp)",
        each.join("; ")
    )))
}

/// Connects the groups of this process's `local` devices, the client's devices
/// `first_device..first_device + local`, through `store` (every process of the run calls
/// this with the same devices before its first step); a second call with the same layout
/// keeps the groups. `layout` describes this process's devices (their count and mesh): the
/// ranks compare theirs first, so ranks that disagree stop with one line each rather than
/// wait for groups that never fill.
pub fn connect(
    store: &ScopedStore,
    topology: &Topology,
    first_device: usize,
    local: usize,
    layout: &str,
) -> Result<()> {
    let mut slot = current().write().unwrap_or_else(|p| p.into_inner());
    if let Some(g) = slot.as_ref() {
        if g.rank == topology.rank
            && g.world == topology.world_size
            && g.first_device == first_device
            && g.groups.len() == local
        {
            return Ok(());
        }
    }
    let timeout = timeout_from_env()?;
    agree_on_layout(store, topology, layout, timeout)?;
    let listen = match std::env::var(SOCKET_IFNAME_ENV) {
        Ok(i) if !i.trim().is_empty() => Listen::Interface(i.trim().to_string()),
        // every process on this machine: loopback needs no name to resolve
        _ if topology.num_nodes == 1 => Listen::Host("127.0.0.1".into()),
        _ => Listen::HostName,
    };
    // this rank's key, dropped by the store soon after the process dies
    let alive = store
        .set_while_alive(
            &alive_key(topology.rank),
            std::process::id().to_string().as_bytes(),
            ALIVE_TTL,
        )
        .unwrap_or(false);
    let mut groups = Vec::with_capacity(local);
    for l in 0..local {
        let rendezvous = StoreRendezvous {
            store,
            prefix: format!("gloo/{l}/"),
        };
        let group = Group::connect(
            &rendezvous,
            topology.rank,
            topology.world_size,
            &listen,
            timeout,
        )
        .map_err(|e| {
            Error::Config(format!(
                "collectives between processes (group of local replica {l}): {e}; set \
                 {SOCKET_IFNAME_ENV} to the interface the processes reach each other on"
            ))
        })?;
        groups.push(group);
    }
    *slot = Some(Arc::new(Groups {
        rank: topology.rank,
        world: topology.world_size,
        first_device,
        groups,
        store: alive.then(|| store.clone()),
    }));
    Ok(())
}

/// `1` (builds with the `test-hooks` feature only): every collective between processes
/// leaves out the other processes, as if each were alone, so that a test can show that its
/// comparison would catch a run whose reduction between processes was skipped.
#[cfg(feature = "test-hooks")]
pub const SKIP_ENV: &str = "NEURON_PC_TEST_SKIP_PROCESS_COLLECTIVES";

fn skipping() -> bool {
    #[cfg(feature = "test-hooks")]
    {
        static SKIP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *SKIP.get_or_init(|| std::env::var(SKIP_ENV).is_ok_and(|v| v == "1"))
    }
    #[cfg(not(feature = "test-hooks"))]
    false
}

/// One call's view: its operands, results and the group of its local replica.
struct Call {
    args: Vec<BufferRef>,
    rets: Vec<BufferRef>,
    groups: Arc<Groups>,
    local: usize,
    tag: u32,
    op: Reduce,
    dim: usize,
    /// Only the process's first device exchanges; the others give zeros.
    leader: bool,
}

/// Runs `body` for the call in `frame`, answering XLA's probe and turning a failure into the
/// execution's error.
///
/// # Safety
/// `frame` is the call frame XLA passed a handler of this module.
unsafe fn handle(
    frame: *mut CallFrame,
    body: impl FnOnce(&Call) -> std::result::Result<(), String>,
) -> *mut FfiError {
    // SAFETY: the caller's contract.
    if unsafe { ffi::answer_probe(frame) } {
        return std::ptr::null_mut();
    }
    // SAFETY: a real call (not the probe): its lists and attributes are live for the call.
    let result = unsafe { call_of(frame) }.and_then(|c| body(&c));
    match result {
        Ok(()) => std::ptr::null_mut(),
        // SAFETY: as above.
        Err(m) => unsafe { ffi::error(frame, &m) },
    }
}

/// # Safety
/// As [`handle`], past the probe.
unsafe fn call_of(frame: *mut CallFrame) -> std::result::Result<Call, String> {
    let groups = current()
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .ok_or("a collective between processes ran before the groups were connected")?;
    // SAFETY: the caller's contract.
    let (args, rets) = unsafe { (ffi::args(frame), ffi::rets(frame)) };
    // SAFETY: as above.
    let attr = |name: &str| unsafe { ffi::int_attr(frame, name) }.unwrap_or(0);
    // SAFETY: as above.
    let ordinal = unsafe { ffi::device_ordinal(frame) }
        .ok_or("the runtime did not say which device runs a collective between processes")?;
    let local = ordinal.checked_sub(groups.first_device).ok_or_else(|| {
        format!(
            "device {ordinal} runs a collective between processes, but this process's groups \
             start at device {}",
            groups.first_device
        )
    })?;
    let op = match attr("op") {
        0 => Reduce::Sum,
        1 => Reduce::Prod,
        2 => Reduce::Max,
        _ => Reduce::Min,
    };
    Ok(Call {
        args,
        rets,
        groups,
        local,
        tag: attr("tag") as u32,
        op,
        dim: attr("dim") as usize,
        leader: attr("leader") == 1,
    })
}

impl Call {
    fn group(&self) -> std::result::Result<&Group, String> {
        self.groups.groups.get(self.local).ok_or_else(|| {
            format!(
                "local replica {} has no group ({} connected)",
                self.local,
                self.groups.groups.len()
            )
        })
    }

    /// A failure of gloo, with the ranks found gone ([`Groups::failure`]).
    fn failed(&self, e: neuron_pc_gloo::Error) -> String {
        self.groups.failure(e.to_string())
    }

    fn value(&self) -> std::result::Result<(&BufferRef, &BufferRef), String> {
        match (self.args.first(), self.rets.first()) {
            (Some(a), Some(r)) => Ok((a, r)),
            _ => Err("a process collective without its operand or result".into()),
        }
    }
}

fn element(d: i32) -> std::result::Result<Element, String> {
    Ok(match d {
        dtype::F32 => Element::F32,
        dtype::F64 => Element::F64,
        dtype::BF16 => Element::Bf16,
        dtype::F16 => Element::F16,
        dtype::S8 => Element::S8,
        dtype::S16 => Element::S16,
        dtype::S32 => Element::S32,
        dtype::S64 => Element::S64,
        dtype::U8 | dtype::PRED => Element::U8,
        dtype::U16 => Element::U16,
        dtype::U32 => Element::U32,
        dtype::U64 => Element::U64,
        other => {
            return Err(format!(
                "element type {other} has no reduction between processes"
            ))
        }
    })
}

/// The bytes of `b`, `element` wide each.
///
/// # Safety
/// `b` is a buffer of the running call, not aliased by another slice alive at the same time.
unsafe fn bytes<'a>(b: &BufferRef, element: Element) -> &'a mut [u8] {
    // SAFETY: the caller's contract; XLA's buffer holds `elements()` elements.
    unsafe { std::slice::from_raw_parts_mut(b.data, b.elements() * element.size()) }
}

/// (elements before `dim`, bytes of one slice from `dim` on) of a buffer.
fn outer_inner(dims: &[i64], dim: usize, element: Element) -> (usize, usize) {
    let outer: i64 = dims[..dim.min(dims.len())].iter().product();
    let inner: i64 = dims[dim.min(dims.len())..].iter().product();
    (
        outer.max(0) as usize,
        inner.max(0) as usize * element.size(),
    )
}

/// A leader's exchange failed: the process's other devices already wait for it in XLA's
/// all-reduce inside the process, which would never complete (XLA aborts the process after
/// 40 s with a rendezvous message that names nothing). The run cannot go on, so the process
/// ends now with the reason, as torch.distributed's watchdog ends a process whose collective
/// failed.
fn leader_failed(message: &str) -> ! {
    eprintln!("error: collective between processes failed: {message}");
    std::process::exit(1)
}

unsafe extern "C" fn process_index(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA calls this handler with its call frame.
    unsafe {
        handle(frame, |c| {
            let r = c.rets.first().ok_or("process_index without its result")?;
            *(r.data as *mut u32) = c.groups.rank as u32;
            Ok(())
        })
    }
}

/// The operand, once the others are computed (an ordering edge). XLA gives the result the
/// operand's buffer (aliased), so there is nothing to do unless copy insertion gave it its own.
unsafe extern "C" fn ordered(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA calls this handler with its call frame; past the probe, its lists are live
    // for the call, and the operand and the result do not overlap unless they are one buffer.
    unsafe {
        if ffi::answer_probe(frame) {
            return std::ptr::null_mut();
        }
        let (args, rets) = (ffi::args(frame), ffi::rets(frame));
        let (Some(a), Some(r)) = (args.first(), rets.first()) else {
            return ffi::error(frame, "an ordering edge without its operand or result");
        };
        let el = match element(a.dtype) {
            Ok(el) => el,
            Err(m) => return ffi::error(frame, &m),
        };
        if a.data != r.data {
            std::ptr::copy_nonoverlapping(a.data, r.data, a.elements() * el.size());
        }
        std::ptr::null_mut()
    }
}

unsafe extern "C" fn all_reduce(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA calls this handler with its call frame.
    unsafe {
        handle(frame, |c| {
            let (a, r) = c.value()?;
            let el = element(a.dtype)?;
            let out = bytes(r, el);
            if c.leader && c.local != 0 {
                // a sum's identity: the process's first device brings the processes' sum
                out.fill(0);
                return Ok(());
            }
            if a.data != out.as_mut_ptr() {
                std::ptr::copy_nonoverlapping(a.data, out.as_mut_ptr(), out.len());
            }
            if skipping() {
                return Ok(());
            }
            let result = c.group()?.all_reduce(out, el, c.op, c.tag);
            match result {
                Ok(()) => Ok(()),
                Err(e) if c.leader => leader_failed(&c.failed(e)),
                Err(e) => Err(c.failed(e)),
            }
        })
    }
}

unsafe extern "C" fn all_gather(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA calls this handler with its call frame.
    unsafe {
        handle(frame, |c| {
            let (a, r) = c.value()?;
            let el = element(a.dtype)?;
            let (input, out) = (bytes(a, el), bytes(r, el));
            let group = c.group()?;
            let (outer, inner) = outer_inner(&a.dims, c.dim, el);
            if outer <= 1 && !skipping() {
                return group.all_gather(input, out, c.tag).map_err(|e| c.failed(e));
            }
            // gathered whole per process, then each process's slices put in place
            let p = group.size();
            let mut all = vec![0u8; input.len() * p];
            if skipping() {
                for block in all.chunks_exact_mut(input.len()) {
                    block.copy_from_slice(input);
                }
            } else {
                group
                    .all_gather(input, &mut all, c.tag)
                    .map_err(|e| c.failed(e))?;
            }
            for (k, from) in all.chunks_exact(input.len()).enumerate() {
                for o in 0..outer {
                    let to = (o * p + k) * inner;
                    out[to..to + inner].copy_from_slice(&from[o * inner..(o + 1) * inner]);
                }
            }
            Ok(())
        })
    }
}

unsafe extern "C" fn reduce_scatter(frame: *mut CallFrame) -> *mut FfiError {
    // SAFETY: XLA calls this handler with its call frame.
    unsafe {
        handle(frame, |c| {
            let (a, r) = c.value()?;
            let el = element(a.dtype)?;
            let (input, out) = (bytes(a, el), bytes(r, el));
            let group = c.group()?;
            let p = group.size();
            let (outer, inner) = outer_inner(&a.dims, c.dim, el);
            let block = inner / p;
            let mut scratch;
            let ordered: &[u8] = if outer <= 1 {
                input
            } else {
                // process k's block of every outer slice, together: [k][outer][block]
                scratch = vec![0u8; input.len()];
                for o in 0..outer {
                    for k in 0..p {
                        let from = o * inner + k * block;
                        let to = (k * outer + o) * block;
                        scratch[to..to + block].copy_from_slice(&input[from..from + block]);
                    }
                }
                &scratch
            };
            if skipping() {
                let own = &ordered[group.rank() * out.len()..(group.rank() + 1) * out.len()];
                out.copy_from_slice(own);
                return Ok(());
            }
            group
                .reduce_scatter(ordered, out, el, c.op, c.tag)
                .map_err(|e| c.failed(e))
        })
    }
}
