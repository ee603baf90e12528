//! CPU tests of the fuzzer: generation, the model, the judge, the graph classes (against an
//! interleaving simulator and `TaskGraph::check`), the option checks. No GPU.

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use proptest::prelude::*;

use super::exec::{build_graph, error_kind, judge, FailKind, Obs};
use super::model::{kinds, Caps, Expect, Step, ThreadModel};
use super::program::{
    gen_graph, generate, refused_graph, valid_graph, Elem, GTask, GraphClass, GraphSpec, Op,
    TicketAction,
};
use super::{without, FuzzOptions};
use crate::ordering::Cmp;
use crate::rng::rng_for;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The same seed gives the same program; op counts add up; indices stay in range.
    #[test]
    fn issue19_fuzz_generation_is_reproducible(seed in any::<u64>(), ops in 1usize..300, threads in 1usize..5) {
        let p = generate(seed, ops, threads);
        prop_assert_eq!(&p, &generate(seed, ops, threads));
        prop_assert_eq!(p.len(), ops);
        prop_assert_eq!(p.threads.len(), threads);
        for t in &p.threads {
            prop_assert!(t.len() >= ops / threads && t.len() <= ops / threads + 1);
        }
    }

    /// The model is a function of the ops: two models fed the same program agree step by step,
    /// and every read it predicts has the buffer's length.
    #[test]
    fn issue19_fuzz_model_is_deterministic(seed in any::<u64>()) {
        let p = generate(seed, 200, 2);
        for ops in &p.threads {
            let (mut m1, mut m2) = (ThreadModel::new(Caps::all()), ThreadModel::new(Caps::all()));
            for op in ops {
                let (s1, s2) = (m1.step(op), m2.step(op));
                prop_assert_eq!(&s1, &s2);
                if let (Op::Read { slot }, Some((_, data))) = (op, &s1.data) {
                    prop_assert_eq!(Some(data.len()), m1.buf(*slot).map(|b| b.data.len()));
                }
            }
        }
    }

    /// Dropping any ops leaves a program the model still handles (what the minimiser relies on).
    #[test]
    fn issue19_fuzz_model_takes_any_sub_program(seed in any::<u64>(), from in 0usize..100, len in 0usize..100) {
        let p = without(&generate(seed, 100, 2), from, from + len);
        prop_assert_eq!(p.len(), 100 - len.min(100 - from.min(100)));
        for ops in &p.threads {
            let mut m = ThreadModel::new(Caps::all());
            for op in ops {
                let _ = m.step(op);
            }
        }
    }
}

/// Generated programs are mostly valid calls, with expected errors of several kinds among them.
#[test]
fn issue19_fuzz_programs_mix_valid_and_invalid_calls() {
    let (mut run, mut skip, mut errs) = (0, 0, HashSet::new());
    let mut refused = 0;
    for seed in 0..200 {
        for ops in generate(seed, 200, 3).threads {
            let mut m = ThreadModel::new(Caps::all());
            for op in &ops {
                match m.step(op).expect {
                    Expect::Skip => skip += 1,
                    Expect::Err(k) => {
                        run += 1;
                        errs.extend(k.iter().copied());
                    }
                    Expect::Refused => {
                        run += 1;
                        refused += 1;
                    }
                    _ => run += 1,
                }
            }
        }
    }
    assert!(run > 2 * skip, "{run} ops run, {skip} skipped");
    for k in [
        kinds::EMPTY,
        kinds::LENGTH,
        kinds::WRONG_STREAM,
        kinds::BAD_SHAPE,
        kinds::MISALIGNED,
        kinds::PITCH,
        kinds::PTX_NUL,
        kinds::MISSING_KERNEL,
        kinds::OWN,
    ] {
        assert!(errs.contains(k), "no expected {k} in 200 seeds: {errs:?}");
    }
    assert!(refused > 50, "{refused} refused graphs");
}

fn step(m: &mut ThreadModel, op: Op) -> Step {
    m.step(&op)
}

