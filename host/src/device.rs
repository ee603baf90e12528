//! `Device`: one GPU, its context, the loaded PTX module with every kernel resolved at open, and
//! what the hardware offers.

use std::collections::BTreeMap;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdevice_attribute as Attr};
use cudarc::driver::{result, CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::error::{CudaCall, Error, Result};
use crate::kernels::KERNEL_SPECS;
use crate::stream::Stream;

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
}

/// A resolved kernel of the module.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub(crate) name: String,
    pub(crate) func: CudaFunction,
}

impl Kernel {
    /// Entry name in the PTX module.
    pub fn name(&self) -> &str {
        &self.name
    }
    pub(crate) fn cu_function(&self) -> sys::CUfunction {
        self.func.cu_function()
    }
}

/// One GPU with warpline's module loaded.
///
/// `open` loads the embedded PTX and resolves *and loads* every kernel entry (`cuFuncLoad`), so no
/// kernel is loaded lazily later: lazy loading needs the device idle and can deadlock behind
/// on-stream waits (see the stream-wait-value fence seed). Kernels whose shared memory is above
/// 48 KiB get `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` set here.
pub struct Device {
    ctx: Arc<CudaContext>,
    ptx: Arc<str>,
    _module: Arc<CudaModule>,
    kernels: BTreeMap<String, Kernel>,
    caps: Capabilities,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("caps", &self.caps)
            .field("kernels", &self.kernels.keys())
            .finish()
    }
}

/// True when the CUDA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen libcuda; no CUDA call is made.
    unsafe { sys::is_culib_present() }
}

/// The `.entry` names of a PTX module, in order.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            l.trim_start()
                .strip_prefix(".visible .entry ")
                .or_else(|| l.trim_start().strip_prefix(".entry "))
        })
        .map(|rest| {
            rest.split(|c: char| c == '(' || c.is_whitespace())
                .next()
                .unwrap_or_default()
                .to_string()
        })
        .collect()
}

impl Device {
    /// Opens GPU `ordinal` with the embedded PTX module ([`crate::PTX`]).
    ///
    /// Errors: [`Error::NoDriver`] without a driver, [`Error::NoDevice`] for a missing ordinal,
    /// [`Error::ComputeCapability`] below 9.0, [`Error::SharedMemory`] if a kernel's contract does
    /// not fit the device, [`Error::Cuda`] for a failing driver call.
    pub fn open(ordinal: usize) -> Result<Self> {
        Self::open_with_ptx(ordinal, crate::PTX)
    }

    /// As [`Device::open`] with another PTX module (for tools that carry their own).
    pub fn open_with_ptx(ordinal: usize, ptx: &str) -> Result<Self> {
        Self::open_on(ordinal, ptx, |o| {
            CudaContext::new(o).call("cuDevicePrimaryCtxRetain")
        })
    }

    /// As [`Device::open_with_ptx`], but on a fresh non-primary context of GPU `ordinal`
    /// (`cuCtxCreate`) that nothing else in the process uses. Its streams get hardware queues of
    /// their own (each context has its own channels), which is what keeps [`crate::Fence`] live
    /// when streams of one context share a queue (`CUDA_DEVICE_MAX_CONNECTIONS=1`). Kernels of
    /// two contexts time-slice rather than run concurrently. Errors: as [`Device::open`].
    pub fn open_in_new_context_with_ptx(ordinal: usize, ptx: &str) -> Result<Self> {
        Self::open_on(ordinal, ptx, |o| {
            CudaContext::new_non_primary(o, 0).call("cuCtxCreate")
        })
    }

    /// The PTX module this device was opened with.
    pub fn ptx(&self) -> &str {
        &self.ptx
    }

    /// The GPU's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The driver handle of this device's context (for identity checks).
    pub(crate) fn context_raw(&self) -> sys::CUcontext {
        self.ctx.cu_ctx()
    }

