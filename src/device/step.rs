//! Turning the pending tensors of a `mark_step` into one step graph: a post-order walk that
//! numbers nodes by position, turns device data into parameters (in order of first use), and
//! writes the graph's exact identity as a list of integers. Equal lists mean equal graphs, so
//! the executable found under that list in memory is the right one; no hashing is involved.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use neuron_pc_compiler::ir::{Graph, NodeId};

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
    Op {
        node: Arc<Node>,
        operands: smallvec::SmallVec<[u32; 2]>,
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
}

#[derive(Default)]
struct PtrMap<T>(HashMap<usize, T>);

impl<T: Copy> PtrMap<T> {
    fn get<P>(&self, p: &Arc<P>) -> Option<T> {
        self.0.get(&(Arc::as_ptr(p) as *const u8 as usize)).copied()
    }
    fn insert<P>(&mut self, p: &Arc<P>, v: T) {
        self.0.insert(Arc::as_ptr(p) as *const u8 as usize, v);
    }
}

/// Walks the DAG below `roots` (each must be an op node) in post-order.
pub(crate) fn trace(roots: &[Arc<Node>]) -> Traced {
    let mut t = Traced {
        identity: Vec::new(),
        entries: Vec::new(),
        params: Vec::new(),
        data_refs: Vec::new(),
        outputs: Vec::new(),
        op_count: 0,
    };
    let mut node_pos: PtrMap<u32> = PtrMap::default();
    let mut data_pos: PtrMap<u32> = PtrMap::default();
    let mut stack: Vec<(Arc<Node>, usize)> = Vec::new();

    for root in roots {
        if node_pos.get(root).is_none() {
            stack.push((root.clone(), 0));
        }
        while let Some((node, i)) = stack.last_mut() {
            if *i < node.operands.len() {
                let v = node.operands[*i].clone();
                *i += 1;
                match v {
                    Value::Node(c) => {
                        if node_pos.get(&c).is_none() {
                            stack.push((c, 0));
                        }
                    }
                    Value::Data(d) => {
                        if data_pos.get(&d).is_none() {
                            data_pos.insert(&d, t.entries.len() as u32);
                            t.identity.extend([PARAM_MARK, d.ty_id]);
                            t.entries.push(Entry::Param {
                                ty_id: d.ty_id,
                                index: t.params.len(),
                            });
                            t.params.push(d);
                            t.data_refs.push(0);
                        }
                    }
                }
                continue;
            }
            let (node, _) = stack.pop().expect("stack is not empty");
            if node_pos.get(&node).is_some() {
                continue; // reached twice through a diamond before being finished
            }
            let operands: smallvec::SmallVec<[u32; 2]> = node
                .operands
                .iter()
                .map(|v| match v {
                    Value::Node(c) => node_pos.get(c).expect("operands come first in post-order"),
                    Value::Data(d) => {
                        let pos = data_pos.get(d).expect("data operands were registered");
                        if let Entry::Param { index, .. } = &t.entries[pos as usize] {
                            t.data_refs[*index] += 1;
                        }
                        pos
                    }
                })
                .collect();
            t.identity.push(node.op_id);
            t.identity.push(operands.len() as u32);
            t.identity.extend(&operands);
            node_pos.insert(&node, t.entries.len() as u32);
            t.entries.push(Entry::Op { node, operands });
            t.op_count += 1;
        }
    }
    t.identity.push(OUTPUTS_MARK);
    for root in roots {
        let pos = node_pos.get(root).expect("every root was walked");
        t.outputs.push(pos);
        t.identity.push(pos);
    }
    t
}

impl Traced {
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

    /// Builds the compiler's graph for this walk (only needed when no executable is known).
    pub fn to_graph(&self, interner: &Interner) -> Result<Graph> {
        let mut g = Graph::new();
        let mut ids: Vec<NodeId> = Vec::with_capacity(self.entries.len());
        for e in &self.entries {
            let id = match e {
                Entry::Param { ty_id, .. } => g.parameter(interner.type_of(*ty_id).clone()),
                Entry::Op { node, operands } => {
                    let (op, _) = interner.op_of(node.op_id);
                    let args: Vec<NodeId> = operands.iter().map(|&p| ids[p as usize]).collect();
                    g.push(op.clone(), &args)?
                }
            };
            ids.push(id);
        }
        let outs: Vec<NodeId> = self.outputs.iter().map(|&p| ids[p as usize]).collect();
        g.set_outputs(&outs)?;
        Ok(g)
    }
}
