//! The launch contract between host and device: kernel names, CTA shapes, tile sizes and
//! shared-memory layouts, in one place. The host launchers size grids and shared memory from these
//! constants and the kernels index with them; changing a number here changes both sides.

/// Bytes in one `f32`.
pub const F32_BYTES: usize = 4;
pub use warpline_device::{MBARRIER_BYTES, WARP_SIZE};

/// Warp-specialized, double-buffered vector add `C = A + B` (f32), after the chapter's
/// "warp-specialized, two pipelines" kernel (ch. 11), done with per-role mbarrier arrivals.
pub mod vector_add {
    use super::*;

    /// Entry point in the PTX module.
    pub const KERNEL: &str = "ws_vector_add";
    /// Elements of A (and of B, and of C) in one tile. A multiple of 4 (16-byte vectors).
    pub const TILE_ELEMS: usize = 4096;
    /// Pipeline depth: double buffering.
    pub const STAGES: usize = 2;
    /// Warps of the loader role (cp.async global -> shared).
    pub const LOADER_WARPS: u32 = 1;
    /// Warps of the compute role (shared A, B -> shared C).
    pub const COMPUTE_WARPS: u32 = 1;
    /// Warps of the storer role (shared C -> global).
    pub const STORER_WARPS: u32 = 1;
    /// Threads per CTA.
    pub const THREADS_PER_CTA: u32 = WARP_SIZE * (LOADER_WARPS + COMPUTE_WARPS + STORER_WARPS);
    /// CTAs resident on each SM (shared memory allows 2 at 96 KiB each): the size of a
    /// persistent grid, `CTAS_PER_SM x SMs`.
    pub const CTAS_PER_SM: u32 = 2;
    /// Tiles per CTA of the default grid (`ceil(tiles / TILES_PER_CTA)` CTAs, so each CTA fills
    /// its `STAGES` stages once and the block scheduler hands the next tiles to whichever SM
    /// frees first). Measured on the H100 at 2^28 floats (issue 12, docs/perf-notes.md): 1.016x
    /// the D2D copy against 0.975x for the persistent grid, whose CTAs each take a fixed share
    /// and finish unevenly; 1 tile per CTA leaves half the ring idle (0.959x).
    pub const TILES_PER_CTA: usize = STAGES;

    /// Shared-memory layout, byte offsets from the start of dynamic shared memory:
    /// `[loader->compute full|empty mbarriers][compute->storer full|empty mbarriers][pad]`
    /// then `STAGES x [A | B | C]`, each buffer `TILE_ELEMS` f32.
    pub const LC_BARRIERS_OFFSET: usize = 0;
    /// Offset of the compute->storer pipeline's barriers.
    pub const CS_BARRIERS_OFFSET: usize = LC_BARRIERS_OFFSET + 2 * STAGES * MBARRIER_BYTES;
    /// Offset of stage 0's A buffer (128-byte aligned).
    pub const BUFFERS_OFFSET: usize = 128;
    /// Bytes of one buffer (A, B or C) of one stage.
    pub const BUFFER_BYTES: usize = TILE_ELEMS * F32_BYTES;
    /// Bytes of one stage `[A | B | C]`.
    pub const STAGE_BYTES: usize = 3 * BUFFER_BYTES;
    /// Dynamic shared memory per CTA, bytes.
    pub const SMEM_BYTES: usize = BUFFERS_OFFSET + STAGES * STAGE_BYTES;

    const _: () = assert!(CS_BARRIERS_OFFSET + 2 * STAGES * MBARRIER_BYTES <= BUFFERS_OFFSET);
    const _: () = assert!(TILE_ELEMS.is_multiple_of(4));

    /// Candidate `ws_vector_add_bulk`: warp-specialized like `ws_vector_add`, but one loader thread
    /// fills each stage with two bulk copies (`cp.async.bulk`, TMA without a tensor map) of A and
    /// B completing on the stage's full mbarrier (expect-tx), and the compute warps add from
    /// shared memory straight into global C (no C buffer, no storer warps). Issue 12, to be
    /// measured.
    pub mod bulk {
        use super::*;

        /// Entry point in the PTX module.
        pub const KERNEL: &str = "ws_vector_add_bulk";
        /// Elements of A (and of B) in one tile, a multiple of 4 (bulk copies move multiples of
        /// 16 bytes; the ragged last tile's last `len % 4` elements are read from global).
        pub const TILE_ELEMS: usize = 4096;
        /// Stages of the load ring.
        pub const STAGES: usize = 3;
        /// Warps of the loader role (lane 0 of warp 0 issues the copies).
        pub const LOADER_WARPS: u32 = 1;
        /// Warps of the compute role (shared A, B -> registers -> global C).
        pub const COMPUTE_WARPS: u32 = 2;
        /// Threads per CTA.
        pub const THREADS_PER_CTA: u32 = WARP_SIZE * (LOADER_WARPS + COMPUTE_WARPS);
        /// CTAs of the persistent grid per SM (shared memory allows 2).
        pub const CTAS_PER_SM: u32 = 2;
        /// Offset of stage 0's A buffer (after the load ring's `2 * STAGES` mbarriers).
        pub const BUFFERS_OFFSET: usize = 128;
        /// Bytes of one stage `[A | B]`.
        pub const STAGE_BYTES: usize = 2 * TILE_ELEMS * F32_BYTES;
        /// Dynamic shared memory per CTA, bytes.
        pub const SMEM_BYTES: usize = BUFFERS_OFFSET + STAGES * STAGE_BYTES;

        const _: () = assert!(2 * STAGES * MBARRIER_BYTES <= BUFFERS_OFFSET);
        const _: () = assert!(TILE_ELEMS.is_multiple_of(4));
    }

    /// Candidate `ws_vector_add_bulk_deep`: the kernel of `bulk` with 8192-element tiles, four
    /// compute warps and one CTA per SM (one CTA owns the SM's shared memory). Issue 12, to be
    /// measured.
    pub mod bulk_deep {
        use super::*;

        /// Entry point in the PTX module.
        pub const KERNEL: &str = "ws_vector_add_bulk_deep";
        /// Elements of A (and of B) in one tile, a multiple of 4.
        pub const TILE_ELEMS: usize = 8192;
        /// Stages of the load ring.
        pub const STAGES: usize = 3;
        /// Warps of the loader role.
        pub const LOADER_WARPS: u32 = 1;
        /// Warps of the compute role.
        pub const COMPUTE_WARPS: u32 = 4;
        /// Threads per CTA.
        pub const THREADS_PER_CTA: u32 = WARP_SIZE * (LOADER_WARPS + COMPUTE_WARPS);
        /// CTAs of the persistent grid per SM.
        pub const CTAS_PER_SM: u32 = 1;
        /// Offset of stage 0's A buffer.
        pub const BUFFERS_OFFSET: usize = 128;
        /// Bytes of one stage `[A | B]`.
        pub const STAGE_BYTES: usize = 2 * TILE_ELEMS * F32_BYTES;
        /// Dynamic shared memory per CTA, bytes.
        pub const SMEM_BYTES: usize = BUFFERS_OFFSET + STAGES * STAGE_BYTES;

        const _: () = assert!(2 * STAGES * MBARRIER_BYTES <= BUFFERS_OFFSET);
        const _: () = assert!(TILE_ELEMS.is_multiple_of(4));
    }

    /// Candidates `vector_add_flat` and `vector_add_flat_cs`: no warp specialization, no shared
    /// memory. CTA `b` takes tiles `b, b + gridDim.x, ...` of `TILE_ELEMS` elements
    /// (so the grid may be one CTA per tile or persistent); each thread issues all its
    /// `ld.global.nc` 16-byte loads of A and B before its adds, then 16-byte stores
    /// (`vector_add_flat_cs`: `st.global.cs`, evict-first). Issue 12, to be measured.
    pub mod flat {
        /// Entry point, plain stores.
        pub const KERNEL: &str = "vector_add_flat";
        /// Entry point, streaming (`.cs`) stores.
        pub const CS_KERNEL: &str = "vector_add_flat_cs";
        /// Threads per CTA.
        pub const THREADS_PER_CTA: u32 = 256;
        /// 16-byte vectors of A (and of B) per thread per tile, all loads in flight together.
        pub const VECS_PER_THREAD: u32 = 4;
        /// Elements per tile: `4 x VECS_PER_THREAD x THREADS_PER_CTA`.
        pub const TILE_ELEMS: usize = 4 * (VECS_PER_THREAD * THREADS_PER_CTA) as usize;
        /// CTAs per SM of the persistent launch shape (host: `flat_persistent`).
        pub const CTAS_PER_SM: u32 = 4;
    }

    /// Candidate `vector_add_flat_v1`: the `flat` kernel shaped like PyTorch's vectorized
    /// elementwise kernel: 128 threads, one 16-byte vector of A and B per thread, one CTA per
    /// tile. Issue 12, to be measured.
    pub mod flat_v1 {
        /// Entry point.
        pub const KERNEL: &str = "vector_add_flat_v1";
        /// Threads per CTA.
        pub const THREADS_PER_CTA: u32 = 128;
        /// 16-byte vectors of A (and of B) per thread per tile.
        pub const VECS_PER_THREAD: u32 = 1;
        /// Elements per tile.
        pub const TILE_ELEMS: usize = 4 * (VECS_PER_THREAD * THREADS_PER_CTA) as usize;
    }
}

/// Batched 128x128x128 FP32 GEMM, `C_t = A_t x B_t` for each tile `t` (row-major f32 tiles,
/// what cuBLAS calls strided-batched SGEMM with m = n = k = 128). Two kernels share one layout:
/// `cluster_tile_gemm` (a cluster of 1..=8 CTAs splits each tile's rows; the leader CTA loads each
/// chunk of B once and multicasts it into every CTA of the cluster) and `tile_gemm` (one CTA per
/// tile, loads everything itself).
///
/// The register tile and the stage shape below (from [`VEC`](gemm::VEC) to [`A_PITCH`](gemm::A_PITCH)) are those of every
/// FP32 GEMM of the module: the split-K GEMM of [`pdl`] runs the same mainloop and epilogue
/// (gpu/src/kernels/gemm.rs) with its own `TILE_M x TILE_N` tile and [`pdl::K_CHUNK`].
pub mod gemm {
    use super::*;

    /// Entry point of the clustered kernel.
    pub const CLUSTER_KERNEL: &str = "cluster_tile_gemm";
    /// Entry point of the cluster-free kernel.
    pub const PLAIN_KERNEL: &str = "tile_gemm";
    /// Rows = columns = depth of one tile.
    pub const TILE: usize = 128;
    /// Elements of one tile (A, B or C).
    pub const TILE_ELEMS: usize = TILE * TILE;
    /// Depth of one pipeline stage (k-chunk): a stage holds `A[band, k0..k0+K_CHUNK]` and
    /// `B[k0..k0+K_CHUNK, 0..TILE]`.
    pub const K_CHUNK: usize = 64;
    /// k-chunks (stages' worth of data) per tile.
    pub const CHUNKS_PER_TILE: usize = TILE / K_CHUNK;
    /// Largest cluster (portable cluster size limit).
    pub const MAX_CLUSTER: u32 = 8;
    /// Cluster sizes the kernel supports: each CTA computes `TILE / cluster` rows with
    /// `8 / cluster` compute warps ([`WARP_ROWS`] rows per warp).
    pub const CLUSTER_SIZES: [u32; 4] = [1, 2, 4, 8];
    /// Warps of the loader role (bulk copies global -> shared).
    pub const LOADER_WARPS: u32 = 1;
    /// Compute warps of a whole cluster (and of a `tile_gemm` CTA): 256 threads, each with an 8x8
    /// block of C, cover the 128x128 tile.
    pub const CLUSTER_COMPUTE_WARPS: u32 = 8;

    /// Floats in one 16-byte vector (`ld.shared.v4`, `st.global.v4`, a 16-byte `cp.async`): the
    /// k-depth of one A load of the mainloop, the width of one B load and of one C store.
    pub const VEC: usize = 4;
    /// Compute threads side by side along the columns of C: a "row group" is `COL_GROUPS`
    /// consecutive compute threads that own the same rows, thread `g` of it columns
    /// `VEC g .. VEC g + VEC` of each [`COL_SPAN`]-wide column block.
    pub const COL_GROUPS: u32 = 16;
    /// Row groups per compute warp (`WARP_SIZE / COL_GROUPS` = 2): compute thread `t` is in row
    /// group `t / COL_GROUPS`.
    pub const ROW_GROUPS_PER_WARP: u32 = WARP_SIZE / COL_GROUPS;
    /// Columns one row group covers with one vector per thread (`COL_GROUPS x VEC` = 64): a
    /// thread's column vectors lie `COL_SPAN` apart.
    pub const COL_SPAN: usize = COL_GROUPS as usize * VEC;
    /// Rows of C per compute thread (its rows lie "number of row groups of the CTA" apart).
    pub const THREAD_ROWS: usize = 8;
    /// Rows of C per compute warp (`ROW_GROUPS_PER_WARP x THREAD_ROWS` = 16).
    pub const WARP_ROWS: u32 = ROW_GROUPS_PER_WARP * THREAD_ROWS as u32;
    /// Column vectors per compute thread of a tile (`TILE / COL_SPAN` = 2: a thread owns an 8x8
    /// block of C).
    pub const COL_VECS: usize = TILE / COL_SPAN;
    /// Floats of padding after each A row of a stage: a warp's two row groups read adjacent rows,
    /// `A_PAD` banks apart, so their 16-byte loads do not conflict (and rows stay 16-byte aligned).
    pub const A_PAD: usize = 4;
    /// Row pitch of a stage's A chunk in shared memory, floats.
    pub const A_PITCH: usize = K_CHUNK + A_PAD;
    /// k-steps of the mainloop per unrolled iteration (`K_UNROLL / VEC` vector steps): unrolling a
    /// whole 64-deep chunk spills.
    pub const K_UNROLL: usize = 16;

    /// Bytes of one global row-piece of the A chunk (one bulk copy).
    pub const A_ROW_CHUNK_BYTES: usize = K_CHUNK * F32_BYTES;
    /// Bytes of one stage's B chunk (contiguous in global memory: one bulk copy).
    pub const B_STAGE_BYTES: usize = K_CHUNK * TILE * F32_BYTES;
    /// Shared-memory layout: `[stages full mbarriers | stages empty mbarriers | pad]` then
    /// `stages x [A chunk | B chunk]`.
    pub const BARRIERS_OFFSET: usize = 0;
    /// Offset of stage 0 (128-byte aligned).
    pub const BUFFERS_OFFSET: usize = 128;

