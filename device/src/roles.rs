//! A warp-specialized kernel skeleton, after ThunderKittens' `prototype/lcsf` template: a kernel
//! is a struct of role hooks ([`WarpSpecialized::load`], [`compute`](WarpSpecialized::compute),
//! [`store`](WarpSpecialized::store), [`finish`](WarpSpecialized::finish)) and [`run`] owns
//! everything between them: the mbarriers of the stage rings, their initialisation, the init
//! fence and the CTA barrier, the dispatch of each warp to its role, the persistent loop over work
//! items, and the stage/phase bookkeeping (`producer_acquire`/`commit`,
//! `consumer_wait`/`release` of [`super::pipeline`]).
//!
//! ```text
//!   warps [0, P)          [P, P + C)             [P + C, P + C + S)
//!   producers  --load ring-->  consumers  --store ring-->  storers      (STAGES stages each)
//!   load(item)                 compute(item)               store(item)
//!                              finish() after the last item
//! ```
//!
//! The pieces:
//! - [`Roles`]: how many warps each role has; the CTA is `32 * (P + C + S)` threads, 1-D;
//! - [`SmemAlloc`] / [`Layout`]: the dynamic shared-memory layout, built in a `const` so its
//!   offsets, alignment and total (at most [`SMEM_BUDGET`]) are checked at compile time; it
//!   reserves the rings' barriers itself and hands out typed tokens ([`StageBuf`], [`Array`]) that
//!   role code resolves to [`Tile`]s: no raw shared addresses in role code;
//! - [`Stage`]: a token for the stage a hook may touch, made only by [`run`], between the
//!   acquire/wait and the commit/release of that stage.
//!
//! Work items: CTA `b` takes items `b, b + gridDim.x, ...` below [`WarpSpecialized::items`], and
//! every role walks the same sequence, so any grid size works (a persistent grid of
//! `CTAs per SM x SMs` is the usual choice). Each item takes one stage of each ring.
//!
//! The layout types, [`Roles`] and [`RoleThread`] compile on the host too (a host can read a
//! kernel's [`Layout::bytes`] and [`Roles::threads`] for its launch); [`run`] and the tile
//! accessors are device-only.

use core::marker::PhantomData;

use crate::{MBARRIER_BYTES, WARP_SIZE};

/// Dynamic shared memory a CTA can have on sm_90: 227 KiB (232,448 bytes; the 228 KiB of an SM
/// less the 1 KiB the system reserves per CTA).
pub const SMEM_BUDGET: u32 = 227 * 1024;

/// Alignment of every region [`SmemAlloc`] hands out (and so of every stage): 128 bytes, enough
/// for `cp.async` (16), vector loads (16) and bulk copies (16; 128 for TMA tiles).
pub const REGION_ALIGN: u32 = 128;

/// Largest number of stages of a ring.
pub const MAX_STAGES: u32 = 16;

/// A warp's role in a warp-specialized CTA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Fills stages of the load ring ([`WarpSpecialized::load`]).
    Producer,
    /// Reads stages of the load ring, fills stages of the store ring
    /// ([`WarpSpecialized::compute`], then [`WarpSpecialized::finish`]).
    Consumer,
    /// Drains stages of the store ring ([`WarpSpecialized::store`]).
    Storer,
}

/// Warps per role: producers are warps `[0, P)`, consumers `[P, P + C)`, storers
/// `[P + C, P + C + S)`. At least one producer and one consumer warp; at most 1024 threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Roles {
    producer_warps: u32,
    consumer_warps: u32,
    storer_warps: u32,
}

impl Roles {
    /// `producer_warps` producers and `consumer_warps` consumers, no storers (consumers write
    /// their results themselves). Both at least 1 (checked at compile time in a `const`).
    pub const fn new(producer_warps: u32, consumer_warps: u32) -> Self {
        assert!(
            producer_warps >= 1 && consumer_warps >= 1,
            "a role has no warps"
        );
        let r = Self {
            producer_warps,
            consumer_warps,
            storer_warps: 0,
        };
        assert!(r.threads() <= 1024, "more than 1024 threads per CTA");
        r
    }

    /// The same roles plus `storer_warps` storers (0 removes them).
    pub const fn with_storers(self, storer_warps: u32) -> Self {
        let r = Self {
            storer_warps,
            ..self
        };
        assert!(r.threads() <= 1024, "more than 1024 threads per CTA");
        r
    }

