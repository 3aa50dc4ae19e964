//! Replayed steps (step functions, made by `LazyDevice::step_fn`): a training step
//! traced on its first calls and then run again without tracing, the way `jax.jit` runs a
//! traced function again without Python.
//!
//! A call that traces runs the step's closure and cuts its graph as `mark_step` does, and
//! notes where each input of the graph came from. Two traced calls in a row that cut the same
//! graph decide the plan, by comparing where their inputs came from:
//! - an argument of the call: the next call's argument;
//! - a value the previous call computed: the tensor that received it, which the next replay
//!   reads (parameters and optimizer state updated in place, or moved to a new tensor that the
//!   closure kept);
//! - the same value both times (a frozen weight, a table): kept as a constant;
//! - anything else (a value uploaded anew inside the closure, such as a learning rate made
//!   from a host number on every call) cannot be replayed: the step traces on every call and
//!   says why once.
//!
//! A replay reads those inputs, launches the executable, writes each output to the tensor the
//! traced call wrote it to (the closure's results become new tensors) and does nothing else:
//! no closure, no recording, no walk. Any write to a tensor between calls that the step did not
//! make (`Tensor::assign`, a checkpoint load, another step function's replay) makes the next
//! call trace again, and so does an input that is pending or of another type.

use std::panic::Location;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Instant;

use super::executables::{How, StepExecutable};
use super::trace::{Cell, DeviceData, Value};
use super::{debug, diagnose, lock, DeviceInner};
use crate::error::Result;

/// What one step cut ran, as a step function needs it.
pub(crate) struct Captured {
    pub identity: Vec<u32>,
    pub exe: Arc<StepExecutable>,
    /// The graph's inputs, by parameter index.
    pub params: Vec<Arc<DeviceData>>,
    /// The tensors that received the outputs, by output index.
    pub outputs: Vec<Arc<Cell>>,
    /// What they received (weakly: the allocation stays, so no later value takes its address).
    pub out_data: Vec<Weak<DeviceData>>,
    pub aliases: Vec<(usize, usize)>,
    pub per_replica: Vec<bool>,
}

/// A traced call, as the next traced call compares with it.
struct Previous {
    identity: Vec<u32>,
    params: Vec<Weak<DeviceData>>,
    out_data: Vec<Weak<DeviceData>>,
}

/// Where a replay finds one input of the graph.
enum Source {
    /// The call's argument.
    Arg(usize),
    /// The value the last call wrote to output `j`'s destination.
    Output(usize),
    /// The same value on every call.
    Const(Arc<DeviceData>),
}

/// Where a replay puts one output of the graph.
enum Dest {
    /// A tensor the closure kept (a parameter, optimizer state).
    Kept(Weak<Cell>),
    /// The call's argument, updated in place.
    Arg(usize),
    /// A result of the closure: a new tensor on every call.
    Returned,
}

/// A step decided by two traced calls (see the module doc).
struct Plan {
    exe: Arc<StepExecutable>,
    sources: Vec<Source>,
    /// Each input's type id, sharding id and whether its replicas differ, as traced.
    inputs: Vec<(u32, u32, bool)>,
    dests: Vec<Dest>,
    /// The closure's results: which output each is.
    results: Vec<usize>,
    out_types: Vec<Arc<neuron_pc_compiler::ir::TensorType>>,
    /// Inputs the program updates in place that a replay may donate (not the constants).
    donatable: Vec<bool>,
    per_replica: Vec<bool>,
    args: usize,
    /// The device's write count after this plan's last call.
    writes: u64,
}

/// The replay state of one step function (the public `StepFn` wraps it):
/// the last traced call, the plan once two traced calls agree, and why there is none.
#[derive(Default)]
pub(crate) struct Replayer {
    previous: Option<Previous>,
    plan: Option<Plan>,
    /// Why the step is not replayed, once a traced pair could not make a plan.
    refused: Option<String>,
}

impl Replayer {
    /// True when the next call with arguments like the last ones will be replayed.
    pub fn is_replaying(&self, dev: &DeviceInner) -> bool {
        self.plan.as_ref().is_some_and(|p| p.writes == dev.writes())
    }

    /// Why the step traces on every call, when two traced calls could not make a plan.
    pub fn why_traced(&self) -> Option<&str> {
        self.refused.as_deref()
    }

