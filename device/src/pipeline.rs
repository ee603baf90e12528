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

/// The TMA-transaction pipeline, after CUTLASS's `PipelineTmaAsync` (sm90_pipeline.hpp): per stage
/// a "full" mbarrier completed by one producer arrival plus the bytes the TMA copies into the
/// stage (expect-tx), and an "empty" mbarrier completed by one release per consumer (warpgroup,
/// warp or thread: the init count says which) *of every CTA that writes into the stage* — with
/// cluster multicast, a producer fills the same stage of every CTA of its mask, so it must wait
/// until all of them released it.
///
/// Verbs (one set for both roles): [`Self::producer_acquire`] (wait for the empty barrier, arm the
/// full barrier's transaction bytes; the TMA copies then complete on the returned barrier),
/// [`Self::producer_tail`] (before exit: wait until every stage was released, so no remote
/// release lands on an exited CTA), [`Self::consumer_wait`], [`Self::consumer_release`]. The
/// producer starts at [`PipelineState::new`] waiting on parity 1 of the empty barriers, which
/// passes at once on fresh barriers ("producer start state").
///
/// **One CTA, no cluster.** A kernel launched without cluster dimensions uses the pipeline as it
/// is: every CTA is then a cluster of one (PTX ISA 8.3 §2.2.1; `%cluster_nctarank` is 1), the TMA
/// copies' `.shared::cluster` destinations name this CTA's own shared memory, and no cluster
/// barrier is needed. The recipe: [`Self::init_cta`] (thread 0 runs [`Self::init`] with the
/// consumer count of this CTA alone, e.g. one release per consumer warpgroup, then
/// [`fence_init`](super::mbarrier::fence_init); then [`super::thread::sync_threads`], not
/// `cluster::sync_cluster`, publishes the barriers); consumers release with
/// [`Self::consumer_release_local`] (a plain `mbarrier.arrive` on this CTA's barrier, no `mapa`);
/// [`Self::producer_tail`] is not needed, since no other CTA can arrive on this CTA's barriers
/// (the consumers wait for every stage they read, so no copy is in flight when the CTA exits).
/// `gpu/src/kernels/batched_gemm.rs` is a kernel built this way.
#[derive(Clone, Copy)]
pub struct TmaPipeline<const STAGES: u32> {
    base: u32,
}

impl<const STAGES: u32> TmaPipeline<STAGES> {
    /// Shared-memory bytes the barriers take: `STAGES` full then `STAGES` empty barriers.
    pub const BYTES: u32 = 2 * STAGES * MBARRIER_BYTES as u32;

    /// The pipeline whose barriers start at shared-window address `base`.
    ///
    /// # Safety
    /// As [`Pipeline::at`], with this protocol: per stage and phase, one
    /// [`Self::producer_acquire`] in this CTA arming exactly the bytes that the TMA copies then
    /// write into this CTA's stage (from this CTA or, multicast, from others), and exactly the
    /// `consumer_arrivals` given to [`Self::init`] releases, from this CTA's and the other
    /// writing CTAs' consumers together. Barrier initialisation is published to the whole cluster
    /// (`fence_init` then a cluster barrier) before any CTA uses the pipeline; for a launch
    /// without clusters (a cluster of one), `fence_init` then a CTA barrier (`bar.sync`).
    #[inline(always)]
    pub const unsafe fn at(base: u32) -> Self {
        Self { base }
    }

    /// Initialises the barriers: full barriers expect 1 arrival (the producer's) plus
    /// transaction bytes, empty barriers `consumer_arrivals` releases per phase.
    ///
    /// # Safety
    /// As [`Pipeline::init`] (`consumer_arrivals` in `1..2^20`).
    #[inline(always)]
    pub unsafe fn init(self, consumer_arrivals: u32) {
        let mut s = 0;
        while s < STAGES {
            // SAFETY: the barriers of stage s lie inside the region (contract of `at`); the caller
            // upholds `Mbarrier::init`'s contract.
            unsafe {
                self.barrier(s).init(1);
                self.barrier(STAGES + s).init(consumer_arrivals);
            }
            s += 1;
        }
    }