    /// Rows of each tile (the A band) a CTA of a cluster of `cluster` CTAs computes.
    pub const fn band_rows(cluster: u32) -> u32 {
        TILE as u32 / cluster
    }
    /// Compute warps per CTA for a cluster of `cluster` CTAs ([`WARP_ROWS`] rows of the band each).
    pub const fn compute_warps(cluster: u32) -> u32 {
        CLUSTER_COMPUTE_WARPS / cluster
    }
    /// Threads per CTA for a cluster of `cluster` CTAs: the loader warp first, then the compute
    /// warps (288, 160, 96, 64 for 1, 2, 4, 8).
    pub const fn threads_per_cta(cluster: u32) -> u32 {
        WARP_SIZE * (LOADER_WARPS + compute_warps(cluster))
    }
    /// Depth of the stage ring for a cluster of `cluster` CTAs: as deep as fits one CTA per SM
    /// (cluster 1) or two CTAs per SM (clusters of 2, 4, 8: at most [`SMEM_BYTES_2_PER_SM`]).
    pub const fn stages(cluster: u32) -> usize {
        match cluster {
            1 => 3,
            2 => 2,
            4 => 2,
            _ => 3,
        }
    }
    /// Bytes reserved for one stage's A chunk (the band's rows, pitch `A_PITCH`).
    pub const fn a_stage_bytes(cluster: u32) -> usize {
        band_rows(cluster) as usize * A_PITCH * F32_BYTES
    }
    /// Bytes of one stage `[A chunk | B chunk]`.
    pub const fn stage_bytes(cluster: u32) -> usize {
        a_stage_bytes(cluster) + B_STAGE_BYTES
    }
    /// Dynamic shared memory per CTA for a cluster of `cluster` CTAs, bytes (209,024; 102,528;
    /// 105,088; 112,256 for 1, 2, 4, 8).
    pub const fn smem_bytes(cluster: u32) -> usize {
        BUFFERS_OFFSET + stages(cluster) * stage_bytes(cluster)
    }
    /// Largest dynamic shared memory per CTA with which two CTAs fit on an sm_90 SM (228 KiB per
    /// SM, 1 KiB reserved per CTA).
    pub const SMEM_BYTES_2_PER_SM: usize = 228 * 1024 / 2 - 1024;
    /// `tile_gemm`'s threads per CTA (the layout of a cluster of 1).
    pub const THREADS_PER_CTA: u32 = threads_per_cta(1);
    /// `tile_gemm`'s dynamic shared memory per CTA, and the largest `cluster_tile_gemm` uses
    /// (cluster of 1), bytes.
    pub const SMEM_BYTES: usize = smem_bytes(1);
    /// Largest stage ring of any cluster size.
    pub const MAX_STAGES: usize = 6;
    /// Largest tile count (tile indices and element offsets stay in range).
    pub const MAX_TILES: usize = (u32::MAX / 2) as usize;

    const _: () = {
        assert!(TILE.is_multiple_of(K_CHUNK));
        assert!(K_CHUNK.is_multiple_of(K_UNROLL) && K_UNROLL == 4 * VEC);
        assert!(VEC * F32_BYTES == 16 && A_PAD.is_multiple_of(VEC));
        assert!(WARP_SIZE.is_multiple_of(COL_GROUPS));
        assert!(COL_VECS * COL_SPAN == TILE);
        assert!(CLUSTER_COMPUTE_WARPS * WARP_ROWS == TILE as u32);
        assert!(BARRIERS_OFFSET + 2 * MAX_STAGES * MBARRIER_BYTES <= BUFFERS_OFFSET);
        assert!(SMEM_BYTES <= 227 * 1024);
        let mut i = 0;
        while i < CLUSTER_SIZES.len() {
            let n = CLUSTER_SIZES[i];
            assert!(compute_warps(n) * WARP_ROWS == band_rows(n));
            assert!(stages(n) <= MAX_STAGES);
            assert!(a_stage_bytes(n).is_multiple_of(128) && stage_bytes(n).is_multiple_of(128));
            assert!(smem_bytes(n) <= SMEM_BYTES);
            assert!(n == 1 || smem_bytes(n) <= SMEM_BYTES_2_PER_SM);
            i += 1;
        }
    };
}

/// Signal kernels and the ordering probes (gpu/src/kernels/signal.rs); none uses shared memory.
pub mod signal {
    /// Device-side set: `(sig: *mut u64, value: u64)`, one thread.
    pub const SET_KERNEL: &str = "ws_signal_set";
    /// Device-side atomic add: `(sig: *mut u64, value: u64)`, one thread.
    pub const ADD_KERNEL: &str = "ws_signal_add";
    /// Device-side spinning wait until `>= value`: `(sig: *const u64, value: u64)`.
    pub const WAIT_KERNEL: &str = "ws_signal_wait";
    /// Timed busy work, then `out[i] = pattern(seed, i)`: `(out: *mut u32, n: u32, seed: u32, spin_ns: u64)`.
    pub const BUSY_FILL_KERNEL: &str = "ws_busy_fill";
    /// `dst[i] = src[i]`: `(src: *const u32, dst: *mut u32, n: u32)`.
    pub const COPY_KERNEL: &str = "ws_copy_u32";
    /// `*slot = atomicAdd(counter, 1)`: `(counter: *mut u32, slot: *mut u32)`.
    pub const ARRIVAL_KERNEL: &str = "ws_record_arrival";
    /// Threads per CTA of the grid-stride probes.
    pub const THREADS_PER_CTA: u32 = 256;

    /// The value `ws_busy_fill` writes at index `i` (host and device compute it the same way).
    #[inline(always)]
    pub const fn pattern(seed: u32, i: u32) -> u32 {
        (seed ^ i.wrapping_mul(0x9E37_79B9)).rotate_left(7)
    }
}

/// Programmatic Dependent Launch (ch. 11, "Programmatic Dependent Launch" and "Combining PDL and
/// Thread Block Clusters with Warp Specialization"): the kernel_A / kernel_B pair, the
/// primary / secondary GEMM pair (clusters of 2 CTAs, warp-specialized), and `chain_step`.
pub mod pdl {
    use super::*;

    /// Producer of the pair: `buf[i] = 2 * inp[i] + 1`, then triggers the dependent.
    pub const PRODUCER_KERNEL: &str = "pdl_producer";
    /// Test-only producer that triggers *before* its stores (negative control).
    pub const EARLY_TRIGGER_KERNEL: &str = "pdl_producer_early_trigger";
    /// Consumer of the pair: waits, then `out[i] = buf[i] * scale[i]` (no global read before the
    /// wait: the previous kernel may write `scale` as well as `buf`).
    pub const CONSUMER_KERNEL: &str = "pdl_consumer";
    /// Test-only consumer that reads `buf` *without* waiting (negative control).
    pub const CONSUMER_NO_WAIT_KERNEL: &str = "pdl_consumer_no_wait";
    /// Threads per CTA of the pair kernels (grid-stride loops, any grid size).
    pub const PAIR_THREADS: u32 = 256;

    /// `x[i] += 1` for `i < n`: wait at start, trigger after the stores.
    pub const CHAIN_STEP_KERNEL: &str = "chain_step";
    /// Threads per CTA of `chain_step`.
    pub const CHAIN_STEP_THREADS: u32 = 256;

    /// `C = A · B` (f32, row-major), triggers after its last store of C.
    pub const PRIMARY_GEMM_KERNEL: &str = "primary_gemm";
    /// `C = A · B` where A is the primary's output: prologue (barriers, B tiles) before the wait.
    pub const SECONDARY_GEMM_KERNEL: &str = "secondary_gemm";
    /// Rows of C per cluster tile.
    pub const TILE_M: usize = 64;
    /// Columns of C per cluster tile.
    pub const TILE_N: usize = 64;
    /// Depth (K) of one pipeline stage (the concept of [`super::gemm::K_CHUNK`]).
    pub const K_CHUNK: usize = 32;
    /// Pipeline depth.
    pub const STAGES: usize = 3;
    /// CTAs per cluster: the two CTAs split K in halves and reduce through DSMEM.
    pub const CLUSTER_CTAS: u32 = 2;
    /// Producer warps (cp.async global -> shared, one stage at a time).
    pub const PRODUCER_WARPS: u32 = 1;
    /// Consumer warps (FMA on the staged tiles).
    pub const CONSUMER_WARPS: u32 = 4;
    /// Threads per GEMM CTA.
    pub const GEMM_THREADS: u32 = WARP_SIZE * (PRODUCER_WARPS + CONSUMER_WARPS);
    pub use super::gemm::{A_PAD, COL_GROUPS, COL_SPAN, THREAD_ROWS, VEC};
    /// Column vectors per consumer thread (`TILE_N / COL_SPAN` = 1: 8 x 4 accumulators per
    /// thread, rows `TILE_M / THREAD_ROWS` apart).
    pub const COL_VECS: usize = TILE_N / COL_SPAN;
    /// Row/column elements must be multiples of this (16-byte rows for cp.async 16).
    pub const ROW_ALIGN_ELEMS: usize = VEC;

    /// Shared-memory layout (bytes from the start of dynamic shared memory):
    /// `[full mbarriers x STAGES][empty mbarriers x STAGES][pad]`, then `STAGES x [A | B]`
    /// (A: `TILE_M x K_CHUNK` with row pitch `A_PITCH`, B: `K_CHUNK x TILE_N`, row-major f32),
    /// then the `TILE_M x TILE_N` split-K partial that rank 1 hands to rank 0 through DSMEM.
    pub const BARRIERS_OFFSET: usize = 0;
    /// Offset of stage 0's A tile (128-byte aligned).
    pub const BUFFERS_OFFSET: usize = 128;
    /// Row pitch of a staged A tile, in f32: `K_CHUNK` plus [`A_PAD`] (the concept of
    /// [`super::gemm::A_PITCH`]).
    pub const A_PITCH: usize = K_CHUNK + A_PAD;
    /// Bytes of one A tile.
    pub const A_TILE_BYTES: usize = TILE_M * A_PITCH * F32_BYTES;
    /// Bytes of one B tile.
    pub const B_TILE_BYTES: usize = K_CHUNK * TILE_N * F32_BYTES;
    /// Bytes of one stage `[A | B]`.
    pub const STAGE_BYTES: usize = A_TILE_BYTES + B_TILE_BYTES;
    /// Offset of the split-K partial tile.
    pub const PARTIAL_OFFSET: usize = BUFFERS_OFFSET + STAGES * STAGE_BYTES;
    /// Dynamic shared memory per GEMM CTA, bytes.
    pub const GEMM_SMEM_BYTES: usize = PARTIAL_OFFSET + TILE_M * TILE_N * F32_BYTES;

    /// `u64` %globaltimer stamps per CTA (nanoseconds): start, middle (primary: trigger; secondary:
    /// wait returned), end.
    pub const STAMPS_PER_CTA: usize = 3;

    const _: () = assert!(BARRIERS_OFFSET + 2 * STAGES * MBARRIER_BYTES <= BUFFERS_OFFSET);
    const _: () = assert!(
        (CONSUMER_WARPS * WARP_SIZE) as usize * THREAD_ROWS * COL_VECS * VEC == TILE_M * TILE_N
    );
    const _: () = assert!(COL_VECS * COL_SPAN == TILE_N && TILE_M.is_multiple_of(THREAD_ROWS));
    const _: () = assert!(K_CHUNK.is_multiple_of(super::gemm::K_UNROLL));
    const _: () = assert!(STAGE_BYTES.is_multiple_of(128) && A_TILE_BYTES.is_multiple_of(16));
}

/// Tensor-core GEMM for Hopper (sm_90a module, `gpu/src/kernels/tc_gemm.rs`):
/// `C[M,N] = alpha * A[M,K] * B[K,N] + beta * C`, BF16 or FP16 inputs, FP32 accumulation, FP32 or
/// 16-bit (same type as the inputs) output. A is row-major (K contiguous). B is either
/// column-major (K contiguous, "K-major": entries ending `_bcol`) or row-major (N contiguous,
/// "N-major": entries ending `_brow`). C is row-major with row pitch `ldc` elements.
///
/// Structure (chapter 11, Figures 11-10/11-11, done with TMA and wgmma): one producer warpgroup
/// (one thread issues TMA loads into a `STAGES`-deep ring completing on mbarriers with expect-tx)
/// and two consumer warpgroups (wgmma `m64n256k16`, 64 rows of the `BM x BN` CTA tile each,
/// "cooperative"), a persistent grid walking output tiles in a grouped raster order, clusters of 1
/// or 2 CTAs along M that multicast the B tile both CTAs share, and a TMA-store epilogue that
/// overlaps the next tile's mainloop. Calls `griddepcontrol.wait` before its first global access
/// and `launch_dependents` once its last mainloop load is issued, so it may be launched with PDL.
///
/// Kernel parameters, in order (all entries):
/// `(tmap_a: u64, tmap_b: u64, tmap_c: u64, c: u64, m: u32, n: u32, k: u32, ldc: u32, alpha: f32,
///   beta: f32, out_f32: u32, raster: u32, group: u32)`:
/// - `tmap_a`, `tmap_b`, `tmap_c`: device (global-memory) addresses of 128-byte, 64-byte aligned
///   `CUtensorMap`s made by `cuTensorMapEncodeTiled` (see [`tc_gemm::A_BOX`], ...);
/// - `c`: device address of C (read when `beta != 0`), `ldc` its row pitch in elements;
/// - `out_f32`: 1 when C is f32, 0 when C has the input type;
/// - `raster`: [`tc_gemm::RASTER_ALONG_M`] or [`tc_gemm::RASTER_ALONG_N`]; `group`: tiles per
///   raster group (>= 1).
///
/// FP8 (issue 20): the entries `tc_gemm_e4m3*_bcol` take E4M3 A and E4M3 or E5M2 B, both
/// K-major (B column-major, i.e. stored `N x K` row-major: "TN"), accumulate in the tensor
/// cores' FP32 accumulators (`wgmma ... k32.f32.e4m3.*`), write BF16 (`out_f32 = 0`) or f32 C,
/// and append `a_scale: u64, b_scale: u64` to the parameter list ([`tc_gemm::FP8_EXTRA_PARAMS`]).
/// A k-block is [`tc_gemm::FP8_BK`] elements (128 bytes, as the 16-bit k-block), with boxes
/// [`tc_gemm::A_BOX_FP8`] and [`tc_gemm::B_BOX_KMAJOR_FP8`]; the shared-memory layout is the
/// same in bytes.
///
/// CTA tiles are `BM x BN` (ping-pong entry: `WG_M x BN`); cluster tiles `cluster` CTA tiles
/// along M. Grid: whole clusters, any count (persistent); `ceil(ceil(M / tile rows) / cluster) *
/// ceil(N / BN)` must fit in `MAX_UNITS`.
pub mod tc_gemm {
    use super::*;

