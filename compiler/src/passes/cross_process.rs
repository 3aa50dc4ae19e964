//! The rewrite that runs a program of several processes on a runtime whose collectives stay
//! inside one process (XLA's cpu client): each process compiles the program over its own
//! `local` replicas, and every collective whose groups reach other processes becomes XLA's
//! collective over the local part of each group plus a [`Op::ProcessCollective`] between the
//! processes (a custom call into the collective library).
//!
//! Global replica `r` is local replica `r % local` of process `r / local`. A collective's
//! groups must either each lie in one process, the same local groups in every process (they
//! stay XLA's, renumbered locally), or each span every process with the same local replicas in
//! each: group `{p * local + s | p in processes, s in S}` for local sets `S` that partition the
//! local replicas. The second kind is hierarchical:
//!
//! - all-reduce: XLA's over `S`, then between processes (each local replica with its peers);
//!   a sum over one local group of every replica instead runs between processes on the first
//!   replica only, the others giving zeros, and XLA's all-reduce over `S` again spreads it;
//! - all-gather: XLA's over `S`, then between processes (blocks in process order: the global
//!   group's order, since global ids are process-major);
//! - reduce-scatter: between processes first (process `p` keeps block `p`), then XLA's over
//!   `S` inside that block, so replica `(p, s)` keeps block `p * |S| + s`.
//!
//! In a partitioned program (a mesh in each process) each process is one replica of the run:
//! a collective over the processes runs on each device's block of its operand, with the same
//! device of the other processes, inside a manual region of the operand's layout.
//!
//! There the all-reduces between processes whose operands need no such call themselves (the
//! gradients' means) are joined into buckets ([`Op::ProcessBucket`]): one exchange for many
//! values, as DDP's buckets are, instead of one per value and device.
//!
//! `ReplicaId` becomes `ProcessIndex * local + ReplicaId`. The program text is the same in
//! every process (the process index is read at run time), so all share one cache entry.
//! Every collective's operand, between processes or inside one, waits for the previous one's
//! result (`After`): XLA runs them in one order on every device of every process. A collective
//! library needs that order; and XLA's cpu runtime runs independent operations concurrently
//! on a pool of as many threads as cores, so without it a device could block a thread in a call
//! between processes while another device of its process blocks the other thread in XLA's
//! collective waiting for the first device (a ZeRO-1 step of 2 processes of 2 replicas hung so
//! on 2 cores: its reduce-scatter between processes and the loss's all-reduce inside the
//! process ran in different orders on the two devices).

use std::collections::HashMap;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ir::ReplicaRule;
use crate::ir::{BinaryOp, Graph, Literal, Node, NodeId, Op, ProcessCollective, ReduceOp};

use super::rewrite::{rebuild, Builder, NodeRewrite};

/// How the replicas of a run lie over its processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ProcessLayout {
    /// Processes in the run.
    pub processes: usize,
    /// Replicas each process drives (1 in a partitioned program).
    pub local: usize,
    /// The program is partitioned over this process's devices (a mesh): each process
    /// collective runs on every device's block, in a manual region of the operand's layout
    /// (the sharding constraint it comes from; else each device's whole copy).
    pub partitioned: bool,
}

/// `graph`, recorded over `layout.processes * layout.local` global replicas, as each process
/// runs it over its `layout.local` replicas (see the module documentation).
pub fn cross_process(graph: &Graph, layout: ProcessLayout) -> Result<Graph> {
    if layout.processes == 0 || layout.local == 0 {
        return Err(unsupported(format!("a layout of {layout:?}")));
    }
    for node in graph.nodes() {
        if let Op::Scan { body, .. } = &node.op {
            if body.graph.nodes().iter().any(rewritten) {
                let what = "a collective or replica index inside a scanned loop body of a \
                            multi-process cpu run";
                return Err(unsupported(what.into()));
            }
        }
    }
    let mut rw = Rewrite {
        graph,
        layout,
        last: None,
        tag: 0,
        buckets: if layout.partitioned {
            buckets(graph, layout)?
        } else {
            HashMap::new()
        },
        built: HashMap::new(),
    };
    rebuild(graph, None, false, &mut rw)
}

