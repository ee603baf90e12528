//! Seeded programs of safe warpline calls: the [`Op`]s each fuzz thread runs, and their
//! generation from a seed (pure CPU, deterministic: the same seed, op count and thread count give
//! the same [`Program`] on every machine).
//!
//! Generation keeps a [`ThreadModel`] of the thread's state so that most ops are valid (reads of
//! live buffers, adds of float buffers on one stream); a share of them are invalid on purpose
//! (wrong lengths, wrong streams, grid 0, misaligned views, waits that never fire, graphs that
//! `check` must refuse), and the model says which typed error each must return. Any op is
//! meaningful in any state (an op on an empty slot is skipped), so the minimiser may drop ops
//! freely.

use crate::ordering::Cmp;
use crate::rng::{rng_for, StdRng};

use super::model::{Caps, ThreadModel};

// The ops and programs themselves live in `ops.rs`, below `model.rs` (which simulates them) and
// this file (which generates them with the model), so that the two do not import each other;
// re-exported here, their public path.
pub use super::ops::{
    Elem, GTask, GraphClass, GraphMode, GraphSpec, ModuleAction, Op, Program, TicketAction,
    GRAPH_SLOTS, MAX_GEMM_DIM, MAX_LEN, MAX_PIPELINE_ELEMS, SLOTS, STREAMS,
};

/// The program of `seed`: `threads` threads of `ops` ops each (`ops` split as evenly as
/// possible, every thread at least one op when `ops >= threads`).
pub fn generate(seed: u64, ops: usize, threads: usize) -> Program {
    let threads = threads.max(1);
    Program {
        seed,
        threads: (0..threads)
            .map(|t| {
                let n = ops / threads + usize::from(t < ops % threads);
                generate_thread(seed, t, n)
            })
            .collect(),
    }
}

/// Signal waits that never fire are generated in programs of any thread count: releasing one
/// (`synchronize_timeout`, `OnTimeout::Release`) makes driver calls, which on the H100 once
/// blocked behind another thread's synchronous copy queued behind the pending wait; host copies
/// now poll instead (`memory::staging`, issue 19).
fn generate_thread(seed: u64, t: usize, n: usize) -> Vec<Op> {
    let mut rng = rng_for(seed, 0xF022, t as u64);
    // The generator's view: every feature present (the executor's model knows the device).
    let mut model = ThreadModel::new(Caps::all());
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        let op = gen_op(&mut rng, &model);
        model.step(&op);
        ops.push(op);
    }
    ops
}

/// Weighted op kinds: (weight, kind index).
const WEIGHTS: [(u32, u8); 23] = [
    (12, 0), // alloc
    (4, 1),  // free
    (6, 2),  // fill
    (8, 3),  // upload
    (12, 4), // read
    (3, 5),  // view
    (5, 6),  // copy d2d
    (3, 7),  // move
    (12, 8), // vector add
    (2, 9),  // pipeline
    (4, 10), // chain
    (3, 11), // fence
    (2, 12), // signal set
    (2, 13), // signal add
    (2, 14), // signal wait
    (1, 15), // signal read
    (4, 16), // graph
    (2, 17), // capture
    (3, 18), // replay
    (1, 19), // drop captured
    (1, 20), // tc gemm
    (1, 21), // trace
    (2, 22), // module / sync
];

fn pick<T: Copy>(rng: &mut StdRng, items: &[T]) -> Option<T> {
    if items.is_empty() {
        None
    } else {
        Some(items[rng.random_range(0..items.len())])
    }
}

fn slot_any(rng: &mut StdRng) -> u8 {
    rng.random_range(0..SLOTS)
}

fn stream_any(rng: &mut StdRng) -> u8 {
    rng.random_range(0..STREAMS)
}

