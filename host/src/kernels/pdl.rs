//! Launchers of the Programmatic Dependent Launch kernels (gpu/src/kernels/pdl.rs): the
//! kernel_A / kernel_B pair, `chain_step`, and the primary / secondary GEMM pair of chapter 11
//! ("Programmatic Dependent Launch", "Combining PDL and Thread Block Clusters with Warp
//! Specialization").
//!
//! `pdl: true` launches with `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` through
//! `cuLaunchKernelEx`: the kernel may start once every CTA of the previous kernel on the stream
//! has executed `griddepcontrol.launch_dependents` (or exited); it runs its prologue and then
//! `griddepcontrol.wait`s for that kernel's completion before touching its data. Every kernel here
//! is also correct without the attribute (the wait then returns at once).

use warpline_gpu::contract::pdl as contract;

use super::{check_grid, check_input, check_output, check_stream};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch::{launch_raw, LaunchConfig};
use crate::memory::{DeviceView, DeviceViewMut};
use crate::params;
use crate::stream::Stream;

pub use super::MAX_GRID;
/// Largest `m`, `n` or `k` of the GEMM pair (tile indices and row offsets stay in 32 bits).
pub const GEMM_MAX_DIM: u32 = 1 << 24;

/// [`Error::PdlUnsupported`] unless `compute_capability` is 9.0 or newer (the first with
/// `griddepcontrol` and the programmatic stream serialization attribute).
pub fn check_pdl_support(device: &str, compute_capability: (i32, i32)) -> Result<()> {
    let (major, minor) = compute_capability;
    if major < 9 {
        return Err(Error::PdlUnsupported {
            device: device.to_string(),
            major,
            minor,
        });
    }
    Ok(())
}

/// [`check_pdl_support`] for `dev` when `pdl` is requested.
pub(crate) fn require_pdl(dev: &Device, pdl: bool) -> Result<()> {
    if pdl {
        let caps = dev.capabilities();
        check_pdl_support(&caps.name, caps.compute_capability)?;
    }
    Ok(())
}

/// Which producer kernel of the pair to launch (for [`pdl_producer_variant`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Producer {
    /// `pdl_producer`: waits, stores, then triggers (the chapter's rule).
    Correct,
    /// `pdl_producer_early_trigger`: triggers before its stores. Negative control for tests.
    EarlyTrigger,
}

/// Which consumer kernel of the pair to launch (for [`pdl_consumer_variant`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumer {
    /// `pdl_consumer`: independent prologue, `griddepcontrol.wait`, then reads.
    Waits,
    /// `pdl_consumer_no_wait`: reads without waiting. Negative control for tests: races.
    NoWait,
}

/// Queues the pair's producer `pdl_producer`: `buf[i] = 2 * inp[i] + 1` for every element
/// (f32), on a grid-stride grid of `grid` CTAs of `PAIR_THREADS` threads. The kernel
/// `griddepcontrol.wait`s before it reads or writes anything and triggers after its last store,
/// so it is correct after any kernel, with or without the PDL attribute.
///
/// Shapes: `inp`, `buf` of equal length `n >= 1`. Alignment: 4 bytes (f32). Streams: both views on
/// `stream`. `pdl`: launch with the PDL attribute.
///
/// Errors, before launch: [`Error::LengthMismatch`], [`Error::Empty`], [`Error::BadShape`] (grid),
/// [`Error::WrongStream`], [`Error::Misaligned`], [`Error::PdlUnsupported`]; [`Error::Launch`].
pub fn pdl_producer(
    dev: &Device,
    stream: &Stream,
    inp: DeviceView<'_, f32>,
    buf: DeviceViewMut<'_, f32>,
    grid: u32,
    pdl: bool,
) -> Result<()> {
    // SAFETY: `Producer::Correct` waits before touching memory and triggers after its stores.
    unsafe { pdl_producer_variant(dev, stream, Producer::Correct, inp, buf, grid, pdl) }
}