/// The most bytes of (whole) operands one bucket joins: DDP's default bucket is 25 MiB; the
/// joined blocks are one temporary buffer on each device.
const BUCKET_BYTES: usize = 32 << 20;

/// One member of a bucket: the all-reduce (its index in the recorded graph), its operand's
/// index, and the operand's layout.
#[derive(Clone)]
struct Member {
    node: usize,
    operand: usize,
    layout: String,
}

/// In a partitioned program, the all-reduces between processes whose operands need no
/// collective between processes (the gradients' means), in runs of one combiner and dtype, by
/// their first member's index: each run becomes one exchange ([`Op::ProcessBucket`]) instead of
/// one per value and device. The step's graph interleaves them with their uses (each
/// parameter's update after its gradient's mean), so the later members' operands are built
/// ahead, when the first member is ([`Rewrite::ensure`]).
fn buckets(graph: &Graph, layout: ProcessLayout) -> Result<HashMap<usize, Vec<Member>>> {
    let mut out: HashMap<usize, Vec<Member>> = HashMap::new();
    let mut run: Vec<Member> = Vec::new();
    let mut key = None;
    let mut bytes = 0;
    let mut close = |run: &mut Vec<Member>| {
        if run.len() > 1 {
            out.insert(run[0].node, std::mem::take(run));
        }
        run.clear();
    };
    // whether a node needs a collective between processes
    let mut crosses = vec![false; graph.len()];
    for (i, node) in graph.nodes().iter().enumerate() {
        let spanning = match node.op.replicas() {
            ReplicaRule::Groups { groups, .. } => {
                matches!(split(groups, layout)?, Split::Spanning(_))
            }
            ReplicaRule::Local | ReplicaRule::FirstOperand | ReplicaRule::Distinct => false,
        };
        let below = node.operands.iter().any(|o| crosses[o.index()]);
        crosses[i] = spanning || below;
        let (Op::AllReduce { op, .. }, true, Some(&x)) =
            (&node.op, spanning, node.operands.first())
        else {
            continue;
        };
        if crosses[x.index()] {
            continue;
        }
        let operand = graph.nodes().get(x.index()).ok_or_else(|| missing(node))?;
        let size = node.ty.dims.iter().product::<usize>() * node.ty.dtype.size_in_bytes();
        let fits = key == Some((*op, node.ty.dtype)) && bytes + size <= BUCKET_BYTES;
        if !fits {
            close(&mut run);
            key = Some((*op, node.ty.dtype));
            bytes = 0;
        }
        let layout = if let Op::ShardingConstraint { sharding } = &operand.op {
            sharding.clone()
        } else {
            "{replicated}".to_string()
        };
        run.push(Member {
            node: i,
            operand: x.index(),
            layout,
        });
        bytes += size;
    }
    close(&mut run);
    Ok(out)
}

/// Whether the rewrite changes `n` (a collective, or the replica index).
fn rewritten(n: &Node) -> bool {
    matches!(
        n.op,
        Op::AllReduce { .. } | Op::AllGather { .. } | Op::ReduceScatter { .. } | Op::ReplicaId
    )
}

fn unsupported(what: String) -> Error {
    Error::InvalidGraph {
        message: format!("{what} is not supported across processes yet"),
    }
}

/// How a collective's groups lie over the processes.
enum Split {
    /// Every group inside one process: the same local groups in each.
    Local(Vec<Vec<usize>>),
    /// Every group over all processes, with these local groups.
    Spanning(Vec<Vec<usize>>),
}

