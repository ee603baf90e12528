//! Host copies that never block inside the driver: pinned staging and event polling.
//!
//! A synchronous or pageable copy (`cuMemcpyDtoH`, `cuMemcpyDtoHAsync` into pageable memory)
//! blocks *inside* the driver until its stream reaches it, holding a driver lock that
//! `cuStreamCreate`, `cuEventCreate` and `cuStreamQuery` also take. When the copy's stream shares
//! a hardware queue with an on-stream wait whose release needs another host thread, that thread
//! cannot make its release calls and the process hangs (issue 19; stacks taken with cuda-gdb on
//! the H100 showed one thread in `cuMemcpyDtoH_v2`, the others in `cuStreamCreate` and
//! `cuEventCreate`).
//!
//! The copies here queue asynchronous copies between device memory and warpline's own
//! page-locked staging memory (which return at once), record an event after each piece, and poll
//! it with `cuEventQuery` (a short, non-blocking call) with a backoff, as the reaper does: no driver
//! lock is held while the host waits. The GPU never touches the caller's memory, only the staging
//! buffer, so an error part-way leaves nothing in flight that borrows host memory.
//!
//! Staging buffers ([`STAGING_BYTES`], two halves so that one piece is copied on the host while
//! the next moves on the bus) are cached per context in its `ContextState`, at most
//! [`IDLE_KEPT`] idle ones; concurrent copies take a fresh one. They are never freed with
//! `cuMemFreeHost` (it waits for the whole device, also behind a user's blocking host callback):
//! they stay allocated until the context is destroyed. A buffer whose copies could not be seen
//! complete (a poisoned context) is likewise never reused.

use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext};

use super::PinnedBuffer;
use crate::device::{bind_context, refuse_in_host_callback, state_for};
use crate::driver::core as drv;
use crate::error::Result;

/// Bytes of one staging buffer (two halves of 2 MiB).
pub(crate) const STAGING_BYTES: usize = 4 << 20;
/// Idle staging buffers kept per context.
const IDLE_KEPT: usize = 4;

/// A context's idle staging buffers.
#[derive(Default)]
pub(crate) struct StagingCache {
    idle: Mutex<Vec<PinnedBuffer<u8>>>,
}

impl std::fmt::Debug for StagingCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.idle.lock().map(|v| v.len()).unwrap_or(0);
        write!(f, "StagingCache {{ idle: {n} }}")
    }
}

impl Drop for StagingCache {
    fn drop(&mut self) {
        // Never freed explicitly: `cuMemFreeHost` waits for the whole device, and behind a host
        // callback that blocks its stream (a user's closure) it held the driver lock until the
        // callback returned; on the H100 a `Device` drop then stalled in `cuEventCreate` behind
        // the reaper's free. The buffers (at most `IDLE_KEPT` of 4 MiB) go with the context.
        for b in std::mem::take(self.idle.get_mut().unwrap_or_else(|e| e.into_inner())) {
            b.leak_to_context();
        }
    }
}

impl StagingCache {
    fn take(&self, ctx: &Arc<CudaContext>) -> Result<PinnedBuffer<u8>> {
        let cached = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match cached {
            Some(b) => Ok(b),
            None => PinnedBuffer::new_in(ctx, STAGING_BYTES),
        }
    }

    fn give_back(&self, b: PinnedBuffer<u8>) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_KEPT {
            idle.push(b);
        } else {
            // Not freed (see the Drop impl): left to the context's teardown.
            b.leak_to_context();
        }
    }
}

/// Two non-timing events, destroyed on drop.
struct Markers([sys::CUevent; 2]);

impl Markers {
    fn new() -> Result<Self> {
        let flag = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING;
        let a = drv::event_create_with(flag)?;
        match drv::event_create_with(flag) {
            Ok(b) => Ok(Self([a, b])),
            Err(e) => {
                let _ = drv::event_destroy(a);
                Err(e)
            }
        }
    }
}

impl Drop for Markers {
    fn drop(&mut self) {
        for e in self.0 {
            // cuEventDestroy on a pending event is legal (released once it completes).
            let _ = drv::event_destroy(e);
        }
    }
}

/// One staged copy: the staging buffer, its two half-buffer events and which are pending.
struct Staged<'c> {
    ctx: &'c Arc<CudaContext>,
    buf: Option<PinnedBuffer<u8>>,
    marks: Markers,
    pending: [bool; 2],
}

impl<'c> Staged<'c> {
    fn begin(ctx: &'c Arc<CudaContext>, call: &'static str) -> Result<Self> {
        refuse_in_host_callback(call)?;
        bind_context(ctx, call)?;
        let marks = Markers::new()?;
        let buf = state_for(ctx.cu_ctx()).ext::<StagingCache>().take(ctx)?;
        Ok(Self {
            ctx,
            buf: Some(buf),
            marks,
            pending: [false; 2],
        })
    }

    fn half(&mut self, slot: usize) -> &mut [u8] {
        let half = STAGING_BYTES / 2;
        let buf = self
            .buf
            .as_mut()
            .expect("staging buffer present until finish");
        &mut buf[slot * half..(slot + 1) * half]
    }

