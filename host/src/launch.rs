//! Kernel launch configurations and the one launch path, `cuLaunchKernelEx` (CUDA driver API), with
//! optional thread-block cluster dimensions (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`) and
//! Programmatic Dependent Launch (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`).

use std::ffi::c_void;
use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{sys, CudaContext};

use crate::device::{bind_context, Capabilities, ContextState, Device, Kernel, LaunchRecord};
use crate::driver::core as drv;
use crate::error::{Error, Result};
use crate::stream::Stream;

/// Grid, CTA, shared memory and launch attributes of one launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// CTAs per grid dimension.
    pub grid: [u32; 3],
    /// Threads per CTA dimension.
    pub block: [u32; 3],
    /// Dynamic shared memory per CTA, bytes.
    pub shared_mem_bytes: u32,
    /// Cluster dimensions in CTAs (`None`: no clusters). The grid must be a multiple of it.
    pub cluster: Option<[u32; 3]>,
    /// Launch with PDL: the kernel may start before the previous kernel on the stream finished;
    /// it must `griddepcontrol.wait` before reading that kernel's results, and before writing
    /// memory that kernel reads or writes.
    pub pdl: bool,
}

/// Largest portable cluster, CTAs (CUDA programming guide: 8 without
/// `cudaFuncAttributeNonPortableClusterSizeAllowed`, which warpline does not set).
pub const MAX_PORTABLE_CLUSTER: u32 = 8;

/// What a launch may use: the device's limits and the kernel's own shared-memory limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchLimits {
    /// Largest grid per dimension, CTAs.
    pub max_grid_dim: [u32; 3],
    /// Largest CTA per dimension, threads.
    pub max_block_dim: [u32; 3],
    /// Largest CTA, threads.
    pub max_threads_per_block: u32,
    /// The kernel's `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, bytes.
    pub kernel_max_dynamic_smem: usize,
    /// The kernel's static shared memory, bytes.
    pub kernel_static_smem: usize,
    /// The device's opt-in shared memory limit per CTA, bytes.
    pub smem_optin: usize,
    /// Thread-block clusters supported.
    pub cluster_launch: bool,
}

impl LaunchLimits {
    /// The limits of an sm_90 device (H100: 227 KiB opt-in shared memory) for a kernel without
    /// static shared memory whose dynamic limit was raised to the opt-in limit.
    pub const SM90: LaunchLimits = LaunchLimits {
        max_grid_dim: [i32::MAX as u32, 65535, 65535],
        max_block_dim: [1024, 1024, 64],
        max_threads_per_block: 1024,
        kernel_max_dynamic_smem: 232448,
        kernel_static_smem: 0,
        smem_optin: 232448,
        cluster_launch: true,
    };

    /// The limits of `kernel` on `dev`.
    pub fn of(dev: &Device, kernel: &Kernel) -> Self {
        Self::from_capabilities(dev.capabilities(), kernel)
    }

    /// The limits of `kernel` on a device with capabilities `caps`.
    pub fn from_capabilities(caps: &Capabilities, kernel: &Kernel) -> Self {
        Self {
            max_grid_dim: caps.max_grid_dim,
            max_block_dim: caps.max_block_dim,
            max_threads_per_block: caps.max_threads_per_block,
            kernel_max_dynamic_smem: kernel.max_dynamic_shared_memory(),
            kernel_static_smem: kernel.static_shared_memory(),
            smem_optin: caps.max_shared_mem_per_block_optin,
            cluster_launch: caps.cluster_launch,
        }
    }
}

impl LaunchConfig {
    /// A 1-D launch of `grid` CTAs of `block` threads with `shared_mem_bytes` dynamic shared memory.
    pub fn linear(grid: u32, block: u32, shared_mem_bytes: u32) -> Self {
        Self {
            grid: [grid, 1, 1],
            block: [block, 1, 1],
            shared_mem_bytes,
            cluster: None,
            pdl: false,
        }
    }

    /// The same launch with clusters of `size` CTAs along x.
    pub fn with_cluster_x(mut self, size: u32) -> Self {
        self.cluster = Some([size, 1, 1]);
        self
    }

    /// The same launch with the PDL attribute.
    pub fn with_pdl(mut self, pdl: bool) -> Self {
        self.pdl = pdl;
        self
    }