fn split(groups: &[Vec<usize>], layout: ProcessLayout) -> Result<Split> {
    let (p_count, l) = (layout.processes, layout.local);
    let bad = || {
        unsupported(format!(
            "replica groups {groups:?} over {p_count} processes of {l} replicas each (groups \
             must each stay in one process, or each span all processes with the same local \
             replicas)"
        ))
    };
    let process = |r: usize| r / l;
    if groups.iter().flatten().any(|&r| r >= p_count * l) {
        return Err(bad());
    }
    if groups
        .iter()
        .all(|g| g.iter().all(|&r| process(r) == process(g[0])))
    {
        // local groups: those of process 0, renumbered; every process must have the same
        let local = |p: usize| -> Vec<Vec<usize>> {
            let mut v: Vec<Vec<usize>> = groups
                .iter()
                .filter(|g| process(g[0]) == p)
                .map(|g| g.iter().map(|r| r % l).collect())
                .collect();
            v.sort();
            v
        };
        let first = local(0);
        if (1..p_count).any(|p| local(p) != first) {
            return Err(bad());
        }
        return Ok(Split::Local(first));
    }
    let mut locals = Vec::new();
    for g in groups {
        let size = g.len();
        if size % p_count != 0 {
            return Err(bad());
        }
        let per = size / p_count;
        let s: Vec<usize> = g[..per].iter().map(|r| r % l).collect();
        let expected: Vec<usize> = (0..p_count)
            .flat_map(|p| s.iter().map(move |x| p * l + x))
            .collect();
        if *g != expected || s.windows(2).any(|w| w[0] >= w[1]) {
            return Err(bad());
        }
        locals.push(s);
    }
    let mut seen: Vec<usize> = locals.iter().flatten().copied().collect();
    seen.sort_unstable();
    if seen != (0..l).collect::<Vec<_>>() {
        return Err(bad());
    }
    Ok(Split::Spanning(locals))
}

struct Rewrite<'g> {
    /// The recorded graph.
    graph: &'g Graph,
    layout: ProcessLayout,
    /// The previous process collective: the next one's ordering edge.
    last: Option<NodeId>,
    tag: u32,
    /// The buckets, by their first member's index in the recorded graph (see [`buckets`]).
    buckets: HashMap<usize, Vec<Member>>,
    /// What each node of the recorded graph became (some ahead of their turn: a bucket's
    /// later members and their operands).
    built: HashMap<usize, NodeId>,
}

