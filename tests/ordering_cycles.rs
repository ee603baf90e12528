//! Property tests of `TaskGraph::check` (pure CPU, run in CI): random task graphs with explicit
//! dependencies, per-stream order and signal set/add -> wait edges. An independent oracle
//! (edges derived from the documented rules with brute-force value enumeration, cycles found by a
//! Floyd–Warshall transitive closure) decides what the checker must say: every graph with a cycle
//! is rejected with a cycle that really is one, every acyclic graph gets a submission order that
//! respects every edge, and a wait whose value no set/add can produce is `UnmatchedWait`
//! (finding 6 of issue 9). A simulation checks that accepted add-only graphs cannot hang.

use proptest::prelude::*;
use warpline::ordering::{Cmp, TaskGraph};
use warpline::Error;

#[derive(Clone, Debug)]
enum Kind {
    Work,
    Wait { sig: usize, cmp: Cmp, value: u64 },
    Set { sig: usize, value: u64 },
    Add { sig: usize, value: u64 },
}

#[derive(Clone, Debug)]
struct Spec {
    lanes: usize,
    signals: usize,
    tasks: Vec<(usize, Kind)>,
    deps: Vec<(usize, usize)>,
}

fn cmp() -> impl Strategy<Value = Cmp> {
    prop_oneof![
        Just(Cmp::Eq),
        Just(Cmp::Geq),
        Just(Cmp::And),
        Just(Cmp::Nor)
    ]
}

fn kind(signals: usize) -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Work),
        (0..signals, cmp(), 0u64..4).prop_map(|(sig, cmp, value)| Kind::Wait { sig, cmp, value }),
        (0..signals, 0u64..4).prop_map(|(sig, value)| Kind::Set { sig, value }),
        (0..signals, 0u64..3).prop_map(|(sig, value)| Kind::Add { sig, value }),
    ]
}

fn spec() -> impl Strategy<Value = Spec> {
    (1usize..5, 1usize..4, 1usize..14).prop_flat_map(|(lanes, signals, n)| {
        (
            prop::collection::vec((0..lanes, kind(signals)), n),
            prop::collection::vec((0..n, 0..n), 0..10),
        )
            .prop_map(move |(tasks, deps)| Spec {
                lanes,
                signals,
                tasks,
                deps: deps.into_iter().filter(|(a, b)| a != b).collect(),
            })
    })
}

fn build(s: &Spec) -> TaskGraph<'static> {
    let mut g = TaskGraph::new();
    let lanes: Vec<_> = (0..s.lanes).map(|i| g.lane(format!("lane{i}"))).collect();
    let sigs: Vec<_> = (0..s.signals)
        .map(|i| g.signal(format!("sig{i}")))
        .collect();
    let ids: Vec<_> = s
        .tasks
        .iter()
        .enumerate()
        .map(|(i, (lane, k))| {
            let (lane, label) = (lanes[*lane], format!("t{i}"));
            match *k {
                Kind::Work => g.host(lane, label, || {}),
                Kind::Wait { sig, cmp, value } => g.wait(lane, label, sigs[sig], cmp, value),
                Kind::Set { sig, value } => g.set(lane, label, sigs[sig], value),
                Kind::Add { sig, value } => g.add(lane, label, sigs[sig], value),
            }
            .unwrap()
        })
        .collect();
    for &(a, b) in &s.deps {
        g.depend(ids[a], ids[b]).unwrap();
    }
    g
}

/// Runs the tasks of an add-only graph in a random greedy schedule (a task runs once it heads its
/// lane, its dependencies ran, and, for a wait, the value holds); true if every task ran.
fn simulate(s: &Spec, picks: &[usize]) -> bool {
    let n = s.tasks.len();
    let mut ran = vec![false; n];
    let mut value = vec![0u64; s.signals];
    let mut pick = picks.iter().cycle();
    loop {
        let runnable: Vec<usize> = (0..n)
            .filter(|&t| {
                !ran[t]
                    && (0..t).all(|e| ran[e] || s.tasks[e].0 != s.tasks[t].0)
                    && s.deps.iter().all(|&(a, b)| b != t || ran[a])
                    && match s.tasks[t].1 {
                        Kind::Wait { sig, cmp, value: v } => cmp.holds(value[sig], v),
                        _ => true,
                    }
            })
            .collect();
        let Some(&p) = pick.next() else { return false };
        if runnable.is_empty() {
            return ran.iter().all(|&r| r);
        }
        let t = runnable[p % runnable.len()];
        ran[t] = true;
        match s.tasks[t].1 {
            Kind::Add { sig, value: a } => value[sig] = value[sig].wrapping_add(a),
            Kind::Set { sig, value: v } => value[sig] = v,
            _ => {}
        }
    }
}

fn hard_edges(s: &Spec) -> Vec<(usize, usize)> {
    let mut edges = s.deps.clone();
    for lane in 0..s.lanes {
        let on: Vec<usize> = (0..s.tasks.len())
            .filter(|&i| s.tasks[i].0 == lane)
            .collect();
        edges.extend(on.windows(2).map(|w| (w[0], w[1])));
    }
    edges
}

