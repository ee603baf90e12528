//! The pure-CPU part of [`super::TaskGraph`]: the dependency graph of a task list (explicit
//! dependencies, each stream's program order, and the edges CUDA cannot see, from each producer
//! a wait relies on to the wait), the value check of every wait (issue 19, item 7: it must fire
//! in every legal execution), the cycle check, and the submission order. The semantics and the
//! argument are in [`plan`]; `tests/ordering_cycles.rs` checks it against a brute-force
//! interleaving explorer.
//!
//! Why a topological submission order prevents the seeds' hangs: CUDA may funnel several streams
//! into one FIFO hardware queue, adding false dependencies in *submission* order
//! ("NVSHMEM and the CUDA model", "CUDA streams and false circular dependencies"). If tasks are
//! submitted in a topological order of the full graph, anything a task can be queued behind was
//! submitted earlier and so does not depend on it; by induction over the order every task
//! completes. A cycle in the full graph is a hang no submission order can avoid, so it is
//! rejected before anything is enqueued.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use super::types::Cmp;
use crate::error::{Error, Result};

/// A task of a [`super::TaskGraph`]: the graph that made it and its position in the order the
/// tasks were added. Using it with another graph is [`Error::ForeignHandle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId {
    pub(crate) graph: u64,
    pub(crate) index: usize,
}

impl TaskId {
    /// Position of the task in its graph (0 = first added).
    pub fn index(self) -> usize {
        self.index
    }
}

/// Why one task must complete before another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EdgeKind {
    /// An explicit dependency ([`super::TaskGraph::depend`]); becomes an event across streams.
    Dependency,
    /// Consecutive tasks of one stream (CUDA stream order).
    StreamOrder,
    /// From a signal set/add to a wait that relies on it (the check's choice, see
    /// [`super::TaskGraph::check`]): invisible to CUDA in a direct run (it orders submission
    /// only), an event in a captured graph.
    Signal,
}

/// One edge of the full dependency graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Edge {
    /// The task that must complete first.
    pub from: TaskId,
    /// The task that waits for it.
    pub to: TaskId,
    /// Where the edge comes from.
    pub kind: EdgeKind,
}

/// What the checker needs to know about a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// Kernel, copy or host callback: no signal involvement.
    Work,
    Wait {
        signal: usize,
        cmp: Cmp,
        value: u64,
    },
    Set {
        signal: usize,
        value: u64,
    },
    Add {
        signal: usize,
        value: u64,
    },
}

/// The result of a successful check: every edge, and the submission order.
#[derive(Clone, Debug)]
pub struct Plan {
    order: Vec<TaskId>,
    edges: Vec<Edge>,
}

impl Plan {
    /// Tasks in submission order: a topological order of [`Plan::edges`] that keeps each stream's
    /// tasks in the order they were added and otherwise prefers earlier-added tasks.
    pub fn order(&self) -> &[TaskId] {
        &self.order
    }

    /// All edges: explicit dependencies, stream order, and signal set/add -> each wait that
    /// relies on it.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }
}

pub(crate) struct TaskView<'a> {
    pub lane: usize,
    pub label: &'a str,
    pub shape: Shape,
}

/// Most distinct values [`all_hold`] and [`ever_holds`] enumerate for one wait. Above it the
/// answer is "unknown", which the checker treats as "may never fire": it refuses what it cannot
/// decide.
const VALUE_SET_CAP: usize = 4096;

/// Most members [`Signals::choose`] tries to drop from the producers a wait relies on.
const DROP_TRIES: usize = 16;

/// Whether every value `base + (sum of any subset of opt)` (wrapping at 2^64, as the GPU's
/// `atom.add.u64` does) satisfies `cmp value` ([`Cmp::holds`], the driver's rule).
/// `Err(Some(v))`: `v` is such a value that fails; `Err(None)`: more than [`VALUE_SET_CAP`]
/// values, not decided.
pub(crate) fn all_hold(
    cmp: Cmp,
    value: u64,
    base: u64,
    opt: &[u64],
) -> std::result::Result<(), Option<u64>> {
    if !cmp.holds(base, value) {
        return Err(Some(base));
    }
    if cmp == Cmp::Geq {
        // Cyclic `>=`: `s - value` (wrapping) must lie in [0, 2^63). Every subset sum lies in
        // [0, total]; if `base - value + total` stays below 2^63, no value can fail.
        let d = base.wrapping_sub(value) as u128;
        let total: u128 = opt.iter().map(|&a| a as u128).sum();
        if d + total <= i64::MAX as u128 {
            return Ok(());
        }
    }
    let mut seen = BTreeSet::from([base]);
    for &a in opt {
        let now: Vec<u64> = seen.iter().copied().collect();
        for x in now {
            let y = x.wrapping_add(a);
            if !cmp.holds(y, value) {
                return Err(Some(y));
            }
            seen.insert(y);
        }
        if seen.len() > VALUE_SET_CAP {
            return Err(None);
        }
    }
    Ok(())
}