/// A live slot of `elem` (any live slot when `None`), else any slot.
fn slot_of(rng: &mut StdRng, model: &ThreadModel, elem: Option<Elem>) -> u8 {
    let live: Vec<u8> = (0..SLOTS)
        .filter(|&s| {
            model
                .buf(s)
                .is_some_and(|b| elem.is_none_or(|e| b.elem == e))
        })
        .collect();
    pick(rng, &live).unwrap_or_else(|| slot_any(rng))
}

fn gen_op(rng: &mut StdRng, model: &ThreadModel) -> Op {
    let total: u32 = WEIGHTS.iter().map(|w| w.0).sum();
    let mut r = rng.random_range(0..total);
    let mut kind = 0;
    for (w, k) in WEIGHTS {
        if r < w {
            kind = k;
            break;
        }
        r -= w;
    }
    match kind {
        0 => {
            let elem = if rng.random_bool(0.6) {
                Elem::F32
            } else {
                Elem::U32
            };
            let len = if rng.random_bool(0.02) {
                0
            } else if rng.random_bool(0.5) {
                rng.random_range(1..=64)
            } else {
                rng.random_range(1..=MAX_LEN)
            };
            Op::Alloc {
                slot: slot_any(rng),
                elem,
                len,
                stream: stream_any(rng),
            }
        }
        1 => Op::Free {
            slot: slot_of(rng, model, None),
        },
        2 => Op::Fill {
            slot: slot_of(rng, model, None),
            value: rng.random_range(0..=2000u32) as i32 - 1000,
        },
        3 => Op::Upload {
            slot: slot_of(rng, model, None),
            seed: rng.random(),
            extra: if rng.random_bool(0.05) {
                if rng.random_bool(0.5) {
                    1
                } else {
                    -1
                }
            } else {
                0
            },
        },
        4 => Op::Read {
            slot: slot_of(rng, model, None),
        },
        5 => {
            let slot = slot_of(rng, model, None);
            let len = model.buf(slot).map_or(16, |b| b.data.len() as u32);
            let start = rng.random_range(0..=len + 2);
            let end = rng.random_range(0..=len + 2);
            Op::View { slot, start, end }
        }
        6 => {
            let elem = if rng.random_bool(0.5) {
                Elem::F32
            } else {
                Elem::U32
            };
            Op::CopyD2D {
                dst: slot_of(rng, model, Some(elem)),
                src: slot_of(rng, model, Some(elem)),
            }
        }
        7 => Op::Move {
            slot: slot_of(rng, model, None),
            stream: stream_any(rng),
        },
        8 => gen_vector_add(rng, model),
        9 => {
            let n = rng.random_range(1..=MAX_PIPELINE_ELEMS);
            let batch_elems = if rng.random_bool(0.05) {
                0
            } else {
                rng.random_range(1..=n.min(2048))
            };
            Op::Pipeline {
                streams: rng.random_range(1..=4u8),
                n,
                batch_elems,
                c_extra: if rng.random_bool(0.05) { 1 } else { 0 },
                seed: rng.random(),
            }
        }
        10 => {
            let slot = slot_of(rng, model, Some(Elem::U32));
            let on = model.buf(slot).map(|b| b.stream);
            let stream = match on {
                Some(s) if rng.random_bool(0.9) => s,
                _ => stream_any(rng),
            };
            Op::Chain {
                slot,
                stream,
                steps: rng.random_range(1..=8u8),
                grid: if rng.random_bool(0.05) {
                    0
                } else {
                    rng.random_range(1..=4u32)
                },
                pdl: rng.random_bool(0.5),
                replays: rng.random_range(0..=3u8),
            }
        }
        11 => {
            let action = match rng.random_range(0..20u32) {
                0..=6 => TicketAction::Submit,
                7..=9 => TicketAction::SubmitElsewhere,
                10..=14 => TicketAction::Drop,
                15..=16 => TicketAction::SubmitErr,
                17..=18 => TicketAction::SubmitPanic,
                _ => TicketAction::Forget,
            };
            Op::Fence {
                stream: stream_any(rng),
                action,
            }
        }
        12 => Op::SignalSet {
            stream: stream_any(rng),
            value: rng.random_range(0..=100u64),
        },
        13 => Op::SignalAdd {
            stream: stream_any(rng),
            value: rng.random_range(0..=10u64),
        },
        14 => {
            let v = model.signal();
            // Mostly waits that fire; one in ten never fires (released on timeout; see
            // generate_thread).
            let (cmp, value) = if rng.random_bool(0.9) {
                match rng.random_range(0..3u32) {
                    0 => (Cmp::Geq, rng.random_range(0..=v)),
                    1 => (Cmp::Eq, v),
                    _ => (Cmp::Nor, 0),
                }
            } else {
                (Cmp::Geq, v + rng.random_range(1..=5u64))
            };
            Op::SignalWait {
                stream: stream_any(rng),
                cmp,
                value,
            }
        }
        15 => Op::SignalRead,
        16 => Op::Graph {
            spec: gen_graph(rng),
            mode: match rng.random_range(0..4u32) {
                0 => GraphMode::CheckOnly,
                1 => GraphMode::RunCaptured,
                _ => GraphMode::Enqueue,
            },
        },
        17 => {
            let mut spec = gen_graph(rng);
            if rng.random_bool(0.8) {
                spec = valid_graph(rng);
            }
            Op::Capture {
                gslot: rng.random_range(0..GRAPH_SLOTS),
                spec,
            }
        }
        18 => Op::Replay {
            gslot: rng.random_range(0..GRAPH_SLOTS),
            wait: rng.random_bool(0.6),
        },
        19 => Op::DropCaptured {
            gslot: rng.random_range(0..GRAPH_SLOTS),
        },
        20 => {
            let m = rng.random_range(1..=MAX_GEMM_DIM);
            let n = rng.random_range(1..=MAX_GEMM_DIM / 8) * 8;
            let k = rng.random_range(1..=MAX_GEMM_DIM / 8) * 8;
            Op::TcGemm {
                m,
                n,
                k,
                stream: stream_any(rng),
                seed: rng.random(),
                bad_pitch: rng.random_bool(0.1),
                fresh: rng.random_bool(0.1),
            }
        }
        21 => Op::Trace {
            install: rng.random_bool(0.5),
        },
        _ => {
            if rng.random_bool(0.5) {
                Op::Sync {
                    stream: stream_any(rng),
                }
            } else {
                Op::Module(match rng.random_range(0..10u32) {
                    0..=3 => ModuleAction::Load,
                    4 => ModuleAction::LoadNul,
                    5 => ModuleAction::LoadGarbage,
                    6..=7 => ModuleAction::Kernel {
                        missing: rng.random_bool(0.3),
                    },
                    _ => ModuleAction::Drop,
                })
            }
        }
    }
}

