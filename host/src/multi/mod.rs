//! Several GPUs of one host (issue 13; `docs/multi-gpu.md`): a [`DeviceSet`] opened through the
//! primary contexts, its peer-access matrix, peer copies on the copy engines, pools whose memory
//! peers may access, high-priority communication streams, the two-GPU layer pipeline
//! ([`LayerPipeline`]), NCCL communicators and the data-parallel step ([`nccl`]), CUDA graphs of
//! each GPU's compute, captured per GPU from a thread of its own, in that step (NCCL outside the
//! graphs; [`bench::DataParallelConfig::graphs`]) and in the pipeline (peer copy outside;
//! [`LayerPipeline::capture_graphs`]), and the measurements the `warpline mgpu` subcommand prints
//! ([`mod@bench`]).
//!
//! Safety rule of the shared machines: NVLink multicast (NVLS / NVLink SHARP) stays off.
//! warpline never calls `cuMulticastCreate`, and makes no NCCL communicator unless
//! `NCCL_NVLS_ENABLE=0` ([`nccl::require_nvls_off`]; the CLI sets it at the top of `main` with
//! [`nccl::disable_nvls_unless_set`]).
//!
//! Events recorded on one GPU's stream may be waited on by another GPU's stream
//! ([`Stream::wait`] with an [`crate::Event`] of any device: `cuStreamWaitEvent` accepts an event
//! of another context, CUDA driver API "Stream Management").

pub mod bench;
mod graphs;
pub mod nccl;
mod pipeline;
pub mod seeds;
mod task_graph;

pub use pipeline::{LayerPipeline, LayerPipelineConfig, LayerPipelineReport, Placement};

use bytemuck::Pod;

use crate::device::{bind_context, driver_present, Device};
use crate::driver::{core as drv, peer};
use crate::error::{CudaCall, Error, Result};
use crate::memory::{DeviceBuffer, MemPool};
use crate::stream::Stream;

/// The first index where `a` and `b` differ bit for bit (over their common length): how the
/// graph replays are compared with the eager runs they must equal exactly.
pub(crate) fn first_bit_difference(a: &[f32], b: &[f32]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x.to_bits() != y.to_bits())
}

/// GPUs the driver reports (`cuInit` + `cuDeviceGetCount`), without opening any.
/// Errors: [`Error::NoDriver`], [`Error::Cuda`].
pub fn device_count() -> Result<usize> {
    if !driver_present() {
        return Err(Error::NoDriver);
    }
    drv::init()?;
    Ok(drv::device_get_count()? as usize)
}

/// Checks a list of ordinals for a [`DeviceSet`] without touching a GPU: at least one, all
/// distinct, each below `available`. Errors: [`Error::Empty`], [`Error::BadShape`] (a repeated
/// ordinal), [`Error::NoDevice`].
pub fn check_ordinals(ordinals: &[usize], available: usize) -> Result<()> {
    if ordinals.is_empty() {
        return Err(Error::Empty {
            what: "device set ordinals",
        });
    }
    for (i, &o) in ordinals.iter().enumerate() {
        if o >= available {
            return Err(Error::NoDevice {
                ordinal: o,
                available,
            });
        }
        if ordinals[..i].contains(&o) {
            return Err(Error::BadShape {
                what: "device set ordinals",
                detail: format!("GPU {o} is listed twice; allowed: distinct ordinals"),
            });
        }
    }
    Ok(())
}

/// N GPUs opened through their primary contexts ([`Device::open`] each), with peer access
/// enabled between every pair that supports it.
///
/// - [`DeviceSet::peer_matrix`]: `cuDeviceCanAccessPeer` for every ordered pair (the diagonal is
///   true). Peer access is enabled with `cuCtxEnablePeerAccess` from each context to every peer it
///   can access; `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` (NCCL enables it too) is not an error.
/// - Memory of stream-ordered pools is not covered by `cuCtxEnablePeerAccess`:
///   [`DeviceSet::pool`] makes a pool and grants every peer that can access its GPU read-write
///   access (`cuMemPoolSetAccess`).
/// - A set of one GPU is that [`Device`]: [`DeviceSet::device`]`(0)` is used exactly as before.
pub struct DeviceSet {
    devices: Vec<Device>,
    /// `can[i][j]`: device i can access device j's memory.
    can: Vec<Vec<bool>>,
}

impl std::fmt::Debug for DeviceSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSet")
            .field(
                "ordinals",
                &self.devices.iter().map(Device::ordinal).collect::<Vec<_>>(),
            )
            .field("peer_matrix", &self.can)
            .finish()
    }
}