/// The model's rules, op by op: fills and uploads define every element, vector_add checks in
/// the launcher's order and adds exactly, chains add steps x runs, waits that cannot fire are
/// released with the satisfying value.
#[test]
fn issue19_fuzz_model_follows_the_api_rules() {
    let mut m = ThreadModel::new(Caps::all());
    let alloc = |slot, elem, len, stream| Op::Alloc {
        slot,
        elem,
        len,
        stream,
    };
    assert_eq!(
        step(&mut m, alloc(0, Elem::F32, 0, 0)).expect,
        Expect::Err(&[kinds::EMPTY])
    );
    for (slot, stream) in [(0, 0), (1, 0), (2, 0), (3, 1)] {
        assert_eq!(
            step(&mut m, alloc(slot, Elem::F32, 16, stream)).expect,
            Expect::Ok
        );
    }
    step(&mut m, Op::Fill { slot: 0, value: 3 });
    step(&mut m, Op::Fill { slot: 1, value: -5 });
    let va = |c, off, len, c_len, grid, stream| Op::VectorAdd {
        a: 0,
        b: 1,
        c,
        off,
        len,
        c_len,
        grid,
        stream,
    };
    let e = |s: Step| s.expect;
    assert_eq!(
        e(step(&mut m, va(2, 0, 17, 17, None, 0))),
        Expect::Err(&[kinds::LENGTH])
    );
    assert_eq!(
        e(step(&mut m, va(2, 0, 8, 8, Some(0), 0))),
        Expect::Err(&[kinds::BAD_SHAPE])
    );
    assert_eq!(
        e(step(&mut m, va(2, 0, 8, 7, None, 0))),
        Expect::Err(&[kinds::LENGTH])
    );
    assert_eq!(
        e(step(&mut m, va(2, 0, 0, 0, None, 0))),
        Expect::Err(&[kinds::EMPTY])
    );
    assert_eq!(
        e(step(&mut m, va(2, 1, 8, 8, None, 0))),
        Expect::Err(&[kinds::MISALIGNED])
    );
    assert_eq!(
        e(step(&mut m, va(3, 0, 8, 8, None, 0))),
        Expect::Err(&[kinds::WRONG_STREAM])
    );
    assert_eq!(
        e(step(&mut m, va(0, 0, 8, 8, None, 0))),
        Expect::Skip,
        "c aliases a"
    );
    assert_eq!(e(step(&mut m, va(2, 4, 8, 8, Some(2), 0))), Expect::Ok);
    let r = step(&mut m, Op::Read { slot: 2 });
    let (elem, data) = r.data.unwrap();
    assert_eq!(elem, Elem::F32);
    for (i, v) in data.iter().enumerate() {
        let want = (4..12).contains(&i).then(|| (-2f32).to_bits());
        assert_eq!(*v, want, "element {i}");
    }
    // Chains: u32 only, on the buffer's stream, steps x max(replays, 1).
    step(&mut m, alloc(4, Elem::U32, 8, 2));
    step(&mut m, Op::Fill { slot: 4, value: -1 });
    let chain = |stream, grid, replays| Op::Chain {
        slot: 4,
        stream,
        steps: 3,
        grid,
        pdl: true,
        replays,
    };
    assert_eq!(
        e(step(&mut m, chain(1, 1, 0))),
        Expect::Err(&[kinds::WRONG_STREAM])
    );
    assert_eq!(
        e(step(&mut m, chain(2, 0, 0))),
        Expect::Err(&[kinds::BAD_SHAPE])
    );
    assert_eq!(e(step(&mut m, chain(2, 1, 2))), Expect::Ok);
    let data = step(&mut m, Op::Read { slot: 4 }).data.unwrap().1;
    assert!(data.iter().all(|v| *v == Some(5)), "{data:?}");
    // Copies: same length and stream.
    assert_eq!(
        e(step(&mut m, Op::CopyD2D { dst: 2, src: 3 })),
        Expect::Err(&[kinds::WRONG_STREAM])
    );
    step(&mut m, Op::Move { slot: 3, stream: 0 });
    assert_eq!(e(step(&mut m, Op::CopyD2D { dst: 3, src: 2 })), Expect::Ok);
    assert_eq!(
        step(&mut m, Op::Read { slot: 3 }).data.unwrap().1,
        data_of(&mut m, 2)
    );
    // Signals.
    step(
        &mut m,
        Op::SignalSet {
            stream: 0,
            value: 7,
        },
    );
    step(
        &mut m,
        Op::SignalAdd {
            stream: 1,
            value: 2,
        },
    );
    assert_eq!(step(&mut m, Op::SignalRead).signal, Some(9));
    let wait = |cmp, value| Op::SignalWait {
        stream: 0,
        cmp,
        value,
    };
    assert_eq!(e(step(&mut m, wait(Cmp::Geq, 9))), Expect::Ok);
    assert_eq!(e(step(&mut m, wait(Cmp::Geq, 12))), Expect::Released);
    assert_eq!(m.signal(), 12, "the release writes the satisfying value");
    // Fence tickets.
    let fence = |action| Op::Fence { stream: 0, action };
    assert_eq!(
        e(step(&mut m, fence(TicketAction::Forget))),
        Expect::Released
    );
    assert_eq!(
        e(step(&mut m, fence(TicketAction::SubmitPanic))),
        Expect::Panic
    );
    assert_eq!(
        e(step(&mut m, fence(TicketAction::SubmitErr))),
        Expect::Err(&[kinds::OWN])
    );
    // Without the features: expected errors or skips, never a call that cannot work.
    let mut bare = ThreadModel::new(Caps {
        tc_gemm: false,
        pdl: false,
        signals: false,
    });
    let gemm = Op::TcGemm {
        m: 8,
        n: 8,
        k: 8,
        stream: 0,
        seed: 1,
        bad_pitch: false,
        fresh: false,
    };
    assert_eq!(e(step(&mut bare, gemm)), Expect::Err(&[kinds::SM90A]));
    assert_eq!(e(step(&mut bare, Op::SignalRead)), Expect::Skip);
    step(&mut bare, alloc(0, Elem::U32, 4, 0));
    assert_eq!(
        e(step(
            &mut bare,
            Op::Chain {
                slot: 0,
                stream: 0,
                steps: 1,
                grid: 1,
                pdl: true,
                replays: 0
            }
        )),
        Expect::Err(&[kinds::PDL])
    );
}