    /// Entry: BF16 inputs, B column-major (K-major).
    pub const KERNEL_BF16_BCOL: &str = "tc_gemm_bf16_bcol";
    /// Entry: BF16 inputs, B row-major (N-major).
    pub const KERNEL_BF16_BROW: &str = "tc_gemm_bf16_brow";
    /// Entry: FP16 inputs, B column-major (K-major).
    pub const KERNEL_F16_BCOL: &str = "tc_gemm_f16_bcol";
    /// Entry: FP16 inputs, B row-major (N-major).
    pub const KERNEL_F16_BROW: &str = "tc_gemm_f16_brow";
    /// Entry: BF16 inputs, B column-major, *ping-pong* consumers: each consumer warpgroup computes
    /// whole `WG_M x BN` tiles (CTA tiles of `WG_M` rows), the two taking alternate tiles so one's
    /// epilogue overlaps the other's mainloop. A's box is [`A_BOX_PINGPONG`]; everything else as
    /// the cooperative entries (which split each `BM x BN` tile's rows between the two).
    pub const KERNEL_BF16_BCOL_PINGPONG: &str = "tc_gemm_bf16_bcol_pingpong";
    /// Entry: FP8 inputs, A and B E4M3 (OCP FP8), B column-major (K-major; FP8 wgmma has no
    /// transpose, PTX ISA §9.7.15.5.2), BF16 or f32 output. Parameters: the common list plus
    /// [`FP8_EXTRA_PARAMS`].
    pub const KERNEL_E4M3_BCOL: &str = "tc_gemm_e4m3_bcol";
    /// Entry: FP8 inputs, A E4M3, B E5M2, B column-major; otherwise as [`KERNEL_E4M3_BCOL`].
    pub const KERNEL_E4M3_E5M2_BCOL: &str = "tc_gemm_e4m3_e5m2_bcol";
    /// Entry: as [`KERNEL_E4M3_BCOL`] with ping-pong consumers (as
    /// [`KERNEL_BF16_BCOL_PINGPONG`]; A box [`A_BOX_PINGPONG_FP8`]).
    pub const KERNEL_E4M3_BCOL_PINGPONG: &str = "tc_gemm_e4m3_bcol_pingpong";
    /// The FP8 entries' parameters after the common list: `a_scale: u64, b_scale: u64`, device
    /// addresses of one f32 each (4-byte aligned), or 0 for 1.0. Read once per consumer
    /// warpgroup after `griddepcontrol.wait`; the epilogue computes
    /// `alpha * a_scale * b_scale * acc + beta * C` (cuBLASLt's `A_SCALE_POINTER` /
    /// `B_SCALE_POINTER`).
    pub const FP8_EXTRA_PARAMS: usize = 2;
    /// Entry: block-scaled FP8 (DeepSeek-V3 fine-grained scaling, as DeepGEMM), A and B E4M3, B
    /// column-major, BF16 or f32 output, cooperative `BM x BN` tiles. Parameters: the common list
    /// plus [`FP8_BLOCK_EXTRA_PARAMS`]. Every 128-wide k-block (one stage) is multiplied by the
    /// tensor cores into a temporary FP32 accumulator (`wgmma m64n128k32`, the tile's two
    /// 128-column halves one after the other), which is then added in FP32 registers into the
    /// tile's accumulator times `a_scale[row, kb] * b_scale[col / 128, kb]` ("promotion").
    pub const KERNEL_E4M3_BCOL_BLOCK_SCALED: &str = "tc_gemm_e4m3_bcol_block_scaled";
    /// Side of a scale block: A has one scale per row and 128-wide k-block (`1 x 128`), B one per
    /// `128 x 128` block of (N, K) (DeepSeek-V3, arXiv 2412.19437, §3.3.2). Equal to
    /// [`FP8_BK`], so one stage is one scale block along K, and to half of [`BN`], so each
    /// 128-column half of a tile has one B scale per k-block.
    pub const SCALE_BLOCK: usize = 128;
    /// The block-scaled entry's parameters after the common list:
    /// `a_scale: u64, b_scale: u64, a_scales_ld: u32, b_scales_ld: u32` (the per-tensor entries'
    /// two scale addresses, here of the scale arrays, then their pitches):
    /// - `a_scale`: device address of f32 A scales, `[ceil(K / 128)][a_scales_ld]` ("M-major",
    ///   DeepGEMM's transposed layout): the scale of row `i`, k-block `kb` at
    ///   `a_scale[kb * a_scales_ld + i]`, `a_scales_ld >= M`;
    /// - `b_scale`: device address of f32 B scales, `[ceil(N / 128)][b_scales_ld]` (K-major):
    ///   the scale of N block `nb`, k-block `kb` at `b_scale[nb * b_scales_ld + kb]`,
    ///   `b_scales_ld >= ceil(K / 128)`.
    ///
    /// Both 4-byte aligned, read by the consumers after `griddepcontrol.wait`, not written until
    /// the kernel completes. The epilogue computes `alpha * acc + beta * C`.
    pub const FP8_BLOCK_EXTRA_PARAMS: usize = 4;
    /// Bytes of one FP8 element.
    pub const FP8_IN_BYTES: usize = 1;
    /// K per stage of the FP8 entries: 128 one-byte elements = 128 bytes, the span of the
    /// 128-byte swizzle (so every stage's shared-memory layout, in bytes, equals the 16-bit one).
    pub const FP8_BK: usize = 128;
    /// K of one FP8 wgmma instruction (`m64nNk32`).
    pub const FP8_WGMMA_K: usize = 32;
    /// TMA box of an FP8 A, `{inner (K), outer (M)}` elements, 128-byte swizzle.
    pub const A_BOX_FP8: [u32; 2] = [FP8_BK as u32, BM as u32];
    /// TMA box of an FP8 A for the ping-pong entry (CTA tiles of `WG_M` rows).
    pub const A_BOX_PINGPONG_FP8: [u32; 2] = [FP8_BK as u32, WG_M as u32];
    /// TMA box of an FP8 K-major B, `{inner (K), outer (N)}`: half the tile's N, as
    /// [`B_BOX_KMAJOR`].
    pub const B_BOX_KMAJOR_FP8: [u32; 2] = [FP8_BK as u32, (BN / 2) as u32];

    /// Bytes of one BF16/FP16 element.
    pub const IN_BYTES: usize = 2;
    /// Rows of C per CTA tile (two consumer warpgroups x 64).
    pub const BM: usize = 128;
    /// Columns of C per CTA tile (the N of `wgmma.m64n256k16`).
    pub const BN: usize = 256;
    /// K per stage: 64 16-bit elements = 128 bytes, the span of the 128-byte swizzle.
    pub const BK: usize = 64;
    /// K of one wgmma instruction.
    pub const WGMMA_K: usize = 16;
    /// Rows of C per consumer warpgroup (the M of the wgmma instruction).
    pub const WG_M: usize = 64;
    /// Pipeline depth (shared-memory stages of `[A | B]`).
    pub const STAGES: usize = 4;
    /// Threads per warpgroup.
    pub const WARPGROUP_THREADS: u32 = 4 * WARP_SIZE;
    /// Consumer warpgroups (each computes `WG_M` rows of the tile).
    pub const CONSUMER_WARPGROUPS: u32 = 2;
    /// Threads per CTA: one producer warpgroup plus the consumers.
    pub const THREADS_PER_CTA: u32 = WARPGROUP_THREADS * (1 + CONSUMER_WARPGROUPS);
    /// Registers per thread the producer warpgroup keeps (`setmaxnreg.dec`).
    pub const PRODUCER_REGS: u32 = 40;
    /// Registers per thread a consumer warpgroup gets (`setmaxnreg.inc`).
    pub const CONSUMER_REGS: u32 = 232;
    /// Cluster sizes the kernel supports (along M; the pair shares and multicasts B).
    pub const CLUSTER_SIZES: [u32; 2] = [1, 2];

    /// TMA box of A, `{inner (K), outer (M)}` elements, 128-byte swizzle.
    pub const A_BOX: [u32; 2] = [BK as u32, BM as u32];
    /// TMA box of A for the ping-pong entry (CTA tiles of `WG_M` rows).
    pub const A_BOX_PINGPONG: [u32; 2] = [BK as u32, WG_M as u32];
    /// TMA box of a K-major (column-major) B, `{inner (K), outer (N)}`: half the tile's N, so a
    /// cluster of 2 loads one half per CTA and multicasts it (a lone CTA issues both halves).
    pub const B_BOX_KMAJOR: [u32; 2] = [BK as u32, (BN / 2) as u32];
    /// TMA box of an N-major (row-major) B, `{inner (N), outer (K)}`: 64 columns (128 bytes, the
    /// swizzle span) by `BK` rows; a tile's B half takes `BN / 2 / 64` boxes.
    pub const B_BOX_NMAJOR: [u32; 2] = [64, BK as u32];
    /// Bytes of one row of the C staging chunk (the 128-byte swizzle span): 32 f32 or 64 16-bit.
    pub const C_CHUNK_ROW_BYTES: usize = 128;
    /// TMA box of C with f32 output, `{inner (N), outer (M)}`.
    pub const C_BOX_F32: [u32; 2] = [(C_CHUNK_ROW_BYTES / F32_BYTES) as u32, WG_M as u32];
    /// TMA box of C with 16-bit output.
    pub const C_BOX_16: [u32; 2] = [(C_CHUNK_ROW_BYTES / IN_BYTES) as u32, WG_M as u32];

    /// Bytes of one stage's A tile (`BM x BK`).
    pub const A_STAGE_BYTES: usize = BM * BK * IN_BYTES;
    /// Bytes of one stage's B tile (`BN x BK`).
    pub const B_STAGE_BYTES: usize = BN * BK * IN_BYTES;
    /// Bytes of one C staging chunk (`WG_M` rows x 128 bytes).
    pub const C_CHUNK_BYTES: usize = WG_M * C_CHUNK_ROW_BYTES;
    /// C staging chunks per consumer warpgroup (double-buffered TMA stores).
    pub const C_CHUNKS: usize = 2;

    /// Shared-memory layout, byte offsets from the 1024-byte aligned base (dynamic shared memory
    /// rounded up; the launch asks for [`SMEM_BYTES`], which includes the 1 KiB of slack):
    /// `STAGES x A | STAGES x B | 2 warpgroups x C_CHUNKS x C chunk | full[STAGES] | empty[STAGES]
    /// | order[2]`.
    pub const A_OFFSET: usize = 0;
    /// Offset of stage 0's B tile.
    pub const B_OFFSET: usize = A_OFFSET + STAGES * A_STAGE_BYTES;
    /// Offset of the C staging chunks.
    pub const C_OFFSET: usize = B_OFFSET + STAGES * B_STAGE_BYTES;
    /// Offset of the pipeline's mbarriers.
    pub const BARRIERS_OFFSET: usize =
        C_OFFSET + CONSUMER_WARPGROUPS as usize * C_CHUNKS * C_CHUNK_BYTES;
    /// Alignment the 128-byte swizzle needs for every tile base.
    pub const SWIZZLE_ALIGN: usize = 1024;
    /// Dynamic shared memory per CTA, bytes (layout + barriers + alignment slack).
    /// Offset of the ping-pong mainloop-order mbarriers (one per consumer warpgroup).
    pub const ORDER_BARRIERS_OFFSET: usize = BARRIERS_OFFSET + 2 * STAGES * MBARRIER_BYTES;
    /// Dynamic shared memory per CTA, bytes (layout + barriers + alignment slack).
    pub const SMEM_BYTES: usize =
        ORDER_BARRIERS_OFFSET + CONSUMER_WARPGROUPS as usize * MBARRIER_BYTES + SWIZZLE_ALIGN;

    /// Raster order: consecutive tiles walk down M within a band of `group` tile rows (cluster
    /// tiles: `cluster` M tiles each), then move one tile along N (Triton's grouped order).
    pub const RASTER_ALONG_M: u32 = 0;
    /// Raster order: consecutive tiles walk along N within a band of `group` tile columns, then
    /// move one (cluster) tile down M.
    pub const RASTER_ALONG_N: u32 = 1;
    /// Largest number of cluster tiles `ceil(ceil(M / BM) / cluster) * ceil(N / BN)` a launch may
    /// have (the scheduler counts them in 32 bits; the launcher checks).
    pub const MAX_UNITS: u64 = u32::MAX as u64;
    /// Default raster group (tiles).
    pub const DEFAULT_GROUP: u32 = 8;

    const _: () = {
        assert!(BM == CONSUMER_WARPGROUPS as usize * WG_M);
        assert!(BK * IN_BYTES == 128 && BK.is_multiple_of(WGMMA_K));
        assert!(FP8_BK * FP8_IN_BYTES == 128 && FP8_BK / FP8_WGMMA_K == BK / WGMMA_K);
        assert!(FP8_WGMMA_K * FP8_IN_BYTES == WGMMA_K * IN_BYTES);
        assert!(SCALE_BLOCK == FP8_BK && 2 * SCALE_BLOCK == BN);
        assert!(A_STAGE_BYTES.is_multiple_of(SWIZZLE_ALIGN));
        assert!(B_STAGE_BYTES.is_multiple_of(SWIZZLE_ALIGN));
        assert!(C_CHUNK_BYTES.is_multiple_of(SWIZZLE_ALIGN));
        assert!((BN / 2).is_multiple_of(64));
        assert!(SMEM_BYTES <= 227 * 1024);
        assert!(
            PRODUCER_REGS * WARPGROUP_THREADS
                + CONSUMER_REGS * WARPGROUP_THREADS * CONSUMER_WARPGROUPS
                <= 65536
        );
    };
}