fn gen_vector_add(rng: &mut StdRng, model: &ThreadModel) -> Op {
    let a = slot_of(rng, model, Some(Elem::F32));
    let b = if rng.random_bool(0.2) {
        a
    } else {
        slot_of(rng, model, Some(Elem::F32))
    };
    let c = slot_of(rng, model, Some(Elem::F32));
    let min_len = [a, b, c]
        .iter()
        .map(|&s| model.buf(s).map_or(0, |b| b.data.len() as u32))
        .min()
        .unwrap_or(0);
    let stream = match model.buf(a) {
        Some(buf) if rng.random_bool(0.9) => buf.stream,
        _ => stream_any(rng),
    };
    // Offsets in whole 16-byte vectors, except 5% misaligned ones.
    let mut off = if min_len > 4 && rng.random_bool(0.3) {
        rng.random_range(0..min_len / 4) * 4
    } else {
        0
    };
    if rng.random_bool(0.05) {
        off += 1;
    }
    let room = min_len.saturating_sub(off);
    let len = if rng.random_bool(0.03) {
        room + 1 // out of range
    } else if rng.random_bool(0.03) || room == 0 {
        0
    } else {
        rng.random_range(1..=room)
    };
    let c_len = if rng.random_bool(0.04) && len > 1 {
        len - 1
    } else {
        len
    };
    let grid = match rng.random_range(0..20u32) {
        0 => Some(0),
        1..=4 => Some(rng.random_range(1..=3u32)),
        _ => None,
    };
    Op::VectorAdd {
        a,
        b,
        c,
        off,
        len,
        c_len,
        grid,
        stream,
    }
}

