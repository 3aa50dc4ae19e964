//! Turning the pending tensors of a `mark_step` into one step graph: a post-order walk that
//! numbers nodes by position, turns device data into parameters (in order of first use), and
//! writes the graph's exact identity as a list of integers. Equal lists mean equal graphs, so
//! the executable found under that list in memory is the right one; no hashing is involved.

use std::sync::Arc;

use neuron_pc_compiler::ir::{CallExpander, Graph, NodeId, Op};
use neuron_pc_compiler::sharding::Sharding;

use super::trace::{Cell, DeviceData, Interner, Node, Value};
use crate::error::Result;

const PARAM_MARK: u32 = u32::MAX;
const OUTPUTS_MARK: u32 = u32::MAX - 1;
const ALIAS_MARK: u32 = u32::MAX - 2;

/// One entry of the walk, in graph order.
enum Entry {
    Param {
        ty_id: u32,
        index: usize,
    },
    /// Its operands' entry positions are `identity[at..at + count]`.
    Op {
        op_id: u32,
        at: u32,
        count: u32,
    },
}

/// The result of walking from a set of root nodes.
pub(crate) struct Traced {
    /// The graph's exact identity (see the module doc).
    pub identity: Vec<u32>,
    entries: Vec<Entry>,
    /// Device data read by the graph, by parameter index.
    pub params: Vec<Arc<DeviceData>>,
    /// How many operand slots of the walked nodes hold each parameter's data.
    pub data_refs: Vec<usize>,
    /// Graph outputs as references: entry index.
    outputs: Vec<u32>,
    pub op_count: usize,
    /// The deepest the walk's stack went.
    depth: usize,
}

/// The lengths of a walk's lists, to allocate the next walk's at once.
#[derive(Clone, Copy, Default)]
pub(crate) struct WalkSizes {
    identity: usize,
    entries: usize,
    params: usize,
    depth: usize,
}

/// Walks the DAG below `roots` (each must be an op node) in post-order. `walk` is this walk's
/// number, distinct from every earlier walk's on this device, and no other walk may run until
/// this one returns: nodes and device data are numbered by marking them (`WalkMark`), with no
/// map from addresses to positions.
///
/// `sizes` are the last walk's (see [`Traced::sizes`]): a training loop cuts the same graph
/// every step, so the walk's lists are allocated once at their final size.
pub(crate) fn trace(roots: &[Arc<Node>], walk: u64, sizes: WalkSizes) -> Traced {
    let mut t = Traced {
        identity: Vec::with_capacity(sizes.identity),
        entries: Vec::with_capacity(sizes.entries),
        params: Vec::with_capacity(sizes.params),
        data_refs: Vec::with_capacity(sizes.params),
        outputs: Vec::with_capacity(roots.len()),
        op_count: 0,
        depth: 0,
    };
    // The roots keep every node below them alive, so the walk borrows instead of counting.
    let mut stack: Vec<(&Node, usize)> = Vec::with_capacity(sizes.depth);

    for root in roots {
        if root.mark.get(walk).is_none() {
            stack.push((root, 0));
        }
        while let Some(&mut (node, ref mut i)) = stack.last_mut() {
            if let Some(v) = node.operands.get(*i) {
                *i += 1;
                match v {
                    Value::Node(c) => {
                        if c.mark.get(walk).is_none() {
                            stack.push((c, 0));
                        }
                    }
                    Value::Data(d) => {
                        if d.mark.get(walk).is_none() {
                            d.mark.set(walk, t.entries.len() as u32);
                            t.identity.extend([PARAM_MARK, d.ty_id, d.sharding_id]);
                            t.entries.push(Entry::Param {
                                ty_id: d.ty_id,
                                index: t.params.len(),
                            });
                            t.params.push(d.clone());
                            t.data_refs.push(0);
                        }
                    }
                }
                continue;
            }
            t.depth = t.depth.max(stack.len());
            stack.pop();
            if node.mark.get(walk).is_some() {
                continue; // reached twice through a diamond before being finished
            }
            t.identity.push(node.op_id);
            t.identity.push(node.operands.len() as u32);
            let at = t.identity.len() as u32;
            for v in &node.operands {
                let pos = match v {
                    Value::Node(c) => c.mark.get(walk).expect("operands come first in post-order"),
                    Value::Data(d) => {
                        let pos = d.mark.get(walk).expect("data operands were registered");
                        if let Entry::Param { index, .. } = &t.entries[pos as usize] {
                            t.data_refs[*index] += 1;
                        }
                        pos
                    }
                };
                t.identity.push(pos);
            }
            node.mark.set(walk, t.entries.len() as u32);
            t.entries.push(Entry::Op {
                op_id: node.op_id,
                at,
                count: node.operands.len() as u32,
            });
            t.op_count += 1;
        }
    }
    t.identity.push(OUTPUTS_MARK);
    for root in roots {
        let pos = root.mark.get(walk).expect("every root was walked");
        t.outputs.push(pos);
        t.identity.push(pos);
    }
    t
}