fn data_of(m: &mut ThreadModel, slot: u8) -> Vec<Option<u32>> {
    m.step(&Op::Read { slot }).data.unwrap().1
}

/// The judge: expected errors count by kind, anything else is a failure of the right class.
#[test]
fn issue19_fuzz_judge_classifies_outcomes() {
    let op = Op::Sync { stream: 0 };
    let st = |expect| Step {
        expect,
        data: None,
        signal: None,
        host_runs: None,
        kernel_calls: None,
    };
    let err = |k: &str| Obs::Err(k.into(), "message".into());
    assert_eq!(judge(&op, &st(Expect::Ok), &Obs::Ok), Ok(None));
    assert_eq!(
        judge(&op, &st(Expect::Err(&[kinds::LENGTH])), &err(kinds::LENGTH)),
        Ok(Some(kinds::LENGTH.into()))
    );
    let class = |e, o: &Obs| judge(&op, &st(e), o).unwrap_err().0;
    assert_eq!(
        class(Expect::Err(&[kinds::LENGTH]), &Obs::Ok),
        FailKind::MissingError
    );
    assert_eq!(
        class(Expect::Err(&[kinds::LENGTH]), &err(kinds::EMPTY)),
        FailKind::UnexpectedError
    );
    assert_eq!(
        class(Expect::Ok, &err(kinds::CUDA)),
        FailKind::UnexpectedError
    );
    assert_eq!(class(Expect::Refused, &Obs::Ok), FailKind::MissingError);
    assert_eq!(
        judge(&op, &st(Expect::Refused), &err("Cycle")),
        Ok(Some("Cycle".into()))
    );
    assert_eq!(
        class(Expect::Ok, &Obs::Wrong("x".into())),
        FailKind::WrongResult
    );
    assert_eq!(class(Expect::Ok, &Obs::Hang("t".into())), FailKind::Hang);
    assert_eq!(
        class(Expect::Released, &Obs::Hang("t".into())),
        FailKind::Hang
    );
    assert_eq!(class(Expect::Released, &Obs::Ok), FailKind::MissingError);
    assert_eq!(
        class(Expect::Ok, &Obs::Panic("boom".into())),
        FailKind::Panic
    );
    assert_eq!(class(Expect::Panic, &Obs::Ok), FailKind::Panic);
    let expected = Obs::Panic(super::exec::EXPECTED_PANIC.into());
    assert_eq!(judge(&op, &st(Expect::Panic), &expected), Ok(None));
    assert_eq!(
        judge(
            &op,
            &st(Expect::OkOr(&[kinds::WAIT_PENDING])),
            &err(kinds::WAIT_PENDING)
        ),
        Ok(Some(kinds::WAIT_PENDING.into()))
    );
    assert_eq!(
        error_kind(&crate::Error::Empty { what: "x" }),
        kinds::EMPTY,
        "kinds are variant names"
    );
}