/// [`pdl_producer`] with a choice of kernel, including the early-trigger negative control.
///
/// # Safety
/// For negative-control tests. With [`Producer::EarlyTrigger`], a kernel launched with the PDL
/// attribute right after it may start before the producer's stores to `buf`: such a dependent
/// must `griddepcontrol.wait` before it reads `buf` (the warpline launchers that read `buf` after
/// their wait are fine; [`Consumer::NoWait`] is not). [`Producer::Correct`] has no extra contract.
pub unsafe fn pdl_producer_variant(
    dev: &Device,
    stream: &Stream,
    which: Producer,
    inp: DeviceView<'_, f32>,
    buf: DeviceViewMut<'_, f32>,
    grid: u32,
    pdl: bool,
) -> Result<()> {
    const WHAT: &str = "pdl_producer";
    check_grid(WHAT, grid)?;
    let n = inp.len();
    if buf.len() != n {
        return Err(Error::LengthMismatch {
            what: WHAT,
            detail: format!(
                "inp has {n} elements, buf {}; they must be equal",
                buf.len()
            ),
        });
    }
    if n == 0 {
        return Err(Error::Empty { what: WHAT });
    }
    check_input("pdl_producer input inp", &inp, stream, 4)?;
    check_output("pdl_producer output buf", &buf, stream, 4)?;
    require_pdl(dev, pdl)?;
    let name = match which {
        Producer::Correct => contract::PRODUCER_KERNEL,
        Producer::EarlyTrigger => contract::EARLY_TRIGGER_KERNEL,
    };
    let cfg = LaunchConfig::linear(grid, contract::PAIR_THREADS, 0).with_pdl(pdl);
    cfg.validate(dev, name)?;
    let kernel = dev.kernel(name)?;
    let (pi, pb, n64) = (inp.device_ptr(), buf.device_ptr(), n as u64);
    // SAFETY: parameters match `(*const f32, *mut f32, u64)`; both views are live allocations of
    // n f32 on `stream` (checked); `buf` is a mutable view, so it does not alias `inp`.
    unsafe { launch_raw(dev, kernel, stream, &cfg, &mut params![pi, pb, n64]) }
}

/// Queues the pair's consumer `pdl_consumer` in plain stream order (no PDL attribute):
/// `out[i] = buf[i] * scale[i]` (f32). To overlap it with the producer use [`pdl_pair`].
///
/// Shapes: `buf`, `scale`, `out` of equal length `n >= 1`. Alignment 4 bytes. Streams: all on
/// `stream`.
///
/// Errors: as [`pdl_producer`].
pub fn pdl_consumer(
    dev: &Device,
    stream: &Stream,
    buf: DeviceView<'_, f32>,
    scale: DeviceView<'_, f32>,
    out: DeviceViewMut<'_, f32>,
    grid: u32,
) -> Result<()> {
    // SAFETY: without the PDL attribute the kernel starts after the previous work on `stream`
    // completed, so its pre-wait reads race with nothing.
    unsafe { pdl_consumer_variant(dev, stream, Consumer::Waits, buf, scale, out, grid, false) }
}

