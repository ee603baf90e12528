//! `Device`: one GPU, its context, the loaded PTX module with every kernel resolved at open, and
//! what the hardware offers. The per-context record that turns sticky errors into
//! [`Error::ContextPoisoned`] (first error, the launches that preceded it) is `context.rs`'s,
//! re-exported here for the layers above.

use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use cudarc::driver::CudaContext;

use crate::contract_check::KERNEL_SPECS;
use crate::driver::core as drv;
use crate::error::{CudaCall, Error, Result};
use crate::loaded::{Module, ModuleInner};
use crate::stream::{Stream, StreamStock};

// `Capabilities` and `Kernel` live with the loaded module (`loaded.rs`, below this layer: a
// `Kernel` keeps its module loaded); their public path is this module's.
pub use crate::loaded::{Capabilities, Kernel};
pub use crate::ptx::check_ptx_text;

// The per-context record and the context binding live in `context.rs` (below `stream`, which
// uses them); re-exported here, where the layers above `device` find them.
pub(crate) use crate::context::{
    bind_context, bind_context_unchecked, defer_error, in_host_callback, refuse_in_host_callback,
    state_for, ContextState, HostCallbackScope, LaunchRecord,
};

/// The modules loaded into one context through warpline (for [`Device::all_kernels_loaded`]),
/// kept in the context's record ([`ContextState::ext`]); entries of dropped modules are pruned.
#[derive(Default)]
struct LoadedModules(Mutex<Vec<Weak<ModuleInner>>>);

impl LoadedModules {
    /// Remembers a module loaded into this context.
    fn register(&self, m: &Arc<ModuleInner>) {
        let mut all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(m));
    }

    /// The live modules of this context.
    fn live(&self) -> Vec<Arc<ModuleInner>> {
        let all = self.0.lock().unwrap_or_else(|e| e.into_inner());
        all.iter().filter_map(Weak::upgrade).collect()
    }
}

/// One GPU with warpline's module loaded.
///
/// `open` loads the embedded PTX and resolves *and loads* every kernel entry (`cuFuncLoad`), so no
/// kernel is loaded lazily later: lazy loading needs the device idle and can deadlock behind
/// on-stream waits (see the stream-wait-value fence seed). warpline's kernels whose shared memory
/// is above 48 KiB get `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` set here.
///
/// More modules (your own PTX) are loaded with [`Device::load_module`], the same eager way.
///
/// After a sticky error (illegal address, launch failure, ...) every call on the device returns
/// [`Error::ContextPoisoned`], naming the first error and the launches that preceded it.
pub struct Device {
    ctx: Arc<CudaContext>,
    ptx: Arc<str>,
    state: Arc<ContextState>,
    /// The module the device was opened with (warpline's embedded one for `open`).
    module: Module,
    caps: Capabilities,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("caps", &self.caps)
            .field("kernels", &self.module.inner.kernels.keys())
            .field("primary_context", &self.ctx.is_primary())
            .finish()
    }
}

/// True when the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda; no CUDA call is made.
    unsafe { sys::is_culib_present() }
}

/// The `.entry` names of a PTX module, in order (see [`crate::module::ptx_signatures`]).
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    crate::ptx::ptx_signatures(ptx)
        .into_iter()
        .map(|e| e.name)
        .collect()
}

impl Device {
    /// Opens GPU `ordinal` on its primary context with the embedded PTX module ([`crate::PTX`]).
    ///
    /// Errors: [`Error::ContractMismatch`] if the module was built from another launch contract
    /// (`gpu/src/contract.rs`) than this host (checked on the PTX text, before the driver);
    /// [`Error::NoDriver`] without a driver, [`Error::NoDevice`] for a missing ordinal,
    /// [`Error::ComputeCapability`] below 9.0, [`Error::SharedMemory`] if a kernel's contract does
    /// not fit the device, [`Error::Cuda`] for a failing driver call.
    pub fn open(ordinal: usize) -> Result<Self> {
        Self::open_impl(ordinal, crate::PTX, false)
    }