/// Brute force: some start (0 or a set's value) plus the sum of some subset of the adds
/// satisfies the wait.
fn brute_reaches(cmp: Cmp, value: u64, starts: &[u64], adds: &[u64]) -> bool {
    starts.iter().any(|&start| {
        (0u32..1 << adds.len()).any(|mask| {
            let sum = (0..adds.len())
                .filter(|i| mask & (1 << i) != 0)
                .fold(start, |acc, i| acc.wrapping_add(adds[i]));
            cmp.holds(sum, value)
        })
    })
}

/// (satisfiable, contributors) of producers `xs` for a wait `cmp value`.
fn brute_assess(s: &Spec, xs: &[usize], cmp: Cmp, value: u64) -> (bool, Vec<usize>) {
    let adds: Vec<u64> = xs
        .iter()
        .filter_map(|&p| match s.tasks[p].1 {
            Kind::Add { value, .. } => Some(value),
            _ => None,
        })
        .collect();
    let mut starts = vec![0];
    let mut contrib = Vec::new();
    for &p in xs {
        match s.tasks[p].1 {
            Kind::Set { value: v, .. } => {
                starts.push(v);
                if brute_reaches(cmp, value, &[v], &adds) {
                    contrib.push(p);
                }
            }
            Kind::Add { .. } => contrib.push(p),
            _ => {}
        }
    }
    (brute_reaches(cmp, value, &starts, &adds), contrib)
}

/// The oracle's edges, from the rules in docs/safety.md; `None` if some wait cannot reach its
/// value from 0 with all the sets and non-zero adds of its signal.
fn oracle_edges(s: &Spec) -> Option<Vec<(usize, usize)>> {
    let n = s.tasks.len();
    let hard = hard_edges(s);
    let after = closure(n, &hard);
    let mut edges = hard;
    for (w, (_, k)) in s.tasks.iter().enumerate() {
        if let Kind::Wait { sig, cmp, value } = *k {
            let producers: Vec<usize> = (0..n)
                .filter(|&p| match s.tasks[p].1 {
                    Kind::Set { sig: ps, .. } => ps == sig,
                    Kind::Add { sig: ps, value } => ps == sig && value != 0,
                    _ => false,
                })
                .collect();
            let before: Vec<usize> = producers
                .iter()
                .copied()
                .filter(|&p| !after[w][p])
                .collect();
            let from = match brute_assess(s, &before, cmp, value) {
                (true, c) => c,
                _ => match brute_assess(s, &producers, cmp, value) {
                    (true, c) => c,
                    _ => return None,
                },
            };
            edges.extend(from.into_iter().map(|p| (p, w)));
        }
    }
    Some(edges)
}