    /// Warps of `role`.
    pub const fn warps_of(self, role: Role) -> u32 {
        match role {
            Role::Producer => self.producer_warps,
            Role::Consumer => self.consumer_warps,
            Role::Storer => self.storer_warps,
        }
    }

    /// Threads of `role` (`32 * warps_of(role)`): the arrivals per stage and phase it gives.
    pub const fn threads_of(self, role: Role) -> u32 {
        WARP_SIZE * self.warps_of(role)
    }

    /// First warp of `role`.
    pub const fn first_warp(self, role: Role) -> u32 {
        match role {
            Role::Producer => 0,
            Role::Consumer => self.producer_warps,
            Role::Storer => self.producer_warps + self.consumer_warps,
        }
    }

    /// Warps per CTA.
    pub const fn warps(self) -> u32 {
        self.producer_warps + self.consumer_warps + self.storer_warps
    }

    /// Threads per CTA: the block size of the launch.
    pub const fn threads(self) -> u32 {
        WARP_SIZE * self.warps()
    }

    /// Whether there is a store ring (storer warps).
    pub const fn has_storers(self) -> bool {
        self.storer_warps > 0
    }

    /// The role of warp `warp` of the CTA, `None` past the last warp.
    pub const fn role(self, warp: u32) -> Option<Role> {
        if warp < self.producer_warps {
            Some(Role::Producer)
        } else if warp < self.producer_warps + self.consumer_warps {
            Some(Role::Consumer)
        } else if warp < self.warps() {
            Some(Role::Storer)
        } else {
            None
        }
    }
}

/// The calling thread as its role sees it: its warp and thread index within the role.
#[derive(Clone, Copy, Debug)]
pub struct RoleThread {
    role: Role,
    warp: u32,
    lane: u32,
    warps: u32,
}

impl RoleThread {
    /// Thread `lane` of warp `warp` (counted from the role's first warp) of a role of `warps`
    /// warps.
    pub const fn new(role: Role, warp: u32, lane: u32, warps: u32) -> Self {
        Self {
            role,
            warp,
            lane,
            warps,
        }
    }
    /// The role.
    pub const fn role(self) -> Role {
        self.role
    }
    /// Warp within the role, `0..warps()`.
    pub const fn warp(self) -> u32 {
        self.warp
    }
    /// Lane within the warp, `0..32`.
    pub const fn lane(self) -> u32 {
        self.lane
    }
    /// Warps of the role.
    pub const fn warps(self) -> u32 {
        self.warps
    }
    /// Thread within the role, `0..threads()`.
    pub const fn thread(self) -> u32 {
        self.warp * WARP_SIZE + self.lane
    }
    /// Threads of the role.
    pub const fn threads(self) -> u32 {
        self.warps * WARP_SIZE
    }
}

const fn align_up(x: u32, a: u32) -> u32 {
    x.div_ceil(a) * a
}

/// Builds the dynamic shared-memory [`Layout`] of kernel `K` in a `const`: the rings' barriers
/// first, then one 128-byte aligned region per call. Overflow and a total above [`SMEM_BUDGET`]
/// fail the constant's evaluation, i.e. the build.
///
/// ```ignore
/// const LAYOUT: Layout<MyKernel> = {
///     let mut a = SmemAlloc::new(Roles::new(1, 4), 2);
///     let rows = a.stages::<f32>(4 * 1024); // 2 stages x 4096 f32
///     let stats = a.array::<f32>(64);
///     a.finish(Parts { rows, stats })       // Layout<MyKernel> carrying the tokens
/// };
/// ```
pub struct SmemAlloc<K> {
    roles: Roles,
    stages: u32,
    next: u32,
    load_ring: u32,
    store_ring: u32,
    _k: PhantomData<fn() -> K>,
}

impl<K> SmemAlloc<K> {
    /// A layout for `roles` with rings of `stages` stages (`1..=MAX_STAGES`): the load ring's
    /// `2 * stages` mbarriers at offset 0, then the store ring's if there are storers.
    pub const fn new(roles: Roles, stages: u32) -> Self {
        assert!(stages >= 1 && stages <= MAX_STAGES, "stages out of 1..=16");
        let ring = 2 * stages * MBARRIER_BYTES as u32;
        let store_ring = if roles.has_storers() { ring } else { 0 };
        Self {
            roles,
            stages,
            next: ring + if roles.has_storers() { ring } else { 0 },
            load_ring: 0,
            store_ring,
            _k: PhantomData,
        }
    }

