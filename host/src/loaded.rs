//! A PTX module loaded into a context: [`Module`] (re-exported as `warpline::module::Module`),
//! its [`Kernel`]s and [`Capabilities`] (re-exported from `warpline::device`), and the
//! keep-alive that unloads the module only after every launch of its kernels has completed.
//!
//! It sits below `device` (a `Device` owns the module it was opened with and loads modules) and
//! above `stream` (the keep-alive notes the streams its kernels were launched on), so that
//! `device` imports nothing of `module`, which adds typed kernel handles on top (issue 22,
//! item 11).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::context::{bind_context, ContextState};
use crate::driver::core as drv;
use crate::error::{CudaCall, Error, Result};
use crate::ptx::{ptx_signatures, PtxEntry};
use crate::stream::{Stream, StreamTrail};

/// What the device offers, read at open.
#[derive(Clone, Debug)]
pub struct Capabilities {
    /// Device name as the driver reports it.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Largest dynamic shared memory a CTA may opt in to, bytes.
    pub max_shared_mem_per_block_optin: usize,
    /// Thread-block cluster launches (`CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH`).
    pub cluster_launch: bool,
    /// Stream-ordered memory pools (`cuMemAllocAsync`).
    pub memory_pools: bool,
    /// Copy engines that can run concurrently with kernels.
    pub async_engines: u32,
    /// 64-bit stream memory operations (`cuStreamWaitValue64`...).
    pub stream_mem_ops_64: bool,
    /// Device memory, bytes.
    pub total_mem: usize,
    /// Largest grid per dimension, CTAs (`CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X/Y/Z`).
    pub max_grid_dim: [u32; 3],
    /// Largest CTA per dimension, threads (`CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X/Y/Z`).
    pub max_block_dim: [u32; 3],
    /// Largest CTA, threads (`CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK`).
    pub max_threads_per_block: u32,
}