fn closure(n: usize, edges: &[(usize, usize)]) -> Vec<Vec<bool>> {
    let mut r = vec![vec![false; n]; n];
    for &(a, b) in edges {
        r[a][b] = true;
    }
    for k in 0..n {
        let via = r[k].clone();
        for row in r.iter_mut().filter(|row| row[k]) {
            for (cell, &reach) in row.iter_mut().zip(&via) {
                *cell |= reach;
            }
        }
    }
    r
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Finding 6: with adds and `>=` waits only, a graph the checker accepts completes in every
    /// schedule (no wait is left short of its value), and an `UnmatchedWait` never completes.
    #[test]
    fn finding_06_accepted_add_only_graphs_complete_in_every_schedule(
        lanes in 1usize..4,
        tasks in prop::collection::vec((0usize..3, 0usize..2, any::<bool>(), 0u64..4), 1..12),
        deps in prop::collection::vec((0usize..12, 0usize..12), 0..4),
        picks in prop::collection::vec(any::<usize>(), 1..8),
    ) {
        let tasks: Vec<(usize, Kind)> = tasks
            .into_iter()
            .map(|(l, sig, is_wait, v)| {
                let k = if is_wait {
                    Kind::Wait { sig, cmp: Cmp::Geq, value: v }
                } else {
                    Kind::Add { sig, value: v }
                };
                (l % lanes, k)
            })
            .collect();
        let n = tasks.len();
        let deps = deps.into_iter().map(|(a, b)| (a % n, b % n)).filter(|(a, b)| a < b).collect();
        let s = Spec { lanes, signals: 2, tasks, deps };
        match build(&s).check() {
            Ok(_) => prop_assert!(simulate(&s, &picks), "accepted graph hangs: {s:?}"),
            Err(Error::UnmatchedWait { .. }) => prop_assert!(!simulate(&s, &picks), "{s:?}"),
            Err(Error::Cycle { .. }) => {}
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    #[test]
    fn checker_agrees_with_the_oracle(s in spec()) {
        let g = build(&s);
        let n = s.tasks.len();
        let result = g.check();
        let Some(edges) = oracle_edges(&s) else {
            prop_assert!(matches!(result, Err(Error::UnmatchedWait { .. })), "{:?}", result.err());
            return Ok(());
        };
        let reach = closure(n, &edges);
        let cyclic = (0..n).any(|i| reach[i][i]);
        match result {
            Err(Error::Cycle { tasks, path }) => {
                prop_assert!(cyclic, "acyclic graph rejected: {path}");
                prop_assert!(tasks.len() >= 2, "{path}");
                for k in 0..tasks.len() {
                    let (a, b) = (tasks[k], tasks[(k + 1) % tasks.len()]);
                    prop_assert!(edges.contains(&(a, b)), "named cycle uses a non-edge {a}->{b}: {path}");
                }
            }
            Ok(plan) => {
                prop_assert!(!cyclic, "cyclic graph accepted");
                let mut pos = vec![usize::MAX; n];
                for (p, t) in plan.order().iter().enumerate() {
                    prop_assert_eq!(pos[t.index()], usize::MAX, "task twice in order");
                    pos[t.index()] = p;
                }
                prop_assert!(pos.iter().all(|&p| p != usize::MAX), "task missing from order");
                for &(a, b) in &edges {
                    prop_assert!(pos[a] < pos[b], "order puts {b} before its predecessor {a}");
                }
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
        }
    }

    /// Graphs built so that every edge points forward in insertion order (sets of a signal before
    /// its waits, dependencies forward) are accepted; adding the reverse of one dependency is then
    /// always rejected as a cycle.
    #[test]
    fn forward_graphs_pass_and_a_back_edge_is_a_cycle(
        lanes in 1usize..5,
        picks in prop::collection::vec((0usize..4, 0usize..3, 0u8..4), 2..16),
        dep_picks in prop::collection::vec((0usize..16, 0usize..16), 1..8),
    ) {
        let mut s = Spec { lanes, signals: 3, tasks: Vec::new(), deps: Vec::new() };
        let mut set_seen = [false; 3];
        let mut wait_seen = [false; 3];
        for (lane, sig, what) in picks {
            let lane = lane % lanes;
            let k = match what {
                1 if !wait_seen[sig] => { set_seen[sig] = true; Kind::Set { sig, value: 1 } }
                2 if set_seen[sig] => { wait_seen[sig] = true; Kind::Wait { sig, cmp: Cmp::Geq, value: 1 } }
                _ => Kind::Work,
            };
            s.tasks.push((lane, k));
        }
        let n = s.tasks.len();
        s.deps = dep_picks
            .into_iter()
            .map(|(a, b)| (a % n, b % n))
            .filter(|(a, b)| a < b)
            .collect();
        prop_assert!(build(&s).check().is_ok());
        if let Some(&(a, b)) = s.deps.first() {
            s.deps.push((b, a));
            let rejected = matches!(build(&s).check(), Err(Error::Cycle { .. }));
            prop_assert!(rejected);
        }
    }
}

#[test]
fn cmp_follows_the_driver_rules() {
    assert!(Cmp::Eq.holds(3, 3) && !Cmp::Eq.holds(4, 3));
    assert!(Cmp::Geq.holds(4, 3) && !Cmp::Geq.holds(2, 3));
    assert!(Cmp::And.holds(0b110, 0b010) && !Cmp::And.holds(0b100, 0b010));
    assert!(Cmp::Nor.holds(0, 1) && !Cmp::Nor.holds(u64::MAX, 0));
    for (c, v) in [(Cmp::Eq, 5), (Cmp::Geq, 9), (Cmp::And, 4), (Cmp::Nor, 7)] {
        let s = c.satisfying_value(v).unwrap();
        assert!(c.holds(s, v), "{c:?} {v}: {s}");
    }
    assert_eq!(Cmp::And.satisfying_value(0), None);
}

#[test]
fn the_seeds_same_stream_exchange_is_rejected_naming_its_cycle() {
    // Third seed, both kernels of a PE in one stream, wait first: PE0 [wait m0, notify m1],
    // PE1 [wait m1, notify m0]. Each wait needs the other PE's notify, queued behind its wait.
    let mut g = TaskGraph::new();
    let (p0, p1) = (g.lane("pe0"), g.lane("pe1"));
    let (m0, m1) = (g.signal("to_pe0"), g.signal("to_pe1"));
    g.wait(p0, "pe0 wait", m0, Cmp::Geq, 1).unwrap();
    g.set(p0, "pe0 notify", m1, 1).unwrap();
    g.wait(p1, "pe1 wait", m1, Cmp::Geq, 1).unwrap();
    g.set(p1, "pe1 notify", m0, 1).unwrap();
    match g.check() {
        Err(Error::Cycle { tasks, path }) => {
            assert_eq!(tasks.len(), 4, "{path}");
            for name in ["pe0 wait", "pe0 notify", "pe1 wait", "pe1 notify"] {
                assert!(path.contains(name), "{path}");
            }
        }
        other => panic!(
            "expected a cycle, got {:?}",
            other.map(|p| p.order().to_vec())
        ),
    }
}