    /// `stages` regions of `elems` elements of `T` each (one per stage of the rings), each
    /// 128-byte aligned.
    pub const fn stages<T>(&mut self, elems: u32) -> StageBuf<K, T> {
        assert!(elems >= 1, "empty stage region");
        assert!(core::mem::align_of::<T>() <= REGION_ALIGN as usize);
        let offset = align_up(self.next, REGION_ALIGN);
        let stage_bytes = align_up(elems * core::mem::size_of::<T>() as u32, REGION_ALIGN);
        self.next = offset + self.stages * stage_bytes;
        assert!(
            self.next <= SMEM_BUDGET,
            "shared-memory layout over SMEM_BUDGET"
        );
        StageBuf {
            offset,
            stage_bytes,
            elems,
            _p: PhantomData,
        }
    }

    /// One region of `elems` elements of `T`, 128-byte aligned (per-CTA state that is not
    /// staged; the roles share it as they agree).
    pub const fn array<T>(&mut self, elems: u32) -> Array<K, T> {
        assert!(elems >= 1, "empty region");
        assert!(core::mem::align_of::<T>() <= REGION_ALIGN as usize);
        let offset = align_up(self.next, REGION_ALIGN);
        self.next = offset + elems * core::mem::size_of::<T>() as u32;
        assert!(
            self.next <= SMEM_BUDGET,
            "shared-memory layout over SMEM_BUDGET"
        );
        Array {
            offset,
            elems,
            _p: PhantomData,
        }
    }

    /// The finished layout, carrying the kernel's tokens `parts` (a struct of the
    /// [`StageBuf`]s and [`Array`]s made above). Fails the build if the total exceeds
    /// [`SMEM_BUDGET`].
    pub const fn finish<P: Copy>(self, parts: P) -> Layout<K, P> {
        assert!(
            self.next <= SMEM_BUDGET,
            "shared-memory layout over SMEM_BUDGET"
        );
        Layout {
            roles: self.roles,
            stages: self.stages,
            bytes: self.next,
            load_ring: self.load_ring,
            store_ring: self.store_ring,
            parts,
            _k: PhantomData,
        }
    }
}

/// The shared-memory layout of kernel `K`: where the rings' barriers are, the total bytes (the
/// launch's dynamic shared memory, checked by [`run`]) and the kernel's region tokens `P`.
pub struct Layout<K, P = ()> {
    roles: Roles,
    stages: u32,
    bytes: u32,
    load_ring: u32,
    store_ring: u32,
    parts: P,
    _k: PhantomData<fn() -> K>,
}

impl<K, P: Copy> Clone for Layout<K, P> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K, P: Copy> Copy for Layout<K, P> {}

impl<K, P: Copy> Layout<K, P> {
    /// Dynamic shared memory the launch must give each CTA, bytes (at most [`SMEM_BUDGET`]).
    pub const fn bytes(&self) -> u32 {
        self.bytes
    }
    /// The roles (and so [`Roles::threads`], the block size).
    pub const fn roles(&self) -> Roles {
        self.roles
    }
    /// Stages of each ring.
    pub const fn stages(&self) -> u32 {
        self.stages
    }
    /// Byte offset of the load ring's barriers (`STAGES` full, then `STAGES` empty mbarriers).
    pub const fn load_ring_offset(&self) -> u32 {
        self.load_ring
    }
    /// Byte offset of the store ring's barriers (meaningful only with storers).
    pub const fn store_ring_offset(&self) -> u32 {
        self.store_ring
    }
    /// The kernel's region tokens.
    pub const fn parts(&self) -> P {
        self.parts
    }
}

/// A staged region: one run of `elems()` elements of `T` per stage, for the stage a hook was
/// handed ([`Self::at`]). Made only by [`SmemAlloc::stages`].
pub struct StageBuf<K, T> {
    offset: u32,
    stage_bytes: u32,
    elems: u32,
    _p: PhantomData<fn() -> (K, T)>,
}

impl<K, T> Clone for StageBuf<K, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K, T> Copy for StageBuf<K, T> {}

impl<K, T> StageBuf<K, T> {
    /// Elements per stage.
    pub const fn elems(self) -> u32 {
        self.elems
    }
    /// Byte offset of stage 0 from the start of dynamic shared memory.
    pub const fn offset(self) -> u32 {
        self.offset
    }
    /// Bytes between consecutive stages (a multiple of 128).
    pub const fn stage_bytes(self) -> u32 {
        self.stage_bytes
    }
}