/// Queues the pair, producer then consumer on `stream`: `buf = 2 inp + 1`, then
/// `out = buf * scale`, the consumer launched with the PDL attribute when `pdl` (it reads both
/// `buf` and `scale` after its `griddepcontrol.wait`).
///
/// `scale` is also kept disjoint from the producer's output (defence in depth, should a later
/// kernel version read it in its prologue): the producer
/// writes only `buf`, a mutable view that the borrow checker keeps apart from `scale`, and the
/// launcher checks the address ranges as well ([`Error::BadShape`] on overlap).
///
/// Shapes: `inp`, `buf`, `scale`, `out` of equal length `n >= 1`; alignment 4 bytes; all on
/// `stream`. Errors: those of [`pdl_producer`], [`Error::BadShape`].
#[allow(clippy::too_many_arguments)]
pub fn pdl_pair(
    dev: &Device,
    stream: &Stream,
    inp: DeviceView<'_, f32>,
    mut buf: DeviceViewMut<'_, f32>,
    scale: DeviceView<'_, f32>,
    out: DeviceViewMut<'_, f32>,
    grid: u32,
    pdl: bool,
) -> Result<()> {
    let bytes = |p: u64, n: usize| p..p + (n * 4) as u64;
    let (b, s) = (
        bytes(buf.device_ptr(), buf.len()),
        bytes(scale.device_ptr(), scale.len()),
    );
    if b.start < s.end && s.start < b.end {
        return Err(Error::BadShape {
            what: "pdl_pair",
            detail: format!(
                "scale [{:#x}, {:#x}) overlaps the producer's output buf [{:#x}, {:#x}); scale must not be written by the producer",
                s.start, s.end, b.start, b.end
            ),
        });
    }
    // Validate the consumer before queueing the producer, so bad input queues nothing.
    check_consumer(dev, stream, buf.len(), &scale, &out, grid, pdl)?;
    check_stream("pdl_consumer input buf", buf.stream(), stream)?;
    pdl_producer(dev, stream, inp, buf.reborrow(), grid, false)?;
    let buf_view = buf.into_view();
    // SAFETY: the previous kernel on `stream` is the producer just queued, which writes only
    // `buf`; the consumer reads `buf` and `scale` (checked disjoint from `buf`) only after its
    // wait.
    unsafe {
        pdl_consumer_variant(
            dev,
            stream,
            Consumer::Waits,
            buf_view,
            scale,
            out,
            grid,
            pdl,
        )
    }
}

/// The checks every consumer launch shares, over a `buf` of `n` elements: grid, equal lengths
/// (`n >= 1`), `scale` and `out` on `stream` and 4-byte aligned, PDL support when asked.
fn check_consumer(
    dev: &Device,
    stream: &Stream,
    n: usize,
    scale: &DeviceView<'_, f32>,
    out: &DeviceViewMut<'_, f32>,
    grid: u32,
    pdl: bool,
) -> Result<()> {
    const WHAT: &str = "pdl_consumer";
    check_grid(WHAT, grid)?;
    if scale.len() != n || out.len() != n {
        return Err(Error::LengthMismatch {
            what: WHAT,
            detail: format!(
                "buf has {n} elements, scale {}, out {}; all must be equal",
                scale.len(),
                out.len()
            ),
        });
    }
    if n == 0 {
        return Err(Error::Empty { what: WHAT });
    }
    check_input("pdl_consumer input scale", scale, stream, 4)?;
    check_output("pdl_consumer output out", out, stream, 4)?;
    require_pdl(dev, pdl)
}

/// The consumer with a choice of kernel and of the PDL attribute.
///
/// Shapes: `buf`, `scale`, `out` of equal length `n >= 1`. Alignment 4 bytes. Streams: all on
/// `stream`. Errors: as [`pdl_producer`].
///
/// # Safety
/// With `pdl`, the kernel may start before the kernel queued just before it on `stream` has
/// finished. [`Consumer::Waits`] reads `buf` and `scale` and writes `out` only after its
/// `griddepcontrol.wait`, which waits for the previous kernel's completion; the caller still keeps
/// `scale` unwritten by that kernel, as the safe [`pdl_pair`] does. [`Consumer::NoWait`] reads `buf` without waiting: a negative
/// control for tests, it races with a PDL-overlapped producer of `buf` (its results are then
/// unspecified, though every access stays inside the views).
///
/// ```compile_fail,E0133
/// // finding 12: the racing negative controls are not reachable from safe code.
/// use warpline::kernels::pdl::{pdl_consumer_variant, Consumer};
/// fn f(
///     d: &warpline::Device,
///     s: &warpline::Stream,
///     b: warpline::DeviceView<'_, f32>,
///     c: warpline::DeviceView<'_, f32>,
///     o: warpline::DeviceViewMut<'_, f32>,
/// ) {
///     let _ = pdl_consumer_variant(d, s, Consumer::NoWait, b, c, o, 1, true);
/// }
/// ```
#[allow(clippy::too_many_arguments)]
pub unsafe fn pdl_consumer_variant(
    dev: &Device,
    stream: &Stream,
    which: Consumer,
    buf: DeviceView<'_, f32>,
    scale: DeviceView<'_, f32>,
    out: DeviceViewMut<'_, f32>,
    grid: u32,
    pdl: bool,
) -> Result<()> {
    let n = buf.len();
    check_consumer(dev, stream, n, &scale, &out, grid, pdl)?;
    check_input("pdl_consumer input buf", &buf, stream, 4)?;
    let name = match which {
        Consumer::Waits => contract::CONSUMER_KERNEL,
        Consumer::NoWait => contract::CONSUMER_NO_WAIT_KERNEL,
    };
    let cfg = LaunchConfig::linear(grid, contract::PAIR_THREADS, 0).with_pdl(pdl);
    cfg.validate(dev, name)?;
    let kernel = dev.kernel(name)?;
    let (pb, ps, po, n64) = (
        buf.device_ptr(),
        scale.device_ptr(),
        out.device_ptr(),
        n as u64,
    );
    // SAFETY: parameters match `(*const f32, *const f32, *mut f32, u64)`; views are live, n f32
    // each, on `stream` (checked); `out` is a mutable view and aliases neither input.
    unsafe { launch_raw(dev, kernel, stream, &cfg, &mut params![pb, ps, po, n64]) }
}