/// Swap-AB tensor-core GEMM with split-K across a cluster (issue 20), sm_90a module,
/// `gpu/src/kernels/swap_ab_gemm.rs`: `C[M,N] = epilogue(alpha * A[M,K] * B[K,N]) + beta * C`
/// for few rows of A (tokens), B column-major (the weights, `N x K`, K contiguous), BF16 inputs,
/// FP32 accumulation, FP32 or BF16 output.
///
/// Structure: the kernel computes `C^T = B^T A^T`, so the weights are wgmma's A operand (64
/// weight rows per consumer warpgroup, [`W_ROWS`](swap_ab_gemm::W_ROWS) per CTA) and the tokens
/// its B operand (`wgmma.m64nNk16` with `N` = the entry's token tile `NT` in
/// [`TOKEN_TILES`](swap_ab_gemm::TOKEN_TILES)). Both arrive by TMA (128-byte swizzle) in a ring
/// of `stages(NT)` stages. The k-blocks of one output tile are split between the `ksplit` CTAs
/// of a cluster (`ksplit` in [`KSPLITS`](swap_ab_gemm::KSPLITS)): each CTA writes its FP32
/// partial tile to shared memory, and after a cluster barrier CTA `r` adds the partials of
/// every CTA for its tokens `r NT / ksplit .. (r + 1) NT / ksplit` through distributed shared
/// memory (ranks in the fixed
/// order 0, 1, ..: deterministic), applies the epilogue and stores.
///
/// Parameters, in order: `(tmap_w: u64, tmap_x: u64, c: u64, bias: u64, m: u32, n: u32, k: u32,
/// ldc: u32, alpha: f32, beta: f32, out_f32: u32, epilogue: u32, flags: u32, stamps: u64, norm:
/// u64)` (`stamps`: the decode step's `%globaltimer` buffer or 0; `norm`: the fused RMSNorm's
/// argument block with [`FLAG_NORM_IN`](swap_ab_gemm::FLAG_NORM_IN) or
/// [`FLAG_NORM_OUT`](swap_ab_gemm::FLAG_NORM_OUT), else unread). `tmap_w`: BF16
/// `{K, N}` map (or the tiled map of [`FLAG_W_TILED`](swap_ab_gemm::FLAG_W_TILED)), box
/// [`W_BOX`](swap_ab_gemm::W_BOX); `tmap_x`: BF16 `{K, M}` map, box
/// `x_box(NT)`; both 128-byte swizzle, zero fill. `c`: row-major C (`M x N`, or `M x N / 2` for
/// [`EPI_SWIGLU`](swap_ab_gemm::EPI_SWIGLU)), pitch `ldc` a multiple of 8 elements, 16-byte
/// aligned. `bias`: 0 or the address of `N` f32. Launch: grid `(n_tiles * ksplit, ceil(M / NT),
/// 1)` with `n_tiles = ceil(N / W_ROWS)`, cluster `(ksplit, 1, 1)`, [`THREADS_PER_CTA`](swap_ab_gemm::THREADS_PER_CTA)
/// threads, `smem_bytes(NT)` of dynamic shared memory, `ksplit <= ceil(K / BK)`; the kernel
/// traps on another block size or a cluster that is not one of [`KSPLITS`](swap_ab_gemm::KSPLITS).
pub mod swap_ab_gemm {
    use super::*;

    /// Entries, one per token tile of [`TOKEN_TILES`] (same order).
    pub const KERNELS: [&str; 5] = [
        "swap_ab_gemm_bf16_n8",
        "swap_ab_gemm_bf16_n16",
        "swap_ab_gemm_bf16_n32",
        "swap_ab_gemm_bf16_n64",
        "swap_ab_gemm_bf16_n128",
    ];
    /// Tokens (rows of A, rows of C) per CTA: the N of the entry's wgmma.
    pub const TOKEN_TILES: [u32; 5] = [8, 16, 32, 64, 128];
    /// Cluster sizes (CTAs that split one tile's K).
    pub const KSPLITS: [u32; 5] = [1, 2, 3, 4, 8];
    /// Whether `ks` is one of [`KSPLITS`] (the kernel traps on any other cluster size).
    pub const fn is_ksplit(ks: u32) -> bool {
        let mut i = 0;
        while i < KSPLITS.len() {
            if KSPLITS[i] == ks {
                return true;
            }
            i += 1;
        }
        false
    }
    /// Bytes of one BF16 element.
    pub const IN_BYTES: usize = 2;
    /// Weight rows (columns of C) per consumer warpgroup: the M of wgmma.
    pub const WG_ROWS: usize = 64;
    /// Consumer warpgroups. One: a CTA streams 64 weight rows, so that small N still gives
    /// enough CTAs to keep every SM reading (measured on the H200, session 13: with 128-row CTAs
    /// each CTA read at most ~35 GB/s whatever its ring depth, and 4096 x 4096 left half the
    /// SMs idle).
    pub const CONSUMER_WARPGROUPS: u32 = 1;
    /// Weight rows per CTA.
    pub const W_ROWS: usize = WG_ROWS * CONSUMER_WARPGROUPS as usize;
    /// K per stage: 64 BF16 = 128 bytes, the 128-byte swizzle span.
    pub const BK: usize = 64;
    /// K of one wgmma.
    pub const WGMMA_K: usize = 16;
    /// Threads per warpgroup.
    pub const WARPGROUP_THREADS: u32 = 4 * WARP_SIZE;
    /// Threads per CTA: the consumer warpgroup (warps 0..4) and one producer warp (warp 4).
    pub const THREADS_PER_CTA: u32 = CONSUMER_WARPGROUPS * WARPGROUP_THREADS + WARP_SIZE;
    /// TMA box of the weights, `{K, N}` elements.
    pub const W_BOX: [u32; 2] = [BK as u32, W_ROWS as u32];
    /// TMA box of the tokens for token tile `nt`, `{K, M}` elements.
    pub const fn x_box(nt: u32) -> [u32; 2] {
        [BK as u32, nt]
    }
    /// Bytes of one stage's weight tile.
    pub const W_STAGE_BYTES: usize = W_ROWS * BK * IN_BYTES;
    /// Bytes of one stage's token tile.
    pub const fn x_stage_bytes(nt: u32) -> usize {
        nt as usize * BK * IN_BYTES
    }
    /// f32 per token row of the partial tile: `W_ROWS` plus 4 of padding (the accumulator
    /// stores of one warp then hit 32 distinct banks).
    pub const PARTIAL_PITCH: usize = W_ROWS + 4;
    /// Bytes of the partial tile (`NT` tokens x [`PARTIAL_PITCH`] f32).
    pub const fn partial_bytes(nt: u32) -> usize {
        nt as usize * PARTIAL_PITCH * F32_BYTES
    }
    /// Alignment of every swizzled tile.
    pub const SWIZZLE_ALIGN: usize = 1024;
    /// Most stages a ring may have.
    pub const MAX_STAGES: usize = 12;
    /// Shared memory a CTA may use (227 KiB).
    pub const SMEM_LIMIT: usize = 227 * 1024;
    /// Shared memory of a CTA that shares its SM with another: half of the SM's 228 KiB less
    /// the 1 KiB the driver reserves per CTA.
    pub const SMEM_HALF_SM: usize = 113 * 1024;
    /// Shared memory a CTA of token tile `nt` sizes its ring for: two CTAs per SM up to 64
    /// tokens ([`SMEM_HALF_SM`]), one above.
    pub const fn smem_target(nt: u32) -> usize {
        if nt <= 64 {
            SMEM_HALF_SM
        } else {
            SMEM_LIMIT
        }
    }
    /// Pipeline depth of token tile `nt`: as many `[W | X]` stages as fit beside the
    /// barriers, the fused RMSNorm's words and the alignment slack within [`smem_target`], at
    /// most [`MAX_STAGES`] (the partial tile reuses the ring: [`partial_offset`]).
    pub const fn stages(nt: u32) -> usize {
        let fixed = SWIZZLE_ALIGN + 2 * MAX_STAGES * MBARRIER_BYTES + norm_bytes(nt);
        let s = (smem_target(nt) - fixed) / (W_STAGE_BYTES + x_stage_bytes(nt));
        if s > MAX_STAGES {
            MAX_STAGES
        } else {
            s
        }
    }
    /// Layout from the 1024-byte aligned base: `stages x W | stages x X | full[stages] |
    /// empty[stages] | norm area` ([`norm_offset`]), the partial tile over the ring's start
    /// ([`partial_offset`]). Offset of stage 0's token tile.
    pub const fn x_offset(nt: u32) -> usize {
        stages(nt) * W_STAGE_BYTES
    }
    /// Offset of the partial tile: the ring's first bytes, which the consumers overwrite only
    /// after the mainloop (every TMA write into the ring has landed and every wgmma reading
    /// it has retired), so the ring gets those bytes as stages.
    pub const fn partial_offset(_nt: u32) -> usize {
        0
    }
    /// Offset of the ring's mbarriers.
    pub const fn barriers_offset(nt: u32) -> usize {
        x_offset(nt) + stages(nt) * x_stage_bytes(nt)
    }
    /// Offset of the fused RMSNorm's shared words (after the mbarriers, 16-byte aligned): the
    /// [`NORM_ARGS_WORDS`] u64 of the argument block, then `nt` f32 row scales.
    pub const fn norm_offset(nt: u32) -> usize {
        (barriers_offset(nt) + 2 * stages(nt) * MBARRIER_BYTES).next_multiple_of(16)
    }
    /// Bytes of the fused RMSNorm's shared words: the block's words, `nt` row scales, the
    /// tile's `W_ROWS` gamma values (bf16).
    pub const fn norm_bytes(nt: u32) -> usize {
        NORM_ARGS_WORDS * 8 + nt as usize * F32_BYTES + W_ROWS * IN_BYTES + 16
    }
    /// Dynamic shared memory per CTA of token tile `nt`.
    pub const fn smem_bytes(nt: u32) -> usize {
        norm_offset(nt) + norm_bytes(nt) + SWIZZLE_ALIGN
    }
    /// Epilogue: `alpha * acc + bias` (bias when given) `+ beta * C`.
    pub const EPI_NONE: u32 = 0;
    /// Epilogue: `silu(alpha * acc + bias) + beta * C`.
    pub const EPI_SILU: u32 = 1;
    /// Epilogue: `gelu(alpha * acc + bias) + beta * C`, GELU's tanh form.
    pub const EPI_GELU: u32 = 2;
    /// Epilogue on column pairs: with `v = alpha * acc + bias`, output column `j` (C has `N / 2`
    /// columns, N even) is `silu(v[2j]) * v[2j + 1] + beta * C[j]` (gate and up rows of the
    /// weights interleaved).
    pub const EPI_SWIGLU: u32 = 3;
    /// The decode step's QKV epilogue (issue 21; not offered by `TcGemm`): `bias` is the
    /// address of the `decode_gemm::QKV_ARGS` argument block, C is Q (`M x heads * head_dim`
    /// bf16, pitch `ldc`), `out_f32 = 0`, `beta = 0`; the weight rows are packed in RoPE pairs
    /// (rows `2 i`, `2 i + 1` of each head are dims `i` and `i + head_dim / 2`; `head_dim` a
    /// multiple of 4, `N = (heads + 2 kv_heads) head_dim`): RoPE on the Q and K heads, Q into C,
    /// K and V into the paged caches at each token's position (traps as the decode GEMM's).
    pub const EPI_QKV: u32 = 4;
    /// `flags` bit: the producer loads the first stages' weight tiles before
    /// `griddepcontrol.wait` (the weights must not be written by any kernel that may still be
    /// running: with PDL the preceding one, and the one before it where that kernel triggers
    /// before its own wait, as the decode step's RMSNorm does).
    pub const FLAG_WEIGHTS_EARLY: u32 = 1;
    /// `flags` bit: B (the weights) is stored tiled ([`tiled_weight_elems`]): each CTA's
    /// `W_ROWS x BK` weight tile is 8 KiB of contiguous memory, so one stage reads one DRAM
    /// stretch instead of 64 rows' 128-byte pieces `K * 2` bytes apart. `tmap_w` then maps
    /// the tiled buffer as `{BK, ceil(N / W_ROWS) * ceil(K / BK) * W_ROWS}` elements with
    /// [`W_BOX`] boxes; tile `(t, kb)` starts at row `(t * ceil(K / BK) + kb) * W_ROWS`, and
    /// the elements past N and K are zeros (finite: they meet A's zero fill in the products).
    pub const FLAG_W_TILED: u32 = 8;
    /// `flags` bit: the producer triggers `griddepcontrol.launch_dependents` right after its
    /// `griddepcontrol.wait` instead of after its last mainloop load, so the next kernel on
    /// the stream may be scheduled as soon as every CTA of this grid has passed its wait (its
    /// CTAs then take whatever SM room this grid's finished CTAs leave). Its own wait still
    /// waits for this grid to complete and flush (PTX ISA `griddepcontrol`).
    pub const FLAG_TRIGGER_AT_WAIT: u32 = 16;
    /// Elements of the tiled weight buffer of an `N x K` B ([`FLAG_W_TILED`]): whole tiles,
    /// zero-padded past N and K.
    pub const fn tiled_weight_elems(n: usize, k: usize) -> usize {
        n.div_ceil(W_ROWS) * k.div_ceil(BK) * W_ROWS * BK
    }
    /// Shift of the `%globaltimer` stamp slot in `flags` (16 bits), as `decode_gemm`'s: with a
    /// non-null `stamps` the kernel stamps `[slot][decode_step::STAMP_WORDS]` (first CTA start,
    /// first and last CTA past the producer's `griddepcontrol.wait`, last CTA end).
    pub const STAMP_SLOT_SHIFT: u32 = 16;

    /// `flags` bit, RMSNorm fused into A's consumer (the decode step, issue 21): the GEMM's A is
    /// `bf16(x * gamma)` of rows x that were never scaled by their RMS, and the argument block
    /// at `norm` gives the sums of squares of x's rows in partials (`f32 [M][parts_in]`, row
    /// `m`'s sum is the sum of its `parts_in` partials, in order). Each output is multiplied by
    /// `1 / sqrt(sum_m / n_in + eps)` before the bias and the activation (RMSNorm is linear in
    /// A's row, so `(x / rms(x) * gamma) W^T = (x * gamma) W^T / rms(x)`).
    pub const FLAG_NORM_IN: u32 = 2;
    /// `flags` bit, RMSNorm of C prepared for the next GEMM (`EPI_NONE`, BF16 C only): besides
    /// C, the epilogue writes `normed = bf16(bf16(c) * gamma)` (`M x N` bf16, pitch `ld_out`)
    /// and the sums of squares of C's BF16 values over each 64-column tile of weight rows into
    /// `ss_out [M][ceil(N / 64)]` (f32, one writer each, no atomics: deterministic).
    pub const FLAG_NORM_OUT: u32 = 4;
    /// u64 words of the fused RMSNorm's argument block (`norm` parameter), in order:
    /// `[0]` `ss_in` (address of f32 partials, [`FLAG_NORM_IN`]), `[1]` `parts_in`, `[2]` `n_in`
    /// (the normalised row's length: the sum of squares is divided by it) in the low and the f32
    /// bits of `eps` in the high 32 bits, `[3]` `gamma` (address of `N` bf16, [`FLAG_NORM_OUT`]),
    /// `[4]` `normed` (address), `[5]` `ss_out` (address), `[6]` `ld_out` (elements, a multiple
    /// of 4) in the low and `parts_out = ceil(N / 64)` in the high 32 bits, `[7]` 0.
    pub const NORM_ARGS_WORDS: usize = 8;

    /// The argument block of a fused RMSNorm ([`NORM_ARGS_WORDS`]): `input` is `(ss_in,
    /// parts_in, n_in, eps)`, `output` `(gamma, normed, ss_out, ld_out, parts_out)`.
    pub const fn norm_args(
        input: Option<(u64, u32, u32, f32)>,
        output: Option<(u64, u64, u64, u32, u32)>,
    ) -> [u64; NORM_ARGS_WORDS] {
        let mut a = [0u64; NORM_ARGS_WORDS];
        if let Some((ss, parts, n, eps)) = input {
            a[0] = ss;
            a[1] = parts as u64;
            a[2] = n as u64 | (eps.to_bits() as u64) << 32;
        }
        if let Some((gamma, normed, ss, ld, parts)) = output {
            a[3] = gamma;
            a[4] = normed;
            a[5] = ss;
            a[6] = ld as u64 | (parts as u64) << 32;
        }
        a
    }