/// An unstaged region of `elems()` elements of `T`. Made only by [`SmemAlloc::array`].
pub struct Array<K, T> {
    offset: u32,
    elems: u32,
    _p: PhantomData<fn() -> (K, T)>,
}

impl<K, T> Clone for Array<K, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K, T> Copy for Array<K, T> {}

impl<K, T> Array<K, T> {
    /// Elements.
    pub const fn elems(self) -> u32 {
        self.elems
    }
    /// Byte offset from the start of dynamic shared memory.
    pub const fn offset(self) -> u32 {
        self.offset
    }
}

/// The stage of the rings that a hook of kernel `K` is handed: made only by [`run`], valid
/// during that hook call (between the role's acquire/wait and its commit/release of the stage).
pub struct Stage<K> {
    index: u32,
    _k: PhantomData<fn() -> K>,
}

impl<K> Clone for Stage<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for Stage<K> {}

impl<K> Stage<K> {
    /// Stage index, `0..stages`.
    pub const fn index(self) -> u32 {
        self.index
    }
}

/// How the producers' writes to a stage of the load ring are committed to the consumers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoadCommit {
    /// [`WarpSpecialized::load`] finished its writes (plain stores, or `cp.async` it waited
    /// for): one `mbarrier.arrive` (release) per producer thread after the hook.
    Arrive,
    /// [`WarpSpecialized::load`] issues `cp.async` copies and does not wait: [`run`] closes
    /// them as one commit group per stage and commits stage `k - 1` once at most the newest
    /// group is pending (`cp.async.wait_group 1` after issuing stage `k`), so two stages are in
    /// flight and the producer never blocks on the newest; the last stage after `wait_group 0`.
    /// (What `ws_vector_add` does; compute-sanitizer's racecheck understands it.)
    CpAsyncGroups,
    /// [`WarpSpecialized::load`] issues `cp.async` copies: `cp.async.mbarrier.arrive.noinc` per
    /// producer thread, the hardware commits when they land (racecheck reports false races).
    CpAsyncBarrier,
    /// Transaction bytes (bulk copies, TMA): each full barrier of the load ring expects one
    /// arrival per phase. After every producer thread acquired the stage, [`run`] has thread 0 of
    /// the producer role arm the stage's full barrier with one arrival and
    /// [`WarpSpecialized::load_tx_bytes`]`(item)` bytes (`mbarrier.arrive.expect_tx`), then calls
    /// [`WarpSpecialized::load`] in every producer thread. The hook's thread 0 issues bulk copies
    /// of exactly that many bytes completing on [`Stage::load_full`]; the stage is committed when
    /// they land (the other producer threads only wait on the empty barrier themselves, which
    /// keeps racecheck's view of the ring whole).
    BulkTx,
}

/// A warp-specialized kernel: its shared-memory layout and its role hooks. `STAGES` is the depth
/// of its rings and must equal `LAYOUT.stages()` (checked at compile time by [`run`]).
///
/// The hooks are called by [`run`] only, in every thread of their role, with the stage the role
/// owns at that moment:
/// - producers, per item: `load(item, stage)` between `producer_acquire` and the commit chosen by
///   [`Self::LOAD_COMMIT`];
/// - consumers, per item: `consumer_wait` on the load ring (and `producer_acquire` on the store
///   ring if there are storers), `compute(item, stage)`, `consumer_release` (and
///   `producer_commit` on the store ring); after the last item, `finish()`;
/// - storers, per item: `consumer_wait` on the store ring, `store(item, stage)`,
///   `consumer_release`.
///
/// A hook of one role must not wait for another role's progress in a way the rings do not give
/// (the rings are the only cross-role ordering); within a role, hooks may use
/// `bar.warp.sync`, warp shuffles, or named barriers over the role's warps.
pub trait WarpSpecialized<const STAGES: u32>: Sized {
    /// The region tokens of [`Self::LAYOUT`].
    type Parts: Copy;
    /// Roles, ring depth and shared-memory layout (build it with [`SmemAlloc`]).
    const LAYOUT: Layout<Self, Self::Parts>;
    /// How the load ring's stages are committed ([`LoadCommit::Arrive`] unless overridden).
    const LOAD_COMMIT: LoadCommit = LoadCommit::Arrive;