    /// Checks the configuration against the device and the kernel before any launch: see
    /// [`LaunchConfig::check`]; the limits come from the device's attributes and the kernel's own
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` / `SHARED_SIZE_BYTES`.
    ///
    /// Errors: those of [`LaunchConfig::check`], [`Error::MissingKernel`].
    pub fn validate(&self, dev: &Device, kernel: &'static str) -> Result<()> {
        let k = dev.kernel(kernel)?;
        self.check(kernel, &LaunchLimits::of(dev, k))
    }

    /// Checks the configuration against `limits`, without a device:
    /// - every grid and block dimension non-zero; grid at most `max_grid_dim` per dimension
    ///   (2^31 - 1, 65535, 65535 on sm_90), block at most `max_block_dim` (1024, 1024, 64) and
    ///   `max_threads_per_block` (1024) threads in all (computed in u64: no overflow);
    /// - dynamic shared memory at most the kernel's own limit
    ///   (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`, raised with
    ///   [`crate::device::Kernel::set_max_dynamic_shared_memory`]), and static plus dynamic
    ///   shared memory at most the device's opt-in limit;
    /// - clusters: supported by the device, each dimension non-zero and dividing the grid, at most
    ///   [`MAX_PORTABLE_CLUSTER`] (8) CTAs (warpline does not set the non-portable attribute).
    ///
    /// Errors: [`Error::BadShape`], [`Error::TooLarge`], [`Error::SharedMemory`],
    /// [`Error::ClustersUnsupported`].
    pub fn check(&self, kernel: &'static str, limits: &LaunchLimits) -> Result<()> {
        if self.grid.contains(&0) || self.block.contains(&0) {
            return Err(Error::BadShape {
                what: "launch configuration",
                detail: format!(
                    "grid {:?} and block {:?} must be non-zero",
                    self.grid, self.block
                ),
            });
        }
        const GRID: [&str; 3] = ["grid x (CTAs)", "grid y (CTAs)", "grid z (CTAs)"];
        const BLOCK: [&str; 3] = [
            "block x (threads)",
            "block y (threads)",
            "block z (threads)",
        ];
        for i in 0..3 {
            if self.grid[i] > limits.max_grid_dim[i] {
                return Err(Error::TooLarge {
                    what: GRID[i],
                    value: self.grid[i] as u64,
                    max: limits.max_grid_dim[i] as u64,
                });
            }
            if self.block[i] > limits.max_block_dim[i] {
                return Err(Error::TooLarge {
                    what: BLOCK[i],
                    value: self.block[i] as u64,
                    max: limits.max_block_dim[i] as u64,
                });
            }
        }
        let threads: u64 = self.block.iter().map(|&b| b as u64).product();
        if threads > limits.max_threads_per_block as u64 {
            return Err(Error::TooLarge {
                what: "threads per CTA",
                value: threads,
                max: limits.max_threads_per_block as u64,
            });
        }
        let dynamic = self.shared_mem_bytes as usize;
        if dynamic > limits.kernel_max_dynamic_smem {
            return Err(Error::SharedMemory {
                kernel,
                requested: dynamic,
                max: limits.kernel_max_dynamic_smem,
            });
        }
        let total = dynamic + limits.kernel_static_smem;
        if total > limits.smem_optin {
            return Err(Error::SharedMemory {
                kernel,
                requested: total,
                max: limits.smem_optin,
            });
        }
        if let Some(c) = self.cluster {
            if !limits.cluster_launch {
                return Err(Error::ClustersUnsupported);
            }
            if c.contains(&0) || (0..3).any(|i| !self.grid[i].is_multiple_of(c[i])) {
                return Err(Error::BadShape {
                    what: "cluster launch",
                    detail: format!(
                        "grid {:?} must be a non-zero multiple of the cluster {:?}",
                        self.grid, c
                    ),
                });
            }
            let ctas: u64 = c.iter().map(|&d| d as u64).product();
            if ctas > MAX_PORTABLE_CLUSTER as u64 {
                return Err(Error::TooLarge {
                    what: "CTAs per cluster (portable cluster size)",
                    value: ctas,
                    max: MAX_PORTABLE_CLUSTER as u64,
                });
            }
        }
        Ok(())
    }

