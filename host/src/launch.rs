//! Kernel launch configurations and the one launch path, `cuLaunchKernelEx` (CUDA driver API), with
//! optional thread-block cluster dimensions (`CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`) and
//! Programmatic Dependent Launch (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`).

use std::ffi::c_void;

use cudarc::driver::sys;

use crate::device::{Device, Kernel};
use crate::error::{CudaCall, Error, Result};
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
    /// it must `griddepcontrol.wait` before reading that kernel's results.
    pub pdl: bool,
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

    /// Checks the configuration against the device before any launch: non-zero dimensions, shared
    /// memory within the opt-in limit, cluster support and grid divisibility.
    pub fn validate(&self, dev: &Device, kernel: &'static str) -> Result<()> {
        if self.grid.contains(&0) || self.block.contains(&0) {
            return Err(Error::BadShape {
                what: "launch configuration",
                detail: format!(
                    "grid {:?} and block {:?} must be non-zero",
                    self.grid, self.block
                ),
            });
        }
        let threads: u32 = self.block.iter().product();
        if threads > 1024 {
            return Err(Error::TooLarge {
                what: "threads per CTA",
                value: threads as u64,
                max: 1024,
            });
        }
        let max = dev.capabilities().max_shared_mem_per_block_optin;
        if self.shared_mem_bytes as usize > max {
            return Err(Error::SharedMemory {
                kernel,
                requested: self.shared_mem_bytes as usize,
                max,
            });
        }
        if let Some(c) = self.cluster {
            if !dev.capabilities().cluster_launch {
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
        }
        Ok(())
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

/// Launches `kernel` with `cfg` on `stream`.
///
/// # Safety
/// `params` holds one pointer per kernel parameter, in order, each to a value of exactly the
/// parameter's type, and the kernel's memory accesses with these arguments stay inside live
/// allocations that are ordered on `stream`. The typed launchers in [`crate::kernels`] establish
/// this; prefer them.
pub unsafe fn launch_raw(
    dev: &Device,
    kernel: &Kernel,
    stream: &Stream,
    cfg: &LaunchConfig,
    params: &mut [*mut c_void],
) -> Result<()> {
    dev.bind()?;
    let mut attrs = cfg.attributes();
    let config = cfg.driver_config(stream.raw(), &mut attrs);
    sys::cuLaunchKernelEx(
        &config,
        kernel.cu_function(),
        params.as_mut_ptr(),
        std::ptr::null_mut(),
    )
    .call("cuLaunchKernelEx")
}

/// Builds the `void*` parameter array of a launch from local values: `params![a, b, n]`.
#[macro_export]
macro_rules! params {
    ($($v:expr),* $(,)?) => {
        [$(&$v as *const _ as *mut ::std::ffi::c_void),*]
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
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `config` points into `attrs`, alive for the call; valid function handle and
        // out-pointer.
        unsafe { sys::cuOccupancyMaxActiveClusters(&mut n, kernel.cu_function(), &config) }
            .call("cuOccupancyMaxActiveClusters")?;
        Ok(n.max(0) as u32)
    }
}