    /// Work items of the whole grid (CTA `b` takes `b, b + gridDim.x, ...`).
    fn items(&self) -> u32;

    /// Bytes the bulk copies of item `item` write into its stage of the load ring: what [`run`]
    /// arms the stage's full barrier with under [`LoadCommit::BulkTx`] (unused otherwise). The
    /// copies [`Self::load`] issues for the item must total exactly this (0: no copy; the stage
    /// is committed at once).
    fn load_tx_bytes(&self, item: u32) -> u32 {
        let _ = item;
        0
    }

    /// Producer hook: fill `stage` of the load ring with item `item`.
    ///
    /// # Safety
    /// Called by [`run`] only, under the launch contract of the kernel that calls `run`; the
    /// implementation may rely on that contract and on owning `stage` for writing.
    unsafe fn load(&self, me: RoleThread, stage: Stage<Self>, item: u32);

    /// Consumer hook: read `stage` of the load ring (and fill `stage` of the store ring, if
    /// there are storers) for item `item`.
    ///
    /// # Safety
    /// As [`Self::load`]; the load stage is filled and owned for reading, the store stage (if
    /// any) owned for writing.
    unsafe fn compute(&self, me: RoleThread, stage: Stage<Self>, item: u32);

    /// Storer hook: write out `stage` of the store ring for item `item` (only called if the
    /// roles have storers).
    ///
    /// # Safety
    /// As [`Self::load`]; the store stage is filled and owned for reading.
    unsafe fn store(&self, me: RoleThread, stage: Stage<Self>, item: u32) {
        let _ = (me, stage, item);
    }

    /// Consumer hook after the last item of this CTA (epilogue: per-CTA results, flushes).
    ///
    /// # Safety
    /// As [`Self::load`].
    unsafe fn finish(&self, me: RoleThread) {
        let _ = me;
    }
}

#[cfg(any(target_arch = "nvptx64", doc))]
pub use device::*;

#[cfg(any(target_arch = "nvptx64", doc))]
mod device {
    use super::*;
    use crate::cp_async;
    use crate::mbarrier::{fence_init, Mbarrier};
    use crate::pipeline::{Pipeline, PipelineState};
    use crate::smem::{dynamic_smem_base, dynamic_smem_size, Shared};
    use crate::thread::{block_dim_x, block_idx_x, grid_dim_x, sync_threads, thread_idx_x};
    use crate::warp::lane_id;

    /// The elements of one region in shared memory: a typed base address and a length. Loads
    /// and stores through [`Self::at`] are [`Shared`]'s (unsafe: the caller keeps `i < len()`
    /// and owns the element).
    #[derive(Clone, Copy)]
    pub struct Tile<T> {
        base: Shared<T>,
        len: u32,
    }

    impl<T> Tile<T> {
        /// Address of element `i` (in the tile when `i < len()`; computing it is safe, using it
        /// is not).
        #[inline(always)]
        pub fn at(self, i: u32) -> Shared<T> {
            self.base.add(i)
        }
        /// Elements in the tile.
        #[inline(always)]
        pub fn len(self) -> u32 {
            self.len
        }
        /// Whether the tile has no elements (never, for tiles of a [`Layout`]).
        #[inline(always)]
        pub fn is_empty(self) -> bool {
            self.len == 0
        }
    }

    impl<K, T> StageBuf<K, T> {
        /// The region of `stage`.
        #[inline(always)]
        pub fn at(self, stage: Stage<K>) -> Tile<T> {
            Tile {
                base: Shared::at(
                    dynamic_smem_base() + self.offset + stage.index * self.stage_bytes,
                ),
                len: self.elems,
            }
        }
    }

    impl<K, T> Array<K, T> {
        /// The region.
        #[inline(always)]
        pub fn get(self) -> Tile<T> {
            Tile {
                base: Shared::at(dynamic_smem_base() + self.offset),
                len: self.elems,
            }
        }
    }

    impl<K> Stage<K> {
        /// The load ring's full barrier of this stage: under [`LoadCommit::BulkTx`], the barrier
        /// the producer hook's bulk copies complete on (armed by [`run`] before
        /// [`WarpSpecialized::load`] is called). `S` is the kernel's ring depth.
        #[inline(always)]
        pub fn load_full<const S: u32>(self) -> Mbarrier
        where
            K: WarpSpecialized<S>,
        {
            // SAFETY: a `Stage` is made only by `run` for kernel `K`, so `index < S` and the
            // barrier lies in the load ring that `run` initialised and published at
            // `K::LAYOUT.load_ring_offset()`; the arrival protocol is the ring's (`run`), the
            // transaction bytes the hook's contract (`LoadCommit::BulkTx`).
            unsafe {
                Mbarrier::at(
                    dynamic_smem_base()
                        + K::LAYOUT.load_ring_offset()
                        + self.index * crate::MBARRIER_BYTES as u32,
                )
            }
        }
    }

