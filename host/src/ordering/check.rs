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
use std::collections::BinaryHeap;

use super::signal::Cmp;
use crate::error::{Error, Result};

/// Index of a task in its graph, in the order the tasks were added.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TaskId(pub(crate) usize);

impl TaskId {
    /// Position of the task in its graph (0 = first added).
    pub fn index(self) -> usize {
        self.0
    }
}

/// Why one task must complete before another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EdgeKind {
    /// An explicit dependency ([`super::TaskGraph::depend`]); becomes an event across streams.
    Dependency,
    /// Consecutive tasks of one stream (CUDA stream order).
    StreamOrder,
    /// A signal set/add to a wait it can satisfy: invisible to CUDA.
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

/// Builds the full graph and orders it; [`Error::Cycle`] names a cycle, [`Error::UnmatchedWait`]
/// a wait nothing can satisfy.
pub(crate) fn plan(
    tasks: &[TaskView<'_>],
    deps: &[(TaskId, TaskId)],
    lane_names: &[String],
    signal_names: &[String],
) -> Result<Plan> {
    let n = tasks.len();
    let mut edges: Vec<Edge> = deps
        .iter()
        .map(|&(from, to)| Edge {
            from,
            to,
            kind: EdgeKind::Dependency,
        })
        .collect();
    let mut last_on_lane: Vec<Option<usize>> = vec![None; lane_names.len()];
    for (i, t) in tasks.iter().enumerate() {
        if let Some(prev) = last_on_lane[t.lane].replace(i) {
            edges.push(Edge {
                from: TaskId(prev),
                to: TaskId(i),
                kind: EdgeKind::StreamOrder,
            });
        }
    }
    for (w, t) in tasks.iter().enumerate() {
        let Shape::Wait { signal, cmp, value } = t.shape else {
            continue;
        };
        let mut producers = 0;
        for (p, pt) in tasks.iter().enumerate() {
            let produces = match pt.shape {
                Shape::Set {
                    signal: s,
                    value: v,
                } => s == signal && cmp.holds(v, value),
                Shape::Add { signal: s } => s == signal,
                _ => false,
            };
            if produces {
                producers += 1;
                edges.push(Edge {
                    from: TaskId(p),
                    to: TaskId(w),
                    kind: EdgeKind::Signal,
                });
            }
        }
        if producers == 0 && !cmp.holds(0, value) {
            return Err(Error::UnmatchedWait {
                task: t.label.to_string(),
                signal: signal_names[signal].clone(),
                condition: format!("value {cmp} {value}"),
            });
        }
    }

    // Kahn's algorithm, smallest index first among the ready tasks.
    let mut preds: Vec<Vec<(usize, EdgeKind)>> = vec![Vec::new(); n];
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut indegree = vec![0usize; n];
    for e in &edges {
        preds[e.to.0].push((e.from.0, e.kind));
        succs[e.from.0].push(e.to.0);
        indegree[e.to.0] += 1;
    }
    let mut ready: BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&i| indegree[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        order.push(TaskId(i));
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
        let err = plan(&tasks, &[], &names(1, "l"), &names(1, "s")).unwrap_err();
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
        let p = plan(&tasks, &[], &names(2, "l"), &names(1, "s")).unwrap();
        assert_eq!(p.order(), &[TaskId(1), TaskId(0)]);
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
        let err = plan(&tasks, &[], &names(2, "l"), &names(1, "s")).unwrap_err();
        assert!(matches!(err, Error::UnmatchedWait { .. }), "{err}");
    }
}