impl Rewrite<'_> {
    /// The call between processes of `value`, after the previous one (see [`Op::After`]).
    fn process_call(
        &mut self,
        b: &mut Builder,
        collective: ProcessCollective,
        value: NodeId,
        leader: bool,
    ) -> Result<NodeId> {
        let manual = self.layout.partitioned.then(|| match &b.node(value) {
            Ok(Node {
                op: Op::ShardingConstraint { sharding },
                ..
            }) => sharding.clone(),
            _ => "{replicated}".to_string(),
        });
        let op = Op::ProcessCollective {
            collective,
            processes: self.layout.processes,
            tag: self.tag,
            manual,
            leader,
        };
        self.tag += 1;
        if self.layout.partitioned {
            // the call sits in a manual region of its operand's layout; the edge is an `After`
            return self.chained(b, op, value);
        }
        // The previous collective's result as a second operand, which the handler only waits
        // for. An `After` is an optimization barrier, and newer XLA cpu pipelines drop those
        // before scheduling: one device of a process then ran its call ahead of an all-reduce
        // inside the process, while the other process kept the program's order (a deadlock).
        let operands = match self.last {
            Some(previous) if previous != value => vec![value, previous],
            _ => vec![value],
        };
        let id = b.push(op, &operands)?;
        self.last = Some(id);
        Ok(id)
    }

    /// `value` waiting for the previous collective's result, if any: by an `After` in a
    /// partitioned program; else, after a call between processes, by an
    /// [`ProcessCollective::Ordered`] call, which no compiler pass removes. XLA runs its own
    /// collectives in one order on every device, so one after another needs no edge.
    fn after_last(&self, b: &mut Builder, value: NodeId) -> Result<NodeId> {
        let after_call = |previous: NodeId, b: &Builder| {
            matches!(
                b.node(previous).map(|n| &n.op),
                Ok(Op::ProcessCollective { .. })
            )
        };
        match self.last {
            Some(previous) if self.layout.partitioned => b.push(Op::After, &[value, previous]),
            Some(previous) if previous != value && after_call(previous, b) => {
                let ordered = Op::ProcessCollective {
                    collective: ProcessCollective::Ordered,
                    processes: self.layout.processes,
                    tag: 0,
                    manual: None,
                    leader: false,
                };
                b.push(ordered, &[value, previous])
            }
            _ => Ok(value),
        }
    }

    /// Collective `op` of `value`, after the previous collective; the next one's predecessor.
    fn chained(&mut self, b: &mut Builder, op: Op, value: NodeId) -> Result<NodeId> {
        let value = self.after_last(b, value)?;
        let id = b.push(op, &[value])?;
        self.last = Some(id);
        Ok(id)
    }

    /// The bucket whose first member is being rewritten: one exchange, after the previous
    /// one, and a node per member; the first member's node.
    fn bucket(&mut self, b: &mut Builder, members: &[Member], op: ReduceOp) -> Result<NodeId> {
        let mut operands = Vec::with_capacity(members.len());
        for m in members {
            operands.push(self.ensure(b, m.operand)?);
        }
        operands[0] = self.after_last(b, operands[0])?;
        let layouts: Vec<String> = members.iter().map(|m| m.layout.clone()).collect();
        let mut first = None;
        for (k, m) in members.iter().enumerate() {
            let node = Op::ProcessBucket {
                op,
                processes: self.layout.processes,
                tag: self.tag,
                layouts: layouts.clone(),
                output: k,
            };
            let id = b.push(node, &operands)?;
            self.built.insert(m.node, id);
            first.get_or_insert(id);
        }
        self.tag += 1;
        let first = first.expect("a bucket has members");
        self.last = Some(first);
        Ok(first)
    }

    /// What node `i` of the recorded graph becomes, built now (with what it needs) if it is
    /// not yet: the rewrite of each, as its turn would have made it. Parameters are the new
    /// graph's first nodes, in order.
    fn ensure(&mut self, b: &mut Builder, i: usize) -> Result<NodeId> {
        let graph = self.graph;
        let mut stack = vec![(i, false)];
        while let Some((n, ready)) = stack.pop() {
            if self.built.contains_key(&n) {
                continue;
            }
            let node = graph.nodes().get(n).ok_or_else(|| Error::InvalidGraph {
                message: format!("node {n} is not in the graph"),
            })?;
            if let Op::Parameter { .. } = node.op {
                let at = graph.parameters().iter().position(|p| p.index() == n);
                let at = at.ok_or_else(|| missing(node))?;
                self.built.insert(n, NodeId(at));
                continue;
            }
            if !ready {
                stack.push((n, true));
                stack.extend(node.operands.iter().map(|o| (o.index(), false)));
                continue;
            }
            let operands: Vec<NodeId> = node
                .operands
                .iter()
                .map(|o| self.built[&o.index()])
                .collect();
            self.rewrite(b, NodeId(n), node, &operands)?;
        }
        Ok(self.built[&i])
    }

    /// XLA's collective `make(groups)` over the local groups, unless they are all single.
    fn local(
        &mut self,
        b: &mut Builder,
        groups: Vec<Vec<usize>>,
        value: NodeId,
        make: impl FnOnce(Vec<Vec<usize>>) -> Op,
    ) -> Result<NodeId> {
        if groups.iter().all(|g| g.len() == 1) {
            return Ok(value);
        }
        self.chained(b, make(groups), value)
    }
}

impl NodeRewrite for Rewrite<'_> {
    fn rewrite(
        &mut self,
        b: &mut Builder,
        old: NodeId,
        node: &Node,
        operands: &[NodeId],
    ) -> Result<NodeId> {
        if let Some(&id) = self.built.get(&old.index()) {
            return Ok(id);
        }
        let bucket = self.buckets.remove(&old.index());
        let id = match (&node.op, bucket) {
            (Op::AllReduce { op, .. }, Some(members)) => self.bucket(b, &members, *op)?,
            (_, _) => self.rewrite_node(b, node, operands)?,
        };
        self.built.insert(old.index(), id);
        Ok(id)
    }
}