impl DeviceSet {
    /// Opens the GPUs `ordinals` (distinct) through their primary contexts and enables peer access
    /// where `cuDeviceCanAccessPeer` allows it. Errors: those of [`check_ordinals`] and
    /// [`Device::open`] ([`Error::NoDriver`], [`Error::ComputeCapability`], ...), [`Error::Cuda`]
    /// (`cuDeviceCanAccessPeer`, `cuCtxEnablePeerAccess`).
    pub fn open(ordinals: &[usize]) -> Result<Self> {
        check_ordinals(ordinals, device_count()?)?;
        let devices = ordinals
            .iter()
            .map(|&o| Device::open(o))
            .collect::<Result<Vec<_>>>()?;
        Self::from_devices(devices)
    }

    /// Opens GPUs `0..n`. Errors: [`Error::NotEnoughDevices`] when the driver reports fewer, and
    /// those of [`DeviceSet::open`].
    pub fn open_first(n: usize) -> Result<Self> {
        let available = device_count()?;
        if n > available {
            return Err(Error::NotEnoughDevices {
                what: "DeviceSet::open_first",
                needed: n,
                available,
            });
        }
        Self::open(&(0..n).collect::<Vec<_>>())
    }

    /// A set of devices already open (each on its primary or own context; distinct GPUs).
    /// Builds the peer matrix and enables peer access.
    pub fn from_devices(devices: Vec<Device>) -> Result<Self> {
        let ordinals: Vec<usize> = devices.iter().map(Device::ordinal).collect();
        check_ordinals(&ordinals, usize::MAX)?;
        let n = devices.len();
        let mut can = vec![vec![false; n]; n];
        for i in 0..n {
            for j in 0..n {
                can[i][j] = i == j
                    || peer::device_can_access_peer(
                        devices[i].context().cu_device(),
                        devices[j].context().cu_device(),
                    )?;
            }
        }
        for i in 0..n {
            for j in 0..n {
                if i != j && can[i][j] {
                    devices[i].bind()?;
                    peer::ctx_enable_peer_access(devices[j].raw_context())?;
                }
            }
        }
        Ok(Self { devices, can })
    }

    /// Number of GPUs.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Always false (a set has at least one GPU).
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The GPUs, in the order given at open.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// GPU `i` of the set (not its ordinal: position in the set); the same as
    /// [`DeviceSet::get`]. Errors: [`Error::BadShape`] if `i >= len()`.
    pub fn device(&self, i: usize) -> Result<&Device> {
        self.get(i)
    }

    /// GPU `i` of the set. Errors: [`Error::BadShape`] if `i >= len()`.
    pub fn get(&self, i: usize) -> Result<&Device> {
        self.devices.get(i).ok_or_else(|| Error::BadShape {
            what: "DeviceSet GPU index",
            detail: format!(
                "{i}; allowed: 0 to {} (the set has {} GPUs)",
                self.len().saturating_sub(1),
                self.len()
            ),
        })
    }

    /// `m[i][j]`: GPU i of the set can access GPU j's memory (`cuDeviceCanAccessPeer`; the
    /// diagonal is true). Peer access is enabled for every true entry.
    pub fn peer_matrix(&self) -> &[Vec<bool>] {
        &self.can
    }

    /// Whether GPU `from` of the set can access GPU `to`'s memory.
    pub fn can_access(&self, from: usize, to: usize) -> bool {
        self.can
            .get(from)
            .and_then(|r| r.get(to))
            .copied()
            .unwrap_or(false)
    }

    /// Position in the set of the device whose context is `ctx`.
    pub(crate) fn index_of_context(
        &self,
        ctx: cudarc::driver::sys::CUcontext,
        what: &'static str,
    ) -> Result<usize> {
        self.devices
            .iter()
            .position(|d| d.raw_context() == ctx)
            .ok_or(Error::WrongContext { what })
    }

    /// Position in the set of the device `stream` belongs to. Errors: [`Error::WrongContext`].
    pub fn index_of_stream(&self, stream: &Stream) -> Result<usize> {
        self.index_of_context(
            stream.context_raw(),
            "DeviceSet: stream of no GPU of the set",
        )
    }