/// A random graph: valid four times in five, else one of the refused classes.
pub(crate) fn gen_graph(rng: &mut StdRng) -> GraphSpec {
    if rng.random_bool(0.8) {
        return valid_graph(rng);
    }
    let class = match rng.random_range(0..6u32) {
        0 => GraphClass::Unreachable,
        1 => GraphClass::ProducerAfterWait,
        2 => GraphClass::Cycle,
        3 => GraphClass::Overwritten,
        4 => GraphClass::OverwrittenEq,
        _ => GraphClass::WrappingAdd,
    };
    refused_graph(rng, class)
}

/// A graph whose waits fire in every interleaving: per signal either exactly one set (waits `==`
/// or `>=` its value, each ordered after it), or only adds of 1..=5 (each wait `>=` the sum of
/// the adds it is ordered after), every producer of a signal created before its first wait;
/// host and kernel tasks anywhere; extra dependencies only from
/// earlier to later tasks (acyclic). One graph in twenty has a kernel closure that fails.
pub(crate) fn valid_graph(rng: &mut StdRng) -> GraphSpec {
    let lanes = rng.random_range(1..=STREAMS);
    let signals = rng.random_range(1..=2u8);
    // Per signal: Some(set value) for set-once signals, None for add signals.
    let set_once: Vec<Option<u64>> = (0..signals)
        .map(|_| rng.random_bool(0.3).then(|| rng.random_range(1..=50u64)))
        .collect();
    let mut set_done: Vec<Option<u16>> = vec![None; signals as usize];
    let mut adds: Vec<Vec<(u16, u64)>> = vec![Vec::new(); signals as usize];
    // Once a signal has a waiter it gets no more producers: `check` draws an edge from every
    // producer to every wait it could help, so a later producer would close a cycle.
    let mut waited = vec![false; signals as usize];
    let mut tasks = Vec::new();
    let mut deps = Vec::new();
    let n = rng.random_range(1..=12usize);
    let fail_at = rng.random_bool(0.05).then(|| rng.random_range(0..n));
    for i in 0..n {
        let id = tasks.len() as u16;
        let lane = rng.random_range(0..lanes);
        if fail_at == Some(i) {
            tasks.push(GTask::Kernel { lane, fail: true });
            continue;
        }
        let sig = rng.random_range(0..signals);
        let s = sig as usize;
        match rng.random_range(0..10u32) {
            0..=2 => match set_once[s] {
                Some(v) if set_done[s].is_none() => {
                    tasks.push(GTask::Set {
                        lane,
                        sig,
                        value: v,
                    });
                    set_done[s] = Some(id);
                }
                Some(_) => tasks.push(GTask::Host { lane }),
                None if waited[s] => tasks.push(GTask::Host { lane }),
                None => {
                    let value = rng.random_range(1..=5u64);
                    tasks.push(GTask::Add { lane, sig, value });
                    adds[s].push((id, value));
                }
            },
            3..=5 => match set_once[s] {
                Some(v) => match set_done[s] {
                    Some(p) => {
                        let cmp = if rng.random_bool(0.5) {
                            Cmp::Eq
                        } else {
                            Cmp::Geq
                        };
                        tasks.push(GTask::Wait {
                            lane,
                            sig,
                            cmp,
                            value: v,
                        });
                        deps.push((p, id));
                        waited[s] = true;
                    }
                    None => tasks.push(GTask::Host { lane }),
                },
                None => {
                    // Ordered after a random subset of the adds so far.
                    let mut value = 0;
                    for &(p, v) in &adds[s] {
                        if rng.random_bool(0.6) {
                            value += v;
                            deps.push((p, id));
                        }
                    }
                    tasks.push(GTask::Wait {
                        lane,
                        sig,
                        cmp: Cmp::Geq,
                        value,
                    });
                    waited[s] = true;
                }
            },
            6..=7 => tasks.push(GTask::Host { lane }),
            _ => tasks.push(GTask::Kernel { lane, fail: false }),
        }
    }
    // A few extra forward dependencies.
    let len = tasks.len() as u16;
    if len >= 2 {
        for _ in 0..rng.random_range(0..=3u32) {
            let a = rng.random_range(0..len - 1);
            let b = rng.random_range(a + 1..len);
            deps.push((a, b));
        }
    }
    GraphSpec {
        lanes,
        signals,
        tasks,
        deps,
        class: GraphClass::Valid,
    }
}