    fn wait(&mut self, slot: usize) -> Result<()> {
        if self.pending[slot] {
            drv::event_wait_polled(self.marks.0[slot])?;
            self.pending[slot] = false;
        }
        Ok(())
    }

    fn record(&mut self, slot: usize, stream: sys::CUstream) -> Result<()> {
        drv::event_record(self.marks.0[slot], stream)?;
        self.pending[slot] = true;
        Ok(())
    }

    /// Waits for both halves and returns the buffer to the cache; the context's sticky state is
    /// checked after the wait.
    fn finish(mut self, call: &'static str) -> Result<()> {
        self.wait(0)?;
        self.wait(1)?;
        if let Some(b) = self.buf.take() {
            state_for(self.ctx.cu_ctx())
                .ext::<StagingCache>()
                .give_back(b);
        }
        state_for(self.ctx.cu_ctx()).check(call)
    }
}

impl Drop for Staged<'_> {
    fn drop(&mut self) {
        let Some(b) = self.buf.take() else { return };
        // An error path: the buffer may be reused only once no copy into or out of it is pending.
        let settled =
            (0..2).all(|s| !self.pending[s] || drv::event_wait_polled(self.marks.0[s]).is_ok());
        if settled {
            state_for(self.ctx.cu_ctx())
                .ext::<StagingCache>()
                .give_back(b);
        } else {
            // A copy may still be in flight: leak the staging memory rather than free or reuse
            // it under the GPU.
            b.leak_to_context();
        }
    }
}

/// Copies `dst.len()` bytes from device address `src` into `dst`, queued on `stream` (so after
/// its earlier work), and returns once they are in `dst`.
///
/// # Safety
/// `src .. src + dst.len()` must be readable device memory of `ctx` until the copy completes on
/// `stream` (for example an allocation whose uses are all ordered on `stream`), and `stream` a
/// live stream of `ctx`.
pub(crate) unsafe fn copy_dtoh_polled(
    ctx: &Arc<CudaContext>,
    stream: sys::CUstream,
    src: u64,
    dst: &mut [u8],
    call: &'static str,
) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let mut st = Staged::begin(ctx, call)?;
    let half = STAGING_BYTES / 2;
    let mut prev: Option<(usize, usize)> = None; // (slot, piece index) waiting to be copied out
    let pieces = dst.len().div_ceil(half);
    for i in 0..pieces {
        let slot = i % 2;
        let off = i * half;
        let piece = half.min(dst.len() - off);
        // The slot's previous piece (i - 2) was copied out in the previous iteration.
        let stage = st.half(slot).as_mut_ptr();
        // SAFETY: the staging half holds `half >= piece` bytes and nothing else uses it until
        // its event completes; the source range is in bounds (caller's contract).
        unsafe { drv::memcpy_dtoh_async(stage.cast(), src + off as u64, piece, stream) }?;
        st.record(slot, stream)?;
        if let Some((ps, pi)) = prev.replace((slot, i)) {
            copy_out(&mut st, ps, pi, dst)?;
        }
    }
    if let Some((ps, pi)) = prev {
        copy_out(&mut st, ps, pi, dst)?;
    }
    st.finish(call)
}

/// Waits for piece `index` in staging half `slot` and copies it into its place in `dst`.
fn copy_out(st: &mut Staged<'_>, slot: usize, index: usize, dst: &mut [u8]) -> Result<()> {
    let half = STAGING_BYTES / 2;
    st.wait(slot)?;
    let start = index * half;
    let end = (start + half).min(dst.len());
    let n = end - start;
    dst[start..end].copy_from_slice(&st.half(slot)[..n]);
    Ok(())
}

/// Copies `src` to device address `dst`, queued on `stream` (after its earlier work), and
/// returns once the copy has completed.
///
/// # Safety
/// `dst .. dst + src.len()` must be writable device memory of `ctx` that nothing else accesses
/// until the copy completes on `stream`, and `stream` a live stream of `ctx`.
pub(crate) unsafe fn copy_htod_polled(
    ctx: &Arc<CudaContext>,
    stream: sys::CUstream,
    src: &[u8],
    dst: u64,
    call: &'static str,
) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    let mut st = Staged::begin(ctx, call)?;
    let half = STAGING_BYTES / 2;
    for (i, piece) in src.chunks(half).enumerate() {
        let slot = i % 2;
        // The copy of piece i - 2 out of this half must have completed before it is refilled.
        st.wait(slot)?;
        let stage = st.half(slot);
        stage[..piece.len()].copy_from_slice(piece);
        let stage = stage.as_ptr();
        // SAFETY: the staging half holds the piece and is not touched until its event completes;
        // the destination range is in bounds and ours (caller's contract).
        unsafe {
            drv::memcpy_htod_async(dst + (i * half) as u64, stage.cast(), piece.len(), stream)
        }?;
        st.record(slot, stream)?;
    }
    st.finish(call)
}