    /// As [`Device::open`] with another PTX module (a warpline-compatible build, for tools that
    /// carry their own). Every entry is loaded eagerly. warpline's kernels that the module has get
    /// their shared-memory attribute as in `open`; kernels it lacks are not required here (their
    /// launchers return [`Error::MissingKernel`]). Only the embedded module ([`crate::PTX`]) must
    /// hold every kernel of [`KERNEL_SPECS`]. For arbitrary PTX next to warpline's kernels, use
    /// [`Device::open`] and [`Device::load_module`].
    /// Errors also: [`Error::PtxNul`] for PTX text with a NUL byte (checked first).
    ///
    /// # Safety
    /// warpline's safe launchers ([`crate::kernels`], the pipelines, fences, signals) launch the
    /// module's entries that carry the names of warpline's kernels ([`KERNEL_SPECS`]) with the
    /// arguments, grids and shared memory of warpline's own kernels, and trust what they do. Only
    /// the launch-contract hash embedded in the PTX is checked, which any PTX can carry; the
    /// entries' parameter lists and code are not. The caller guarantees that every such entry of
    /// `ptx` is a build of warpline's kernel of that name (gpu/) from the same launch contract
    /// (`gpu/src/contract.rs`) as this host: the same parameter list, shared-memory layout and
    /// memory accesses. The embedded module needs no promise: [`Device::open`]. For PTX of your
    /// own, use [`Device::open`] and the safe [`Device::load_module`] (its kernels are launched
    /// only through the `unsafe` [`crate::module::TypedKernel::launch`] and
    /// [`crate::launch::launch_raw`]).
    ///
    /// ```compile_fail,E0133
    /// // issue 19, item 3: trusting foreign PTX as warpline's kernels needs `unsafe`.
    /// let _ = warpline::Device::open_with_ptx(0, warpline::PTX);
    /// ```
    pub unsafe fn open_with_ptx(ordinal: usize, ptx: &str) -> Result<Self> {
        Self::open_impl(ordinal, ptx, false)
    }

    /// As [`Device::open`], but on a fresh, non-primary context of its own
    /// (`cuCtxCreate`; cudarc `CudaContext::new_non_primary`): its streams never share hardware
    /// queues or the context's error state with work of the primary context. Every kernel is
    /// loaded eagerly as in `open`. The context is destroyed when the device and everything made
    /// from it (streams, buffers, pools) are dropped. Streams and buffers of one context cannot
    /// be used with another ([`Error::WrongContext`]).
    pub fn open_in_new_context(ordinal: usize) -> Result<Self> {
        Self::open_impl(ordinal, crate::PTX, true)
    }

    /// [`Device::open_in_new_context`] with another PTX module.
    ///
    /// # Safety
    /// As [`Device::open_with_ptx`]: every entry of `ptx` named like a warpline kernel is a build
    /// of that kernel from this host's launch contract.
    pub unsafe fn open_in_new_context_with_ptx(ordinal: usize, ptx: &str) -> Result<Self> {
        Self::open_impl(ordinal, ptx, true)
    }

    /// A new device on GPU `ordinal` with the same module as `self` (whose PTX was vouched for
    /// when `self` was opened: the embedded one, or one under the contract of
    /// [`Device::open_with_ptx`]), on its own new context with `new_context`.
    pub(crate) fn reopen(&self, ordinal: usize, new_context: bool) -> Result<Self> {
        Self::open_impl(ordinal, &self.ptx, new_context)
    }