/// Launch configuration of `chain_step` with `grid` CTAs of `CHAIN_STEP_THREADS` threads.
pub fn chain_step_config(grid: u32, pdl: bool) -> LaunchConfig {
    LaunchConfig::linear(grid, contract::CHAIN_STEP_THREADS, 0).with_pdl(pdl)
}

/// Validates a `chain_step` launch on `x` (`n >= 1` u32 on `stream`, grid 1 to 2^31 - 1, PDL
/// support when asked) and returns its configuration.
pub(crate) fn chain_step_checked(
    dev: &Device,
    stream: &Stream,
    x: &DeviceViewMut<'_, u32>,
    grid: u32,
    pdl: bool,
) -> Result<LaunchConfig> {
    check_grid(contract::CHAIN_STEP_KERNEL, grid)?;
    if x.is_empty() {
        return Err(Error::Empty {
            what: contract::CHAIN_STEP_KERNEL,
        });
    }
    check_output("chain_step buffer x", x, stream, 4)?;
    require_pdl(dev, pdl)?;
    let cfg = chain_step_config(grid, pdl);
    cfg.validate(dev, contract::CHAIN_STEP_KERNEL)?;
    Ok(cfg)
}

/// Queues one `chain_step`: `x[i] += 1` (wrapping u32) for every element. It waits at start and
/// triggers after its stores, so consecutive steps launched with `pdl: true` stay ordered.
/// For long chains and graph capture use [`crate::chain::Chain`].
///
/// Errors: [`Error::Empty`], [`Error::BadShape`] (grid), [`Error::WrongStream`],
/// [`Error::PdlUnsupported`], [`Error::Launch`].
pub fn chain_step(
    dev: &Device,
    stream: &Stream,
    x: DeviceViewMut<'_, u32>,
    grid: u32,
    pdl: bool,
) -> Result<()> {
    let cfg = chain_step_checked(dev, stream, &x, grid, pdl)?;
    let kernel = dev.kernel(contract::CHAIN_STEP_KERNEL)?;
    let (px, n64) = (x.device_ptr(), x.len() as u64);
    // SAFETY: parameters match `chain_step(*mut u32, u64)`; x is a live allocation of n u32 on
    // `stream` (checked).
    unsafe { launch_raw(dev, kernel, stream, &cfg, &mut params![px, n64]) }
}

/// Shape of one GEMM of the pair: `C[m x n] = A[m x k] · B[k x n]`, f32, row-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmDims {
    /// Rows of A and C (any value 1 to [`GEMM_MAX_DIM`]).
    pub m: u32,
    /// Columns of B and C (a multiple of 4: 16-byte rows).
    pub n: u32,
    /// Columns of A, rows of B (a multiple of 4: 16-byte rows).
    pub k: u32,
}