    fn open_on(
        ordinal: usize,
        ptx: &str,
        make_ctx: impl FnOnce(usize) -> Result<Arc<CudaContext>>,
    ) -> Result<Self> {
        if !driver_present() {
            return Err(Error::NoDriver);
        }
        result::init().call("cuInit")?;
        let available = result::device::get_count().call("cuDeviceGetCount")? as usize;
        if ordinal >= available {
            return Err(Error::NoDevice { ordinal, available });
        }
        let ctx = make_ctx(ordinal)?;
        // warpline orders its own work with streams and events; cudarc's implicit per-buffer event
        // tracking would add synchronisation it cannot see.
        // SAFETY: no cudarc-tracked buffers exist yet in this context.
        unsafe { ctx.disable_event_tracking() };
        let attr = |a: Attr| ctx.attribute(a).call("cuDeviceGetAttribute");
        let caps = Capabilities {
            name: ctx.name().call("cuDeviceGetName")?,
            compute_capability: ctx.compute_capability().call("cuDeviceGetAttribute")?,
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            max_shared_mem_per_block_optin: attr(
                Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )? as usize,
            cluster_launch: attr(Attr::CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)? != 0,
            memory_pools: attr(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0,
            async_engines: attr(Attr::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)? as u32,
            stream_mem_ops_64: attr(Attr::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS)? != 0,
            total_mem: ctx.total_mem().call("cuDeviceTotalMem")?,
        };
        let (major, minor) = caps.compute_capability;
        if major < 9 {
            return Err(Error::ComputeCapability {
                device: caps.name,
                major,
                minor,
            });
        }
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .call("cuModuleLoadData")?;
        let mut kernels = BTreeMap::new();
        for name in ptx_entries(ptx) {
            let func = module.load_function(&name).call("cuModuleGetFunction")?;
            // SAFETY: a valid function handle of a module loaded in the current context.
            unsafe { sys::cuFuncLoad(func.cu_function()) }.call("cuFuncLoad")?;
            kernels.insert(name.clone(), Kernel { name, func });
        }
        let dev = Self {
            ctx,
            ptx: Arc::from(ptx),
            _module: module,
            kernels,
            caps,
        };
        for spec in KERNEL_SPECS {
            let kernel = dev.kernel(spec.name)?;
            if spec.dyn_smem_bytes > dev.caps.max_shared_mem_per_block_optin {
                return Err(Error::SharedMemory {
                    kernel: spec.name,
                    requested: spec.dyn_smem_bytes,
                    max: dev.caps.max_shared_mem_per_block_optin,
                });
            }
            if spec.dyn_smem_bytes > 48 * 1024 {
                // SAFETY: valid function handle; the value was checked against the opt-in limit.
                unsafe {
                    result::function::set_function_attribute(
                        kernel.cu_function(),
                        sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        spec.dyn_smem_bytes as i32,
                    )
                }
                .call("cuFuncSetAttribute")?;
            }
        }
        Ok(dev)
    }

    /// What the device offers.
    pub fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    /// The cudarc context (for interop, e.g. cuBLAS baselines).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Makes this device's context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")
    }

    /// The kernel `name` of the module; [`Error::MissingKernel`] if it is not there.
    pub fn kernel(&self, name: &str) -> Result<&Kernel> {
        self.kernels.get(name).ok_or_else(|| Error::MissingKernel {
            kernel: name.to_string(),
            entries: self.kernels.keys().cloned().collect::<Vec<_>>().join(", "),
        })
    }

    /// Names of all kernels in the module (all loaded at open).
    pub fn kernel_names(&self) -> impl Iterator<Item = &str> {
        self.kernels.keys().map(String::as_str)
    }

    /// True when every kernel of the module is loaded (`cuFuncIsLoaded`), as `open` guarantees.
    pub fn all_kernels_loaded(&self) -> Result<bool> {
        self.bind()?;
        for k in self.kernels.values() {
            let mut state = sys::CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_UNLOADED;
            // SAFETY: valid function handle and out-pointer.
            unsafe { sys::cuFuncIsLoaded(&mut state, k.cu_function()) }.call("cuFuncIsLoaded")?;
            if state != sys::CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_LOADED {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// A new non-blocking stream (never synchronises with the legacy default stream).
    pub fn new_stream(&self) -> Result<Stream> {
        Ok(Stream::new(self.ctx.new_stream().call("cuStreamCreate")?))
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().call("cuCtxSynchronize")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