    /// A new pool on GPU `i` ([`MemPool::new`] with `release_threshold` bytes) whose memory every
    /// peer that can access GPU `i` may read and write (`cuMemPoolSetAccess`), so kernels and
    /// copies of those peers can use its buffers directly.
    /// Errors: [`Error::BadShape`] if `i >= len()`, [`Error::MemoryPoolsUnsupported`],
    /// [`Error::Cuda`].
    pub fn pool(&self, i: usize, release_threshold: u64) -> Result<MemPool> {
        let pool = MemPool::new(self.get(i)?, release_threshold)?;
        self.grant_pool_access(&pool)?;
        Ok(pool)
    }

    /// Grants every GPU of the set that can access the pool's GPU read-write access to the pool's
    /// memory (`cuMemPoolSetAccess`). Errors: [`Error::WrongContext`] for a pool of no GPU of the
    /// set, [`Error::Cuda`].
    pub fn grant_pool_access(&self, pool: &MemPool) -> Result<()> {
        let owner = self.index_of_context(pool.context_raw(), "DeviceSet::grant_pool_access")?;
        self.devices[owner].bind()?;
        for (j, d) in self.devices.iter().enumerate() {
            if j != owner && self.can[j][owner] {
                peer::mem_pool_set_access_rw(pool.raw_pool(), d.ordinal() as i32)?;
            }
        }
        Ok(())
    }

    /// A non-blocking stream on GPU `i` with the greatest priority its context allows
    /// (`cuCtxGetStreamPriorityRange`, `cuStreamCreateWithPriority`): for communication
    /// (NCCL collectives, peer copies) that should not queue behind compute kernels.
    /// Errors: [`Error::BadShape`] if `i >= len()`, [`Error::Cuda`].
    pub fn high_priority_stream(&self, i: usize) -> Result<Stream> {
        let dev = self.get(i)?;
        dev.bind()?;
        let (_least, greatest) = peer::ctx_stream_priority_range()?;
        let s = dev
            .context()
            .new_stream_with_priority(greatest)
            .call("cuStreamCreateWithPriority")?;
        Ok(Stream::new(s))
    }

    /// Copies `src` (a buffer of one GPU of the set) into `dst` (a buffer of another, or the same)
    /// on `on`, any stream of a GPU of the set, with `cuMemcpyPeerAsync` (the copy engines; no
    /// SM is used). Returns at once.
    ///
    /// Ordering (why it is safe): `on` first waits for an event recorded now on `src`'s and
    /// `dst`'s streams (their earlier work, writes to `src` included, comes first); after the
    /// copy an event on `on` is waited for by both buffers' streams, so their later work (and
    /// their stream-ordered frees) come after it. Pass `dst.stream()` (or `src.stream()`) as `on`
    /// for no extra stream.
    ///
    /// Errors, before anything is queued: [`Error::LengthMismatch`], [`Error::WrongContext`] (a
    /// buffer or stream of no GPU of the set), [`Error::PeerAccessUnavailable`] when the GPUs of
    /// `src` and `dst` cannot access each other's memory in both directions (the copy would
    /// silently go through host memory); then [`Error::Cuda`].
    pub fn copy_peer<T: Pod>(
        &self,
        on: &Stream,
        src: &DeviceBuffer<T>,
        dst: &mut DeviceBuffer<T>,
    ) -> Result<()> {
        self.check_peer_copy(on, src, dst)?;
        for s in [src.stream(), dst.stream()] {
            if s != on {
                let ev = s.record_marker()?;
                on.wait(&ev)?;
            }
        }
        // SAFETY: both buffers are live allocations of `len` T (lengths checked), ordered on `on`
        // after their streams' earlier work and before their later work (events above/below).
        unsafe { self.copy_peer_raw(on, src.device_ptr(), dst.device_ptr(), src, dst) }?;
        let ordered = on.record_marker().and_then(|after| {
            for s in [src.stream(), dst.stream()] {
                if s != on {
                    s.wait(&after)?;
                }
            }
            Ok(())
        });
        if ordered.is_err() {
            // The buffers' streams may not wait for the copy: finish it before either buffer can
            // be freed on its own stream (copy engines need no host thread, so this ends).
            let _ = on.synchronize();
        }
        ordered
    }