/// CTAs of a GEMM launch: `CLUSTER_CTAS` per `TILE_M x TILE_N` tile of C.
pub fn gemm_grid(dims: GemmDims) -> u64 {
    let tiles = (dims.m as u64).div_ceil(contract::TILE_M as u64)
        * (dims.n as u64).div_ceil(contract::TILE_N as u64);
    tiles * contract::CLUSTER_CTAS as u64
}

/// Which kernel of the GEMM pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKernel {
    /// `primary_gemm`: waits only before storing C; triggers after its last store of C.
    Primary,
    /// `secondary_gemm`: barrier init and B tiles before the wait, A (the primary's C) after.
    Secondary,
}

/// Queues `C = A · B` with `primary_gemm` or `secondary_gemm`: clusters of `CLUSTER_CTAS` (2) CTAs
/// per `TILE_M x TILE_N` (64 x 64) tile of C, each CTA half of K, one producer warp staging
/// `K_CHUNK` (32)-deep A and B tiles with cp.async into `STAGES` (3) mbarrier-tracked stages,
/// four consumer warps computing with FMA (the mainloop and epilogue of `cluster_tile_gemm`, an
/// 8 x 4 block of C per thread), split-K partials reduced through DSMEM.
///
/// Shapes: `a.len() == m k`, `b.len() == k n`, `c.len() == m n`; `m, n, k` in 1 to
/// [`GEMM_MAX_DIM`], `n` and `k` multiples of 4. Alignment: 16 bytes for `a`, `b`, `c`.
/// `stamps`: optional `gemm_grid(dims) * STAMPS_PER_CTA` u64 that receive each CTA's
/// `%globaltimer` (ns) at start, at the trigger (primary) / wait return (secondary), at end.
/// Streams: every view on `stream`. `pdl`: launch with the PDL attribute (typically the
/// secondary, right after the primary). The safe, plain-stream-order form is [`gemm`].
///
/// Errors, before launch: [`Error::Empty`], [`Error::TooLarge`], [`Error::BadShape`],
/// [`Error::LengthMismatch`], [`Error::Misaligned`], [`Error::WrongStream`],
/// [`Error::PdlUnsupported`], [`Error::ClustersUnsupported`]; [`Error::Launch`].
#[allow(clippy::too_many_arguments)]
///
/// # Safety
/// With `pdl`, the kernel may start before the kernel queued just before it on `stream` has
/// finished, and reads some inputs before its `griddepcontrol.wait`: that kernel must not write
/// `a` or `b` ([`GemmKernel::Primary`]: reads both before its wait) or `b`
/// ([`GemmKernel::Secondary`]: B tiles before its wait, A after), nor `stamps`. Without `pdl`
/// there is no extra contract. Typical use: the secondary, with `a` = the primary's `c`, right
/// after the primary.
pub unsafe fn gemm_with_pdl(
    dev: &Device,
    stream: &Stream,
    which: GemmKernel,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
    dims: GemmDims,
    pdl: bool,
    stamps: Option<DeviceViewMut<'_, u64>>,
) -> Result<()> {
    const WHAT: &str = "pdl gemm";
    let GemmDims { m, n, k } = dims;
    if m == 0 || n == 0 || k == 0 {
        return Err(Error::Empty { what: WHAT });
    }
    for (name, v) in [("pdl gemm m", m), ("pdl gemm n", n), ("pdl gemm k", k)] {
        if v > GEMM_MAX_DIM {
            return Err(Error::TooLarge {
                what: name,
                value: v as u64,
                max: GEMM_MAX_DIM as u64,
            });
        }
    }
    let row = contract::ROW_ALIGN_ELEMS as u32;
    if !n.is_multiple_of(row) || !k.is_multiple_of(row) {
        return Err(Error::BadShape {
            what: WHAT,
            detail: format!("n = {n} and k = {k} must be multiples of {row} (16-byte rows)"),
        });
    }
    let (m64, n64, k64) = (m as usize, n as usize, k as usize);
    if a.len() != m64 * k64 || b.len() != k64 * n64 || c.len() != m64 * n64 {
        return Err(Error::LengthMismatch {
            what: WHAT,
            detail: format!(
                "a has {}, b {}, c {} elements; m x k = {}, k x n = {}, m x n = {} expected",
                a.len(),
                b.len(),
                c.len(),
                m64 * k64,
                k64 * n64,
                m64 * n64
            ),
        });
    }
    let grid = gemm_grid(dims);
    if grid > MAX_GRID as u64 {
        return Err(Error::TooLarge {
            what: "pdl gemm CTAs",
            value: grid,
            max: MAX_GRID as u64,
        });
    }
    let stamps_ptr = match &stamps {
        None => 0u64,
        Some(s) => {
            let want = grid as usize * contract::STAMPS_PER_CTA;
            if s.len() != want {
                return Err(Error::LengthMismatch {
                    what: "pdl gemm stamps",
                    detail: format!(
                        "{} u64 given, {want} (CTAs x STAMPS_PER_CTA) expected",
                        s.len()
                    ),
                });
            }
            check_stream("pdl gemm stamps", s.stream(), stream)?;
            s.device_ptr()
        }
    };
    check_input("pdl gemm input a", &a, stream, 16)?;
    check_input("pdl gemm input b", &b, stream, 16)?;
    check_output("pdl gemm output c", &c, stream, 16)?;
    require_pdl(dev, pdl)?;
    let name = match which {
        GemmKernel::Primary => contract::PRIMARY_GEMM_KERNEL,
        GemmKernel::Secondary => contract::SECONDARY_GEMM_KERNEL,
    };
    let cfg = LaunchConfig::linear(
        grid as u32,
        contract::GEMM_THREADS,
        contract::GEMM_SMEM_BYTES as u32,
    )
    .with_cluster_x(contract::CLUSTER_CTAS)
    .with_pdl(pdl);
    cfg.validate(dev, name)?;
    let kernel = dev.kernel(name)?;
    let (pa, pb, pc) = (a.device_ptr(), b.device_ptr(), c.device_ptr());
    // SAFETY: parameters match `(*const f32, *const f32, *mut f32, u32, u32, u32, *mut u64)`;
    // the views are live allocations of the checked sizes on `stream`, 16-byte aligned; `c` is a
    // mutable view and aliases neither input; `stamps` is null or grid x STAMPS_PER_CTA u64.
    unsafe {
        launch_raw(
            dev,
            kernel,
            stream,
            &cfg,
            &mut params![pa, pb, pc, m, n, k, stamps_ptr],
        )
    }
}