    /// Grid, block, shared memory, cluster and PDL, for error reports.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "grid {:?} block {:?} dynamic shared memory {} B",
            self.grid, self.block, self.shared_mem_bytes
        );
        if let Some(c) = self.cluster {
            s.push_str(&format!(" cluster {c:?}"));
        }
        if self.pdl {
            s.push_str(" PDL");
        }
        s
    }

    /// The attributes, in the driver's layout.
    pub(crate) fn attributes(&self) -> Vec<sys::CUlaunchAttribute> {
        let mut attrs = Vec::new();
        if let Some([x, y, z]) = self.cluster {
            // SAFETY: the attribute is a plain C struct/union; zero is valid and the fields used
            // are set right after.
            let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
            a.value.clusterDim.x = x;
            a.value.clusterDim.y = y;
            a.value.clusterDim.z = z;
            attrs.push(a);
        }
        if self.pdl {
            // SAFETY: as above.
            let mut a: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            a.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            a.value.programmaticStreamSerializationAllowed = 1;
            attrs.push(a);
        }
        attrs
    }

    /// `cfg` in the driver's layout, pointing into `attrs`.
    pub(crate) fn driver_config(
        &self,
        stream: sys::CUstream,
        attrs: &mut [sys::CUlaunchAttribute],
    ) -> sys::CUlaunchConfig {
        sys::CUlaunchConfig {
            gridDimX: self.grid[0],
            gridDimY: self.grid[1],
            gridDimZ: self.grid[2],
            blockDimX: self.block[0],
            blockDimY: self.block[1],
            blockDimZ: self.block[2],
            sharedMemBytes: self.shared_mem_bytes,
            hStream: stream,
            attrs: attrs.as_mut_ptr(),
            numAttrs: attrs.len() as u32,
        }
    }
}

/// One kernel parameter passed by value: the bytes of a [`Pod`] value of at most 8 bytes (every
/// integer and float scalar, device addresses), owned, so a parameter array built from
/// temporaries cannot dangle. Build with [`ParamValue::new`] or [`params!`](crate::params).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct ParamValue {
    bytes: [u8; 8],
    size: u8,
}

impl ParamValue {
    /// The bytes of `value`. Types above 8 bytes are a compile-time error.
    pub fn new<T: Pod>(value: T) -> Self {
        const {
            assert!(
                size_of::<T>() <= 8,
                "kernel parameters by value are at most 8 bytes"
            )
        };
        let mut bytes = [0u8; 8];
        let src = bytemuck::bytes_of(&value);
        bytes[..src.len()].copy_from_slice(src);
        Self {
            bytes,
            size: src.len() as u8,
        }
    }

    /// Size of the value, bytes.
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// The pointer `cuLaunchKernelEx` reads the value through (valid while `self` is).
    pub(crate) fn as_ptr(&self) -> *mut c_void {
        self.bytes.as_ptr() as *mut c_void
    }
}

/// Launches `kernel` with `cfg` on `stream` (`cuLaunchKernelEx`), after checking that `stream`
/// belongs to `dev`'s context ([`Error::WrongContext`]) and that the context is not poisoned. The
/// launch is remembered (kernel and configuration) for [`Error::ContextPoisoned`] reports.
///
/// `params` holds one value per kernel parameter, in order: build it with
/// [`params!`](crate::params) (`&mut params![ptr, n]`), which copies each value, so
/// `let p = params![n as u64];` owns its values and cannot dangle.
///
/// Errors: [`Error::WrongContext`] (stream or kernel of another context),
/// [`Error::ContextPoisoned`], [`Error::Launch`] (naming the kernel and its configuration) when
/// the driver rejects the launch.
///
/// For kernels of your own PTX prefer [`crate::module::TypedKernel::launch`], which checks the
/// parameter list against the PTX, the streams of the views and the launch limits.
///
/// # Safety
/// `params` matches the kernel's signature: one value per kernel parameter, in order, each of
/// exactly the parameter's size in the PTX (at most 8 bytes) and of its meaning; `cfg` fits the
/// kernel (see [`LaunchConfig::validate`]); and the kernel's memory accesses with these
/// arguments stay inside live allocations that are ordered on `stream`; and, with `cfg.pdl`
/// (PDL), the kernel may start while the previous kernel on `stream` still runs (and, if that
/// kernel lets its dependents launch before its own `griddepcontrol.wait`, while the kernels
/// before it still run): before its `griddepcontrol.wait` it neither reads memory those kernels
/// write (read after write), nor writes memory they read (write after read) or write (write
/// after write). The typed launchers in [`crate::kernels`] establish this; prefer them.
pub unsafe fn launch_raw(
    dev: &Device,
    kernel: &Kernel,
    stream: &Stream,
    cfg: &LaunchConfig,
    params: &[ParamValue],
) -> Result<()> {
    const ON_STACK: usize = 16;
    let mut stack = [std::ptr::null_mut::<c_void>(); ON_STACK];
    let mut heap = Vec::new();
    let ptrs: &mut [*mut c_void] = if params.len() <= ON_STACK {
        &mut stack[..params.len()]
    } else {
        heap.resize(params.len(), std::ptr::null_mut());
        &mut heap
    };
    for (p, v) in ptrs.iter_mut().zip(params) {
        *p = v.as_ptr();
    }
    // SAFETY: `ptrs` point into `params`, alive for the call; the caller's contract covers the
    // values, the configuration and the kernel's accesses.
    unsafe { launch_in_context(dev.context(), dev.state(), kernel, stream, cfg, ptrs) }
}