    /// A traced call: `f` (the closure, which records the step and returns its results), then
    /// the step cut, noting where the graph's inputs came from.
    pub fn trace(
        &mut self,
        dev: &Arc<DeviceInner>,
        args: &[Arc<Cell>],
        site: &'static Location<'static>,
        f: impl FnOnce() -> Result<Vec<Arc<Cell>>>,
    ) -> Result<Vec<Arc<Cell>>> {
        self.plan = None;
        // The arguments' values before the closure (it may update them in place).
        let arg_data: Vec<Option<Weak<DeviceData>>> = args
            .iter()
            .map(|a| match &*lock(&a.value) {
                Value::Data(d) => Some(Arc::downgrade(d)),
                Value::Node(_) => None,
            })
            .collect();
        let steps_before = lock(&dev.metrics).steps;
        let results = f()?;
        let cut_inside = lock(&dev.metrics).steps != steps_before;
        let mut captured = None;
        dev.cut_step(site, Some(&mut captured))?;
        let refusal = if cut_inside {
            Some("the closure called mark_step (a step function cuts its own step)".to_string())
        } else if dev.config.check_indices {
            Some("index checks are on: each step's check is read on the host".to_string())
        } else {
            match (&self.previous, &captured) {
                // the trial run: every call traces, so the trial run records each step
                (_, Some(now)) if now.exe.loaded.is_none() => None,
                (Some(prev), Some(now)) if prev.identity == now.identity => {
                    match plan(prev, now, args, &arg_data, &results) {
                        Ok(mut p) => {
                            p.writes = dev.writes();
                            self.plan = Some(p);
                            self.refused = None;
                            None
                        }
                        Err(why) => Some(why),
                    }
                }
                _ => None,
            }
        };
        if let Some(why) = refusal {
            if self.refused.as_deref() != Some(&why) {
                tracing::warn!("the step function at {site} is not replayed: {why}");
            }
            self.refused = Some(why);
        }
        let Some(now) = captured else {
            self.previous = None;
            return Ok(results);
        };
        self.previous = Some(Previous {
            identity: now.identity,
            params: now.params.iter().map(Arc::downgrade).collect(),
            out_data: now.out_data,
        });
        Ok(results)
    }

    /// A replayed call over `args`, returning the closure's results as new tensors' cells, or
    /// `None` where the plan does not apply (the call then traces).
    pub fn replay(
        &mut self,
        dev: &Arc<DeviceInner>,
        args: &[Arc<Cell>],
        site: &'static Location<'static>,
    ) -> Result<Option<Vec<Arc<Cell>>>> {
        let Some(plan) = &mut self.plan else {
            return Ok(None);
        };
        if plan.writes != dev.writes() || plan.args != args.len() {
            return Ok(None);
        }
        let started = Instant::now();
        // launched in place, after the launches handed over (which hold their inputs: the
        // donation count below must not see them)
        dev.launcher.flush()?;
        dev.poll_index_checks(false)?;
        dev.free_retired();
        let data_of = |cell: &Cell| match &*lock(&cell.value) {
            Value::Data(d) => Some(d.clone()),
            Value::Node(_) => None,
        };
        let mut kept = Vec::with_capacity(plan.dests.len());
        for dest in &plan.dests {
            kept.push(match dest {
                Dest::Kept(w) => match w.upgrade() {
                    Some(cell) => Some(cell),
                    None => return Ok(None),
                },
                Dest::Arg(k) => Some(args[*k].clone()),
                Dest::Returned => None,
            });
        }
        let mut params = Vec::with_capacity(plan.sources.len());
        for (source, &(ty_id, sharding_id, per_replica)) in plan.sources.iter().zip(&plan.inputs) {
            let d = match source {
                Source::Arg(k) => data_of(&args[*k]),
                Source::Output(j) => kept[*j].as_deref().and_then(data_of),
                Source::Const(d) => Some(d.clone()),
            };
            match d {
                Some(d)
                    if d.ty_id == ty_id
                        && d.sharding_id == sharding_id
                        && d.per_replica == per_replica =>
                {
                    params.push(d)
                }
                _ => return Ok(None),
            }
        }
        let gathered = Instant::now();
        lock(&dev.metrics).host_lookup_ms += super::ms(gathered - started);
        // An aliased input is donated when only its tensor and this list hold it.
        let keep: Vec<usize> = dev.launcher.counting(|| {
            (0..params.len())
                .filter(|&i| !plan.donatable[i] || DeviceData::holders(&params[i]) != 2)
                .collect()
        });
        lock(&dev.metrics).steps += 1;
        // A donated input's step may still run: the runtime orders the two (as a launch after
        // a launch of `jax.jit` does), so the host does not wait.
        let outputs = dev.launch(
            &plan.exe,
            (params, keep),
            &plan.per_replica,
            site,
            gathered,
            true,
        )?;
        let ran = Instant::now();
        let mut returned = Vec::with_capacity(outputs.len());
        let mut replaced = Vec::with_capacity(outputs.len());
        for ((data, cell), ty) in outputs.into_iter().zip(&kept).zip(&plan.out_types) {
            match cell {
                Some(cell) => {
                    replaced.push(DeviceInner::store_output(cell, data));
                    returned.push(None);
                }
                None => returned.push(Some(dev.new_cell(ty.clone(), Value::Data(data)))),
            }
        }
        let results = plan
            .results
            .iter()
            .map(|&j| returned[j].clone().expect("results are returned outputs"))
            .collect();
        dev.note_write();
        plan.writes = dev.writes();
        {
            let mut m = lock(&dev.metrics);
            m.memory_hits += 1;
            m.replayed_steps += 1;
            m.host_finish_ms += super::ms(ran.elapsed());
        }
        // a traced step after this one records from here
        *lock(&dev.last_step_end) = Instant::now();
        diagnose::step_done(dev, site);
        debug::log_step(
            dev,
            &debug::StepCut {
                site,
                explicit: true,
                key: plan.exe.key.hex(),
                ops: 0,
                how: How::Replayed,
                elapsed: started.elapsed(),
            },
        );
        dev.phase("replay", started, None);
        // the next traced call compares with a traced call right before it
        self.previous = None;
        lock(&dev.retired).values.append(&mut replaced);
        *lock(&dev.last_step_end) = Instant::now();
        super::metrics::take_not_tracing();
        Ok(Some(results))
    }
}