/// A small graph of `class` (which must refuse), with a host task or two as noise.
pub(crate) fn refused_graph(rng: &mut StdRng, class: GraphClass) -> GraphSpec {
    let lanes = rng.random_range(2..=STREAMS);
    let other = rng.random_range(1..lanes);
    let mut tasks = Vec::new();
    let mut deps = Vec::new();
    if rng.random_bool(0.5) {
        tasks.push(GTask::Host { lane: other });
    }
    let base = tasks.len() as u16;
    let wait = |cmp, value| GTask::Wait {
        lane: other,
        sig: 0,
        cmp,
        value,
    };
    match class {
        GraphClass::Valid => return valid_graph(rng),
        GraphClass::Unreachable => {
            tasks.push(wait(Cmp::Geq, rng.random_range(1..=9u64)));
        }
        GraphClass::ProducerAfterWait => {
            let v = rng.random_range(1..=9u64);
            tasks.push(GTask::Wait {
                lane: 0,
                sig: 0,
                cmp: Cmp::Geq,
                value: v,
            });
            tasks.push(GTask::Add {
                lane: 0,
                sig: 0,
                value: v,
            });
        }
        GraphClass::Cycle => {
            tasks.push(GTask::Host { lane: 0 });
            tasks.push(GTask::Host { lane: other });
            deps.push((base, base + 1));
            deps.push((base + 1, base));
        }
        // Two sets on lane 0, then a wait ordered after the second that only the first satisfies.
        GraphClass::Overwritten | GraphClass::OverwrittenEq => {
            let (second, cmp) = if class == GraphClass::Overwritten {
                (0, Cmp::Geq)
            } else {
                (7, Cmp::Eq)
            };
            for value in [5, second] {
                tasks.push(GTask::Set {
                    lane: 0,
                    sig: 0,
                    value,
                });
            }
            tasks.push(wait(cmp, 5));
            deps.push((base + 1, base + 2));
        }
        GraphClass::WrappingAdd => {
            // One lane, or spread over two lanes ordered by dependencies.
            let spread = rng.random_bool(0.5);
            let l = |i: u8| if spread { i % 2 } else { 0 };
            for (i, value) in [1u64, u64::MAX, 1].into_iter().enumerate() {
                tasks.push(GTask::Add {
                    lane: l(i as u8),
                    sig: 0,
                    value,
                });
                if i > 0 && spread {
                    deps.push((base + i as u16 - 1, base + i as u16));
                }
            }
            tasks.push(wait(Cmp::Geq, 2));
            deps.push((base + 2, base + 3));
        }
    }
    if rng.random_bool(0.5) {
        tasks.push(GTask::Host { lane: 0 });
    }
    GraphSpec {
        lanes,
        signals: 1,
        tasks,
        deps,
        class,
    }
}
