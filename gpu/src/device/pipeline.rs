//! A fixed-depth producer/consumer pipeline over shared-memory stages, after CUTLASS's
//! `PipelineAsync` (sm90_pipeline.hpp): per stage a "full" mbarrier (producer -> consumer) and an
//! "empty" mbarrier (consumer -> producer), and a [`PipelineState`] of stage index plus phase bit
//! that flips each time the stage index wraps.
//!
//! Protocol, for each item: the producer `producer_acquire`s (waits until the consumers released
//! the stage), fills it, `producer_commit`s; the consumer `consumer_wait`s, reads,
//! `consumer_release`s. Both sides then `advance` their own state. Each role owns its arrivals, so
//! no role ever waits on a barrier that another role's collective operation must complete (the
//! mistake that hangs the chapter's listing on the H100).

use super::cp_async;
use super::mbarrier::Mbarrier;
use crate::contract::MBARRIER_BYTES;

/// Position of one role in the pipeline: which stage it is at and the parity of that stage's
/// current phase.
#[derive(Clone, Copy)]
pub struct PipelineState<const STAGES: u32> {
    /// Stage index, `0..STAGES`.
    pub stage: u32,
    /// Phase parity of the barriers of `stage` that this role waits for next.
    pub phase: u32,
}

impl<const STAGES: u32> PipelineState<STAGES> {
    /// Stage 0, phase 0: the start for producers and consumers alike.
    #[inline(always)]
    pub const fn new() -> Self {
        Self { stage: 0, phase: 0 }
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

/// `STAGES` full barriers followed by `STAGES` empty barriers, `2 * STAGES * 8` bytes of shared
/// memory starting at an 8-byte aligned shared-window address.
#[derive(Clone, Copy)]
pub struct Pipeline<const STAGES: u32> {
    base: u32,
}

impl<const STAGES: u32> Pipeline<STAGES> {
    /// Shared-memory bytes the barriers take.
    pub const BYTES: u32 = 2 * STAGES * MBARRIER_BYTES as u32;

    /// The pipeline whose barriers start at shared-window address `base`.
    #[inline(always)]
    pub const fn at(base: u32) -> Self {
        Self { base }
    }

    /// Initialises the barriers: each full barrier expects `producer_arrivals` per phase and each
    /// empty barrier `consumer_arrivals`.
    ///
    /// # Safety
    /// Called by one thread, before any use, followed by [`super::mbarrier::fence_init`] and a CTA
    /// barrier.
    #[inline(always)]
    pub unsafe fn init(self, producer_arrivals: u32, consumer_arrivals: u32) {
        let mut s = 0;
        while s < STAGES {
            self.full(s).init(producer_arrivals);
            self.empty(s).init(consumer_arrivals);
            s += 1;
        }
    }

    /// The "stage is filled" barrier of `stage`.
    #[inline(always)]
    pub const fn full(self, stage: u32) -> Mbarrier {
        Mbarrier::at(self.base + stage * MBARRIER_BYTES as u32)
    }

    /// The "stage is free" barrier of `stage`.
    #[inline(always)]
    pub const fn empty(self, stage: u32) -> Mbarrier {
        Mbarrier::at(self.base + (STAGES + stage) * MBARRIER_BYTES as u32)
    }

    /// Producer: waits until the consumers released `state.stage` (passes at once the first time
    /// round: the fresh barrier's "previous" phase, parity 1, counts as complete).
    #[inline(always)]
    pub fn producer_acquire(self, state: PipelineState<STAGES>) {
        self.empty(state.stage).wait_parity(state.phase ^ 1);
    }

    /// Producer: this thread's writes to `state.stage` are done (one arrival per producer thread).
    #[inline(always)]
    pub fn producer_commit(self, state: PipelineState<STAGES>) {
        self.full(state.stage).arrive();
    }

    /// Producer: this thread's `cp.async` copies into `state.stage` count as its commit once they
    /// complete (one arrival per producer thread, without blocking it).
    #[inline(always)]
    pub fn producer_commit_cp_async(self, state: PipelineState<STAGES>) {
        cp_async::arrive_on(self.full(state.stage));
    }

    /// Consumer: waits until `state.stage` is filled.
    #[inline(always)]
    pub fn consumer_wait(self, state: PipelineState<STAGES>) {
        self.full(state.stage).wait_parity(state.phase);
    }

    /// Consumer: this thread is done reading `state.stage` (one arrival per consumer thread).
    #[inline(always)]
    pub fn consumer_release(self, state: PipelineState<STAGES>) {
        self.empty(state.stage).arrive();
    }
}
