//! Thread-block clusters and distributed shared memory (DSMEM), PTX ISA §9.7.13.4 (`barrier.cluster`),
//! §9.7.9.21 (`mapa`), special registers `%cluster_ctarank` / `%cluster_nctarank`.
//!
//! A CTA of a cluster can address another CTA's shared memory through the `.shared::cluster`
//! window: [`map_shared_rank`] turns a local shared address into the same offset in CTA `rank`.

use core::arch::asm;

/// Rank of this CTA in its cluster, `0..cluster_size()` (`%cluster_ctarank`).
#[inline(always)]
pub fn cta_rank() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe {
        asm!("mov.u32 {r}, %cluster_ctarank;", r = out(reg32) r, options(nomem, nostack, pure))
    };
    r
}

/// CTAs in this cluster (`%cluster_nctarank`).
#[inline(always)]
pub fn cluster_size() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe {
        asm!("mov.u32 {r}, %cluster_nctarank;", r = out(reg32) r, options(nomem, nostack, pure))
    };
    r
}

/// Index of this cluster in the grid along x (`%clusterid.x`).
#[inline(always)]
pub fn cluster_idx_x() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {r}, %clusterid.x;", r = out(reg32) r, options(nomem, nostack, pure)) };
    r
}

/// Clusters in the grid along x (`%nclusterid.x`).
#[inline(always)]
pub fn cluster_count_x() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {r}, %nclusterid.x;", r = out(reg32) r, options(nomem, nostack, pure)) };
    r
}

/// `mapa.shared::cluster.u32`: the `.shared::cluster` address of local shared address `addr` in
/// the shared memory of CTA `rank` of this cluster.
#[inline(always)]
pub fn map_shared_rank(addr: u32, rank: u32) -> u32 {
    let r: u32;
    // SAFETY: address arithmetic only.
    unsafe {
        asm!("mapa.shared::cluster.u32 {r}, {a}, {k};", r = out(reg32) r, a = in(reg32) addr, k = in(reg32) rank,
            options(nomem, nostack, pure))
    };
    r
}