    const _: () = {
        assert!(!is_ksplit(0) && !is_ksplit(5) && !is_ksplit(16));
        let mut k = 0;
        while k < KSPLITS.len() {
            assert!(is_ksplit(KSPLITS[k]));
            k += 1;
        }
        let mut i = 0;
        while i < TOKEN_TILES.len() {
            let nt = TOKEN_TILES[i];
            assert!(stages(nt) >= 3);
            assert!(smem_bytes(nt) <= smem_target(nt));
            assert!(x_stage_bytes(nt).is_multiple_of(SWIZZLE_ALIGN));
            assert!(partial_offset(nt).is_multiple_of(16));
            assert!(
                partial_offset(nt) + partial_bytes(nt)
                    <= stages(nt) * (W_STAGE_BYTES + x_stage_bytes(nt))
            );
            assert!(norm_offset(nt) + norm_bytes(nt) <= smem_bytes(nt));
            // Every rank of every cluster size reduces at least one token (rank r takes
            // tokens r NT / ks .. (r + 1) NT / ks).
            let mut j = 0;
            while j < KSPLITS.len() {
                assert!(nt >= KSPLITS[j]);
                j += 1;
            }
            i += 1;
        }
        assert!(W_STAGE_BYTES.is_multiple_of(SWIZZLE_ALIGN));
        assert!(BK * IN_BYTES == 128 && BK.is_multiple_of(WGMMA_K));
        assert!((PARTIAL_PITCH * F32_BYTES).is_multiple_of(16));
    };
}

/// Memory-bound GEMM for small M (LLM decode; issue 20), sm_90 module,
/// `gpu/src/kernels/decode_gemm.rs`: `C[M,N] = alpha * A[M,K] * B[K,N] + beta * C` with `M <=
/// MAX_M` tokens, B column-major (the weights, stored `N x K` row-major like a PyTorch `Linear`
/// weight), BF16 or FP16 inputs, FP32 accumulation, FP32 or 16-bit (the input type) output.
///
/// Structure ("swap-AB" on `mma.sync.m16n8k16`): the weights are the MMA's A operand (16 weight
/// rows = 16 output columns `n` per *row tile*), the tokens its B operand (8 tokens per MMA;
/// `TOKEN_TILES` MMAs per k-step cover `8 * TOKEN_TILES` tokens). Each lane loads its weight
/// fragments straight from global memory with 16-byte `ld.global.nc.L1::no_allocate` loads
/// (8 consecutive k of one row; the k order inside a 32-wide k-step is permuted identically for
/// the weights and the tokens, so the sum is the same), `UNROLL` k-steps per *k-block*, the next
/// k-block's loads issued before the current one's MMAs (register double buffering). The tokens
/// are read with 16-byte `ld.global.nc` (cached in L1: every warp of the SM reads them). Each
/// weight byte is read from DRAM exactly once.
///
/// Split-K inside the CTA: the CTA's `W = blockDim.x / 32` warps form `W / ksplit` row tiles of
/// `ksplit` warps; warp `s` of a row tile takes k-blocks `s, s + ksplit, ...`; the partial
/// accumulators meet in shared memory and warp 0 of the row tile adds them in the fixed order `1,
/// 2, ..., ksplit - 1` (deterministic), then applies `alpha`/`beta` and stores.
///
/// PDL: with [`decode_gemm::FLAG_WEIGHTS_EARLY`] the first k-block's weights are loaded *before*
/// `griddepcontrol.wait` (they must not be written by any kernel that may still be running); A
/// and C are read
/// only after it; `launch_dependents` follows the warp's last weight load.
///
/// Kernel parameters, in order (all entries):
/// `(a: u64, b: u64, c: u64, m: u32, n: u32, k: u32, lda: u32, ldb: u32, ldc: u32, alpha: f32,
///   beta: f32, out_f32: u32, ksplit: u32, flags: u32)`; `flags` is a bit set of
/// [`decode_gemm::FLAG_WEIGHTS_EARLY`] and [`decode_gemm::FLAG_L2_PREFETCH_256`]; pointers are
/// device addresses,
/// 16-byte aligned for A and B, pitches in elements with `lda`, `ldb` multiples of 8 (16 bytes).
/// Block: `32 * W` threads with `W` in [`WARPS`](decode_gemm::WARPS) and `ksplit` dividing `W`; dynamic shared memory
/// at least [`smem_bytes`](decode_gemm::smem_bytes)`(W, TOKEN_TILES)`; grid `ceil(ceil(N / 16) / (W / ksplit))` CTAs.
/// The kernel traps on a block shape, `ksplit` or shared-memory size outside that contract.
pub mod decode_gemm {
    /// Output columns (weight rows) per row tile: the M of `mma.m16n8k16`.
    pub const ROWS: usize = 16;
    /// Tokens per MMA: the N of `mma.m16n8k16`.
    pub const TOKENS_PER_TILE: usize = 8;
    /// K per k-step: two `m16n8k16` MMAs fed by one 16-byte load per lane and row.
    pub const K_STEP: usize = 32;
    /// Largest M (tokens) of any entry.
    pub const MAX_M: usize = 64;
    /// Warps per CTA the launcher may use.
    pub const WARPS: [u32; 3] = [4, 8, 16];
    /// Most row tiles (of [`ROWS`] output columns) one warp covers: a warp with `row_tiles`
    /// tiles loads each token fragment once per k-step and feeds it to the MMAs of all its row
    /// tiles, so A is read `row_tiles` times less often per weight byte (issue 20, M = 16).
    pub const MAX_ROW_TILES: usize = 2;
    /// Bytes of one input element.
    pub const IN_BYTES: usize = 2;
    /// `flags` bit: load the first k-block of weights before `griddepcontrol.wait`.
    pub const FLAG_WEIGHTS_EARLY: u32 = 1;
    /// `flags` bit: stream the weights with the `.L2::256B` prefetch-size hint.
    pub const FLAG_L2_PREFETCH_256: u32 = 2;

    /// One compiled entry: input type, token tiles (`M <= 8 * token_tiles`), k-steps per k-block.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Variant {
        /// Entry point in the sm_90 module.
        pub kernel: &'static str,
        /// BF16 inputs (else FP16).
        pub bf16: bool,
        /// Token tiles of 8: the entry serves `M <= 8 * token_tiles`.
        pub token_tiles: usize,
        /// k-steps (of [`K_STEP`]) per k-block: loads in flight per lane per k-block are
        /// `2 * unroll * row_tiles` 16-byte vectors.
        pub unroll: usize,
        /// Row tiles (of [`ROWS`] output columns) per warp: 1 or [`MAX_ROW_TILES`].
        pub row_tiles: usize,
        /// The token (A) fragments of the next k-block are loaded one k-block ahead, with its
        /// weights (entries `..._pa`), so their latency leaves each k-block's critical path.
        pub prefetch_a: bool,
    }

    const fn v(kernel: &'static str, bf16: bool, token_tiles: usize, unroll: usize) -> Variant {
        vr(kernel, bf16, token_tiles, unroll, 1)
    }

    const fn vr(
        kernel: &'static str,
        bf16: bool,
        token_tiles: usize,
        unroll: usize,
        row_tiles: usize,
    ) -> Variant {
        vp(kernel, bf16, token_tiles, unroll, row_tiles, false)
    }

    const fn vp(
        kernel: &'static str,
        bf16: bool,
        token_tiles: usize,
        unroll: usize,
        row_tiles: usize,
        prefetch_a: bool,
    ) -> Variant {
        Variant {
            kernel,
            bf16,
            token_tiles,
            unroll,
            row_tiles,
            prefetch_a,
        }
    }

    /// Every entry of the module, in the order the kernel file instantiates them.
    pub const VARIANTS: [Variant; 42] = [
        v("decode_gemm_bf16_t1_u2", true, 1, 2),
        v("decode_gemm_bf16_t1_u4", true, 1, 4),
        v("decode_gemm_bf16_t2_u2", true, 2, 2),
        v("decode_gemm_bf16_t2_u4", true, 2, 4),
        v("decode_gemm_bf16_t4_u2", true, 4, 2),
        v("decode_gemm_bf16_t4_u4", true, 4, 4),
        v("decode_gemm_bf16_t8_u2", true, 8, 2),
        v("decode_gemm_bf16_t8_u4", true, 8, 4),
        v("decode_gemm_f16_t1_u2", false, 1, 2),
        v("decode_gemm_f16_t1_u4", false, 1, 4),
        v("decode_gemm_f16_t2_u2", false, 2, 2),
        v("decode_gemm_f16_t2_u4", false, 2, 4),
        v("decode_gemm_f16_t4_u2", false, 4, 2),
        v("decode_gemm_f16_t4_u4", false, 4, 4),
        v("decode_gemm_f16_t8_u2", false, 8, 2),
        v("decode_gemm_f16_t8_u4", false, 8, 4),
        vr("decode_gemm_bf16_t1_u2_r2", true, 1, 2, 2),
        vr("decode_gemm_bf16_t1_u4_r2", true, 1, 4, 2),
        vr("decode_gemm_bf16_t2_u2_r2", true, 2, 2, 2),
        vr("decode_gemm_bf16_t2_u4_r2", true, 2, 4, 2),
        vr("decode_gemm_bf16_t4_u2_r2", true, 4, 2, 2),
        vr("decode_gemm_bf16_t4_u4_r2", true, 4, 4, 2),
        vr("decode_gemm_f16_t1_u2_r2", false, 1, 2, 2),
        vr("decode_gemm_f16_t1_u4_r2", false, 1, 4, 2),
        vr("decode_gemm_f16_t2_u2_r2", false, 2, 2, 2),
        vr("decode_gemm_f16_t2_u4_r2", false, 2, 4, 2),
        vr("decode_gemm_f16_t4_u2_r2", false, 4, 2, 2),
        vr("decode_gemm_f16_t4_u4_r2", false, 4, 4, 2),
        vp("decode_gemm_bf16_t1_u2_pa", true, 1, 2, 1, true),
        vp("decode_gemm_bf16_t2_u2_pa", true, 2, 2, 1, true),
        vp("decode_gemm_bf16_t4_u2_pa", true, 4, 2, 1, true),
        vp("decode_gemm_bf16_t8_u2_pa", true, 8, 2, 1, true),
        vp("decode_gemm_bf16_t1_u2_r2_pa", true, 1, 2, 2, true),
        vp("decode_gemm_bf16_t2_u2_r2_pa", true, 2, 2, 2, true),
        vp("decode_gemm_bf16_t4_u2_r2_pa", true, 4, 2, 2, true),
        vp("decode_gemm_f16_t1_u2_pa", false, 1, 2, 1, true),
        vp("decode_gemm_f16_t2_u2_pa", false, 2, 2, 1, true),
        vp("decode_gemm_f16_t4_u2_pa", false, 4, 2, 1, true),
        vp("decode_gemm_f16_t8_u2_pa", false, 8, 2, 1, true),
        vp("decode_gemm_f16_t1_u2_r2_pa", false, 1, 2, 2, true),
        vp("decode_gemm_f16_t2_u2_r2_pa", false, 2, 2, 2, true),
        vp("decode_gemm_f16_t4_u2_r2_pa", false, 4, 2, 2, true),
    ];

    /// Dynamic shared memory a CTA of `warps` warps needs for `token_tiles` accumulator tiles
    /// (token tiles x row tiles per warp; the split-K exchange: per warp, `tiles x 4` f32 per
    /// lane).
    pub const fn smem_bytes(warps: u32, token_tiles: usize) -> usize {
        warps as usize * token_tiles * 4 * 32 * 4
    }

    /// The most any launch asks for (16 warps, 8 accumulator tiles: 8 token tiles x 1 row tile,
    /// or 4 x 2): 64 KiB.
    pub const MAX_SMEM_BYTES: usize = smem_bytes(16, 8);

    /// `flags` bit (issue 21): before `griddepcontrol.wait`, prefetch the weights of the next
    /// `(flags >> PF_ITERS_SHIFT) & 0xff` k-blocks of every warp into L2
    /// (`cp.async.bulk.prefetch.L2`), beyond the first k-block loaded into registers.
    pub const FLAG_PREFETCH_L2_BULK: u32 = 4;
    /// Shift of the prefetched k-blocks per warp in `flags` (8 bits).
    pub const PF_ITERS_SHIFT: u32 = 8;
    /// Shift of the stamp slot in `flags` (16 bits; see `decode_step::STAMP_WORDS`).
    pub const STAMP_SLOT_SHIFT: u32 = 16;
    /// Epilogue (issue 21) `C = alpha * acc + beta * C` (the plain entries' epilogue; with
    /// `beta = 1` and C the residual stream it is the residual add of the O and down
    /// projections).
    pub const EPI_STORE: u32 = 0;
    /// Epilogue: weights of `2 I` rows with gate and up interleaved by 8 (row tile `p` = gate
    /// rows `8p..8p+8`, then up rows `8p..8p+8`); writes `C[tok][8p + g] = silu(alpha * gate) *
    /// (alpha * up)` to a C of `I` columns, in the input type.
    pub const EPI_SWIGLU: u32 = 1;
    /// Epilogue: fused QKV weight with the rows of each head packed so that row tile `p` of the
    /// head holds dims `8p..8p+8` and `d/2 + 8p..`; applies RoPE to Q and K (cos/sin table),
    /// writes Q to C (`B x H d`) and K, V into the paged caches (arguments in [`QKV_ARGS`]).
    pub const EPI_QKV: u32 = 2;
    /// Unroll of the default epilogue entries (`_u4_`).
    pub const EPI_UNROLL: usize = 4;
    /// Words (u64) of the QKV epilogue's argument block in device memory: `[0]` positions (u32
    /// per token), `[1]` block table (u32), `[2]` K cache, `[3]` V cache (bf16, layout
    /// `[page][kv head][page row][d]`), `[4]` RoPE table (`[pos][d/2][cos, sin]` f32), `[5]`
    /// `heads | kv_heads << 32`, `[6]` `head_dim | page_size << 32`, `[7]` `bt_stride |
    /// num_pages << 32`, `[8]` `max_pos`.
    pub const QKV_ARGS: usize = 9;

    /// One epilogue entry (bf16; the forms of the plain entries `_u4`, `_u2_pa` and `_u2_r2_pa`).
    /// Parameter list: the plain entries' 14, then `stamps: u64` (0: none) and `epi: u64` (the
    /// QKV argument block; 0 for the others).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct EpiVariant {
        /// Entry point in the sm_90 module.
        pub kernel: &'static str,
        /// Token tiles of 8.
        pub token_tiles: usize,
        /// k-steps per k-block.
        pub unroll: usize,
        /// Row tiles per warp.
        pub row_tiles: usize,
        /// Token fragments loaded one k-block ahead.
        pub prefetch_a: bool,
        /// [`EPI_STORE`], [`EPI_SWIGLU`] or [`EPI_QKV`].
        pub epilogue: u32,
    }

    const fn e(
        kernel: &'static str,
        token_tiles: usize,
        unroll: usize,
        row_tiles: usize,
        prefetch_a: bool,
        epilogue: u32,
    ) -> EpiVariant {
        EpiVariant {
            kernel,
            token_tiles,
            unroll,
            row_tiles,
            prefetch_a,
            epilogue,
        }
    }

    /// Every epilogue entry, in the order the kernel file instantiates them.
    pub const EPI_VARIANTS: [EpiVariant; 33] = [
        e("decode_gemm_bf16_t1_u4_store", 1, 4, 1, false, EPI_STORE),
        e("decode_gemm_bf16_t2_u4_store", 2, 4, 1, false, EPI_STORE),
        e("decode_gemm_bf16_t4_u4_store", 4, 4, 1, false, EPI_STORE),
        e("decode_gemm_bf16_t8_u4_store", 8, 4, 1, false, EPI_STORE),
        e("decode_gemm_bf16_t1_u4_swiglu", 1, 4, 1, false, EPI_SWIGLU),
        e("decode_gemm_bf16_t2_u4_swiglu", 2, 4, 1, false, EPI_SWIGLU),
        e("decode_gemm_bf16_t4_u4_swiglu", 4, 4, 1, false, EPI_SWIGLU),
        e("decode_gemm_bf16_t8_u4_swiglu", 8, 4, 1, false, EPI_SWIGLU),
        e("decode_gemm_bf16_t1_u4_qkv", 1, 4, 1, false, EPI_QKV),
        e("decode_gemm_bf16_t2_u4_qkv", 2, 4, 1, false, EPI_QKV),
        e("decode_gemm_bf16_t4_u4_qkv", 4, 4, 1, false, EPI_QKV),
        e("decode_gemm_bf16_t8_u4_qkv", 8, 4, 1, false, EPI_QKV),
        e("decode_gemm_bf16_t1_u2_pa_store", 1, 2, 1, true, EPI_STORE),
        e("decode_gemm_bf16_t2_u2_pa_store", 2, 2, 1, true, EPI_STORE),
        e("decode_gemm_bf16_t4_u2_pa_store", 4, 2, 1, true, EPI_STORE),
        e("decode_gemm_bf16_t8_u2_pa_store", 8, 2, 1, true, EPI_STORE),
        e(
            "decode_gemm_bf16_t1_u2_pa_swiglu",
            1,
            2,
            1,
            true,
            EPI_SWIGLU,
        ),
        e(
            "decode_gemm_bf16_t2_u2_pa_swiglu",
            2,
            2,
            1,
            true,
            EPI_SWIGLU,
        ),
        e(
            "decode_gemm_bf16_t4_u2_pa_swiglu",
            4,
            2,
            1,
            true,
            EPI_SWIGLU,
        ),
        e(
            "decode_gemm_bf16_t8_u2_pa_swiglu",
            8,
            2,
            1,
            true,
            EPI_SWIGLU,
        ),
        e("decode_gemm_bf16_t1_u2_pa_qkv", 1, 2, 1, true, EPI_QKV),
        e("decode_gemm_bf16_t2_u2_pa_qkv", 2, 2, 1, true, EPI_QKV),
        e("decode_gemm_bf16_t4_u2_pa_qkv", 4, 2, 1, true, EPI_QKV),
        e("decode_gemm_bf16_t8_u2_pa_qkv", 8, 2, 1, true, EPI_QKV),
        e(
            "decode_gemm_bf16_t1_u2_r2_pa_store",
            1,
            2,
            2,
            true,
            EPI_STORE,
        ),
        e(
            "decode_gemm_bf16_t2_u2_r2_pa_store",
            2,
            2,
            2,
            true,
            EPI_STORE,
        ),
        e(
            "decode_gemm_bf16_t4_u2_r2_pa_store",
            4,
            2,
            2,
            true,
            EPI_STORE,
        ),
        e(
            "decode_gemm_bf16_t1_u2_r2_pa_swiglu",
            1,
            2,
            2,
            true,
            EPI_SWIGLU,
        ),
        e(
            "decode_gemm_bf16_t2_u2_r2_pa_swiglu",
            2,
            2,
            2,
            true,
            EPI_SWIGLU,
        ),
        e(
            "decode_gemm_bf16_t4_u2_r2_pa_swiglu",
            4,
            2,
            2,
            true,
            EPI_SWIGLU,
        ),
        e("decode_gemm_bf16_t1_u2_r2_pa_qkv", 1, 2, 2, true, EPI_QKV),
        e("decode_gemm_bf16_t2_u2_r2_pa_qkv", 2, 2, 2, true, EPI_QKV),
        e("decode_gemm_bf16_t4_u2_r2_pa_qkv", 4, 2, 2, true, EPI_QKV),
    ];

    const _: () = {
        assert!(MAX_M == 8 * TOKENS_PER_TILE);
        assert!(K_STEP == 4 * 8);
        assert!(MAX_SMEM_BYTES <= 227 * 1024);
        let mut i = 0;
        while i < VARIANTS.len() {
            let v = VARIANTS[i];
            assert!(v.token_tiles * v.row_tiles <= 8);
            assert!(v.row_tiles >= 1 && v.row_tiles <= MAX_ROW_TILES);
            i += 1;
        }
    };
}