/// [`gemm_with_pdl`] in plain stream order (no PDL attribute): safe, since the kernel starts
/// after every earlier kernel on `stream` has completed. Shapes, alignment, streams and errors as
/// [`gemm_with_pdl`].
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    dev: &Device,
    stream: &Stream,
    which: GemmKernel,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
    dims: GemmDims,
    stamps: Option<DeviceViewMut<'_, u64>>,
) -> Result<()> {
    // SAFETY: without the PDL attribute there is no contract beyond the checked arguments.
    unsafe { gemm_with_pdl(dev, stream, which, a, b, c, dims, false, stamps) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdl_needs_compute_capability_9() {
        assert!(check_pdl_support("H100", (9, 0)).is_ok());
        assert!(check_pdl_support("B200", (10, 0)).is_ok());
        let e = check_pdl_support("A100", (8, 0)).unwrap_err();
        assert!(matches!(
            e,
            Error::PdlUnsupported {
                major: 8,
                minor: 0,
                ..
            }
        ));
        assert!(e.to_string().contains("9.0"), "{e}");
    }

    #[test]
    fn gemm_grid_counts_two_ctas_per_tile() {
        let d = GemmDims { m: 65, n: 64, k: 4 };
        assert_eq!(gemm_grid(d), 2 * 2);
        let d = GemmDims {
            m: 1,
            n: 132,
            k: 300,
        };
        assert_eq!(gemm_grid(d), 2 * 3);
    }
}