/// Brute-force interleavings of a graph (lanes in program order, explicit dependencies, waits
/// that block until their condition holds, wrapping adds, overwriting sets): how many of `tries`
/// random schedules ran every task.
fn completed_schedules(spec: &GraphSpec, tries: u64) -> u64 {
    let n = spec.tasks.len();
    let lane_of = |t: &GTask| match *t {
        GTask::Set { lane, .. }
        | GTask::Add { lane, .. }
        | GTask::Wait { lane, .. }
        | GTask::Host { lane }
        | GTask::Kernel { lane, .. } => lane,
    };
    let mut ok = 0;
    for k in 0..tries {
        let mut rng = rng_for(k, 0x5C4E, n as u64);
        let mut done = vec![false; n];
        let mut sig = vec![0u64; spec.signals as usize];
        loop {
            let ready: Vec<usize> = (0..n)
                .filter(|&i| {
                    !done[i]
                        && (0..i)
                            .all(|j| done[j] || lane_of(&spec.tasks[j]) != lane_of(&spec.tasks[i]))
                        && spec
                            .deps
                            .iter()
                            .all(|&(a, b)| b as usize != i || done[a as usize])
                        && match spec.tasks[i] {
                            GTask::Wait {
                                sig: s, cmp, value, ..
                            } => cmp.holds(sig[s as usize], value),
                            _ => true,
                        }
                })
                .collect();
            if ready.is_empty() {
                break;
            }
            let i = ready[rng.random_range(0..ready.len())];
            match spec.tasks[i] {
                GTask::Set { sig: s, value, .. } => sig[s as usize] = value,
                GTask::Add { sig: s, value, .. } => {
                    sig[s as usize] = sig[s as usize].wrapping_add(value)
                }
                _ => {}
            }
            done[i] = true;
        }
        if done.iter().all(|&d| d) {
            ok += 1;
        }
    }
    ok
}

/// Graphs generated valid complete in every simulated interleaving; the refused classes never
/// do (their wait never fires, or they hold a cycle).
#[test]
fn issue19_fuzz_graph_classes_agree_with_an_interleaving_simulator() {
    for seed in 0..300u64 {
        let mut rng = rng_for(seed, 0x6EA, 0);
        let g = valid_graph(&mut rng);
        assert_eq!(
            completed_schedules(&g, 30),
            30,
            "valid graph of seed {seed}: {g:?}"
        );
        for class in [
            GraphClass::Unreachable,
            GraphClass::ProducerAfterWait,
            GraphClass::Cycle,
            GraphClass::Overwritten,
            GraphClass::OverwrittenEq,
            GraphClass::WrappingAdd,
        ] {
            let g = refused_graph(&mut rng, class);
            assert_eq!(g.class, class);
            assert_eq!(
                completed_schedules(&g, 30),
                0,
                "{class:?} graph of seed {seed}: {g:?}"
            );
        }
    }
}

fn checked(spec: &GraphSpec) -> crate::Result<()> {
    let (h, c) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    build_graph(spec, &h, &c)?.check().map(|_| ())
}

/// `TaskGraph::check` (pure CPU) accepts every generated valid graph and refuses the cycles and
/// the waits nothing can satisfy, as the fuzzer expects on the GPU.
#[test]
fn issue19_fuzz_check_accepts_valid_and_refuses_unreachable_graphs() {
    for seed in 0..500u64 {
        let mut rng = rng_for(seed, 0xC4EC, 0);
        let g = gen_graph(&mut rng);
        if g.class == GraphClass::Valid {
            checked(&g).unwrap_or_else(|e| panic!("seed {seed}: {e}\n{g:?}"));
        } else if !g.class.is_item7() {
            assert!(checked(&g).is_err(), "seed {seed}: {g:?} accepted");
        }
    }
}

/// Item 7's waits (overwritten sets, wrapping adds) must be refused too; the fuzzer counts an
/// accepted one as a failure (without enqueueing it).
#[test]
fn issue19_fuzz_check_refuses_item7_waits() {
    for seed in 0..100u64 {
        let mut rng = rng_for(seed, 0x17E7, 0);
        for class in [
            GraphClass::Overwritten,
            GraphClass::OverwrittenEq,
            GraphClass::WrappingAdd,
        ] {
            let g = refused_graph(&mut rng, class);
            assert!(checked(&g).is_err(), "seed {seed}: {g:?} accepted");
        }
    }
}