/// Batched BF16 tensor-core GEMM on 3-D TMA (sm_90a module, `gpu/src/kernels/batched_gemm.rs`;
/// issue 22, "3-D TMA"): `C[b] = A[b] * B[b]` for every `b < batch`, BF16 inputs, FP32
/// accumulation, BF16 output (what cuBLAS's strided-batched BF16 GEMM computes with alpha 1,
/// beta 0).
///
/// Layouts (every pitch and batch stride in elements):
/// - A: `batch x M x K`, K contiguous (row-major per batch), row pitch `lda`, batch stride
///   `stride_a >= M * lda`; a 3-D tensor map with dims `{K, M, batch}`, box [`A_BOX`];
/// - B: `batch x N x K`, K contiguous (B column-major per batch, "K-major"), dims
///   `{K, N, batch}`, box [`B_BOX`];
/// - C: `batch x M x N`, N contiguous, row pitch `ldc` (even), batch stride `stride_c`.
///
/// The 3-D map is what makes batching free of padding: a box that hangs over row `M` of batch `b`
/// reads zeros, not batch `b + 1`'s first rows (a 2-D map over `[batch * M, K]` would).
///
/// One CTA per `BM x BN` output tile (not persistent): grid `(ceil(N / BN), ceil(M / BM),
/// batch)`, `THREADS_PER_CTA` threads, `SMEM_BYTES` of dynamic shared memory, no cluster
/// dimensions. Warpgroup 0 is the producer (one thread TMA-loads A and B into a `STAGES`-deep
/// `TmaPipeline` used without a cluster), warpgroups 1 and 2 the consumers (wgmma
/// `m64n256k16`, 64 rows each), each storing its rows of C from registers.
///
/// Kernel parameters, in order:
/// `(tmap_a: u64, tmap_b: u64, c: u64, m: u32, n: u32, k: u32, ldc: u32, stride_c: u64)`.
pub mod batched_gemm {
    use super::*;

    /// Entry name.
    pub const KERNEL: &str = "batched_gemm_bf16";
    /// Bytes of one BF16 element.
    pub const IN_BYTES: usize = 2;
    /// Rows of C per CTA tile (two consumer warpgroups x 64).
    pub const BM: usize = 128;
    /// Columns of C per CTA tile (the N of `wgmma.m64n256k16`).
    pub const BN: usize = 256;
    /// K per stage: 64 BF16 = 128 bytes, the span of the 128-byte swizzle.
    pub const BK: usize = 64;
    /// K of one wgmma instruction.
    pub const WGMMA_K: usize = 16;
    /// Rows per consumer warpgroup.
    pub const WG_M: usize = 64;
    /// Pipeline depth.
    pub const STAGES: usize = 4;
    /// Threads per warpgroup.
    pub const WARPGROUP_THREADS: u32 = 4 * WARP_SIZE;
    /// Consumer warpgroups.
    pub const CONSUMER_WARPGROUPS: u32 = 2;
    /// Threads per CTA: the producer warpgroup and the consumers.
    pub const THREADS_PER_CTA: u32 = WARPGROUP_THREADS * (1 + CONSUMER_WARPGROUPS);
    /// Registers per thread the producer warpgroup keeps (`setmaxnreg.dec`).
    pub const PRODUCER_REGS: u32 = 40;
    /// Registers per thread of a consumer warpgroup (`setmaxnreg.inc`).
    pub const CONSUMER_REGS: u32 = 232;
    /// TMA box of A, `{K, M, batch}` elements, 128-byte swizzle.
    pub const A_BOX: [u32; 3] = [BK as u32, BM as u32, 1];
    /// TMA box of B, `{K, N, batch}` elements, 128-byte swizzle.
    pub const B_BOX: [u32; 3] = [BK as u32, BN as u32, 1];
    /// Bytes of one stage's A tile.
    pub const A_STAGE_BYTES: usize = BM * BK * IN_BYTES;
    /// Bytes of one stage's B tile.
    pub const B_STAGE_BYTES: usize = BN * BK * IN_BYTES;
    /// Layout from the 1024-byte aligned base: `STAGES x A | STAGES x B | full[STAGES] |
    /// empty[STAGES]`.
    pub const A_OFFSET: usize = 0;
    /// Offset of stage 0's B tile.
    pub const B_OFFSET: usize = A_OFFSET + STAGES * A_STAGE_BYTES;
    /// Offset of the pipeline's mbarriers.
    pub const BARRIERS_OFFSET: usize = B_OFFSET + STAGES * B_STAGE_BYTES;
    /// Alignment of every swizzled tile.
    pub const SWIZZLE_ALIGN: usize = 1024;
    /// Dynamic shared memory per CTA (layout, barriers, alignment slack).
    pub const SMEM_BYTES: usize = BARRIERS_OFFSET + 2 * STAGES * MBARRIER_BYTES + SWIZZLE_ALIGN;
    /// Row pitches and batch strides of A, B and C must be multiples of this many elements (16
    /// bytes: TMA's stride rule, and even, for C's paired 4-byte stores).
    pub const PITCH_ALIGN: usize = 8;
    /// Largest grid y (M tiles) and z (batch) a launch may have.
    pub const MAX_GRID_YZ: u32 = 65535;

    const _: () = {
        assert!(BM == CONSUMER_WARPGROUPS as usize * WG_M);
        assert!(BK * IN_BYTES == 128 && BK.is_multiple_of(WGMMA_K));
        assert!(A_STAGE_BYTES.is_multiple_of(SWIZZLE_ALIGN));
        assert!(B_STAGE_BYTES.is_multiple_of(SWIZZLE_ALIGN));
        assert!(SMEM_BYTES <= 227 * 1024);
        // The setmaxnreg split fits the registers the entry starts with (issue 22, item 7).
        warpline_device::check_setmaxnreg(
            THREADS_PER_CTA,
            1,
            &[PRODUCER_REGS, CONSUMER_REGS, CONSUMER_REGS],
        );
    };
}

/// Instruction-check kernels of the sm_90a module (`gpu/src/kernels/device_check.rs`; issue 22,
/// items 5 and 8), for `tests/issue22_device.rs`.
///
/// TMA copies `tma_copy_{3,4,5}d` and `tma_copy_{3,4,5}d_multicast`, parameters
/// `(src: u64, dst: u64, box_: u64, boxes: u64, box_bytes: u32, l2_src: u64, l2_bytes: u32)`:
/// `src` and `dst` are device addresses of tensor maps of that rank with the same dims and box
/// (no swizzle; `box_bytes` = the box's elements times the element size); `box_` packs the box
/// size and `boxes` the number of boxes per dimension, [`device_check::FIELD_BITS`] bits per
/// dimension, innermost first. CTA `b` copies box `b` (its coordinates are `b`'s digits in the
/// mixed radix of `boxes`, times the box): a load (`cp.async.bulk.tensor.Nd`, after a
/// `cp.async.bulk.prefetch.tensor.Nd` of the same box) into shared memory, then a store. CTA 0
/// also issues `cp.async.bulk.prefetch.L2` of `l2_bytes` (0: none; a multiple of 16) at `l2_src`
/// (16-byte aligned, inside one allocation). Launch: [`device_check::COPY_THREADS`] threads,
/// [`device_check::copy_smem_bytes`] of dynamic shared memory; grid = the number of boxes; the
/// multicast entries with cluster dims `(2, 1, 1)` and an even grid (CTA `b` stores the box
/// `b ^ 1` that its peer multicast to it). The stores clip dimension 0 at 16-byte granularity:
/// each row of `dst` may be written up to the next 16-byte boundary past `dims[0]` (with the
/// zeros the load filled there), so `dst`'s memory reaches that far (the host's
/// `TensorMapDesc::store_extent_bytes`) and nothing else uses those bytes.
///
/// `math_check(x: u64, y: u64, n: u32)`: `y[8 i + j]` = function `j` of
/// [`device_check::MATH_FUNCS_NAMES`] at `x[i]`, for `i < n`; any 1-D launch.
pub mod device_check {
    /// The copy entries, by rank 3, 4, 5.
    pub const COPY_KERNELS: [&str; 3] = ["tma_copy_3d", "tma_copy_4d", "tma_copy_5d"];
    /// The multicast copy entries, by rank 3, 4, 5.
    pub const COPY_MULTICAST_KERNELS: [&str; 3] = [
        "tma_copy_3d_multicast",
        "tma_copy_4d_multicast",
        "tma_copy_5d_multicast",
    ];
    /// The math entry.
    pub const MATH_KERNEL: &str = "math_check";
    /// Threads per CTA of the copies (one warp; thread 0 does the copy).
    pub const COPY_THREADS: u32 = 32;
    /// Bits per dimension in the packed `box_` and `boxes` parameters.
    pub const FIELD_BITS: u32 = 12;
    /// Mask of one packed field.
    pub const FIELD_MASK: u64 = (1 << FIELD_BITS) - 1;
    /// Alignment of the barrier and of each shared-memory slot.
    pub const SLOT_ALIGN: u32 = 1024;
    /// Functions `math_check` writes per input, in order.
    pub const MATH_FUNCS: usize = 8;
    /// Their names, in the output order.
    pub const MATH_FUNCS_NAMES: [&str; MATH_FUNCS] = [
        "sqrt",
        "sqrt_approx",
        "rsqrt_approx",
        "tanh_approx",
        "exp_approx",
        "ln_approx",
        "sin_approx",
        "cos_approx",
    ];