impl Traced {
    /// This walk's list lengths (the identity with room for donation pairs).
    pub fn sizes(&self) -> WalkSizes {
        WalkSizes {
            identity: self.identity.len() + 2 * self.params.len() + 1,
            entries: self.entries.len(),
            params: self.params.len(),
            depth: self.depth,
        }
    }

    /// `(parameter, output)` pairs where output `j`'s tensor held parameter `i`'s data before an
    /// in-place update (same type): candidates for donation. Added to the identity, since they
    /// change the program.
    pub fn donations(&mut self, cells: &[Arc<Cell>]) -> Vec<(usize, usize)> {
        let mut aliases = Vec::new();
        for (j, cell) in cells.iter().enumerate() {
            let Some(d) = super::lock(&cell.donor).as_ref().and_then(|w| w.upgrade()) else {
                continue;
            };
            let Some(i) = self.params.iter().position(|p| Arc::ptr_eq(p, &d)) else {
                continue;
            };
            // An output that is a parameter passed through has nothing to update in place.
            if matches!(self.entries[self.outputs[j] as usize], Entry::Param { .. }) {
                continue;
            }
            if *cell.ty == d.ty() && !aliases.iter().any(|&(p, _)| p == i) {
                aliases.push((i, j));
            }
        }
        if !aliases.is_empty() {
            self.identity.push(ALIAS_MARK);
            for &(i, j) in &aliases {
                self.identity.extend([i as u32, j as u32]);
            }
        }
        aliases
    }

    /// The name of each parameter's tensor (see `Tensor::set_name`), `""` when it has none.
    pub fn param_names(&self) -> Vec<String> {
        self.params
            .iter()
            .map(|d| {
                super::lock(&d.name)
                    .as_deref()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    }

    /// When output `j` is a sharding constraint (`Tensor::with_sharding_constraint`), its
    /// sharding.
    pub fn output_constraint(&self, interner: &Interner, j: usize) -> Option<Arc<Sharding>> {
        let Entry::Op { op_id, .. } = &self.entries[self.outputs[j] as usize] else {
            return None;
        };
        match interner.op_of(*op_id) {
            (Op::ShardingConstraint { sharding }, ty) => {
                interner.sharding_by_hlo(sharding, &ty.dims)
            }
            _ => None,
        }
    }

    /// The number of outputs.
    pub fn output_count(&self) -> usize {
        self.outputs.len()
    }

    /// Builds the compiler's graph for this walk (only needed when no executable is known).
    pub fn to_graph(&self, interner: &Interner) -> Result<Graph> {
        let mut g = Graph::new();
        // calls written out: the passes and the compiler see the ops they stand for
        let mut calls = CallExpander::default();
        let mut ids: Vec<NodeId> = Vec::with_capacity(self.entries.len());
        for e in &self.entries {
            let id = match e {
                Entry::Param { ty_id, .. } => g.parameter(interner.type_of(*ty_id).clone()),
                Entry::Op { op_id, at, count } => {
                    let (op, _) = interner.op_of(*op_id);
                    if let Op::Parameter { .. } = op {
                        return Err(crate::Error::Config(
                            "a tensor computed inside a loop body (nn::scan, ScannedLayers) is \
                             used outside it: return it from the body (as a carry or a stacked \
                             output) instead"
                                .into(),
                        ));
                    }
                    let operands = &self.identity[*at as usize..(at + count) as usize];
                    let args: Vec<NodeId> = operands.iter().map(|&p| ids[p as usize]).collect();
                    calls.push(&mut g, op, &args)?
                }
            };
            ids.push(id);
        }
        let outs: Vec<NodeId> = self.outputs.iter().map(|&p| ids[p as usize]).collect();
        g.set_outputs(&outs)?;
        Ok(g)
    }
}
