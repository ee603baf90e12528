//! A fixed-depth producer/consumer pipeline over shared-memory stages, after CUTLASS's
//! `PipelineAsync` (sm90_pipeline.hpp): per stage a "full" mbarrier (producer -> consumer) and an
//! "empty" mbarrier (consumer -> producer), and a [`PipelineState`] of stage index plus phase bit
//! that flips each time the stage index wraps (mbarrier phases: PTX ISA 8.0 §9.7.13.15).
//!
//! Protocol, for each item: the producer `producer_acquire`s (waits until the consumers released
//! the stage), fills it, `producer_commit`s; the consumer `consumer_wait`s, reads,
//! `consumer_release`s. Both sides then `advance` their own state. Each role owns its arrivals, so
//! no role ever waits on a barrier that another role's collective operation must complete (the
//! mistake that hangs the chapter's listing on the H100).

use super::cp_async;
use super::mbarrier::Mbarrier;
use crate::MBARRIER_BYTES;

/// Position of one role in the pipeline: which stage it is at and the parity of that stage's
/// current phase. Invariant: `stage() < STAGES`, `phase()` is 0 or 1; only [`Self::advance`]
/// moves it, so a state always names a stage of its pipeline.
#[derive(Clone, Copy)]
pub struct PipelineState<const STAGES: u32> {
    stage: u32,
    phase: u32,
}

impl<const STAGES: u32> PipelineState<STAGES> {
    /// Stage 0, phase 0: the start for producers and consumers alike. `STAGES` must be at least 1
    /// (checked at compile time).
    #[inline(always)]
    pub const fn new() -> Self {
        const { assert!(STAGES >= 1, "a pipeline needs at least one stage") };
        Self { stage: 0, phase: 0 }
    }

    /// Stage index, `0..STAGES`.
    #[inline(always)]
    pub const fn stage(self) -> u32 {
        self.stage
    }

    /// Phase parity (0 or 1) of the barriers of [`Self::stage`] that this role waits for next.
    #[inline(always)]
    pub const fn phase(self) -> u32 {
        self.phase
    }

    /// Moves to the next stage; flips the phase when the stage index wraps.
    #[inline(always)]
    pub fn advance(&mut self) {
        self.stage += 1;
        if self.stage == STAGES {
            self.stage = 0;
            self.phase ^= 1;
        }
    }
}

impl<const STAGES: u32> Default for PipelineState<STAGES> {
    fn default() -> Self {
        Self::new()
    }
}

/// `STAGES` full barriers followed by `STAGES` empty barriers, [`Self::BYTES`] = `2 * STAGES * 8`
/// bytes of shared memory starting at an 8-byte aligned shared-window address.
#[derive(Clone, Copy)]
pub struct Pipeline<const STAGES: u32> {
    base: u32,
}

impl<const STAGES: u32> Pipeline<STAGES> {
    /// Shared-memory bytes the barriers take.
    pub const BYTES: u32 = 2 * STAGES * MBARRIER_BYTES as u32;

    /// The pipeline whose barriers start at shared-window address `base`.
    ///
    /// # Safety
    /// For as long as the returned pipeline (or a copy) is used:
    /// - `base` is 8-byte aligned and `base..base + Self::BYTES` lies inside this CTA's shared
    ///   memory, used for nothing but these barriers;
    /// - every operation other than [`Self::init`] happens after one thread ran [`Self::init`] and
    ///   published it ([`super::mbarrier::fence_init`], then a CTA or cluster barrier);
    /// - the roles keep to the protocol the counts given to `init` describe: per stage and phase,
    ///   exactly `producer_arrivals` producer commits and `consumer_arrivals` consumer releases
    ///   (local or remote), each role walking the stages in order with its own
    ///   [`PipelineState`] (see [`Mbarrier::at`]: more arrivals than the count is undefined
    ///   behaviour).
    #[inline(always)]
    pub const unsafe fn at(base: u32) -> Self {
        Self { base }
    }

    /// Initialises the barriers: each full barrier expects `producer_arrivals` per phase and each
    /// empty barrier `consumer_arrivals`.
    ///
    /// # Safety
    /// As [`Mbarrier::init`] for every barrier of the pipeline: both counts in `1..2^20`, called by
    /// one thread while no other thread uses the pipeline, followed by
    /// [`super::mbarrier::fence_init`] and a CTA (or cluster) barrier before any other use.
    #[inline(always)]
    pub unsafe fn init(self, producer_arrivals: u32, consumer_arrivals: u32) {
        let mut s = 0;
        while s < STAGES {
            // SAFETY: the barriers of stage s lie inside the pipeline's region (contract of `at`);
            // the caller upholds `Mbarrier::init`'s contract.
            unsafe {
                self.barrier(s).init(producer_arrivals);
                self.barrier(STAGES + s).init(consumer_arrivals);
            }
            s += 1;
        }
    }

    /// Barrier `i` (`i < 2 * STAGES`) of the pipeline's region.
    #[inline(always)]
    const fn barrier(self, i: u32) -> Mbarrier {
        // SAFETY: callers pass i < 2 * STAGES, so the barrier lies inside the region that the
        // contract of `Pipeline::at` vouches for (aligned, initialised before use, protocol kept).
        unsafe { Mbarrier::at(self.base + i * MBARRIER_BYTES as u32) }
    }

    /// The "stage is filled" barrier of `state`'s stage.
    #[inline(always)]
    pub const fn full(self, state: PipelineState<STAGES>) -> Mbarrier {
        self.barrier(state.stage)
    }

    /// The "stage is free" barrier of `state`'s stage.
    #[inline(always)]
    pub const fn empty(self, state: PipelineState<STAGES>) -> Mbarrier {
        self.barrier(STAGES + state.stage)
    }

    /// Producer: waits until the consumers released `state`'s stage (passes at once the first time
    /// round: the fresh barrier's "previous" phase, parity 1, counts as complete).
    #[inline(always)]
    pub fn producer_acquire(self, state: PipelineState<STAGES>) {
        self.empty(state).wait_parity(state.phase ^ 1);
    }

    /// Producer: this thread's writes to `state`'s stage are done (one arrival per producer
    /// thread).
    #[inline(always)]
    pub fn producer_commit(self, state: PipelineState<STAGES>) {
        self.full(state).arrive();
    }

    /// Producer: this thread's `cp.async` copies into `state`'s stage count as its commit once they
    /// complete (one arrival per producer thread, without blocking it; PTX ISA §9.7.9.25.3.1,
    /// `cp.async.mbarrier.arrive.noinc`).
    #[inline(always)]
    pub fn producer_commit_cp_async(self, state: PipelineState<STAGES>) {
        // SAFETY: the full barrier is an initialised barrier of this CTA whose init count includes
        // one arrival per producer thread and phase (contract of `Pipeline::at`); this is this
        // thread's one commit of the phase.
        unsafe { cp_async::arrive_on(self.full(state)) };
    }

    /// Consumer: waits until `state`'s stage is filled.
    #[inline(always)]
    pub fn consumer_wait(self, state: PipelineState<STAGES>) {
        self.full(state).wait_parity(state.phase);
    }

    /// Consumer: this thread is done reading `state`'s stage (one arrival per consumer thread).
    #[inline(always)]
    pub fn consumer_release(self, state: PipelineState<STAGES>) {
        self.empty(state).arrive();
    }
}