    fn open_impl(ordinal: usize, ptx: &str, new_context: bool) -> Result<Self> {
        refuse_in_host_callback("Device::open")?;
        check_ptx_text(ptx)?;
        // A module with warpline's kernels must be built from the contract this host was built
        // with (tile sizes, roles, shared-memory layout): a stale or foreign build is refused
        // before anything is loaded.
        let entries = ptx_entries(ptx);
        if KERNEL_SPECS
            .iter()
            .any(|s| entries.iter().any(|e| e == s.name))
        {
            crate::contract_check::check_contract(ptx, warpline_gpu::CONTRACT_HASH)?;
        }
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        drv::init()?;
        let available = drv::device_get_count()? as usize;
        if ordinal >= available {
            return Err(Error::NoDevice { ordinal, available });
        }
        let ctx = if new_context {
            CudaContext::new_non_primary(ordinal, 0).call("cuCtxCreate")?
        } else {
            CudaContext::new(ordinal).call("cuDevicePrimaryCtxRetain")?
        };
        // warpline orders its own work with streams and events; cudarc's implicit per-buffer event
        // tracking would add synchronisation it cannot see. No cudarc-tracked buffer is ever
        // handed out: the cudarc context is reachable only through `unsafe` accessors.
        // SAFETY: no cudarc-tracked buffers exist yet in this context.
        unsafe { ctx.disable_event_tracking() };
        let state = state_for(ctx.cu_ctx());
        bind_context(&ctx, "cuCtxSetCurrent")?;
        let cu_dev = ctx.cu_device();
        let attr = |a: Attr| drv::device_get_attribute(cu_dev, a);
        let caps = Capabilities {
            name: ctx.name().call("cuDeviceGetName")?,
            compute_capability: (
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
                attr(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
            ),
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            max_shared_mem_per_block_optin: attr(
                Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )? as usize,
            cluster_launch: attr(Attr::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)? != 0,
            memory_pools: attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0,
            async_engines: attr(Attr::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)? as u32,
            stream_mem_ops_64: attr(Attr::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)? != 0,
            total_mem: ctx.total_mem().call("cuDeviceTotalMem")?,
            max_grid_dim: [
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X)? as u32,
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y)? as u32,
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)? as u32,
            ],
            max_block_dim: [
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X)? as u32,
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y)? as u32,
                attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)? as u32,
            ],
            max_threads_per_block: attr(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)? as u32,
        };
        let (major, minor) = caps.compute_capability;
        if major < 9 {
            return Err(Error::ComputeCapability {
                device: caps.name,
                major,
                minor,
            });
        }
        let inner = Arc::new(ModuleInner::load(&ctx, &state, &caps, ptx)?);
        state.ext::<LoadedModules>().register(&inner);
        let dev = Self {
            ctx,
            ptx: Arc::from(ptx),
            state,
            module: Module { inner },
            caps,
        };
        // warpline's own streams (release, private captures), made now, before any wait.
        dev.state.ext::<StreamStock>().fill(|| dev.new_stream())?;
        let embedded = std::ptr::eq(ptx, crate::PTX) || ptx == crate::PTX;
        for spec in KERNEL_SPECS {
            let kernel = match dev.kernel(spec.name) {
                Ok(k) => k,
                Err(e) if embedded => return Err(e),
                Err(_) => continue,
            };
            if spec.dyn_smem_bytes > dev.caps.max_shared_mem_per_block_optin {
                return Err(Error::SharedMemory {
                    kernel: spec.name,
                    requested: spec.dyn_smem_bytes,
                    max: dev.caps.max_shared_mem_per_block_optin,
                });
            }
            if spec.dyn_smem_bytes > kernel.max_dynamic_shared_memory() {
                kernel.set_max_dynamic_shared_memory(spec.dyn_smem_bytes)?;
            }
        }
        Ok(dev)
    }

    /// What the device offers.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The cudarc context, for warpline's own modules.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The cudarc context, for interop with cudarc-based libraries (cuBLAS handles, say).
    ///
    /// # Safety
    /// warpline disables cudarc's event tracking on this context, and cudarc's safe `CudaSlice`
    /// API relies on it: with tracking off, safe cudarc code (`CudaStream::alloc_zeros`,
    /// `memcpy_*`, launches through `LaunchArgs`, slices used on two streams) gets no ordering
    /// between streams and can race. The caller must not create `CudaSlice`s (or anything else
    /// that relies on event tracking) in this context, must not re-enable event tracking while
    /// warpline objects live, and must order every use of warpline's memory on the stream the
    /// memory is bound to. Raw handles for driver-API interop: [`Device::raw_context`].
    ///
    /// ```compile_fail,E0133
    /// // finding 10: handing out the tracking-disabled cudarc context needs `unsafe`.
    /// fn f(dev: &warpline::Device) { let _ = dev.cudarc_context(); }
    /// ```
    pub unsafe fn cudarc_context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The PTX module this device was opened with (a [`crate::Fence`] opens the same module in
    /// its private context).
    pub fn ptx(&self) -> &str {
        &self.ptx
    }

    /// Free and total device memory, bytes (`cuMemGetInfo`, in this device's context).
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        bind_context(&self.ctx, "cuCtxSetCurrent")?;
        drv::mem_get_info()
    }

    /// The GPU's ordinal (`cuDeviceGet` index).
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The driver's context handle (`CUcontext`), for driver-API interop. Valid while the device
    /// lives; do not destroy it.
    pub fn raw_context(&self) -> sys::CUcontext {
        self.ctx.cu_ctx()
    }

    /// True when this device runs on a context of its own ([`Device::open_in_new_context`]).
    pub fn is_own_context(&self) -> bool {
        !self.ctx.is_primary()
    }

    /// Makes this device's context current on the calling thread (raw `cuCtxSetCurrent`);
    /// [`Error::ContextPoisoned`] after a sticky error.
    pub(crate) fn bind(&self) -> Result<()> {
        bind_context(&self.ctx, "cuCtxSetCurrent")
    }

    /// This context's error record.
    pub(crate) fn state(&self) -> &Arc<ContextState> {
        &self.state
    }

    /// `Ok` unless a sticky error poisoned the context ([`Error::ContextPoisoned`], naming the
    /// first error and the launches before it). Poisoning cannot be undone: restart the process.
    pub fn check_healthy(&self) -> Result<()> {
        self.state.check("Device::check_healthy")
    }

    /// Errors that could not be returned where they happened (frees and destroys in `Drop`,
    /// errors cudarc deferred), oldest first; the list is emptied.
    pub fn take_deferred_errors(&self) -> Vec<String> {
        crate::context::drain_deferred(&self.ctx, &self.state);
        self.state.take_deferred()
    }

    /// The kernel `name` of the module the device was opened with; [`Error::MissingKernel`] if
    /// it is not there.
    pub fn kernel(&self, name: &str) -> Result<&Kernel> {
        self.module.inner.kernel(name)
    }

    /// Names of all kernels in the module the device was opened with (all loaded at open).
    pub fn kernel_names(&self) -> impl Iterator<Item = &str> {
        self.module.entry_names()
    }

    /// The module the device was opened with (warpline's own for [`Device::open`]), for typed
    /// handles of its kernels ([`Module::kernel`]).
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// Loads the PTX module `ptx` into this device's context (`cuModuleLoadData`) and loads every
    /// `.entry` eagerly (`cuModuleGetFunction` + `cuFuncLoad`), so no kernel of it is loaded
    /// lazily later behind an on-stream wait. Any number of modules may be loaded; each lives
    /// while its [`Module`] or a [`crate::module::TypedKernel`] made from it does. No warpline
    /// kernel is required in `ptx`. Dynamic shared memory above 48 KiB is raised per launch by
    /// [`crate::module::TypedKernel::launch`].
    ///
    /// Load modules before setting up on-stream waits: loading code may need the device idle.
    /// While a registered wait (a [`crate::Fence`] guard, a [`crate::Signal`] wait) of this
    /// process is pending the call is refused with [`Error::WaitPending`] instead of hanging
    /// behind it (a wait that another thread enqueues while the load runs is not seen).
    ///
    /// Errors: [`Error::PtxNul`] (checked first), [`Error::WaitPending`],
    /// [`Error::ContextPoisoned`], [`Error::Cuda`] (`cuModuleLoadData` rejects PTX that does not
    /// assemble for this device, naming `CUDA_ERROR_INVALID_PTX` and the like).
    pub fn load_module(&self, ptx: &str) -> Result<Module> {
        // Module loads may wait for the device (issue 19, item 9).
        refuse_in_host_callback("Device::load_module")?;
        check_ptx_text(ptx)?;
        if crate::reaper::any_wait_pending() {
            return Err(Error::WaitPending {
                what: "Device::load_module",
            });
        }
        let inner = Arc::new(ModuleInner::load(&self.ctx, &self.state, &self.caps, ptx)?);
        self.state.ext::<LoadedModules>().register(&inner);
        Ok(Module { inner })
    }

    /// True when every kernel of every module loaded into this device's context through
    /// warpline (the one it was opened with, and every live [`Device::load_module`] module, also
    /// those loaded through another `Device` of the same context) is loaded (`cuFuncIsLoaded`),
    /// as loading them eagerly guarantees. [`crate::Fence`] and [`crate::Signal`] require it.
    /// Modules loaded outside warpline (cudarc, raw driver calls) are not seen.
    pub fn all_kernels_loaded(&self) -> Result<bool> {
        self.bind()?;
        if !self.module.inner.all_loaded()? {
            return Ok(false);
        }
        for m in self.state.ext::<LoadedModules>().live() {
            if !m.all_loaded()? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// How long [`Device::new_stream`] waits for pending on-stream waits to clear before it
    /// returns [`Error::WaitPending`].
    pub const STREAM_CREATE_WAIT: std::time::Duration = crate::reaper::STREAM_CREATE_WAIT;

    /// A new non-blocking stream (never synchronises with the legacy default stream).
    ///
    /// `cuStreamCreate` can wait for the device inside the driver while holding a lock that
    /// every other driver call needs; behind a pending on-stream wait whose release needs another
    /// host thread (a fence ticket, a signal wait released by `synchronize_timeout`), the process
    /// would hang (found by `warpline fuzz` on the H100; issue 19). So no stream is created while
    /// a registered wait is pending: the call first waits up to [`Self::STREAM_CREATE_WAIT`] for
    /// the waits to clear (other threads can release them meanwhile). Create streams before
    /// setting up waits.
    ///
    /// Errors: [`Error::WaitPending`] when a wait stayed pending (or is being enqueued) for
    /// [`Self::STREAM_CREATE_WAIT`]; [`Error::Cuda`].
    pub fn new_stream(&self) -> Result<Stream> {
        crate::stream::gated_new_stream(&self.ctx, None, "Device::new_stream")
    }

    /// A new non-blocking stream with `priority` (`cuStreamCreateWithPriority`; lower numbers are
    /// higher priorities, see [`Self::stream_priority_range`]; the driver clamps values outside
    /// the range). Gated like [`Self::new_stream`], with the same errors.
    pub fn new_stream_with_priority(&self, priority: i32) -> Result<Stream> {
        crate::stream::gated_new_stream(
            &self.ctx,
            Some(priority),
            "Device::new_stream_with_priority",
        )
    }

    /// Stream priorities of the device as `(least, greatest)` (`cuCtxGetStreamPriorityRange`):
    /// `greatest` is the highest priority and the smaller number (0 and -5 on the H100).
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        self.bind()?;
        cudarc::driver::result::stream::get_priority_range().call("cuCtxGetStreamPriorityRange")
    }

    /// Version of the CUDA driver API the installed driver supports (`cuDriverGetVersion`), as
    /// (major, minor), e.g. (13, 0).
    pub fn driver_version(&self) -> Result<(i32, i32)> {
        let mut v = 0i32;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer; the driver library
        // is loaded (this device was opened through it).
        let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
        r.result().call("cuDriverGetVersion")?;
        Ok((v / 1000, (v % 1000) / 10))
    }

    /// Waits for all work on the device (`cuCtxSynchronize`). Once it has started it really waits
    /// before returning any error, also on a poisoned context.
    ///
    /// `cuCtxSynchronize` blocks inside the driver, where it may hold a lock that every other
    /// driver call of the process needs (as `cuStreamSynchronize` and `cuStreamCreate` were seen
    /// to on the H100); behind a pending on-stream wait whose release needs another thread's
    /// driver call, the whole process would hang. So it runs only while no registered wait (a
    /// fence guard, a `Signal` wait) is pending, with new waits kept out until it returns, as
    /// stream creation does.
    ///
    /// Errors: [`Error::WaitPending`] when a registered wait stays pending for
    /// [`Device::STREAM_CREATE_WAIT`]; [`Error::InHostCallback`] inside a host callback; the
    /// context's sticky error.
    pub fn synchronize(&self) -> Result<()> {
        refuse_in_host_callback("Device::synchronize")?;
        let bound = bind_context_unchecked(&self.ctx);
        let synced = bound.and_then(|()| {
            crate::reaper::without_pending_waits("Device::synchronize", drv::ctx_synchronize)
        });
        synced?;
        self.state.check("cuCtxSynchronize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finding_16_nul_in_ptx_is_a_typed_error() {
        assert!(check_ptx_text(crate::PTX).is_ok());
        let e = check_ptx_text(".version 8.0\n\0.target sm_90").unwrap_err();
        assert!(matches!(e, Error::PtxNul { offset: 13 }), "{e}");
    }

    #[test]
    fn entries_of_embedded_ptx_include_every_kernel_spec() {
        let entries = ptx_entries(crate::PTX);
        for spec in KERNEL_SPECS {
            assert!(
                entries.iter().any(|e| e == spec.name),
                "{} missing from {entries:?}",
                spec.name
            );
        }
    }
}