/// Whether some value `start + (sum of a subset of adds)` (wrapping at 2^64), for a `start` in
/// `starts`, satisfies `cmp value`: whether the wait can fire at all, at any moment. `None`: more
/// than [`VALUE_SET_CAP`] values, not decided.
pub(crate) fn ever_holds(cmp: Cmp, value: u64, starts: &[u64], adds: &[u64]) -> Option<bool> {
    let mut seen: BTreeSet<u64> = starts.iter().copied().collect();
    if seen.iter().any(|&s| cmp.holds(s, value)) {
        return Some(true);
    }
    for &a in adds {
        let now: Vec<u64> = seen.iter().copied().collect();
        for x in now {
            let y = x.wrapping_add(a);
            if cmp.holds(y, value) {
                return Some(true);
            }
            seen.insert(y);
        }
        if seen.len() > VALUE_SET_CAP {
            return None;
        }
    }
    Some(false)
}

/// A legal execution that leaves a wait unsatisfied, found by [`Signals::guarantee`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Witness {
    /// The set that runs last of those that ran; `None`: no set ran (the run's reset to 0 holds).
    pub last_set: Option<usize>,
    /// The value the signal is left with; `None`: more than [`VALUE_SET_CAP`] values possible
    /// (not enumerated, refused as undecided).
    pub value: Option<u64>,
}

/// The hard order (explicit dependencies and lane order, which CUDA enforces) restricted to the
/// signal tasks, as bitsets: what the value analysis of the waits needs.
struct Signals<'a> {
    tasks: &'a [TaskView<'a>],
    /// Column of each signal task (set, add, wait) in the bitsets; `usize::MAX` for other tasks.
    col: Vec<usize>,
    /// `after[x]`: bitset of the signal tasks that are hard-ordered after task `x`.
    after: Vec<Vec<u64>>,
}