    /// The one-CTA setup in one call: thread 0 of the CTA runs [`Self::init`]`(consumer_arrivals)`
    /// and [`fence_init`](super::mbarrier::fence_init), then the whole CTA meets at
    /// `barrier.sync 0` ([`super::thread::sync_threads`]), which publishes the barriers.
    ///
    /// # Safety
    /// Every thread of the CTA calls it once, convergently (it contains `bar.sync`), before any
    /// other use of the pipeline; no other CTA uses this pipeline (a launch without clusters, or
    /// a cluster whose CTAs never multicast into or release on each other's stages);
    /// `consumer_arrivals` in `1..2^20` is the number of releases per stage and phase.
    #[inline(always)]
    pub unsafe fn init_cta(self, consumer_arrivals: u32) {
        if super::thread::thread_idx_x() == 0 {
            // SAFETY: one thread, before any use (contract above); published below.
            unsafe { self.init(consumer_arrivals) };
            super::mbarrier::fence_init();
        }
        // SAFETY: every thread of the CTA, convergently (contract above).
        unsafe { super::thread::sync_threads() };
    }

    #[inline(always)]
    const fn barrier(self, i: u32) -> Mbarrier {
        // SAFETY: callers pass i < 2 * STAGES: a barrier of the region vouched for by `at`.
        unsafe { Mbarrier::at(self.base + i * MBARRIER_BYTES as u32) }
    }

    /// The "stage is filled" barrier of `state`'s stage: the TMA copies into the stage complete
    /// on it.
    #[inline(always)]
    pub const fn full(self, state: PipelineState<STAGES>) -> Mbarrier {
        self.barrier(state.stage)
    }

    /// The "stage is free" barrier of `state`'s stage.
    #[inline(always)]
    pub const fn empty(self, state: PipelineState<STAGES>) -> Mbarrier {
        self.barrier(STAGES + state.stage)
    }

    /// Producer (one thread): waits until every consumer of every writing CTA released `state`'s
    /// stage, then arms its full barrier with this phase's producer arrival and `tx_bytes` (every
    /// byte that lands in *this* CTA's stage, multicast copies from other CTAs included). Returns
    /// the full barrier, for the TMA copies to complete on.
    #[inline(always)]
    pub fn producer_acquire(self, state: PipelineState<STAGES>, tx_bytes: u32) -> Mbarrier {
        self.empty(state).wait_parity(state.phase ^ 1);
        let full = self.full(state);
        full.arrive_expect_tx(tx_bytes);
        full
    }

    /// Producer, after its last [`Self::producer_acquire`] (with the state advanced past it):
    /// waits until the consumers released every stage, i.e. until no consumer of any CTA can
    /// still arrive on this CTA's barriers or read a stage this producer filled.
    #[inline(always)]
    pub fn producer_tail(self, mut state: PipelineState<STAGES>) {
        let mut s = 0;
        while s < STAGES {
            self.empty(state).wait_parity(state.phase ^ 1);
            state.advance();
            s += 1;
        }
    }

    /// Consumer: waits until `state`'s stage is filled (producer arrival and every byte landed).
    #[inline(always)]
    pub fn consumer_wait(self, state: PipelineState<STAGES>) {
        self.full(state).wait_parity(state.phase);
    }

    /// Consumer: one release of `state`'s stage on this CTA's own empty barrier
    /// (`mbarrier.arrive.shared::cta.b64`, PTX ISA 8.3 §9.7.13.15.13), for pipelines that only
    /// this CTA writes into (no multicast from other CTAs; in particular every launch without
    /// clusters). The consumer's reads of the stage must be complete (for wgmma: after the
    /// `wait_group` that covers them); the count is one of those given to [`Self::init`], as the
    /// contract of [`Self::at`] requires.
    #[inline(always)]
    pub fn consumer_release_local(self, state: PipelineState<STAGES>) {
        self.empty(state).arrive();
    }

    /// Consumer: one release of `state`'s stage on the empty barrier of CTA `rank` of the cluster
    /// (this CTA too, as its own rank). A consumer releases once per writing CTA, e.g. thread `r`
    /// of each consumer warpgroup releases on rank `r` for `r < cluster_size()`.
    ///
    /// # Safety
    /// `rank` is a live CTA of this cluster that multicast into this stage (or this CTA); this
    /// release is one of the counts given to its [`Self::init`] for the phase, and that CTA does
    /// not exit before the release lands (its producer runs [`Self::producer_tail`], or a cluster
    /// barrier precedes any exit). The consumer's reads of the stage are complete (for wgmma:
    /// after the `wait_group` that covers them).
    #[inline(always)]
    pub unsafe fn consumer_release(self, state: PipelineState<STAGES>, rank: u32) {
        let remote = super::cluster::map_shared_rank(self.empty(state).addr(), rank);
        // Default (CTA-scope release) arrival, as CUTLASS's pipelines release stages: a
        // cluster-scope release costs a MEMBAR.ALL.GPU per call (measured: the tensor-core GEMM's
        // consumers stalled on it every k-block).
        // SAFETY: the caller's contract above is `remote_arrive_cta`'s.
        unsafe { super::cluster::remote_arrive_cta(remote) };
    }
}
