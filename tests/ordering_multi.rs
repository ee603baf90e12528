//! Cross-GPU ordering (issue 13): cycle rejection across GPUs (CPU, runs in CI) and the seed
//! scenarios on two GPUs (skip without them; `WARPLINE_REQUIRE_GPUS=2` makes the skip a failure).

use std::time::Duration;

use warpline::multi::seeds::{cyclic_graph, opposite_order_graph, run_seeds};
use warpline::ordering::{Cmp, EdgeKind, MultiTaskGraph};
use warpline::Error;
use warpline_suite::support::two_gpus_or_skip;

fn full_peer() -> Vec<Vec<bool>> {
    vec![vec![true; 2]; 2]
}

#[test]
fn cyclic_dependency_between_gpus_is_rejected_before_enqueue() {
    let g = cyclic_graph().unwrap();
    match g.check(&full_peer()) {
        Err(Error::Cycle { tasks, path }) => {
            assert_eq!(tasks.len(), 4, "{path}");
            assert!(path.contains("GPU 0") && path.contains("GPU 1"), "{path}");
            assert!(
                path.contains("signal set->wait") && path.contains("stream order"),
                "{path}"
            );
        }
        other => panic!("expected a cycle, got {other:?}"),
    }
}

#[test]
fn opposite_order_signals_across_gpus_are_planned_producer_first() {
    let g = opposite_order_graph(0).unwrap();
    let plan = g.check(&full_peer()).unwrap();
    let pos = |label: &str| {
        plan.order()
            .iter()
            .position(|t| g.graph().label(*t).unwrap() == label)
            .unwrap()
    };
    assert!(pos("set s1") < pos("wait s1"));
    assert!(pos("set s0") < pos("wait s0"));
    assert!(plan.edges().iter().any(|e| e.kind == EdgeKind::Signal));
}

#[test]
fn a_signal_on_a_gpu_without_peer_access_is_a_typed_error() {
    let mut g = MultiTaskGraph::new();
    let l0 = g.lane("a", 0);
    let l1 = g.lane("b", 1);
    let s = g.signal("s", 1);
    g.set(l0, "set", s, 1).unwrap();
    g.wait(l1, "wait", s, Cmp::Geq, 1).unwrap();
    let no_peer = vec![vec![true, false], vec![false, true]];
    assert!(matches!(
        g.check(&no_peer),
        Err(Error::PeerAccessUnavailable { from: 0, to: 1, .. })
    ));
    assert!(g.check(&full_peer()).is_ok());
    assert!(matches!(
        g.check(&[vec![true]]),
        Err(Error::BadShape { .. })
    ));
}

#[test]
fn cycle_through_three_gpus_and_an_explicit_dependency_is_rejected() {
    let mut g = MultiTaskGraph::new();
    let l: Vec<_> = (0..3).map(|i| g.lane(format!("l{i}"), i)).collect();
    let s01 = g.signal("0->1", 1);
    let s12 = g.signal("1->2", 2);
    let w0 = g.set(l[0], "0 sets", s01, 1).unwrap();
    g.wait(l[1], "1 waits", s01, Cmp::Geq, 1).unwrap();
    g.set(l[1], "1 sets", s12, 1).unwrap();
    let w2 = g.wait(l[2], "2 waits", s12, Cmp::Geq, 1).unwrap();
    let peer = vec![vec![true; 3]; 3];
    assert!(g.check(&peer).is_ok());
    g.depend(w2, w0).unwrap(); // GPU 0's set now waits for GPU 2's wait: a cycle
    assert!(matches!(g.check(&peer), Err(Error::Cycle { .. })));
}

#[test]
fn seed_scenarios_on_two_gpus_200_of_200() {
    let Some(set) = two_gpus_or_skip("seed_scenarios_on_two_gpus_200_of_200") else {
        return;
    };
    let r = run_seeds(&set, 200, Duration::from_secs(5)).unwrap();
    assert_eq!(r.completed, 200);
    assert!(r.cyclic_rejected.contains("cycle"), "{}", r.cyclic_rejected);
}