impl Signals<'_> {
    /// Whether `y` (a signal task) cannot start before `x` has completed (hard edges only).
    fn before(&self, x: usize, y: usize) -> bool {
        let c = self.col[y];
        self.after[x][c / 64] & (1 << (c % 64)) != 0
    }

    fn operand(&self, p: usize) -> u64 {
        match self.tasks[p].shape {
            Shape::Set { value, .. } | Shape::Add { value, .. } => value,
            _ => 0,
        }
    }

    fn is_set(&self, p: usize) -> bool {
        matches!(self.tasks[p].shape, Shape::Set { .. })
    }

    /// Whether the wait `cmp value` is guaranteed to see a satisfying value once every producer
    /// of `req` has run, whatever subset of `opt` has also run, in whatever order the hard edges
    /// allow (over-approximated: every order in which each `req` set that is hard-ordered after
    /// another set stays after it, and each add hard-ordered after or before the last set stays
    /// so, is considered; other constraints are ignored, which only adds executions).
    ///
    /// The value left is that of the last set that ran (or 0, the run's reset, if none ran) plus
    /// every add that ran after it, wrapping at 2^64. So for each set that may run last, and for
    /// "no set ran" when `req` has no set, every value `base + (any subset of the adds that may
    /// or may not follow it)` must satisfy the wait ([`all_hold`]). `Err`: one that does not.
    fn guarantee(
        &self,
        cmp: Cmp,
        value: u64,
        req: &[usize],
        opt: &[usize],
    ) -> std::result::Result<(), Witness> {
        let req_sets: Vec<usize> = req.iter().copied().filter(|&p| self.is_set(p)).collect();
        let mut lasts: Vec<Option<usize>> = Vec::new();
        if req_sets.is_empty() {
            lasts.push(None);
        }
        for &q in req.iter().chain(opt).filter(|&&q| self.is_set(q)) {
            if req_sets.iter().all(|&r| r == q || !self.before(q, r)) {
                lasts.push(Some(q));
            }
        }
        for last in lasts {
            let mut base = last.map_or(0, |q| self.operand(q));
            let mut optional = Vec::new();
            for &a in req.iter().filter(|&&a| !self.is_set(a)) {
                match last {
                    None => base = base.wrapping_add(self.operand(a)),
                    Some(q) if self.before(q, a) => base = base.wrapping_add(self.operand(a)),
                    Some(q) if self.before(a, q) => {}
                    Some(_) => optional.push(self.operand(a)),
                }
            }
            for &a in opt.iter().filter(|&&a| !self.is_set(a)) {
                if last.is_none_or(|q| !self.before(a, q)) {
                    optional.push(self.operand(a));
                }
            }
            all_hold(cmp, value, base, &optional).map_err(|v| Witness {
                last_set: last,
                value: v,
            })?;
        }
        Ok(())
    }

    /// The producers (out of `cands`, tried in that order) that the wait relies on, besides the
    /// ones hard-ordered before it (`before`): a small set `R` such that [`Signals::guarantee`]
    /// holds with `before + R` required and the other candidates optional. The guarantee is
    /// monotone in `R` (requiring more producers leaves fewer possible values), so the shortest
    /// sufficient prefix of `cands` is found by bisection, then members it does not need are
    /// dropped, latest first (up to [`DROP_TRIES`] tries). `None`: not even every candidate
    /// suffices.
    fn choose(
        &self,
        cmp: Cmp,
        value: u64,
        before: &[usize],
        cands: &[usize],
    ) -> Option<Vec<usize>> {
        let ok = |rel: &[usize], rest: &[usize]| {
            let req: Vec<usize> = before.iter().chain(rel).copied().collect();
            self.guarantee(cmp, value, &req, rest).is_ok()
        };
        if !ok(cands, &[]) {
            return None;
        }
        let (mut lo, mut hi) = (0, cands.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if ok(&cands[..mid], &cands[mid..]) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        let mut rel = cands[..lo].to_vec();
        let mut rest = cands[lo..].to_vec();
        // At most DROP_TRIES attempts, so a wait with hundreds of producers stays cheap.
        for i in (0..rel.len()).rev().take(DROP_TRIES) {
            let p = rel.remove(i);
            rest.push(p);
            if !ok(&rel, &rest) {
                rest.pop();
                rel.insert(i, p);
            }
        }
        Some(rel)
    }
}