/// Flags out of range are refused before any device work, naming the flag.
#[test]
fn issue19_fuzz_options_are_checked() {
    assert!(FuzzOptions::default().validate().is_ok());
    let bad = [
        FuzzOptions {
            seeds: 0,
            ..Default::default()
        },
        FuzzOptions {
            ops: 0,
            ..Default::default()
        },
        FuzzOptions {
            threads: 0,
            ..Default::default()
        },
        FuzzOptions {
            threads: 99,
            ..Default::default()
        },
        FuzzOptions {
            start_seed: u64::MAX,
            seeds: 2,
            ..Default::default()
        },
        FuzzOptions {
            bound: std::time::Duration::ZERO,
            ..Default::default()
        },
    ];
    for (o, flag) in bad.iter().zip([
        "--seeds",
        "--ops",
        "--threads",
        "--threads",
        "--start-seed",
        "--bound-ms",
    ]) {
        let e = o.validate().unwrap_err().to_string();
        assert!(e.contains(flag), "{e}");
    }
}

/// The minimiser keeps exactly the ops a failure needs, across threads.
#[test]
fn issue19_fuzz_ddmin_finds_the_ops_a_failure_needs() {
    let p = generate(11, 120, 3);
    let (a, b) = (p.threads[0][17].clone(), p.threads[2][5].clone());
    let needs = |q: &super::Program| {
        q.threads[0].contains(&a) && q.threads.get(2).is_some_and(|t| t.contains(&b))
    };
    assert!(needs(&p));
    let (min, calls) = super::ddmin(&p, |q| Some(needs(q)));
    assert!(needs(&min));
    assert!(
        min.len() <= 2 + p.threads[0].iter().filter(|o| **o == a).count(),
        "{}",
        min.listing()
    );
    assert!(calls < 400, "{calls} calls");
    // A budget that runs out keeps what was found so far.
    let mut left = 3;
    let (partial, _) = super::ddmin(&p, |q| {
        left -= 1;
        (left > 0).then(|| needs(q))
    });
    assert!(needs(&partial));
}

/// The module ops' PTX has the one entry they look up (what `Device::load_module` registers).
#[test]
fn issue19_fuzz_module_ptx_has_its_entry() {
    let entries = crate::device::ptx_entries(super::exec::FUZZ_PTX);
    assert_eq!(entries, [super::exec::FUZZ_ENTRY]);
    assert!(crate::device::check_ptx_text(super::exec::FUZZ_PTX).is_ok());
}

/// A closure's panic reaches the judge with its message (the first H100 run saw "a panic with a
/// non-string payload" for every expected panic: the box, not the payload, was downcast).
#[test]
fn issue19_fuzz_caught_panics_keep_their_message() {
    use super::exec::{caught, Obs, EXPECTED_PANIC};
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let formatted = caught(|| panic!("{EXPECTED_PANIC}"));
    let literal = caught(|| panic!("a literal"));
    std::panic::set_hook(quiet);
    assert_eq!(formatted, Obs::Panic(EXPECTED_PANIC.into()));
    assert_eq!(literal, Obs::Panic("a literal".into()));
    assert_eq!(caught(|| Obs::Ok), Obs::Ok);
}

/// The summary line ends with the first failure (seed, thread, op, class, detail), so that the
/// last line of a run's log says what failed (session 10 lost one to a log filter); without a
/// failure it is unchanged.
#[test]
fn summary_line_names_the_first_failure() {
    let program = generate(7, 10, 1);
    let mut rep = super::FuzzReport {
        device: "test".into(),
        caps: Caps {
            tc_gemm: false,
            pdl: false,
            signals: false,
        },
        notes: Vec::new(),
        options: FuzzOptions::default(),
        seeds_run: 1,
        ops: 10,
        skipped: 0,
        errors: Default::default(),
        failures_by_kind: Default::default(),
        failed_seeds: Vec::new(),
        failures: Vec::new(),
        stopped_early: false,
        time: std::time::Duration::ZERO,
    };
    let clean = rep.summary();
    assert!(clean.contains("failures: 0 (none)"), "{clean}");
    assert!(!clean.contains("first:"), "{clean}");
    rep.failed_seeds.push(7);
    rep.failures_by_kind.insert("unexpected_error", 1);
    rep.failures.push(super::Failure {
        seed: 7,
        thread: 0,
        index: 3,
        op: "graph",
        kind: FailKind::UnexpectedError,
        detail: "expected Ok, got Cuda: capture invalidated".into(),
        program,
        minimized: false,
        minimize_note: None,
    });
    let s = rep.summary();
    assert!(
        s.ends_with(
            "; first: seed 7 thread 0 op 3 (graph): unexpected_error: expected Ok, got Cuda: capture invalidated"
        ),
        "{s}"
    );
}