/// A resolved (and loaded) kernel of a module.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub(crate) name: String,
    /// Declared before `keep`: dropped first, so that the module's last reference is the
    /// keep-alive's, whose drop unloads the module only after the launches completed.
    pub(crate) func: CudaFunction,
    /// Keeps the module loaded until every launch of its kernels has completed (issue 19,
    /// item 4).
    pub(crate) keep: Arc<ModuleKeep>,
    pub(crate) ctx: Arc<CudaContext>,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` as last set (shared by clones).
    pub(crate) max_dyn_smem: Arc<AtomicUsize>,
    /// Serialises automatic raises of the attribute (shared by clones), so they only grow.
    pub(crate) raise: Arc<Mutex<()>>,
    /// `CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`: static shared memory of the kernel.
    pub(crate) static_smem: usize,
    /// The device's opt-in limit per CTA.
    pub(crate) optin: usize,
}

impl Kernel {
    /// Entry name in the PTX module.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The driver handle (`CUfunction`), for launching through the driver API yourself. The
    /// handle stays valid while this `Kernel` (or a clone, or its [`Device`](crate::Device)/[`Module`]) lives.
    /// Launches made through warpline keep the module loaded until they have completed; launches
    /// you make yourself through this handle are not tracked: keep a clone of the `Kernel`
    /// until they have completed.
    pub fn cu_function(&self) -> sys::CUfunction {
        self.func.cu_function()
    }

    /// Dynamic shared memory a launch of this kernel may use, bytes
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`; 48 KiB unless raised).
    pub fn max_dynamic_shared_memory(&self) -> usize {
        self.max_dyn_smem.load(Ordering::Relaxed)
    }

    /// Static shared memory of the kernel, bytes (`CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES`).
    pub fn static_shared_memory(&self) -> usize {
        self.static_smem
    }

    /// Allows launches of this kernel with up to `bytes` of dynamic shared memory per CTA
    /// (`cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)`): needed above
    /// 48 KiB.
    ///
    /// Errors: [`Error::TooLarge`] unless `bytes` plus the kernel's static shared memory is at
    /// most the device's opt-in limit (`Capabilities::max_shared_mem_per_block_optin`);
    /// [`Error::Cuda`], [`Error::ContextPoisoned`].
    pub fn set_max_dynamic_shared_memory(&self, bytes: usize) -> Result<()> {
        let max = self.optin.saturating_sub(self.static_smem);
        if bytes > max {
            return Err(Error::TooLarge {
                what: "dynamic shared memory per CTA (bytes; the opt-in limit minus the kernel's static shared memory)",
                value: bytes as u64,
                max: max as u64,
            });
        }
        bind_context(&self.ctx, "cuFuncSetAttribute")?;
        drv::func_set_attribute(
            self.cu_function(),
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        )?;
        self.max_dyn_smem.store(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Raises the dynamic shared memory limit to at least `bytes` (never lowers it; concurrent
    /// raises are serialised). Errors as [`Kernel::set_max_dynamic_shared_memory`].
    pub(crate) fn raise_max_dynamic_shared_memory(&self, bytes: usize) -> Result<()> {
        let _one = self.raise.lock().unwrap_or_else(|e| e.into_inner());
        if bytes <= self.max_dynamic_shared_memory() {
            return Ok(());
        }
        self.set_max_dynamic_shared_memory(bytes)
    }

    /// The driver handle of the kernel's context (`CUcontext`).
    pub fn context_raw(&self) -> sys::CUcontext {
        self.ctx.cu_ctx()
    }
}

// ---------------------------------------------------------------------------------------------
// Modules
// ---------------------------------------------------------------------------------------------

/// A loaded module's state, shared by [`Module`] clones and [`TypedKernel`]s.
pub(crate) struct ModuleInner {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) state: Arc<ContextState>,
    pub(crate) caps: Capabilities,
    pub(crate) kernels: BTreeMap<String, Kernel>,
    pub(crate) entries: BTreeMap<String, PtxEntry>,
    /// Keeps the `CUmodule` loaded until the last handle is gone and every launch completed
    /// (declared last: dropped after the kernels).
    _keep: Arc<ModuleKeep>,
}

/// Keeps a loaded module (`CUmodule`) alive until every launch of its kernels has completed
/// (issue 19, item 4). Every [`Kernel`] of the module holds it; when the last one (and the
/// [`Module`]) is gone, its `Drop` records an event on each stream the module's kernels were
/// launched on ([`StreamTrail`]) and hands the module to the reaper
/// ([`crate::reaper::defer_after`]), which unloads it (`cuModuleUnload`) once those events
/// completed, with the reaper's gate closed (the unload may synchronise with the device). The
/// dropping thread never blocks.
pub(crate) struct ModuleKeep {
    module: Option<Arc<CudaModule>>,
    launched: Mutex<StreamTrail>,
}

impl ModuleKeep {
    fn new(module: Arc<CudaModule>) -> Self {
        Self {
            module: Some(module),
            launched: Mutex::new(StreamTrail::default()),
        }
    }

    /// Notes a launch of one of the module's kernels on `stream` (after it was queued).
    pub(crate) fn launched_on(&self, stream: &Stream) {
        self.launched
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(stream);
    }
}

impl fmt::Debug for ModuleKeep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ModuleKeep")
    }
}

impl Drop for ModuleKeep {
    fn drop(&mut self) {
        let Some(module) = self.module.take() else {
            return;
        };
        let launched = std::mem::take(self.launched.get_mut().unwrap_or_else(|e| e.into_inner()));
        launched.then_on_reaper(true, move || {
            // `cuModuleUnload`, under the driver's resource lock (see `crate::driver::resource_lock`).
            let _lock = crate::driver::resource_lock();
            drop(module)
        });
    }
}