    /// Calls `f(item)` for this CTA's items: `blockIdx.x, blockIdx.x + gridDim.x, ... < items`.
    #[inline(always)]
    fn for_each_item(items: u32, mut f: impl FnMut(u32)) {
        let mut item = block_idx_x();
        let step = grid_dim_x();
        while item < items {
            f(item);
            item = match item.checked_add(step) {
                Some(next) => next,
                None => break,
            };
        }
    }

    /// Runs kernel `k` in this CTA: checks the launch shape, initialises the rings' mbarriers
    /// (one thread, `fence.mbarrier_init`, CTA barrier), then calls the hooks of the calling
    /// warp's role for each of the CTA's items (see [`WarpSpecialized`]). Returns when the
    /// calling thread's role is done.
    ///
    /// Traps (the launch fails with `CUDA_ERROR_LAUNCH_FAILED`) if the block is not
    /// `K::LAYOUT.roles().threads()` x 1 x 1 threads or the launch's dynamic shared memory is
    /// below `K::LAYOUT.bytes()`.
    ///
    /// # Safety
    /// - Called by every thread of the CTA, once, from convergent code at the top of the kernel
    ///   (it contains `bar.sync`), with nothing else using the dynamic shared memory the layout
    ///   covers, except per-CTA constants: [`Array`] regions the kernel filled before the call
    ///   with plain stores (`run`'s CTA barrier orders those stores before every hook) and that
    ///   the hooks only read;
    /// - `k`'s hooks are sound under the launch contract of the calling kernel, which its caller
    ///   upholds (the hooks' `# Safety`).
    #[inline(always)]
    pub unsafe fn run<K: WarpSpecialized<S>, const S: u32>(k: &K) {
        const {
            assert!(
                K::LAYOUT.stages() == S,
                "STAGES differs from LAYOUT.stages()"
            )
        };
        let roles = K::LAYOUT.roles();
        // SAFETY: reading special registers has no preconditions.
        let (ny, nz) = unsafe {
            (
                core::arch::nvptx::_block_dim_y(),
                core::arch::nvptx::_block_dim_z(),
            )
        };
        if block_dim_x() != roles.threads()
            || ny != 1
            || nz != 1
            || dynamic_smem_size() < K::LAYOUT.bytes()
        {
            // The rings' arrival counts assume exactly these threads, and the layout this much
            // shared memory.
            // SAFETY: `trap` aborts the kernel; no preconditions.
            unsafe { core::arch::nvptx::trap() };
        }
        let base = dynamic_smem_base();
        // SAFETY: the launch gives at least LAYOUT.bytes of dynamic shared memory (checked
        // above); the ring regions (8-byte aligned at offsets 0 and 2 * S * 8, below the first
        // 128-byte aligned region) hold only these barriers (SmemAlloc); thread 0 initialises
        // them below before the CTA barrier; every thread of a role arrives once per stage and
        // phase in the loops below (under BulkTx, producer thread 0 alone, with the hook's
        // transaction bytes), which is what the init counts say.
        let (load_ring, store_ring) = unsafe {
            (
                Pipeline::<S>::at(base + K::LAYOUT.load_ring_offset()),
                Pipeline::<S>::at(base + K::LAYOUT.store_ring_offset()),
            )
        };
        if thread_idx_x() == 0 {
            // SAFETY: one thread, before any use; the counts are 32..=1024 (Roles) or 1 (the
            // BulkTx producer arrival); published by fence_init and the CTA barrier below.
            unsafe {
                // BulkTx: one arrival (the arming thread's) plus the transaction bytes.
                let producer_arrivals = match K::LOAD_COMMIT {
                    LoadCommit::BulkTx => 1,
                    _ => roles.threads_of(Role::Producer),
                };
                load_ring.init(producer_arrivals, roles.threads_of(Role::Consumer));
                if roles.has_storers() {
                    store_ring.init(
                        roles.threads_of(Role::Consumer),
                        roles.threads_of(Role::Storer),
                    );
                }
            }
            fence_init();
        }
        // SAFETY: every thread of the CTA, converged (only thread 0's branch above, no loop;
        // the caller's contract).
        unsafe { sync_threads() };

        let warp = thread_idx_x() / WARP_SIZE;
        let lane = lane_id();
        let items = k.items();
        let me = |role: Role| {
            RoleThread::new(
                role,
                warp - roles.first_warp(role),
                lane,
                roles.warps_of(role),
            )
        };
        // SAFETY: the rings are initialised and published; each role walks the CTA's items in
        // order with its own state and keeps the arrival protocol; the hooks' contract is the
        // caller's.
        unsafe {
            match roles.role(warp) {
                Some(Role::Producer) => producer(k, me(Role::Producer), load_ring, items),
                Some(Role::Consumer) => {
                    consumer(k, me(Role::Consumer), load_ring, store_ring, items)
                }
                Some(Role::Storer) => storer(k, me(Role::Storer), store_ring, items),
                None => {}
            }
        }
    }

