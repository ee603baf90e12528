//! The pure-CPU part of [`super::TaskGraph`]: the dependency graph of a task list (explicit
//! dependencies, each stream's program order, and the edges CUDA cannot see, from each signal
//! set/add to the waits it can satisfy), the cycle check, and the submission order.
//!
//! Why a topological submission order prevents the seeds' hangs: CUDA may funnel several streams
//! into one FIFO hardware queue, adding false dependencies in *submission* order
//! ("NVSHMEM and the CUDA model", "CUDA streams and false circular dependencies"). If tasks are
//! submitted in a topological order of the full graph, anything a task can be queued behind was
//! submitted earlier and so does not depend on it; by induction over the order every task
//! completes. A cycle in the full graph is a hang no submission order can avoid, so it is
//! rejected before anything is enqueued.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};

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
    /// A signal set/add to a wait it can help satisfy: invisible to CUDA.
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

    /// All edges: explicit dependencies, stream order, signal set/add -> wait.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }
}

pub(crate) struct TaskView<'a> {
    pub lane: usize,
    pub label: &'a str,
    pub shape: Shape,
}

/// Most distinct values [`reachable`] tracks for an `Eq`/`And`/`Nor` wait before it gives up and
/// answers "unknown" (which the checker treats as satisfiable: it never rejects what it cannot
/// decide).
const VALUE_SET_CAP: usize = 4096;

/// Whether a wait `cmp value` can see a satisfying value when the signal starts from one of
/// `starts` (0 at the start of the run, or the value of a set) and then any subset of `adds` is
/// applied in any order. `None`: too many distinct values to decide (treated as "yes").
///
/// Values follow the driver: a set overwrites, an add adds (wrapping at 2^64). For `Geq` the
/// largest reachable value is `max(starts) + sum(adds)` (saturating: a sum that can wrap is
/// treated as reaching everything); for the other conditions the exact set of reachable values
/// `start + sum(subset of adds)` is enumerated up to [`VALUE_SET_CAP`] values.
pub(crate) fn reachable(cmp: Cmp, value: u64, starts: &[u64], adds: &[u64]) -> Option<bool> {
    if starts.is_empty() {
        return Some(false);
    }
    if cmp == Cmp::Geq {
        let max = starts.iter().copied().max().unwrap_or(0);
        let top = adds.iter().fold(max, |acc, &a| acc.saturating_add(a));
        return Some(top >= value);
    }
    // Eq: values only grow unless a sum wraps; when none can, values past the target are
    // useless and are dropped. A sum that can wrap makes the answer unknown.
    let max = starts.iter().copied().max().unwrap_or(0);
    if cmp == Cmp::Eq
        && adds
            .iter()
            .try_fold(max, |acc, &a| acc.checked_add(a))
            .is_none()
    {
        return None;
    }
    let mut seen: HashSet<u64> = starts.iter().copied().collect();
    for &a in adds {
        let now: Vec<u64> = seen.iter().copied().collect();
        for x in now {
            let y = x.wrapping_add(a);
            if cmp == Cmp::Eq && y > value {
                continue;
            }
            seen.insert(y);
        }
        if seen.len() > VALUE_SET_CAP {
            return None;
        }
    }
    Some(seen.into_iter().any(|s| cmp.holds(s, value)))
}

