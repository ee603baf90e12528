//! The QKV projection's epilogue, shared by the decode GEMM (`decode_gemm`'s `EPI_QKV` entries,
//! sm_90 module) and the swap-AB GEMM (`swap_ab_gemm`'s `EPI_QKV`, sm_90a module): RoPE on the
//! Q and K heads (rotate half, `theta` table per position), Q into its output, K and V into the
//! paged caches at each token's position (issue 21).

use crate::device::math::pack_bf16x2;

#[inline(always)]
fn trap() -> ! {
    // SAFETY: `trap` aborts the kernel; no preconditions.
    unsafe { core::arch::nvptx::trap() }
}

/// The argument block of the QKV epilogue (`contract::decode_gemm::QKV_ARGS` u64 words):
/// positions, block table, K and V caches, the RoPE table, `heads | kv_heads << 32`, `head_dim |
/// page_size << 32`, `bt_stride | num_pages << 32`, `max_pos`.
#[derive(Clone, Copy)]
pub(crate) struct QkvArgs {
    positions: *const u32,
    bt: *const u32,
    kc: *mut u16,
    vc: *mut u16,
    rope: *const f32,
    pub(crate) heads: u64,
    kv_heads: u64,
    pub(crate) d: u64,
    page: u64,
    bt_stride: u64,
    num_pages: u64,
    max_pos: u64,
}

impl QkvArgs {
    /// Reads the block at `e`; traps on a zero head dim or page size.
    ///
    /// # Safety
    /// `e` points to `QKV_ARGS` readable u64 words that describe, as the entries' launch
    /// contracts say: a positions array of M u32, a block table of M rows of `bt_stride` u32, K
    /// and V caches of `num_pages * kv_heads * page_size * head_dim` bf16, a RoPE table of
    /// `max_pos * head_dim` f32.
    #[inline(always)]
    pub(crate) unsafe fn load(e: *const u64) -> Self {
        // SAFETY: the caller's contract.
        let w = |i: usize| unsafe { e.add(i).read() };
        let (w5, w6, w7) = (w(5), w(6), w(7));
        let a = Self {
            positions: w(0) as *const u32,
            bt: w(1) as *const u32,
            kc: w(2) as *mut u16,
            vc: w(3) as *mut u16,
            rope: w(4) as *const f32,
            heads: w5 as u32 as u64,
            kv_heads: w5 >> 32,
            d: w6 as u32 as u64,
            page: w6 >> 32,
            bt_stride: w7 as u32 as u64,
            num_pages: w7 >> 32,
            max_pos: w(8),
        };
        if a.d == 0 || a.page == 0 {
            trap();
        }
        a
    }

    /// One RoPE pair of token `tok`: dims `j` and `j + d/2` of head `head` (Q heads, then K,
    /// then V) with the projections `x0`, `x1`: rotated by the token's position for Q and K
    /// heads, then stored as bf16 into Q (`q`, row pitch `ldq`) or the K / V cache row of the
    /// token's position. A position `>= max_pos`, a page `>= num_pages` or a position beyond the
    /// block table traps.
    ///
    /// # Safety
    /// [`Self::load`]'s block; `tok < M`; `head < heads + 2 kv_heads`, `j < d / 2`; `q` holds M
    /// rows of pitch `ldq >= heads * d` bf16; only this thread writes these two elements.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn store_pair(
        &self,
        q: *mut u16,
        ldq: u64,
        tok: u32,
        head: u64,
        j: u64,
        x0: f32,
        x1: f32,
    ) {
        let (d, half) = (self.d, self.d / 2);
        // SAFETY: tok < M (the caller's contract: positions has M entries).
        let pos = unsafe { self.positions.add(tok as usize).read() } as u64;
        let (y0, y1) = if head < self.heads + self.kv_heads {
            if pos >= self.max_pos {
                trap();
            }
            // SAFETY: pos < max_pos, j < d / 2: inside the table.
            let (c, s) = unsafe {
                let r = self.rope.add(((pos * half + j) * 2) as usize);
                (r.read(), r.add(1).read())
            };
            (x0 * c - x1 * s, x1 * c + x0 * s)
        } else {
            (x0, x1)
        };
        let (b0, b1) = (pack_bf16x2(y0, 0.0) as u16, pack_bf16x2(y1, 0.0) as u16);
        if head < self.heads {
            let idx = tok as usize * ldq as usize + (head * d + j) as usize;
            // SAFETY: Q holds M rows of pitch ldq >= heads * d (the caller's contract).
            unsafe {
                let cp = q.add(idx);
                cp.write_volatile(b0);
                cp.add(half as usize).write_volatile(b1);
            }
        } else {
            let (cache, kvh) = if head < self.heads + self.kv_heads {
                (self.kc, head - self.heads)
            } else {
                (self.vc, head - self.heads - self.kv_heads)
            };
            let blk = pos / self.page;
            if blk >= self.bt_stride {
                trap();
            }
            // SAFETY: tok < M rows of bt_stride entries, blk < bt_stride.
            let pg = unsafe {
                self.bt
                    .add((tok as u64 * self.bt_stride + blk) as usize)
                    .read()
            } as u64;
            if pg >= self.num_pages {
                trap();
            }
            let off = ((pg * self.kv_heads + kvh) * self.page + pos % self.page) * d + j;
            // SAFETY: pg < num_pages, kvh < kv_heads, pos % page < page, j + d/2 < d: inside
            // the cache (the caller's contract); one writer per element.
            unsafe {
                let cp = cache.add(off as usize);
                cp.write_volatile(b0);
                cp.add(half as usize).write_volatile(b1);
            }
        }
    }
}