/// Kahn's algorithm over `n` tasks, smallest index first among the ready ones: the order, or
/// (`Err`) the tasks of one cycle in edge order.
fn topological(n: usize, edges: &[Edge]) -> std::result::Result<Vec<usize>, Vec<usize>> {
    let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut indegree = vec![0usize; n];
    for e in edges {
        preds[e.to.index].push(e.from.index);
        succs[e.from.index].push(e.to.index);
        indegree[e.to.index] += 1;
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&i| indegree[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &s in &succs[i] {
            indegree[s] -= 1;
            if indegree[s] == 0 {
                ready.push(Reverse(s));
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // Every task left has a predecessor that is also left: walk predecessors until one repeats.
    let left: Vec<bool> = indegree.iter().map(|&d| d > 0).collect();
    let Some(start) = left.iter().position(|&l| l) else {
        return Ok(order);
    };
    let mut seen_at = vec![usize::MAX; n];
    let mut walk = vec![start];
    let mut cur = start;
    seen_at[start] = 0;
    loop {
        let Some(&p) = preds[cur].iter().find(|&&p| left[p]) else {
            // Unreachable: a task left after Kahn has a predecessor left.
            return Err(walk);
        };
        if seen_at[p] != usize::MAX {
            let mut cycle: Vec<usize> = walk[seen_at[p]..].to_vec();
            cycle.reverse(); // walk went backwards along edges
            return Err(cycle);
        }
        seen_at[p] = walk.len();
        walk.push(p);
        cur = p;
    }
}

/// Builds the full graph and orders it. `graph` stamps the returned [`TaskId`]s.
///
/// The semantics checked (docs/safety.md, "Signal and TaskGraph", rule 4): a task starts only
/// after its lane's previous task and its explicit dependencies have completed ("hard" edges,
/// which CUDA enforces); any interleaving of the lanes that respects them is legal. Each run
/// starts with every signal at 0; a set overwrites the 64-bit word; an add adds, wrapping at 2^64;
/// a wait polls and may miss a value that holds only for a moment, so it is live only if the
/// value its producers *leave* satisfies it. A wait is accepted only if, in every legal
/// execution, once the producers it relies on have run, every value the other producers can
/// leave (any subset of them, in any order the hard edges allow) satisfies it
/// ([`Signals::guarantee`]). The producers it relies on get signal edges to it; the full graph
/// (hard + signal edges) must be acyclic, and tasks are submitted in a topological order of it.
///
/// Why that suffices, even when CUDA funnels lanes into one FIFO queue or a captured graph turns
/// the signal edges into real dependencies: by induction over the submission order, every task
/// completes in every execution. A task's hard predecessors and, for a wait, the producers it
/// relies on come earlier in that order, so they complete; the producers hard-ordered after the
/// wait cannot run before it; every other producer may or may not run, in any order, and every
/// value they can leave satisfies the wait, which therefore fires. Any FIFO merging that CUDA
/// chooses follows submission order and adds only edges that point forward in it.
///
/// Errors: [`Error::Cycle`] for a cycle of hard edges, or one closed by a signal edge (including
/// a wait that only producers ordered after it could satisfy); [`Error::UnmatchedWait`] for a
/// wait that no value its signal can ever hold satisfies; [`Error::WaitMayNotFire`] for a wait
/// that some legal execution leaves pending. Refusing is conservative (an over-approximation of
/// the possible values, and one greedy choice of the producers each wait relies on): some graphs
/// that are live in fact are refused; none that can hang is accepted.
pub(crate) fn plan(
    graph: u64,
    tasks: &[TaskView<'_>],
    deps: &[(usize, usize)],
    lane_names: &[String],
    signal_names: &[String],
) -> Result<Plan> {
    let n = tasks.len();
    let id = |index: usize| TaskId { graph, index };
    let mut edges: Vec<Edge> = deps
        .iter()
        .map(|&(from, to)| Edge {
            from: id(from),
            to: id(to),
            kind: EdgeKind::Dependency,
        })
        .collect();
    let mut last_on_lane: Vec<Option<usize>> = vec![None; lane_names.len()];
    for (i, t) in tasks.iter().enumerate() {
        if let Some(prev) = last_on_lane[t.lane].replace(i) {
            edges.push(Edge {
                from: id(prev),
                to: id(i),
                kind: EdgeKind::StreamOrder,
            });
        }
    }
    // The hard graph on its own must be acyclic.
    let hard_order =
        topological(n, &edges).map_err(|cycle| cycle_error(&cycle, &edges, tasks, lane_names))?;
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for e in &edges {
        succ[e.from.index].push(e.to.index);
    }
    let mut col = vec![usize::MAX; n];
    let mut cols = 0;
    for (i, t) in tasks.iter().enumerate() {
        if t.shape != Shape::Work {
            col[i] = cols;
            cols += 1;
        }
    }
    let words = cols.div_ceil(64);
    let mut after = vec![vec![0u64; words]; n];
    for &x in hard_order.iter().rev() {
        let mut row = vec![0u64; words];
        for &y in &succ[x] {
            for (r, &a) in row.iter_mut().zip(&after[y]) {
                *r |= a;
            }
            if col[y] != usize::MAX {
                row[col[y] / 64] |= 1 << (col[y] % 64);
            }
        }
        after[x] = row;
    }
    let mut pos = vec![0; n];
    for (k, &t) in hard_order.iter().enumerate() {
        pos[t] = k;
    }
    let sig = Signals { tasks, col, after };

    let mut full = succ;
    for &w in &hard_order {
        let Shape::Wait { signal, cmp, value } = tasks[w].shape else {
            continue;
        };
        // Sets and non-zero adds of the signal (adds of 0 change nothing), in hard order.
        let producers: Vec<usize> = hard_order
            .iter()
            .copied()
            .filter(|&p| match tasks[p].shape {
                Shape::Set { signal: s, .. } => s == signal,
                Shape::Add {
                    signal: s,
                    value: a,
                } => s == signal && a != 0,
                _ => false,
            })
            .collect();
        let (mut before, mut concurrent, mut later) = (Vec::new(), Vec::new(), Vec::new());
        for &p in &producers {
            if sig.before(p, w) {
                before.push(p);
            } else if sig.before(w, p) {
                later.push(p);
            } else {
                concurrent.push(p);
            }
        }
        // Prefer producers the wait does not already precede through edges chosen so far (those
        // would close a cycle), earliest first.
        let reach = reach_from(&full, w);
        concurrent.sort_by_key(|&p| (reach[p], pos[p]));
        let relied = match sig.choose(cmp, value, &before, &concurrent) {
            Some(r) => r,
            None => {
                // Only producers ordered after the wait could make it fire: their signal edges
                // close a cycle, reported below as such (the wait blocks its own producer).
                let mut all = concurrent.clone();
                all.extend(&later);
                match sig.choose(cmp, value, &before, &all) {
                    Some(r) => r,
                    None => {
                        return Err(unfired(
                            &sig,
                            (w, signal, cmp, value),
                            &before,
                            &concurrent,
                            &producers,
                            lane_names,
                            signal_names,
                        ))
                    }
                }
            }
        };
        for p in relied {
            full[p].push(w);
            edges.push(Edge {
                from: id(p),
                to: id(w),
                kind: EdgeKind::Signal,
            });
        }
    }
    let order =
        topological(n, &edges).map_err(|cycle| cycle_error(&cycle, &edges, tasks, lane_names))?;
    Ok(Plan {
        order: order.into_iter().map(id).collect(),
        edges,
    })
}

/// The error for a wait that no choice of producers guarantees: [`Error::UnmatchedWait`] if no
/// value its signal can ever hold satisfies it, else [`Error::WaitMayNotFire`] with a legal
/// execution that leaves it pending.
fn unfired(
    sig: &Signals<'_>,
    (w, signal, cmp, value): (usize, usize, Cmp, u64),
    before: &[usize],
    concurrent: &[usize],
    producers: &[usize],
    lane_names: &[String],
    signal_names: &[String],
) -> Error {
    let t = &sig.tasks[w];
    let mut starts = vec![0];
    let mut adds = Vec::new();
    for &p in producers {
        if sig.is_set(p) {
            starts.push(sig.operand(p));
        } else {
            adds.push(sig.operand(p));
        }
    }
    let (task, signal, condition) = (
        t.label.to_string(),
        signal_names[signal].clone(),
        format!("value {cmp} {value}"),
    );
    if ever_holds(cmp, value, &starts, &adds) == Some(false) {
        return Error::UnmatchedWait {
            task,
            signal,
            condition,
        };
    }
    let req: Vec<usize> = before.iter().chain(concurrent).copied().collect();
    let why = match sig.guarantee(cmp, value, &req, &[]) {
        Ok(()) => "no producer set suffices".to_string(), // not reached: choose found none
        Err(wit) => {
            let why = match (wit.last_set, wit.value) {
                (None, Some(0)) => "no producer need run before it, and the signal stays at the \
                                    run's reset value 0"
                    .to_string(),
                (None, Some(v)) => format!(
                    "no set need run before it, and from the run's reset to 0 the adds that may \
                     run leave {v}"
                ),
                (Some(q), Some(v)) => {
                    let x = sig.operand(q);
                    let tail = if v == x {
                        String::new()
                    } else {
                        format!(", and the adds that may follow it leave {v}")
                    };
                    format!(
                        "`{}` (task {q}, stream `{}`) may be the last set to run, writing {x}{tail}",
                        sig.tasks[q].label, lane_names[sig.tasks[q].lane]
                    )
                }
                (_, None) => format!(
                    "its producers can leave more than {VALUE_SET_CAP} distinct values, too many \
                     to check"
                ),
            };
            format!("in some legal order of its producers, {why}, while the wait is pending")
        }
    };
    Error::WaitMayNotFire {
        task,
        signal,
        condition,
        why,
    }
}

/// Tasks reachable from `from` (excluding `from` unless on a cycle) along `succ`.
fn reach_from(succ: &[Vec<usize>], from: usize) -> Vec<bool> {
    let mut seen = vec![false; succ.len()];
    let mut stack: Vec<usize> = succ[from].clone();
    while let Some(t) = stack.pop() {
        if !seen[t] {
            seen[t] = true;
            stack.extend(&succ[t]);
        }
    }
    seen
}

fn cycle_error(
    cycle: &[usize],
    edges: &[Edge],
    tasks: &[TaskView<'_>],
    lane_names: &[String],
) -> Error {
    let name = |i: usize| {
        format!(
            "`{}` (task {i}, stream `{}`)",
            tasks[i].label, lane_names[tasks[i].lane]
        )
    };
    let mut path = name(cycle[0]);
    for k in 0..cycle.len() {
        let (from, to) = (cycle[k], cycle[(k + 1) % cycle.len()]);
        let kind = edges
            .iter()
            .find(|e| e.from.index == from && e.to.index == to)
            .map(|e| e.kind);
        let label = match kind {
            Some(EdgeKind::Dependency) => "dependency",
            Some(EdgeKind::StreamOrder) => "stream order",
            Some(EdgeKind::Signal) => "signal set->wait",
            None => "edge", // not reached: consecutive cycle tasks share an edge
        };
        path.push_str(&format!(" -[{label}]-> {}", name(to)));
    }
    Error::Cycle {
        tasks: cycle.to_vec(),
        path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: usize, p: &str) -> Vec<String> {
        (0..n).map(|i| format!("{p}{i}")).collect()
    }

    #[test]
    fn wait_before_its_set_on_one_stream_is_a_cycle() {
        // stream 0: [wait s0 >= 1, set s0 = 1]: the wait blocks the set forever.
        let tasks = [
            TaskView {
                lane: 0,
                label: "w",
                shape: Shape::Wait {
                    signal: 0,
                    cmp: Cmp::Geq,
                    value: 1,
                },
            },
            TaskView {
                lane: 0,
                label: "s",
                shape: Shape::Set {
                    signal: 0,
                    value: 1,
                },
            },
        ];
        let err = plan(0, &tasks, &[], &names(1, "l"), &names(1, "s")).unwrap_err();
        match err {
            Error::Cycle { tasks, path } => {
                assert_eq!(tasks.len(), 2);
                assert!(
                    path.contains("stream order") && path.contains("signal set->wait"),
                    "{path}"
                );
            }
            e => panic!("expected a cycle, got {e}"),
        }
    }

    #[test]
    fn set_before_wait_across_streams_is_ordered_producer_first() {
        let tasks = [
            TaskView {
                lane: 0,
                label: "w",
                shape: Shape::Wait {
                    signal: 0,
                    cmp: Cmp::Eq,
                    value: 7,
                },
            },
            TaskView {
                lane: 1,
                label: "s",
                shape: Shape::Set {
                    signal: 0,
                    value: 7,
                },
            },
        ];
        let p = plan(0, &tasks, &[], &names(2, "l"), &names(1, "s")).unwrap();
        let order: Vec<usize> = p.order().iter().map(|t| t.index()).collect();
        assert_eq!(order, [1, 0]);
    }

    #[test]
    fn a_set_that_cannot_satisfy_the_wait_is_no_producer() {
        let tasks = [
            TaskView {
                lane: 0,
                label: "w",
                shape: Shape::Wait {
                    signal: 0,
                    cmp: Cmp::Eq,
                    value: 7,
                },
            },
            TaskView {
                lane: 1,
                label: "s",
                shape: Shape::Set {
                    signal: 0,
                    value: 6,
                },
            },
        ];
        let err = plan(0, &tasks, &[], &names(2, "l"), &names(1, "s")).unwrap_err();
        assert!(matches!(err, Error::UnmatchedWait { .. }), "{err}");
    }

    fn task(lane: usize, label: &str, shape: Shape) -> TaskView<'_> {
        TaskView { lane, label, shape }
    }
    const fn wait(cmp: Cmp, value: u64) -> Shape {
        Shape::Wait {
            signal: 0,
            cmp,
            value,
        }
    }
    const fn add(value: u64) -> Shape {
        Shape::Add { signal: 0, value }
    }
    const fn set(value: u64) -> Shape {
        Shape::Set { signal: 0, value }
    }

    fn check(tasks: &[TaskView<'_>], deps: &[(usize, usize)]) -> Result<Plan> {
        plan(7, tasks, deps, &names(3, "l"), &names(1, "s"))
    }

    #[test]
    fn finding_06_an_add_too_small_for_the_wait_is_unmatched() {
        // The issue's example: add(s, 1) then wait(s, >= 2) passed and hung.
        let tasks = [task(0, "a", add(1)), task(1, "w", wait(Cmp::Geq, 2))];
        let err = check(&tasks, &[]).unwrap_err();
        assert!(matches!(err, Error::UnmatchedWait { .. }), "{err}");
        // Two adds of 1 reach 2.
        let tasks = [
            task(0, "a", add(1)),
            task(2, "b", add(1)),
            task(1, "w", wait(Cmp::Geq, 2)),
        ];
        check(&tasks, &[]).unwrap();
    }

    #[test]
    fn finding_06_and_issue19_item07_eq_needs_the_value_every_execution_leaves() {
        let eq = |v| {
            [
                task(0, "a", add(2)),
                task(1, "b", add(3)),
                task(2, "w", wait(Cmp::Eq, v)),
            ]
        };
        // Both adds run in every execution: only their sum is left. 2 and 3 hold only for a
        // moment (issue 19, item 7); 1, 4 and 6 never.
        check(&eq(5), &[]).unwrap();
        for racy in [2, 3] {
            let err = check(&eq(racy), &[]).unwrap_err();
            assert!(matches!(err, Error::WaitMayNotFire { .. }), "{racy}: {err}");
        }
        for bad in [1, 4, 6] {
            let err = check(&eq(bad), &[]).unwrap_err();
            assert!(matches!(err, Error::UnmatchedWait { .. }), "{bad}: {err}");
        }
        // A set then adds: 10 + 2 = 12.
        let tasks = [
            task(0, "s", set(10)),
            task(0, "a", add(2)),
            task(1, "w", wait(Cmp::Eq, 12)),
        ];
        check(&tasks, &[]).unwrap();
    }

    #[test]
    fn finding_06_producers_ordered_after_the_wait_do_not_count() {
        // Lane 0: [add 1]; lane 1: [wait >= 2, add 1]: the second add is behind the wait, so only
        // 1 is reachable before it; counting it would form a cycle, reported as such.
        let tasks = [
            task(0, "a", add(1)),
            task(1, "w", wait(Cmp::Geq, 2)),
            task(1, "b", add(1)),
        ];
        match check(&tasks, &[]).unwrap_err() {
            Error::Cycle { tasks, path } => {
                assert_eq!(tasks.len(), 2, "{path}");
                assert!(path.contains("`w`") && path.contains("`b`"), "{path}");
            }
            e => panic!("expected a cycle, got {e}"),
        }
        // An explicit dependency wait -> add on another lane orders the add after the wait too.
        let tasks = [
            task(0, "a", add(1)),
            task(1, "w", wait(Cmp::Geq, 1)),
            task(2, "b", add(1)),
        ];
        check(&tasks, &[(1, 2)]).unwrap();
    }

    #[test]
    fn finding_06_only_contributing_producers_get_signal_edges() {
        // wait == 5 with set 5 and set 4: only `set 5` is a producer; `set 4` after the wait on
        // the same lane is no cycle.
        let tasks = [
            task(0, "s5", set(5)),
            task(1, "w", wait(Cmp::Eq, 5)),
            task(1, "s4", set(4)),
        ];
        let p = check(&tasks, &[]).unwrap();
        let signal_edges: Vec<(usize, usize)> = p
            .edges()
            .iter()
            .filter(|e| e.kind == EdgeKind::Signal)
            .map(|e| (e.from.index(), e.to.index()))
            .collect();
        assert_eq!(signal_edges, [(0, 1)]);
        // Adds of 0 change nothing: they are no producers.
        let tasks = [task(0, "z", add(0)), task(1, "w", wait(Cmp::Geq, 1))];
        assert!(matches!(
            check(&tasks, &[]).unwrap_err(),
            Error::UnmatchedWait { .. }
        ));
        assert!(p.order().iter().all(|t| t.graph == 7));
    }

    #[test]
    fn value_sets_wrap_at_2_64_and_geq_is_cyclic() {
        // Geq is the driver's cyclic comparison: u64::MAX is not >= 1, 2^63 is not >= 0.
        assert_eq!(all_hold(Cmp::Geq, 1, u64::MAX, &[]), Err(Some(u64::MAX)));
        assert_eq!(all_hold(Cmp::Geq, 0, 1 << 63, &[]), Err(Some(1 << 63)));
        assert_eq!(all_hold(Cmp::Geq, 5, 5, &[1, 2, 3]), Ok(()));
        // A large optional add can wrap the value back below the target.
        assert_eq!(
            all_hold(Cmp::Geq, 2, 2, &[u64::MAX]),
            Err(Some(1)),
            "2 + u64::MAX wraps to 1"
        );
        // Eq needs every value equal: an optional add breaks it.
        assert_eq!(all_hold(Cmp::Eq, 5, 5, &[]), Ok(()));
        assert_eq!(all_hold(Cmp::Eq, 5, 5, &[2]), Err(Some(7)));
        assert_eq!(all_hold(Cmp::And, 0b100, 0b100, &[0b1000]), Ok(()));
        assert_eq!(
            all_hold(Cmp::And, 0b100, 0b100, &[0b100]),
            Err(Some(0b1000))
        );
        // Too many values to enumerate is undecided (refused), not accepted.
        let many: Vec<u64> = (0..20).map(|i| 1 << (i + 20)).collect();
        assert_eq!(all_hold(Cmp::And, 1, 1, &many), Err(None));
        assert_eq!(ever_holds(Cmp::Geq, 2, &[0], &[1, u64::MAX, 1]), Some(true));
        assert_eq!(ever_holds(Cmp::Geq, 3, &[0, 1], &[1]), Some(false));
        assert_eq!(ever_holds(Cmp::Nor, u64::MAX, &[0], &[1]), Some(false));
        assert_eq!(ever_holds(Cmp::And, 1, &[0], &many), None);
    }

    #[test]
    fn issue19_item07_a_barrier_relies_on_the_first_add_of_the_other_lane_only() {
        // Lane l: [add 1, wait >= 2, add 1, wait >= 4], l = 0, 1. The first waits rely on the
        // other lane's first add (its second add cannot undo >= 2); relying on the second would
        // close a cycle through the other lane's first wait.
        let tasks: Vec<TaskView<'_>> = (0..2)
            .flat_map(|l| {
                [
                    task(l, "a1", add(1)),
                    task(l, "w2", wait(Cmp::Geq, 2)),
                    task(l, "a2", add(1)),
                    task(l, "w4", wait(Cmp::Geq, 4)),
                ]
            })
            .collect();
        let p = check(&tasks, &[]).unwrap();
        let mut signal_edges: Vec<(usize, usize)> = p
            .edges()
            .iter()
            .filter(|e| e.kind == EdgeKind::Signal)
            .map(|e| (e.from.index(), e.to.index()))
            .collect();
        signal_edges.sort();
        assert_eq!(
            signal_edges,
            [(0, 5), (0, 7), (2, 7), (4, 1), (4, 3), (6, 3)]
        );
    }

    #[test]
    fn issue19_item07_the_refusal_names_the_set_that_may_run_last() {
        // Lane 0: [set 5]; lane 1: [set 0]; lane 2: [wait >= 5]: `zero` may run last.
        let tasks = [
            task(0, "five", set(5)),
            task(1, "zero", set(0)),
            task(2, "w", wait(Cmp::Geq, 5)),
        ];
        match check(&tasks, &[]).unwrap_err() {
            Error::WaitMayNotFire { task, why, .. } => {
                assert_eq!(task, "w");
                assert!(why.contains("`zero`") && why.contains("writing 0"), "{why}");
            }
            e => panic!("expected WaitMayNotFire, got {e}"),
        }
        // zero -> five: five is the last set in every execution.
        let p = check(&tasks, &[(1, 0)]).unwrap();
        assert!(p
            .edges()
            .iter()
            .any(|e| e.kind == EdgeKind::Signal && e.from.index() == 0));
    }

    #[test]
    fn a_barrier_of_a_thousand_tasks_is_checked() {
        // 8 lanes x 64 phases: each lane adds 1, then waits for every lane's add of the phase.
        let (lanes, phases) = (8usize, 64u64);
        let mut tasks = Vec::new();
        for phase in 1..=phases {
            for l in 0..lanes {
                tasks.push(task(l, "add", add(1)));
                tasks.push(task(l, "wait", wait(Cmp::Geq, phase * lanes as u64)));
            }
        }
        let t0 = std::time::Instant::now();
        let p = plan(0, &tasks, &[], &names(lanes, "l"), &names(1, "s")).unwrap();
        assert_eq!(p.order().len(), tasks.len());
        println!("{} tasks checked in {:?}", tasks.len(), t0.elapsed());
    }
}