/// For the wait on `signal` with `cmp value`: whether the producers `xs` (task indices of sets
/// and non-zero adds) can satisfy it, and which of them can contribute (a set from which a
/// satisfying value is reachable with those adds; every non-zero add).
fn assess(tasks: &[TaskView<'_>], xs: &[usize], cmp: Cmp, value: u64) -> (bool, Vec<usize>) {
    let mut sets = Vec::new();
    let mut adds = Vec::new();
    for &p in xs {
        match tasks[p].shape {
            Shape::Set { value: v, .. } => sets.push(v),
            Shape::Add { value: a, .. } => adds.push(a),
            _ => {}
        }
    }
    let mut starts = vec![0];
    starts.extend(&sets);
    let satisfiable = reachable(cmp, value, &starts, &adds) != Some(false);
    let contributors = xs
        .iter()
        .copied()
        .filter(|&p| match tasks[p].shape {
            Shape::Set { value: v, .. } => reachable(cmp, value, &[v], &adds) != Some(false),
            Shape::Add { .. } => true,
            _ => false,
        })
        .collect();
    (satisfiable, contributors)
}

/// Builds the full graph and orders it; [`Error::Cycle`] names a cycle, [`Error::UnmatchedWait`]
/// a wait whose value nothing can produce. `graph` stamps the returned [`TaskId`]s.
///
/// Signal edges (soundly conservative, finding 6 of issue 9): the producers of a wait are the sets
/// and non-zero adds of its signal. Those the wait precedes through hard edges (explicit
/// dependencies and stream order, which CUDA enforces) cannot help it; from the others the wait
/// must be reachable per [`reachable`], starting from 0 (signals start every run at 0). If it is,
/// an edge comes from every producer that can contribute. If it is reachable only with producers
/// ordered after the wait, those edges are added as well, which closes a cycle that is reported
/// as [`Error::Cycle`] (the wait blocks its own producer). Otherwise the wait can never fire:
/// [`Error::UnmatchedWait`]. Not decided: whether concurrent sets race a satisfying value away
/// (the checker assumes any order of the producers it cannot order is possible).
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
    let mut hard: Vec<Vec<usize>> = vec![Vec::new(); n];
    for e in &edges {
        hard[e.from.index].push(e.to.index);
    }
    for (w, t) in tasks.iter().enumerate() {
        let Shape::Wait { signal, cmp, value } = t.shape else {
            continue;
        };
        let producers: Vec<usize> = (0..n)
            .filter(|&p| match tasks[p].shape {
                Shape::Set { signal: s, .. } => s == signal,
                Shape::Add {
                    signal: s,
                    value: a,
                } => s == signal && a != 0,
                _ => false,
            })
            .collect();
        let after = reach_from(&hard, w);
        let before: Vec<usize> = producers.iter().copied().filter(|&p| !after[p]).collect();
        let (ok, contributors) = assess(tasks, &before, cmp, value);
        let from = if ok {
            contributors
        } else {
            match assess(tasks, &producers, cmp, value) {
                (true, contributors) => contributors,
                (false, _) => {
                    return Err(Error::UnmatchedWait {
                        task: t.label.to_string(),
                        signal: signal_names[signal].clone(),
                        condition: format!("value {cmp} {value}"),
                    })
                }
            }
        };
        edges.extend(from.into_iter().map(|p| Edge {
            from: id(p),
            to: id(w),
            kind: EdgeKind::Signal,
        }));
    }

    // Kahn's algorithm, smallest index first among the ready tasks.
    let mut preds: Vec<Vec<(usize, EdgeKind)>> = vec![Vec::new(); n];
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut indegree = vec![0usize; n];
    for e in &edges {
        preds[e.to.index].push((e.from.index, e.kind));
        succs[e.from.index].push(e.to.index);
        indegree[e.to.index] += 1;
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&i| indegree[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        order.push(id(i));
        for &s in &succs[i] {
            indegree[s] -= 1;
            if indegree[s] == 0 {
                ready.push(Reverse(s));
            }
        }
    }
    if order.len() == n {
        return Ok(Plan { order, edges });
    }

    // Every task left has a predecessor that is also left: walk predecessors until one repeats.
    let left: Vec<bool> = indegree.iter().map(|&d| d > 0).collect();
    let start = left.iter().position(|&l| l).expect("some task is left");
    let mut seen_at = vec![usize::MAX; n];
    let mut walk = vec![start];
    let mut cur = start;
    seen_at[start] = 0;
    loop {
        let &(p, _) = preds[cur]
            .iter()
            .find(|(p, _)| left[*p])
            .expect("a task left after Kahn has a predecessor left");
        if seen_at[p] != usize::MAX {
            let mut cycle: Vec<usize> = walk[seen_at[p]..].to_vec();
            cycle.reverse(); // walk went backwards along edges
            return Err(cycle_error(&cycle, &preds, tasks, lane_names));
        }
        seen_at[p] = walk.len();
        walk.push(p);
        cur = p;
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
    preds: &[Vec<(usize, EdgeKind)>],
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
        let kind = preds[to]
            .iter()
            .find(|(p, _)| *p == from)
            .map(|(_, k)| *k)
            .expect("consecutive cycle tasks share an edge");
        let label = match kind {
            EdgeKind::Dependency => "dependency",
            EdgeKind::StreamOrder => "stream order",
            EdgeKind::Signal => "signal set->wait",
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
        // The example: add(s, 1) then wait(s, >= 2) passed and hung.
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
    fn finding_06_eq_needs_a_set_or_a_subset_sum_of_adds() {
        let eq = |v| {
            [
                task(0, "a", add(2)),
                task(1, "b", add(3)),
                task(2, "w", wait(Cmp::Eq, v)),
            ]
        };
        for ok in [2, 3, 5] {
            check(&eq(ok), &[]).unwrap_or_else(|e| panic!("{ok}: {e}"));
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
    fn reachable_handles_wrapping_and_caps() {
        assert_eq!(reachable(Cmp::Geq, u64::MAX, &[0], &[u64::MAX]), Some(true));
        assert_eq!(reachable(Cmp::Geq, 3, &[0, 1], &[1]), Some(false));
        assert_eq!(reachable(Cmp::Eq, 1, &[0], &[u64::MAX, 2]), None);
        assert_eq!(reachable(Cmp::And, 0b100, &[0], &[1, 1, 1, 1]), Some(true));
        assert_eq!(reachable(Cmp::And, 0b1000, &[0], &[1, 2]), Some(false));
        assert_eq!(reachable(Cmp::Nor, u64::MAX, &[0], &[1]), Some(false));
        let many: Vec<u64> = (0..20).map(|i| 1 << (i + 20)).collect();
        assert_eq!(reachable(Cmp::And, 1, &[0], &many), None);
    }
}