    /// # Safety
    /// [`run`]'s, the load ring initialised and published.
    #[inline(always)]
    unsafe fn producer<K: WarpSpecialized<S>, const S: u32>(
        k: &K,
        me: RoleThread,
        ring: Pipeline<S>,
        items: u32,
    ) {
        let mut st = PipelineState::<S>::new();
        let mut pending: Option<PipelineState<S>> = None;
        for_each_item(items, |item| {
            ring.producer_acquire(st);
            if K::LOAD_COMMIT == LoadCommit::BulkTx && me.thread() == 0 {
                // The phase's one arrival, with the bytes the hook's bulk copies will deliver.
                ring.full(st).arrive_expect_tx(k.load_tx_bytes(item));
            }
            let stage = Stage {
                index: st.stage(),
                _k: PhantomData,
            };
            // SAFETY: the stage is acquired for writing; the launch contract is the caller's.
            unsafe { k.load(me, stage, item) };
            match K::LOAD_COMMIT {
                LoadCommit::Arrive => ring.producer_commit(st),
                // Committed by the copies' transaction bytes.
                LoadCommit::BulkTx => {}
                LoadCommit::CpAsyncBarrier => ring.producer_commit_cp_async(st),
                LoadCommit::CpAsyncGroups => {
                    cp_async::commit_group();
                    if let Some(prev) = pending {
                        cp_async::wait_group::<1>();
                        ring.producer_commit(prev);
                    }
                    pending = Some(st);
                }
            }
            st.advance();
        });
        if let Some(last) = pending {
            cp_async::wait_group::<0>();
            ring.producer_commit(last);
        }
    }

    /// # Safety
    /// [`run`]'s, the rings initialised and published.
    #[inline(always)]
    unsafe fn consumer<K: WarpSpecialized<S>, const S: u32>(
        k: &K,
        me: RoleThread,
        load_ring: Pipeline<S>,
        store_ring: Pipeline<S>,
        items: u32,
    ) {
        let storers = K::LAYOUT.roles().has_storers();
        let mut st = PipelineState::<S>::new();
        for_each_item(items, |item| {
            load_ring.consumer_wait(st);
            if storers {
                store_ring.producer_acquire(st);
            }
            let stage = Stage {
                index: st.stage(),
                _k: PhantomData,
            };
            // SAFETY: the load stage is filled, the store stage free; the launch contract is the
            // caller's.
            unsafe { k.compute(me, stage, item) };
            load_ring.consumer_release(st);
            if storers {
                store_ring.producer_commit(st);
            }
            st.advance();
        });
        // SAFETY: the launch contract is the caller's.
        unsafe { k.finish(me) };
    }

    /// # Safety
    /// [`run`]'s, the store ring initialised and published.
    #[inline(always)]
    unsafe fn storer<K: WarpSpecialized<S>, const S: u32>(
        k: &K,
        me: RoleThread,
        ring: Pipeline<S>,
        items: u32,
    ) {
        let mut st = PipelineState::<S>::new();
        for_each_item(items, |item| {
            ring.consumer_wait(st);
            let stage = Stage {
                index: st.stage(),
                _k: PhantomData,
            };
            // SAFETY: the store stage is filled; the launch contract is the caller's.
            unsafe { k.store(me, stage, item) };
            ring.consumer_release(st);
            st.advance();
        });
    }
}