/// The one launch path of [`launch_raw`] and [`crate::module::TypedKernel::launch`]: context
/// checks, binding, the launch record and `cuLaunchKernelEx` with its error mapped to
/// [`Error::Launch`].
///
/// # Safety
/// As [`launch_raw`], with `params` one pointer per kernel parameter to a value of its size.
pub(crate) unsafe fn launch_in_context(
    ctx: &Arc<CudaContext>,
    state: &ContextState,
    kernel: &Kernel,
    stream: &Stream,
    cfg: &LaunchConfig,
    params: &mut [*mut c_void],
) -> Result<()> {
    if stream.context_raw() != ctx.cu_ctx() {
        return Err(Error::WrongContext {
            what: "kernel launch (stream)",
        });
    }
    if kernel.context_raw() != ctx.cu_ctx() {
        return Err(Error::WrongContext {
            what: "kernel launch (kernel of another context's module)",
        });
    }
    bind_context(ctx, "cuCtxSetCurrent")?;
    let mut attrs = cfg.attributes();
    let config = cfg.driver_config(stream.raw(), &mut attrs);
    state.record_launch(LaunchRecord {
        kernel: kernel.name().to_string(),
        config: format!("{} on stream {:p}", cfg.describe(), stream.raw()),
    });
    // SAFETY: `config` points into `attrs`, alive for the call; the caller's contract covers
    // the parameters and the kernel's accesses.
    match unsafe { drv::launch_kernel_ex(&config, kernel.cu_function(), params) } {
        Err(Error::Cuda { source, .. }) => Err(Error::Launch {
            kernel: kernel.name().to_string(),
            config: cfg.describe(),
            source,
        }),
        r => {
            // The module stays loaded until this launch has completed (issue 19, item 4).
            kernel.keep.launched_on(stream);
            r
        }
    }
}

/// Builds the parameter array of a [`launch_raw`] call: `&mut params![a, b, n as u64]` gives an
/// owned `[ParamValue; 3]` holding copies of the values (each a [`Pod`] of at most 8 bytes,
/// passed with its exact size, so write `n as u64` for a `.u64` parameter). Because the array
/// owns its values, `let p = params![n as u64];` is fine: nothing points at a temporary.
#[macro_export]
macro_rules! params {
    ($($v:expr),* $(,)?) => {
        [$($crate::launch::ParamValue::new($v)),*]
    };
}