impl Rewrite<'_> {
    // Every op but the three collectives is local to a process, which `Op::replicas` decides
    // for each; a collective over replica groups without a rule here is refused, not copied.
    #[allow(clippy::wildcard_enum_match_arm)]
    fn rewrite_node(
        &mut self,
        b: &mut Builder,
        node: &Node,
        operands: &[NodeId],
    ) -> Result<NodeId> {
        let x = operands.first().copied();
        match &node.op {
            Op::ReplicaId => {
                let local = b.push(Op::ReplicaId, &[])?;
                if self.layout.processes == 1 {
                    return Ok(local);
                }
                let process = b.push(Op::ProcessIndex, &[])?;
                let l = b.push(
                    Op::Constant(Literal::splat(DType::U32, self.layout.local as f64, &[])),
                    &[],
                )?;
                let offset = b.push(Op::Binary(BinaryOp::Mul), &[process, l])?;
                b.push(Op::Binary(BinaryOp::Add), &[offset, local])
            }
            Op::AllReduce { op, replica_groups } => {
                let x = x.ok_or_else(|| missing(node))?;
                let op = *op;
                match split(replica_groups, self.layout)? {
                    Split::Local(g) => {
                        let all = Op::AllReduce {
                            op,
                            replica_groups: g,
                        };
                        self.chained(b, all, x)
                    }
                    // one local group of several replicas and a sum: the first replica alone
                    // sums with the other processes, an all-reduce inside the process spreads it
                    Split::Spanning(g) if g.len() == 1 && g[0].len() > 1 && op == ReduceOp::Sum => {
                        let all = Op::AllReduce {
                            op,
                            replica_groups: g,
                        };
                        let inner = self.chained(b, all.clone(), x)?;
                        let sum = ProcessCollective::AllReduce(op);
                        let led = self.process_call(b, sum, inner, true)?;
                        self.chained(b, all, led)
                    }
                    Split::Spanning(g) => {
                        let inner = self.local(b, g, x, |replica_groups| Op::AllReduce {
                            op,
                            replica_groups,
                        })?;
                        self.process_call(b, ProcessCollective::AllReduce(op), inner, false)
                    }
                }
            }
            Op::AllGather {
                dim,
                replica_groups,
            } => {
                let (x, dim) = (x.ok_or_else(|| missing(node))?, *dim);
                match split(replica_groups, self.layout)? {
                    Split::Local(g) => {
                        let gather = Op::AllGather {
                            dim,
                            replica_groups: g,
                        };
                        self.chained(b, gather, x)
                    }
                    Split::Spanning(g) => {
                        let inner = self.local(b, g, x, |replica_groups| Op::AllGather {
                            dim,
                            replica_groups,
                        })?;
                        self.process_call(b, ProcessCollective::AllGather { dim }, inner, false)
                    }
                }
            }
            Op::ReduceScatter {
                op,
                dim,
                replica_groups,
            } => {
                let (x, op, dim) = (x.ok_or_else(|| missing(node))?, *op, *dim);
                match split(replica_groups, self.layout)? {
                    Split::Local(g) => {
                        let scatter = Op::ReduceScatter {
                            op,
                            dim,
                            replica_groups: g,
                        };
                        self.chained(b, scatter, x)
                    }
                    Split::Spanning(g) => {
                        let outer = self.process_call(
                            b,
                            ProcessCollective::ReduceScatter { op, dim },
                            x,
                            false,
                        )?;
                        self.local(b, g, outer, |replica_groups| Op::ReduceScatter {
                            op,
                            dim,
                            replica_groups,
                        })
                    }
                }
            }
            op => match op.replicas() {
                ReplicaRule::Groups { .. } => Err(Error::InvalidGraph {
                    message: format!("{op} has no rule for a run of several processes"),
                }),
                ReplicaRule::Local | ReplicaRule::FirstOperand | ReplicaRule::Distinct => {
                    b.push(op.clone(), operands)
                }
            },
        }
    }
}

fn missing(node: &Node) -> Error {
    Error::InvalidGraph {
        message: format!("{} lacks its operand", node.op),
    }
}