/// The plan from two traced calls that cut the same graph, `prev` then `now` (see the module
/// doc), or why there is none.
fn plan(
    prev: &Previous,
    now: &Captured,
    args: &[Arc<Cell>],
    arg_data: &[Option<Weak<DeviceData>>],
    results: &[Arc<Cell>],
) -> std::result::Result<Plan, String> {
    if let Some(k) = arg_data.iter().position(Option::is_none) {
        return Err(format!(
            "argument {k} was pending when the step was called, so computing it became part of \
             the step; call mark_step before the step function"
        ));
    }
    let mut dests = Vec::with_capacity(now.outputs.len());
    for cell in &now.outputs {
        dests.push(if results.iter().any(|r| Arc::ptr_eq(r, cell)) {
            Dest::Returned
        } else if let Some(k) = args.iter().position(|a| Arc::ptr_eq(a, cell)) {
            Dest::Arg(k)
        } else {
            Dest::Kept(Arc::downgrade(cell))
        });
    }
    let mut result_outputs = Vec::with_capacity(results.len());
    for (r, t) in results.iter().enumerate() {
        let Some(j) = now.outputs.iter().position(|c| Arc::ptr_eq(c, t)) else {
            return Err(format!(
                "result {r} is not computed by the step (an argument or a value made before \
                 it)"
            ));
        };
        // Its holders: the results, the captured outputs and the step's retired outputs.
        let copies = results.iter().filter(|u| Arc::ptr_eq(u, t)).count();
        if Arc::strong_count(t) > copies + 2 {
            return Err(format!(
                "result {r} is also kept by the closure's state, which a replay (returning a \
                 new tensor) would leave behind"
            ));
        }
        result_outputs.push(j);
    }
    let mut sources = Vec::with_capacity(now.params.len());
    for (i, d) in now.params.iter().enumerate() {
        let is = |w: &Weak<DeviceData>| std::ptr::eq(w.as_ptr(), Arc::as_ptr(d));
        let source = if let Some(k) = arg_data.iter().position(|a| a.as_ref().is_some_and(is)) {
            Source::Arg(k)
        } else if let Some(j) = prev.out_data.iter().position(is) {
            if matches!(dests[j], Dest::Returned) {
                return Err(format!(
                    "input {} reads result {j} of the previous call; pass it as an argument",
                    describe(d, i)
                ));
            }
            Source::Output(j)
        } else if prev.params.get(i).is_some_and(is) {
            Source::Const(d.clone())
        } else {
            return Err(format!(
                "input {} is a new value on every call, neither an argument nor a value the \
                 step updates (a tensor made inside the closure from host data?); pass it as \
                 an argument",
                describe(d, i)
            ));
        };
        sources.push(source);
    }
    Ok(Plan {
        exe: now.exe.clone(),
        inputs: now
            .params
            .iter()
            .map(|d| (d.ty_id, d.sharding_id, d.per_replica))
            .collect(),
        dests,
        results: result_outputs,
        out_types: now.outputs.iter().map(|c| c.ty.clone()).collect(),
        donatable: (0..sources.len())
            .map(|i| {
                now.aliases.iter().any(|&(p, _)| p == i) && !matches!(sources[i], Source::Const(_))
            })
            .collect(),
        sources,
        per_replica: now.per_replica.clone(),
        args: args.len(),
        writes: 0,
    })
}

/// An input as messages name it: its tensor's name, else its position.
fn describe(d: &DeviceData, i: usize) -> String {
    match lock(&d.name).as_deref() {
        Some(name) => format!("{i} ({name})"),
        None => i.to_string(),
    }
}

impl DeviceInner {
    /// How many writes outside step computations happened (see [`DeviceInner::note_write`]).
    pub(crate) fn writes(&self) -> u64 {
        self.writes.load(Ordering::Acquire)
    }

    /// Counts a change of a tensor's value that is not a step computing a pending one.
    pub(crate) fn note_write(&self) {
        self.writes.fetch_add(1, Ordering::AcqRel);
    }
}