/// `ld.shared::cluster.f32` from a `.shared::cluster` address (see [`map_shared_rank`]).
///
/// # Safety
/// `addr` is a `.shared::cluster` address (from [`map_shared_rank`]) of 4 bytes, 4-byte aligned,
/// inside the shared memory of a CTA of this cluster that has not exited and does not exit before
/// the load completes; no thread writes those bytes concurrently (order the writer's stores
/// before this load, e.g. with a cluster barrier).
#[inline(always)]
pub unsafe fn load_f32(addr: u32) -> f32 {
    let v: f32;
    // SAFETY: the caller's contract above.
    unsafe {
        asm!("ld.shared::cluster.f32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr, options(nostack));
    }
    v
}

/// `ld.shared::cluster.v4.f32`: 16 bytes from a `.shared::cluster` address.
///
/// # Safety
/// As [`load_f32`], for 16 bytes, 16-byte aligned.
#[inline(always)]
pub unsafe fn load_v4(addr: u32) -> [f32; 4] {
    let (x, y, z, w): (f32, f32, f32, f32);
    // SAFETY: the caller's contract above.
    unsafe {
        asm!("ld.shared::cluster.v4.f32 {{{x}, {y}, {z}, {w}}}, [{a}];",
            x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w, a = in(reg32) addr,
            options(nostack));
    }
    [x, y, z, w]
}

/// `barrier.cluster.arrive.release.aligned` (PTX ISA 8.0 §9.7.13.4): this thread's earlier memory
/// operations are released to the cluster; pair with [`wait_acquire`].
///
/// # Safety
/// `.aligned`: every thread of the warp executes this same instruction convergently (no
/// divergence since the warp last reconverged, e.g. after a spin loop: reconverge with
/// [`super::warp::sync_warp`] first). Every non-exited thread of every CTA of the cluster arrives
/// once per cluster phase, each followed by [`wait_acquire`] before it arrives again; otherwise
/// the waiters hang or the behaviour is undefined.
///
/// Convergence in the Rust source is not enough: rustc does not mark `asm!` as `convergent`, so
/// LLVM may copy this instruction into both arms of a preceding branch whose condition is tested
/// again after it (`if tid == 0 { init } arrive; wait; if tid == 0 { .. }` became two copies, one
/// per arm: the H100 hang of `tma_copy_3d_multicast`, issue 22). Check the PTX (one copy per
/// call) or use [`sync_cluster`], whose per-thread form does not need convergence.
#[inline(always)]
pub unsafe fn arrive_release() {
    // SAFETY: no operands; convergence and participation are the caller's contract.
    unsafe { asm!("barrier.cluster.arrive.release.aligned;", options(nostack)) };
}

/// `barrier.cluster.wait.acquire.aligned` (PTX ISA 8.0 §9.7.13.4): waits until every thread of the
/// cluster arrived in the current phase; acquires what they released.
///
/// # Safety
/// As [`arrive_release`] (warp-convergent, `.aligned`); this thread arrived in the current phase
/// and has not waited on it yet.
#[inline(always)]
pub unsafe fn wait_acquire() {
    // SAFETY: no operands; the caller's contract as above.
    unsafe { asm!("barrier.cluster.wait.acquire.aligned;", options(nostack)) };
}

/// Cluster-wide barrier (`cluster.sync()` of CUDA): `barrier.cluster.arrive.release` then
/// `barrier.cluster.wait.acquire` (PTX ISA 8.0 §9.7.13.4), the forms *without* `.aligned`, the
/// only ones libcu++'s `cuda::ptx::barrier_cluster_arrive` / `barrier_cluster_wait` expose: each
/// thread arrives and waits for itself, so the warp need not be converged.
///
/// Why not `.aligned` ([`arrive_release`] / [`wait_acquire`]): rustc's `asm!` is not
/// `convergent`, and LLVM duplicated the aligned pair into both arms of the `if tid == 0` before
/// it in `tma_copy_3d_multicast` (three `barrier.cluster.arrive` in the PTX for two calls), so
/// lane 0 and lanes 1..31 executed different `.aligned` barrier instructions: undefined
/// behaviour, and on the H100 the test binary hung. A per-thread barrier stays correct however
/// the compiler places the copies; it runs once or twice per kernel, so its cost does not matter.
///
/// # Safety
/// Every non-exited thread of every CTA of the cluster calls it, the same number of times
/// (a thread that skips one, or a CTA that exits while others wait, hangs the cluster). Its
/// release/acquire orders memory at cluster scope (e.g. `mbarrier.init` and
/// [`super::mbarrier::fence_init`] before a peer's multicast or remote arrive targets the
/// barrier).
#[inline(always)]
pub unsafe fn sync_cluster() {
    // SAFETY: no operands; participation is the caller's contract. The non-`.aligned` forms need
    // no warp convergence.
    unsafe {
        asm!(
            "barrier.cluster.arrive.release;",
            "barrier.cluster.wait.acquire;",
            options(nostack)
        )
    };
}

/// `mbarrier.arrive.release.cluster.shared::cluster.b64` (PTX ISA 8.0 §9.7.13.15.13): one arrival on
/// a barrier in a CTA of the cluster (`remote` from [`map_shared_rank`]), releasing this thread's
/// earlier memory operations (including its DSMEM reads) at cluster scope, e.g. "done reading
/// this stage".
///
/// # Safety
/// `remote` is the `.shared::cluster` address ([`map_shared_rank`] of a local barrier address) of
/// an mbarrier of a CTA of this cluster that has been initialised and whose initialisation was
/// published to this thread (`fence_init` then a cluster barrier); that CTA has not exited and
/// does not exit before the arrival is performed (e.g. a cluster barrier before any CTA exits);
/// the arrival is one of the counts given at its `init` for the current phase
/// (see [`super::mbarrier::Mbarrier::at`]).
#[inline(always)]
pub unsafe fn remote_arrive(remote: u32) {
    // SAFETY: the caller's contract above.
    unsafe {
        asm!("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [{a}];", a = in(reg32) remote,
            options(nostack))
    };
}

/// `mbarrier.arrive.shared::cluster.b64` with the default semantics (`.release`, `.cta` scope;
/// PTX ISA 8.0 §9.7.13.15.13): one arrival on a barrier in a CTA of the cluster, *without* the
/// cluster-scope release of [`remote_arrive`], which ptxas lowers to `MEMBAR.ALL.GPU` and which
/// stalls the arriving warp every time. This is what CUTLASS's `ClusterBarrier::arrive(cta_id)`
/// issues for pipeline releases ("done with this stage"): the stage's readers are this CTA's own
/// threads (or its wgmma, complete after `wgmma.wait_group`), and the barrier's phase completion
/// is what the refilling producer waits for.
///
/// # Safety
/// As [`remote_arrive`].
#[inline(always)]
pub unsafe fn remote_arrive_cta(remote: u32) {
    // SAFETY: the caller's contract (that of `remote_arrive`).
    unsafe {
        asm!("mbarrier.arrive.shared::cluster.b64 _, [{a}];", a = in(reg32) remote,
            options(nostack))
    };
}