impl LaunchConfig {
    /// How many clusters of this configuration the device can run at once for `kernel`
    /// (`cuOccupancyMaxActiveClusters`, CUDA driver API; the grid only needs to be a multiple of
    /// the cluster). 0 means the configuration cannot be scheduled at all. Without a cluster
    /// dimension the driver counts CTAs as clusters of 1.
    pub fn max_active_clusters(&self, dev: &Device, kernel: &Kernel) -> Result<u32> {
        dev.bind()?;
        let mut attrs = self.attributes();
        let config = self.driver_config(std::ptr::null_mut(), &mut attrs);
        // SAFETY: `config` points into `attrs`, alive for the call; valid function handle.
        let n = unsafe { drv::occupancy_max_active_clusters(kernel.cu_function(), &config) }?;
        Ok(n.max(0) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(grid: [u32; 3], block: [u32; 3]) -> LaunchConfig {
        LaunchConfig {
            grid,
            block,
            shared_mem_bytes: 0,
            cluster: None,
            pdl: false,
        }
    }

    #[test]
    fn params_own_their_values() {
        // Built from temporaries and used after the statement: no dangling pointers.
        let n = 7u32;
        let p = crate::params![n as u64, 2.5f32, 3u8];
        assert_eq!(p.map(|v| v.size()), [8, 4, 1]);
        // SAFETY: reading the bytes the values own.
        let first = unsafe { *(p[0].as_ptr() as *const u64) };
        assert_eq!(first, 7);
        let second = unsafe { *(p[1].as_ptr() as *const f32) };
        assert_eq!(second, 2.5);
        let empty: [ParamValue; 0] = crate::params![];
        assert!(empty.is_empty());
    }

    #[test]
    fn finding_15_block_product_cannot_overflow() {
        // 65536 * 65536 wraps to 0 in u32 (and panics in debug builds).
        let e = cfg([1, 1, 1], [65536, 65536, 1])
            .check("k", &LaunchLimits::SM90)
            .unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. }), "{e}");
        let mut l = LaunchLimits::SM90;
        l.max_block_dim = [u32::MAX; 3];
        let e = cfg([1, 1, 1], [65536, 65536, 2])
            .check("k", &l)
            .unwrap_err();
        assert!(
            matches!(e, Error::TooLarge { what: "threads per CTA", value, .. } if value == 1 << 33),
            "{e}"
        );
    }

    #[test]
    fn finding_15_per_dimension_limits() {
        let l = LaunchLimits::SM90;
        assert!(cfg([i32::MAX as u32, 65535, 65535], [1024, 1, 1])
            .check("k", &l)
            .is_ok());
        assert!(cfg([1, 1, 1], [1, 1, 64]).check("k", &l).is_ok());
        for (g, b, what) in [
            ([1u32 << 31, 1, 1], [1u32, 1, 1], "grid x (CTAs)"),
            ([1, 65536, 1], [1, 1, 1], "grid y (CTAs)"),
            ([1, 1, 65536], [1, 1, 1], "grid z (CTAs)"),
            ([1, 1, 1], [1025, 1, 1], "block x (threads)"),
            ([1, 1, 1], [1, 1025, 1], "block y (threads)"),
            ([1, 1, 1], [1, 1, 65], "block z (threads)"),
            ([1, 1, 1], [32, 32, 2], "threads per CTA"),
        ] {
            let e = cfg(g, b).check("k", &l).unwrap_err();
            assert!(
                matches!(e, Error::TooLarge { what: w, .. } if w == what),
                "{g:?} {b:?}: {e}"
            );
        }
    }

    #[test]
    fn finding_15_cluster_rules() {
        let l = LaunchLimits::SM90;
        let ok = cfg([16, 1, 1], [128, 1, 1]).with_cluster_x(8);
        assert!(ok.check("k", &l).is_ok());
        let mut zero = ok;
        zero.cluster = Some([2, 0, 1]);
        assert!(matches!(zero.check("k", &l), Err(Error::BadShape { .. })));
        let indivisible = cfg([12, 1, 1], [128, 1, 1]).with_cluster_x(8);
        assert!(matches!(
            indivisible.check("k", &l),
            Err(Error::BadShape { .. })
        ));
        let too_big = cfg([32, 1, 1], [128, 1, 1]).with_cluster_x(16);
        assert!(matches!(
            too_big.check("k", &l),
            Err(Error::TooLarge { .. })
        ));
        let mut two_d = cfg([4, 4, 1], [128, 1, 1]);
        two_d.cluster = Some([4, 4, 1]);
        assert!(matches!(
            two_d.check("k", &l),
            Err(Error::TooLarge { value: 16, .. })
        ));
        let mut no_clusters = l;
        no_clusters.cluster_launch = false;
        assert!(matches!(
            ok.check("k", &no_clusters),
            Err(Error::ClustersUnsupported)
        ));
    }

    #[test]
    fn finding_15_shared_memory_against_the_kernels_own_limit() {
        let mut l = LaunchLimits::SM90;
        l.kernel_max_dynamic_smem = 48 * 1024;
        let over = LaunchConfig::linear(1, 128, 48 * 1024 + 4);
        // Below the device's opt-in limit but above the kernel's attribute: rejected.
        assert!(matches!(
            over.check("k", &l),
            Err(Error::SharedMemory { requested, max, .. }) if requested == 48 * 1024 + 4 && max == 48 * 1024
        ));
        l.kernel_max_dynamic_smem = l.smem_optin;
        assert!(over.check("k", &l).is_ok());
        // Static plus dynamic above the opt-in limit: rejected.
        l.kernel_static_smem = 1024;
        let full = LaunchConfig::linear(1, 128, l.smem_optin as u32);
        assert!(matches!(
            full.check("k", &l),
            Err(Error::SharedMemory { .. })
        ));
    }
}