    /// Dynamic shared memory a copy launch needs for boxes of `box_bytes`: alignment slack, the
    /// barrier's slot and two box slots.
    pub const fn copy_smem_bytes(box_bytes: u32) -> u32 {
        SLOT_ALIGN + SLOT_ALIGN + 2 * box_bytes.div_ceil(SLOT_ALIGN) * SLOT_ALIGN
    }

    /// Packs five fields (innermost first) for `box_` / `boxes`; `None` if one does not fit.
    pub const fn pack(v: [u32; 5]) -> Option<u64> {
        let mut p = 0u64;
        let mut i = 0;
        while i < 5 {
            if v[i] as u64 > FIELD_MASK {
                return None;
            }
            p |= (v[i] as u64) << (FIELD_BITS * i as u32);
            i += 1;
        }
        Some(p)
    }
}
/// The other kernels of one LLM decode step (issue 21; `gpu/src/kernels/decode_step.rs`): RMSNorm,
/// paged GQA decode attention (split-KV, the splits combined by each (sequence, KV head)'s last CTA). Every entry takes `stamps: u64`
/// (0: none) and stamps `%globaltimer` into `[slot][STAMP_WORDS]`.
pub mod decode_step {
    /// Words per stamp slot: `[0]` first CTA start (atomic min), `[1]` first CTA past
    /// `griddepcontrol.wait` (min), `[2]` last CTA past it (max), `[3]` last CTA end (max), in
    /// `%globaltimer` ns. The host fills a slot with `u64::MAX, u64::MAX, 0, 0` before a run.
    pub const STAMP_WORDS: usize = 4;
    /// `flags` bit: read what does not depend on the previous kernel before `griddepcontrol.wait`
    /// (RMSNorm: its weight; attention: the KV chunks of earlier tokens, copied into its ring).
    pub const FLAG_EARLY: u32 = 1;
    /// Shift of the stamp slot in `flags` (16 bits).
    pub const STAMP_SLOT_SHIFT: u32 = 16;

    /// `decode_rmsnorm_bf16(x, w, out, resid, rows, n, eps, stamps, flags, partials)`: one CTA
    /// per row, `out = bf16(x / sqrt(mean(x^2) + eps) * w)`, and `resid = x` when `resid != 0`.
    /// With `partials != 0` (the first half of a fused RMSNorm, `swap_ab_gemm::FLAG_NORM_IN`)
    /// `out = bf16(x * w)` and `partials[row][ceil(n / 64)]` (f32) the sums of squares of each
    /// 64 columns of x.
    pub const RMSNORM_KERNEL: &str = "decode_rmsnorm_bf16";
    /// Threads per RMSNorm CTA.
    pub const RMSNORM_THREADS: u32 = 256;
    /// 8-element vectors per RMSNorm thread: `n <= 8 * RMSNORM_THREADS * RMSNORM_VECS`.
    pub const RMSNORM_VECS: usize = 4;
    /// Largest row of the RMSNorm kernel.
    pub const RMSNORM_MAX_N: usize = 8 * RMSNORM_THREADS as usize * RMSNORM_VECS;

    /// Consumer warps per attention CTA.
    pub const ATTN_WARPS: u32 = 8;
    /// Rows one attention consumer warp scores per chunk (8 lanes per row).
    pub const ATTN_TOKENS_PER_WARP: u32 = 4;
    /// Threads per attention CTA: the consumer warps and one loader warp.
    pub const ATTN_THREADS: u32 = (ATTN_WARPS + 1) * 32;
    /// Rows of one chunk of the attention's KV ring: up to this many consecutive rows of one
    /// page (one row per consumer row slot).
    pub const ATTN_CHUNK_ROWS: u32 = ATTN_WARPS * ATTN_TOKENS_PER_WARP;
    /// Stages of the attention's KV ring (each a chunk of K and V rows). With
    /// [`FLAG_EARLY`] the loader fills them before `griddepcontrol.wait`.
    pub const ATTN_STAGES: u32 = 4;
    /// Bytes before the ring in the attention's dynamic shared memory (its `2 * ATTN_STAGES`
    /// mbarriers), a multiple of 128.
    pub const ATTN_RING_OFFSET: usize = 256;
    /// Most KV splits per sequence.
    pub const MAX_SPLITS: u32 = 256;
    /// The score scale's initial running maximum (finite, so empty states combine without NaN).
    pub const M_INIT: f32 = -1.0e30;

    /// Consumer warps per tensor-core attention CTA (`AttnVariant::tc_kernel`): each scores 8
    /// rows of every chunk (`mma.m16n8k16`, the `G` query heads as the rows of A) and folds them
    /// into its output (`mma.m16n8k8`, the probabilities as A, straight from the scores'
    /// registers).
    pub const ATTN_TC_WARPS: u32 = ATTN_CHUNK_ROWS / 8;
    /// Threads per tensor-core attention CTA: the consumer warps and one loader warp (its lane 0
    /// issues the chunks' TMA copies).
    pub const ATTN_TC_THREADS: u32 = (ATTN_TC_WARPS + 1) * 32;
    /// The tensor-core attention's launch bound, CTAs per SM (`.minnctapersm`).
    pub const ATTN_TC_CTAS_PER_SM: u32 = 2;
    /// Stages of the tensor-core attention's KV ring. Three (48 KiB at head dim 128), so that
    /// two attention CTAs leave room on their SM for one CTA of the swap-AB GEMM that follows
    /// them in the decode step (`swap_ab_gemm::SMEM_HALF_SM`): that CTA then loads its weights
    /// during the attention instead of after it.
    pub const ATTN_TC_STAGES: u32 = 3;
    /// Alignment of the tensor-core attention's ring (the 128-byte swizzle's period).
    pub const ATTN_TC_RING_ALIGN: usize = 1024;

    /// Rows of one TMA box of the tensor-core attention's KV tensor maps for `page_size`-token
    /// pages: `min(page_size, ATTN_CHUNK_ROWS)`, so that every box lies in one page and a
    /// chunk is whole boxes; 0 where the page size does not allow that (it must be 8, 16 or 32,
    /// or a multiple of 32: boxes of at least 8 rows keep each box 1024-byte aligned in the
    /// swizzled ring).
    pub const fn attn_tc_box_rows(page_size: usize) -> usize {
        if page_size >= 8
            && page_size.is_multiple_of(8)
            && (ATTN_CHUNK_ROWS as usize).is_multiple_of(page_size)
        {
            page_size
        } else if page_size > 0 && page_size.is_multiple_of(ATTN_CHUNK_ROWS as usize) {
            ATTN_CHUNK_ROWS as usize
        } else {
            0
        }
    }

    /// Dynamic shared memory of a tensor-core attention CTA: the ring's barriers, then (aligned
    /// up to [`ATTN_TC_RING_ALIGN`] at run time) the larger of the ring ([`ATTN_TC_STAGES`]
    /// chunks; in each, K then V, each as `head_dim / 64` column halves of
    /// [`ATTN_CHUNK_ROWS`] rows of 128 bytes, 128-byte swizzled by TMA) and the merge area over
    /// it (per consumer warp and head, `head_dim` accumulators plus the running max and sum,
    /// f32).
    pub const fn attn_tc_smem_bytes(head_dim: usize, group: usize) -> usize {
        let ring = ATTN_TC_STAGES as usize * 2 * ATTN_CHUNK_ROWS as usize * head_dim * 2;
        let merge = ATTN_TC_WARPS as usize * group * (head_dim + 2) * 4;
        ATTN_RING_OFFSET + ATTN_TC_RING_ALIGN + if ring > merge { ring } else { merge }
    }

    /// The tensor-core attention's KV tensor maps (the entry's `kv_maps` points at two, K then
    /// V, 128 bytes each, 64-byte aligned) over a cache of `rows = num_pages * n_kv * page_size`
    /// rows of `head_dim` bf16: rank 2, dims `{head_dim, rows}`, row stride `head_dim * 2`
    /// bytes, box `{64, attn_tc_box_rows(page_size)}`, 128-byte swizzle. `rows` must stay below
    /// 2^31 (signed coordinates).
    pub const ATTN_TC_BOX_COLS: u32 = 64;

    /// One attention entry: head dim and query heads per KV head. Parameter list: `q, k_cache,
    /// v_cache, block_table, positions, out, part_o, part_ml: u64`, `n_kv, page_size, bt_stride,
    /// num_pages, splits_pps: u32` (`splits | pages_per_split << 16`), `scale_log2: f32`, `stamps: u64`, `kv_maps: u64`
    /// (the tensor-core entry's KV tensor maps, [`ATTN_TC_BOX_COLS`]; unused by the CUDA-core
    /// entry, which may get 0), `counters: u64` (with `splits > 1`: `batch x n_kv` u32, all 0
    /// before the launch and again after it: the split-KV combine's arrival counts, which the
    /// last CTA of each (sequence, KV head) resets), `flags: u32`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct AttnVariant {
        /// Entry point.
        pub kernel: &'static str,
        /// Head dimension.
        pub head_dim: usize,
        /// Query heads per KV head.
        pub group: usize,
        /// The tensor-core entry for the same shapes and parameter list
        /// ([`ATTN_TC_THREADS`], [`attn_tc_smem_bytes`]).
        pub tc_kernel: &'static str,
    }

    const fn a(kernel: &'static str, head_dim: usize, group: usize) -> AttnVariant {
        AttnVariant {
            kernel,
            head_dim,
            group,
            tc_kernel: tc_name(head_dim, group),
        }
    }

    const fn tc_name(head_dim: usize, group: usize) -> &'static str {
        match (head_dim, group) {
            (64, 1) => "decode_attn_tc_bf16_d64_g1",
            (64, 2) => "decode_attn_tc_bf16_d64_g2",
            (64, 4) => "decode_attn_tc_bf16_d64_g4",
            (64, 8) => "decode_attn_tc_bf16_d64_g8",
            (128, 1) => "decode_attn_tc_bf16_d128_g1",
            (128, 2) => "decode_attn_tc_bf16_d128_g2",
            (128, 4) => "decode_attn_tc_bf16_d128_g4",
            _ => "",
        }
    }

    /// Every attention entry.
    pub const ATTN_VARIANTS: [AttnVariant; 7] = [
        a("decode_attn_bf16_d64_g1", 64, 1),
        a("decode_attn_bf16_d64_g2", 64, 2),
        a("decode_attn_bf16_d64_g4", 64, 4),
        a("decode_attn_bf16_d64_g8", 64, 8),
        a("decode_attn_bf16_d128_g1", 128, 1),
        a("decode_attn_bf16_d128_g2", 128, 2),
        a("decode_attn_bf16_d128_g4", 128, 4),
    ];

    /// The attention entry's launch bound, CTAs per SM (`.minnctapersm`): 1 for every entry
    /// (9 warps; the ring, not the warp count, keeps the loads in flight). Registers are then
    /// capped at `65536 / ATTN_THREADS` per thread, with no spills (ptxas).
    pub const fn attn_ctas_per_sm(head_dim: usize, group: usize) -> u32 {
        let _ = (head_dim, group);
        1
    }

    /// Dynamic shared memory of an attention CTA: the ring's barriers, then the larger of the
    /// ring (`ATTN_STAGES` chunks of `ATTN_CHUNK_ROWS` K and V rows, bf16) and the final merge
    /// area over it (per row slot and head, `head_dim` accumulators plus the running max and
    /// sum, f32). Above 48 KiB: the host raises the entry's limit.
    pub const fn attn_smem_bytes(head_dim: usize, group: usize) -> usize {
        let ring = ATTN_STAGES as usize * 2 * ATTN_CHUNK_ROWS as usize * head_dim * 2;
        let merge = ATTN_CHUNK_ROWS as usize * group * (head_dim + 2) * 4;
        ATTN_RING_OFFSET + if ring > merge { ring } else { merge }
    }

    const _: () = {
        assert!(attn_smem_bytes(128, 4) <= 100 * 1024);
        assert!(attn_smem_bytes(64, 8) <= 100 * 1024);
        assert!(2 * ATTN_STAGES as usize * 8 <= ATTN_RING_OFFSET);
        assert!(ATTN_CHUNK_ROWS == 32 && ATTN_TC_WARPS * 8 == ATTN_CHUNK_ROWS);
        assert!(ATTN_TC_CTAS_PER_SM as usize * attn_tc_smem_bytes(128, 4) <= 227 * 1024);
        assert!(2 * ATTN_TC_STAGES as usize * 8 <= ATTN_RING_OFFSET);
        // Two attention CTAs (head dim 128, 4 heads per KV head) and one swap-AB GEMM CTA of up
        // to 64 tokens (at most SMEM_HALF_SM) share an SM (228 KiB, 1 KiB of it reserved per
        // CTA): the GEMM after the attention loads its first weight tiles beside it.
        assert!(
            ATTN_TC_CTAS_PER_SM as usize * (attn_tc_smem_bytes(128, 4) + 1024)
                + super::swap_ab_gemm::SMEM_HALF_SM
                + 1024
                <= 228 * 1024
        );
        // The fused combine's flag and weights fit in the smallest ring (d 64) of either form.
        assert!(
            16 + 8 * 8 * MAX_SPLITS as usize
                <= ATTN_STAGES as usize * 2 * ATTN_CHUNK_ROWS as usize * 64 * 2
        );
        assert!(
            16 + 8 * 8 * MAX_SPLITS as usize
                <= ATTN_TC_STAGES as usize * 2 * ATTN_CHUNK_ROWS as usize * 64 * 2
        );
        assert!(
            attn_tc_box_rows(16) == 16 && attn_tc_box_rows(64) == 32 && attn_tc_box_rows(4) == 0
        );
        let mut i = 0;
        while i < ATTN_VARIANTS.len() {
            assert!(!ATTN_VARIANTS[i].tc_kernel.is_empty());
            i += 1;
        }
    };
}