    /// Checks a peer copy: lengths, GPUs of the set, peer access. Returns (src GPU, dst GPU).
    fn check_peer_copy<T: Pod>(
        &self,
        on: &Stream,
        src: &DeviceBuffer<T>,
        dst: &DeviceBuffer<T>,
    ) -> Result<(usize, usize)> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch {
                what: "DeviceSet::copy_peer",
                detail: format!(
                    "source has {} elements, destination {}",
                    src.len(),
                    dst.len()
                ),
            });
        }
        self.index_of_context(on.context_raw(), "DeviceSet::copy_peer stream")?;
        let i = self.index_of_context(
            src.stream().context_raw(),
            "DeviceSet::copy_peer source buffer",
        )?;
        let j = self.index_of_context(
            dst.stream().context_raw(),
            "DeviceSet::copy_peer destination buffer",
        )?;
        for (from, to) in [(i, j), (j, i)] {
            if !self.can_access(from, to) {
                return Err(Error::PeerAccessUnavailable {
                    what: "DeviceSet::copy_peer",
                    from: self.devices[from].ordinal(),
                    to: self.devices[to].ordinal(),
                });
            }
        }
        Ok((i, j))
    }

    /// `cuMemcpyPeerAsync` of `src.len()` T from `src_ptr` to `dst_ptr` on `on`.
    ///
    /// # Safety
    /// As [`peer::memcpy_peer_async`]; the buffers give the contexts and the length.
    unsafe fn copy_peer_raw<T: Pod>(
        &self,
        on: &Stream,
        src_ptr: u64,
        dst_ptr: u64,
        src: &DeviceBuffer<T>,
        dst: &DeviceBuffer<T>,
    ) -> Result<()> {
        bind_context(on.ctx(), "cuMemcpyPeerAsync")?;
        peer::memcpy_peer_async(
            dst_ptr,
            dst.stream().context_raw(),
            src_ptr,
            src.stream().context_raw(),
            src.len() * size_of::<T>(),
            on.raw(),
        )
    }

    /// Waits for all work on every GPU of the set (`cuCtxSynchronize` each; every GPU is waited
    /// for before the first error is returned).
    ///
    /// This waits for *every* stream of the contexts, the caller's and other threads' included:
    /// one blocked on a fence ticket or an on-stream wait that is never released makes it wait
    /// forever. Nothing in `multi` calls it (issue 24): its functions wait for their own streams
    /// only ([`nccl::Communicator::synchronize`] for a communicator's, bounded).
    pub fn synchronize(&self) -> Result<()> {
        let mut first = Ok(());
        for d in &self.devices {
            let r = d.synchronize();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// Test helper: in `src`, within the item starting at `item`, the field `first` is declared
/// before every field of `later` (Rust drops fields in declaration order, so graphs declared
/// first are destroyed before the buffers their nodes point at).
#[cfg(test)]
pub(crate) fn assert_declared_before(src: &str, item: &str, first: &str, later: &[&str]) {
    let body = &src[src.find(item).unwrap_or_else(|| panic!("{item} not found"))..];
    let at = body
        .find(first)
        .unwrap_or_else(|| panic!("{first} not in {item}"));
    for field in later {
        let f = body
            .find(field)
            .unwrap_or_else(|| panic!("{field} not in {item}"));
        assert!(at < f, "{item}: {first} must come before {field}");
    }
}

#[cfg(test)]
mod tests {
    use super::first_bit_difference;

    /// Issue 24, item 1: nothing in `multi` waits for whole contexts (`DeviceSet::synchronize`,
    /// `Device::synchronize`, `cuCtxSynchronize`); functions wait for their own streams only.
    #[test]
    fn issue24_item1_no_whole_context_wait_in_multi() {
        let sources = [
            ("bench.rs", include_str!("bench.rs")),
            ("graphs.rs", include_str!("graphs.rs")),
            ("nccl.rs", include_str!("nccl.rs")),
            ("pipeline.rs", include_str!("pipeline.rs")),
            ("seeds.rs", include_str!("seeds.rs")),
            ("task_graph.rs", include_str!("task_graph.rs")),
        ];
        for (name, src) in sources {
            for bad in [
                "set.synchronize()",
                "dev.synchronize()",
                "d.synchronize()",
                "ctx_synchronize",
                "cuCtxSynchronize()",
            ] {
                assert!(!src.contains(bad), "{name} calls {bad}");
            }
        }
    }

    #[test]
    fn bit_differences_count_signed_zeros_and_nans() {
        assert_eq!(first_bit_difference(&[1.0, 2.0], &[1.0, 2.0]), None);
        assert_eq!(first_bit_difference(&[1.0, 0.0], &[1.0, -0.0]), Some(1));
        assert_eq!(first_bit_difference(&[f32::NAN], &[f32::NAN]), None);
        assert_eq!(first_bit_difference(&[3.0, 1.0], &[3.5, 1.0]), Some(0));
    }
}