impl ModuleInner {
    /// Loads `ptx` into `ctx` and every entry eagerly. The caller checked the PTX text and that
    /// no on-stream wait is pending.
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        state: &Arc<ContextState>,
        caps: &Capabilities,
        ptx: &str,
    ) -> Result<Self> {
        crate::ptx::check_ptx_text(ptx)?;
        // No on-stream wait may be enqueued while the load runs (it may need the device idle).
        let _gate = crate::reaper::close_for_load().ok_or(Error::WaitPending {
            what: "module load",
        })?;
        bind_context(ctx, "cuModuleLoadData")?;
        let module = {
            let _lock = crate::driver::resource_lock();
            ctx.load_module(Ptx::from_src(ptx))
                .call("cuModuleLoadData")?
        };
        // The keep-alive holds the only module handle besides the kernels' functions (which
        // drop before it): whatever drops it last, the unload itself runs on the reaper thread
        // (`ModuleKeep`'s drop), also when a later entry fails to load here. Under
        // compute-sanitizer, an unload on a user thread while the reaper was inside
        // `cuMemFreeHost` crashed in the driver (H100, session 8, core stacks).
        let keep = Arc::new(ModuleKeep::new(module));
        let module = keep.module.as_ref().ok_or(Error::Empty {
            what: "module keep-alive",
        })?;
        let mut kernels = BTreeMap::new();
        let mut entries = BTreeMap::new();
        for entry in ptx_signatures(ptx) {
            let func = {
                let _lock = crate::driver::resource_lock();
                module
                    .load_function(&entry.name)
                    .call("cuModuleGetFunction")?
            };
            drv::func_load(func.cu_function())?;
            let get = |a| drv::func_get_attribute(func.cu_function(), a);
            let max_dyn =
                get(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?;
            let static_smem = get(sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?;
            let kernel = Kernel {
                name: entry.name.clone(),
                func,
                keep: keep.clone(),
                ctx: ctx.clone(),
                max_dyn_smem: Arc::new(AtomicUsize::new(max_dyn.max(0) as usize)),
                raise: Arc::new(Mutex::new(())),
                static_smem: static_smem.max(0) as usize,
                optin: caps.max_shared_mem_per_block_optin,
            };
            kernels.insert(entry.name.clone(), kernel);
            entries.insert(entry.name.clone(), entry);
        }
        Ok(Self {
            ctx: ctx.clone(),
            state: state.clone(),
            caps: caps.clone(),
            kernels,
            entries,
            _keep: keep,
        })
    }

    /// Notes a launch of this module's kernels on `stream` that did not go through
    /// [`crate::launch::launch_raw`] (a chain's steps, a replay of a graph of its kernels), so the
    /// module stays loaded until it completed (issue 19, item 4).
    pub(crate) fn launched_on(&self, stream: &Stream) {
        self._keep.launched_on(stream);
    }

    pub(crate) fn kernel(&self, name: &str) -> Result<&Kernel> {
        self.kernels.get(name).ok_or_else(|| Error::MissingKernel {
            kernel: name.to_string(),
            entries: self.kernels.keys().cloned().collect::<Vec<_>>().join(", "),
        })
    }

    /// True when every kernel is loaded (`cuFuncIsLoaded`); the context must be current.
    pub(crate) fn all_loaded(&self) -> Result<bool> {
        for k in self.kernels.values() {
            if !drv::func_is_loaded(k.cu_function())? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// A PTX module loaded into a device's context ([`crate::Device::load_module`]), every entry
/// loaded eagerly. Clones share the module; the `CUmodule` is unloaded (`cuModuleUnload`) once
/// the last clone, the last [`TypedKernel`](crate::module::TypedKernel) and the last [`Kernel`] clone made from it are
/// dropped *and* every launch of its kernels queued through warpline has completed: the unload
/// is handed to warpline's reaper thread, so dropping never blocks and never races a queued
/// launch. Kernel nodes of a captured graph are not launches: whoever keeps the graph keeps the
/// module (a [`Kernel`] clone).
#[derive(Clone)]
pub struct Module {
    pub(crate) inner: Arc<ModuleInner>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("entries", &self.inner.kernels.keys())
            .finish()
    }
}

impl Module {
    /// The entry names of the module, sorted.
    pub fn entry_names(&self) -> impl Iterator<Item = &str> {
        self.inner.kernels.keys().map(String::as_str)
    }
}