/// Attention forward for Hopper (issue 23), sm_90a module, `gpu/src/kernels/attention.rs`:
/// `O = softmax(Q K^T * scale [+ causal mask]) V` and the row log-sum-exp, FlashAttention-3's
/// structure (producer warpgroup on TMA, two consumer warpgroups on wgmma, ping-pong).
///
/// Layouts (FlashAttention's): Q, O `[B, S_q, H, D]`, K, V `[B, S_k, HK, D]`, row-major with
/// D contiguous, 16-bit (BF16 or FP16, the same for all four); varlen: `[total, H, D]` packed,
/// sequence `b` at rows `cu_seqlens[b] .. cu_seqlens[b + 1]`. LSE (f32, natural log) `[B, H,
/// S_q]`, varlen `[H, total_q]`. Query head `h` reads KV head `h / (H / HK)`.
///
/// Tensor maps: rank 4 over Q, K, V and O with dims `{D, heads, rows, batch}` (varlen: `rows` =
/// total, `batch` = 1), strides `{D, heads * D, rows * heads * D}` elements (in bytes on the
/// host), boxes [`Q_BOX`] / [`KV_BOX`] / [`O_BOX`] (O: the TMA-store epilogue), 128-byte
/// swizzle, zero fill out of bounds.
///
/// Parameters, in order: `(tmap_q: u64, tmap_k: u64, tmap_v: u64, o: u64, lse: u64,
/// cu_seqlens_q: u64, cu_seqlens_k: u64, seqlen_q: u32, seqlen_k: u32, heads: u32,
/// kv_heads: u32, total_q: u32, scale_log2: f32, flags: u32, batch: u32, hb_group: u32, n_m:
/// u32, tiles: u32, tmap_o: u64)`:
/// tensor maps and pointers are device addresses; `seqlen_q` / `seqlen_k` are the sequence
/// lengths (varlen: the longest query sequence, which sets the Q tiles per sequence; the lengths
/// come from `cu_seqlens_*`, `i32`, `B + 1` each); `total_q` the rows of the packed Q (varlen)
/// or `B * S_q`; `scale_log2 = softmax_scale * log2(e)`; `flags` a bit set of [`FLAG_CAUSAL`],
/// [`FLAG_VARLEN`], [`FLAG_NO_PINGPONG`], [`FLAG_NO_OVERLAP`], [`FLAG_NO_TMA_STORE`]; `batch` is
/// B; `hb_group >= 1` the
/// (head, batch) pairs of one L2 section of the tile order ([`tile_coords`]); `n_m =
/// ceil(seqlen_q / BLOCK_M)` and `tiles =` [`tile_count`]`(seqlen_q, heads, batch) < 2^31` (the
/// kernel checks both).
///
/// Grid `(G, 1, 1)`, `G >= 1`: CTA `x` works on tiles `x, x + G, x + 2G, ...` of the
/// [`tile_count`] tiles (a persistent grid when `G` is the SM count; one tile per CTA when `G`
/// is the tile count); [`THREADS_PER_CTA`] threads, [`smem_bytes`]`(D)` dynamic shared memory,
/// no cluster.
pub mod attention {
    use super::*;

    /// Entry: BF16, head dim 64.
    pub const KERNEL_BF16_D64: &str = "attention_fwd_bf16_d64";
    /// Entry: BF16, head dim 128.
    pub const KERNEL_BF16_D128: &str = "attention_fwd_bf16_d128";
    /// Entry: FP16, head dim 64.
    pub const KERNEL_F16_D64: &str = "attention_fwd_f16_d64";
    /// Entry: FP16, head dim 128.
    pub const KERNEL_F16_D128: &str = "attention_fwd_f16_d128";
    /// Head dimensions with an entry.
    pub const HEAD_DIMS: [usize; 2] = [64, 128];

    /// Bytes of one element (BF16 / FP16).
    pub const IN_BYTES: usize = 2;
    /// Query rows per CTA (two consumer warpgroups x 64).
    pub const BLOCK_M: usize = 128;
    /// Keys per K/V tile (the N of the `S = Q K^T` wgmma, the K of `O += P V`).
    pub const BLOCK_N: usize = 128;
    /// Query rows per consumer warpgroup (the M of wgmma).
    pub const WG_M: usize = 64;
    /// Columns of one TMA box: 64 16-bit elements, the 128-byte swizzle span; a head dim of D
    /// is `D / 64` boxes ("chunks") side by side.
    pub const CHUNK_COLS: usize = 64;
    /// Stages of the K ring and of the V ring (each its own full/empty mbarriers).
    pub const STAGES: usize = 2;
    /// Threads per warpgroup.
    pub const WARPGROUP_THREADS: u32 = 4 * WARP_SIZE;
    /// Consumer warpgroups.
    pub const CONSUMER_WARPGROUPS: u32 = 2;
    /// Threads per CTA: the producer warpgroup and the consumers.
    pub const THREADS_PER_CTA: u32 = WARPGROUP_THREADS * (1 + CONSUMER_WARPGROUPS);
    /// Registers per thread of the producer warpgroup (`setmaxnreg.dec`).
    pub const PRODUCER_REGS: u32 = 24;
    /// Registers per thread of a consumer warpgroup (`setmaxnreg.inc`).
    pub const CONSUMER_REGS: u32 = 240;
    /// TMA box of Q, `{D chunk, head, rows, batch}` elements.
    pub const Q_BOX: [u32; 4] = [CHUNK_COLS as u32, 1, BLOCK_M as u32, 1];
    /// TMA box of O's stores (TMA-store epilogue): one consumer warpgroup's 64 rows of one chunk.
    pub const O_BOX: [u32; 4] = [CHUNK_COLS as u32, 1, WG_M as u32, 1];
    /// Named barriers of the TMA-store epilogue: `O_STAGE_BARRIER + w` syncs consumer warpgroup
    /// `w`'s 128 threads around its staging tile.
    pub const O_STAGE_BARRIER: u32 = 3;
    /// `flags` bit: store O with bounds-checked 4-byte stores instead of the TMA-store epilogue
    /// (varlen batches always do: a box would cross into the next sequence's rows), to measure
    /// what the TMA store brings.
    pub const FLAG_NO_TMA_STORE: u32 = 16;
    /// TMA box of K and V.
    pub const KV_BOX: [u32; 4] = [CHUNK_COLS as u32, 1, BLOCK_N as u32, 1];
    /// `flags` bit: causal mask, aligned to the bottom right (query `i` sees key `j` iff
    /// `j <= i + S_k - S_q`, FlashAttention's convention).
    pub const FLAG_CAUSAL: u32 = 1;
    /// `flags` bit: variable-length batch (`cu_seqlens_q`, `cu_seqlens_k` are read).
    pub const FLAG_VARLEN: u32 = 2;
    /// `flags` bit: no ping-pong (the consumer warpgroups issue their GEMMs without waiting
    /// for their turn), to measure what the ping-pong brings.
    pub const FLAG_NO_PINGPONG: u32 = 4;
    /// `flags` bit: no in-warpgroup overlap (per key block: `S = Q K^T`, wait, softmax,
    /// `O += P V`, wait; implies no ping-pong), to measure what the overlap brings.
    pub const FLAG_NO_OVERLAP: u32 = 8;
    /// Named barriers of the ping-pong between the consumer warpgroups: `PINGPONG_BARRIER +
    /// w` is warpgroup `w`'s turn (256 threads: `w` syncs, the other arrives).
    pub const PINGPONG_BARRIER: u32 = 1;
    /// Alignment of every swizzled tile.
    pub const SWIZZLE_ALIGN: usize = 1024;
    /// Largest grid y (heads) and z (batch).
    pub const MAX_GRID_YZ: u32 = 65535;

    /// Bytes of one chunk (64 columns) of the Q tile.
    pub const Q_CHUNK_BYTES: usize = BLOCK_M * CHUNK_COLS * IN_BYTES;
    /// Bytes of one chunk (64 columns) of a K or V stage.
    pub const KV_CHUNK_BYTES: usize = BLOCK_N * CHUNK_COLS * IN_BYTES;
    /// Bytes of the Q tile for head dim `d`.
    pub const fn q_bytes(d: usize) -> usize {
        BLOCK_M * d * IN_BYTES
    }
    /// Bytes of one K (or V) stage for head dim `d`.
    pub const fn kv_stage_bytes(d: usize) -> usize {
        BLOCK_N * d * IN_BYTES
    }
    /// Shared-memory layout from the 1024-byte aligned base: `Q | K stages | V stages |
    /// q_full, q_empty, info_full | K full[STAGES], empty[STAGES] | V full[STAGES], empty[STAGES]
    /// | tile info[2]`.
    pub const Q_OFFSET: usize = 0;
    /// Offset of K stage 0.
    pub const fn k_offset(d: usize) -> usize {
        Q_OFFSET + q_bytes(d)
    }
    /// Offset of V stage 0.
    pub const fn v_offset(d: usize) -> usize {
        k_offset(d) + STAGES * kv_stage_bytes(d)
    }
    /// Offset of the O staging tile of the TMA-store epilogue: per consumer warpgroup `w`, at
    /// `o_offset(d) + w * WG_M * d * IN_BYTES`, its 64 rows as `d / 64` chunks of 64 rows x
    /// 128 bytes, 128-byte swizzled (the [`O_BOX`] layout).
    pub const fn o_offset(d: usize) -> usize {
        v_offset(d) + STAGES * kv_stage_bytes(d)
    }
    /// Bytes of one 64-column chunk of a consumer warpgroup's O staging tile.
    pub const O_CHUNK_BYTES: usize = WG_M * CHUNK_COLS * IN_BYTES;
    /// Offset of the tile barriers, `q_full`, `q_empty`, `info_full` (then the K ring's and the
    /// V ring's barriers).
    pub const fn barriers_offset(d: usize) -> usize {
        o_offset(d) + BLOCK_M * d * IN_BYTES
    }
    /// Offset of the K ring's barriers.
    pub const fn k_ring_offset(d: usize) -> usize {
        barriers_offset(d) + 3 * MBARRIER_BYTES
    }
    /// Offset of the V ring's barriers.
    pub const fn v_ring_offset(d: usize) -> usize {
        k_ring_offset(d) + 2 * STAGES * MBARRIER_BYTES
    }
    /// Instruction check `rs_wgmma_check(a: *const f32, b: *const u16, d: *mut f32)` (issue 23,
    /// `tests/issue23_device.rs`): one warpgroup ([`RS_CHECK_THREADS`] threads, one CTA,
    /// [`RS_CHECK_SMEM_BYTES`] dynamic shared memory) computes `D = A B` with `A` 64 x 16 (f32,
    /// row-major, rounded to BF16 on the way in) taken into registers through the FP32
    /// accumulator layout (`AFragment::from_acc_bf16`, the path `P` takes into `O += P V`), and
    /// `B` 16 x 128 (BF16 bits, row-major: k rows of N) stored MN-major with the 128-byte swizzle
    /// in two 64-column chunks (`imm-trans-b = 1`, the leading byte offset between chunks: V's
    /// layout), by one `wgmma.m64n128k16` with A in registers; `D` 64 x 128 f32 row-major.
    pub const RS_CHECK_KERNEL: &str = "rs_wgmma_check";
    /// Threads of the check (one warpgroup).
    pub const RS_CHECK_THREADS: u32 = WARPGROUP_THREADS;
    /// Bytes between the two 64-column chunks of the check's B (16 rows x 128 bytes).
    pub const RS_CHECK_CHUNK_BYTES: usize = 16 * 128;
    /// Dynamic shared memory of the check: B plus alignment slack.
    pub const RS_CHECK_SMEM_BYTES: usize = 2 * RS_CHECK_CHUNK_BYTES + SWIZZLE_ALIGN;

    /// Offset of the two tile-info slots (the producer's description of a tile for the
    /// consumers, [`INFO_WORDS`] `u32` each; slot `i % 2` for the CTA's `i`-th tile).
    pub const fn info_offset(d: usize) -> usize {
        v_ring_offset(d) + 2 * STAGES * MBARRIER_BYTES
    }
    /// `u32` words of one tile-info slot.
    pub const INFO_WORDS: usize = 16;

    /// Bytes of register spill stores, and of spill loads, per thread that ptxas may give each
    /// attention entry without failing the build (`PtxBuilder::allow_spills`). Under
    /// `setmaxnreg` the producer warpgroup has 24 registers and the consumers 240 (the CTA's
    /// whole file at 168 per thread); ptxas 13.0 spills up to 4 words of the persistent loop's
    /// per-tile state (the scheduler's tile index, ring positions, the epilogue's addresses)
    /// around tile boundaries, none in the per-key-block loop (checked in the SASS; session 12).
    pub const SPILL_ALLOWANCE_BYTES: u32 = 64;
    /// The entries [`SPILL_ALLOWANCE_BYTES`] applies to.
    pub const ENTRIES: [&str; 4] = [
        KERNEL_BF16_D64,
        KERNEL_BF16_D128,
        KERNEL_F16_D64,
        KERNEL_F16_D128,
    ];

    /// Dynamic shared memory per CTA for head dim `d` (layout, barriers, tile info, alignment
    /// slack).
    pub const fn smem_bytes(d: usize) -> usize {
        info_offset(d) + 2 * INFO_WORDS * 4 + SWIZZLE_ALIGN
    }

    /// Tiles of a launch: `ceil(S_q / BLOCK_M)` Q tiles (varlen: of the longest sequence) for
    /// each of the `heads * batch` (head, batch) pairs.
    pub const fn tile_count(seqlen_q: u32, heads: u32, batch: u32) -> u64 {
        seqlen_q.div_ceil(BLOCK_M as u32) as u64 * heads as u64 * batch as u64
    }

    /// Tile `t` of a launch as `(m_block, head, batch)`, with `n_m = ceil(S_q / BLOCK_M)` Q
    /// tiles per (head, batch) pair `hb = head + heads * batch`. The pairs are cut into L2
    /// sections of `hb_group` (the last may be shorter); a section's tiles come before the next
    /// section's, and inside a section the heaviest Q tiles (the last, for a causal mask) of
    /// every pair come first, then the next Q tile of every pair, and so on (longest first,
    /// while the section's K and V stay in L2). `t < tile_count`, `hb_group >= 1`.
    pub const fn tile_coords(
        t: u32,
        n_m: u32,
        heads: u32,
        batch: u32,
        hb_group: u32,
    ) -> (u32, u32, u32) {
        let pairs = heads * batch;
        let per_group = hb_group * n_m;
        let g = t / per_group;
        let w = t % per_group;
        let hb0 = g * hb_group;
        let left = pairs - hb0;
        let gs = if left < hb_group { left } else { hb_group };
        let m_block = n_m - 1 - w / gs;
        let hb = hb0 + w % gs;
        (m_block, hb % heads, hb / heads)
    }

    const _: () = {
        assert!(BLOCK_M == CONSUMER_WARPGROUPS as usize * WG_M);
        assert!(CHUNK_COLS * IN_BYTES == 128);
        assert!(Q_CHUNK_BYTES.is_multiple_of(SWIZZLE_ALIGN));
        assert!(O_CHUNK_BYTES.is_multiple_of(SWIZZLE_ALIGN));
        assert!(KV_CHUNK_BYTES.is_multiple_of(SWIZZLE_ALIGN));
        assert!(smem_bytes(128) <= 227 * 1024);
        assert!(info_offset(64).is_multiple_of(4));
        assert!(BLOCK_N.is_multiple_of(16) && BLOCK_N <= 256);
        warpline_device::check_setmaxnreg(
            THREADS_PER_CTA,
            1,
            &[PRODUCER_REGS, CONSUMER_REGS, CONSUMER_REGS],
        );
    };
}
