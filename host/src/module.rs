//! User PTX modules and typed kernel handles.
//!
//! [`crate::Device::load_module`] loads any PTX text into the device's context
//! (`cuModuleLoadData`) and loads every `.entry` eagerly (`cuModuleGetFunction` + `cuFuncLoad`),
//! as [`crate::Device::open`] does for warpline's own module, so no kernel is ever loaded lazily
//! behind an on-stream wait. A device may hold any number of modules; each [`Module`] keeps its
//! `CUmodule` (and the context) alive through an `Arc`, as does every [`TypedKernel`] made from it,
//! and the module is unloaded only after every launch of its kernels has completed.
//!
//! [`Module::kernel`] turns an entry into a [`TypedKernel<Sig>`], where `Sig` is a tuple of
//! marker types ([`View<T>`], [`ViewMut<T>`], [`DevicePtr<T>`], fixed-size scalars). The PTX
//! parameter list of the entry (`.entry name(.param .u64 .ptr ..., .param .u32 ...)`) is checked
//! against `Sig` once, when the handle is made: count, sizes and float-versus-integer classes,
//! which is all PTX declares. PTX has no element types and no read/write intent, so the check
//! cannot tell `View<f32>` from `View<u8>`, `View` from `ViewMut`, or a view from a plain `u64`
//! (see [`Module::kernel`]). [`TypedKernel::launch`] then takes the matching values
//! (`DeviceView<'a, T>`, `DeviceViewMut<'a, T>`, scalars) and checks everything that does not
//! depend on what the kernel does with them: streams, contexts, launch limits.
//!
//! ```no_run
//! use warpline::launch::LaunchConfig;
//! use warpline::module::{TypedKernel, View, ViewMut};
//! # fn f(dev: &warpline::Device, ptx: &str, pool: &warpline::MemPool) -> warpline::Result<()> {
//! let module = dev.load_module(ptx)?;
//! let saxpy: TypedKernel<(View<f32>, ViewMut<f32>, f32, u32)> = module.kernel("saxpy")?;
//! let stream = dev.new_stream()?;
//! let n = 1 << 20;
//! let x = pool.alloc_async::<f32>(&stream, n)?;
//! let mut y = pool.alloc_async::<f32>(&stream, n)?;
//! let cfg = LaunchConfig::linear((n as u32).div_ceil(256), 256, 0);
//! // SAFETY: saxpy reads x[i] and writes y[i] for i < n only.
//! unsafe { saxpy.launch(&stream, &cfg, (x.as_view(), y.as_view_mut(), 2.0, n as u32)) }?;
//! # Ok(()) }
//! ```

use std::collections::BTreeSet;
use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use bytemuck::Pod;

use crate::device::Kernel;
use crate::error::{Error, Result};
use crate::launch::{launch_in_context, LaunchConfig, LaunchLimits, ParamValue};
use crate::memory::{DeviceView, DeviceViewMut};
use crate::ptx::join;
use crate::stream::Stream;

// The PTX parsing (`.entry` parameter lists) is pure text work, kept in the crate-internal
// `ptx.rs` below `device` (whose `open` reads the entries) and re-exported here.
pub use crate::ptx::{ptx_signatures, PtxEntry, PtxParam, PtxParamKind};

// ---------------------------------------------------------------------------------------------
// Rust-side parameter types
// ---------------------------------------------------------------------------------------------

/// The value class of a Rust kernel parameter type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RustParamKind {
    /// An integer scalar.
    Int,
    /// A floating-point scalar.
    Float,
    /// A device address (a view or a [`DevicePtr`]), 8 bytes.
    Address,
}

/// A Rust kernel parameter as checked against the PTX: its type's name, size and class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RustParam {
    /// The marker or scalar type (`View<f32>`, `u32`).
    pub rust_type: String,
    /// Bytes passed to the kernel.
    pub size: usize,
    /// Value class.
    pub kind: RustParamKind,
}

/// A read-only device array parameter: a [`TypedKernel`] launch takes a [`DeviceView<'a, T>`]
/// for it and passes its device address (8 bytes). Matches `.u64`/`.b64`/`.s64` PTX parameters
/// (with or without `.ptr`). A marker type: never constructed.
pub struct View<T>(PhantomData<fn() -> T>);

/// A writable device array parameter: a launch takes a [`DeviceViewMut<'a, T>`] and passes its
/// device address. Matches as [`View`]. A marker type: never constructed.
pub struct ViewMut<T>(PhantomData<fn() -> T>);

/// A raw device address of `T` elements, passed as 8 bytes (`.u64 .ptr` in the PTX). It carries
/// no length and no stream: what the kernel may access through it is entirely the caller's
/// contract of [`TypedKernel::launch`]. In a signature it stands for itself (the launch takes a
/// `DevicePtr<T>` value).
pub struct DevicePtr<T> {
    addr: u64,
    _t: PhantomData<fn() -> T>,
}

impl<T> DevicePtr<T> {
    /// The address `addr` (bytes; alignment as the kernel needs it: at least `align_of::<T>()`).
    pub const fn new(addr: u64) -> Self {
        Self {
            addr,
            _t: PhantomData,
        }
    }
    /// The null address (for kernels that take an optional pointer).
    pub const fn null() -> Self {
        Self::new(0)
    }
    /// The address, bytes.
    pub const fn addr(&self) -> u64 {
        self.addr
    }
}
impl<T> Clone for DevicePtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevicePtr<T> {}
impl<T> fmt::Debug for DevicePtr<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DevicePtr<{}>({:#x})",
            std::any::type_name::<T>(),
            self.addr
        )
    }
}
impl<'a, T> From<DeviceView<'a, T>> for DevicePtr<T> {
    fn from(v: DeviceView<'a, T>) -> Self {
        Self::new(v.device_ptr())
    }
}
impl<'a, T> From<DeviceViewMut<'a, T>> for DevicePtr<T> {
    fn from(v: DeviceViewMut<'a, T>) -> Self {
        Self::new(v.device_ptr())
    }
}

mod sealed {
    pub trait Sealed {}
}

/// `what` of [`Error::WrongStream`] for a view in argument position `i` of a typed launch.
const VIEW_ARG: [&str; MAX_PARAMS] = [
    "typed kernel launch, argument 0 (view)",
    "typed kernel launch, argument 1 (view)",
    "typed kernel launch, argument 2 (view)",
    "typed kernel launch, argument 3 (view)",
    "typed kernel launch, argument 4 (view)",
    "typed kernel launch, argument 5 (view)",
    "typed kernel launch, argument 6 (view)",
    "typed kernel launch, argument 7 (view)",
    "typed kernel launch, argument 8 (view)",
    "typed kernel launch, argument 9 (view)",
    "typed kernel launch, argument 10 (view)",
    "typed kernel launch, argument 11 (view)",
];

/// Most parameters a [`KernelSignature`] tuple has.
pub const MAX_PARAMS: usize = 12;

/// A parameter type of a [`KernelSignature`]: the marker types [`View`], [`ViewMut`],
/// [`DevicePtr`] and the scalars `u8`..`u64`, `i8`..`i64`, `f32`, `f64`. Sealed.
pub trait KernelParam: sealed::Sealed + 'static {
    /// What a launch takes for this parameter.
    type Arg<'a>;
    /// Bytes passed to the kernel.
    const SIZE: usize;
    /// Value class (checked against the PTX type).
    const KIND: RustParamKind;
    /// The type's name for messages.
    fn rust_type() -> String;
    /// Checks `arg` against the launch's stream and returns the value to pass.
    #[doc(hidden)]
    fn prepare(arg: &Self::Arg<'_>, stream: &Stream, index: usize) -> Result<ParamValue>;
}

impl<T: Pod> sealed::Sealed for View<T> {}
impl<T: Pod> KernelParam for View<T> {
    type Arg<'a> = DeviceView<'a, T>;
    const SIZE: usize = 8;
    const KIND: RustParamKind = RustParamKind::Address;
    fn rust_type() -> String {
        format!("View<{}>", std::any::type_name::<T>())
    }
    fn prepare(arg: &DeviceView<'_, T>, stream: &Stream, index: usize) -> Result<ParamValue> {
        if arg.stream() != stream {
            return Err(Error::WrongStream {
                what: VIEW_ARG[index.min(MAX_PARAMS - 1)],
            });
        }
        Ok(ParamValue::new(arg.device_ptr()))
    }
}

impl<T: Pod> sealed::Sealed for ViewMut<T> {}
impl<T: Pod> KernelParam for ViewMut<T> {
    type Arg<'a> = DeviceViewMut<'a, T>;
    const SIZE: usize = 8;
    const KIND: RustParamKind = RustParamKind::Address;
    fn rust_type() -> String {
        format!("ViewMut<{}>", std::any::type_name::<T>())
    }
    fn prepare(arg: &DeviceViewMut<'_, T>, stream: &Stream, index: usize) -> Result<ParamValue> {
        if arg.stream() != stream {
            return Err(Error::WrongStream {
                what: VIEW_ARG[index.min(MAX_PARAMS - 1)],
            });
        }
        Ok(ParamValue::new(arg.device_ptr()))
    }
}

impl<T: 'static> sealed::Sealed for DevicePtr<T> {}
impl<T: 'static> KernelParam for DevicePtr<T> {
    type Arg<'a> = DevicePtr<T>;
    const SIZE: usize = 8;
    const KIND: RustParamKind = RustParamKind::Address;
    fn rust_type() -> String {
        format!("DevicePtr<{}>", std::any::type_name::<T>())
    }
    fn prepare(arg: &DevicePtr<T>, _: &Stream, _: usize) -> Result<ParamValue> {
        Ok(ParamValue::new(arg.addr))
    }
}

macro_rules! scalar_param {
    ($kind:ident: $($t:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl KernelParam for $t {
            type Arg<'a> = $t;
            const SIZE: usize = size_of::<$t>();
            const KIND: RustParamKind = RustParamKind::$kind;
            fn rust_type() -> String {
                stringify!($t).to_string()
            }
            fn prepare(arg: &$t, _: &Stream, _: usize) -> Result<ParamValue> {
                Ok(ParamValue::new(*arg))
            }
        }
    )*};
}
scalar_param!(Int: u8, u16, u32, u64, i8, i16, i32, i64);
scalar_param!(Float: f32, f64);

/// A kernel's parameter list as a tuple of [`KernelParam`] types, 0 to [`MAX_PARAMS`] (12) long:
/// `(View<f32>, ViewMut<f32>, f32, u32)`. Sealed.
pub trait KernelSignature: sealed::Sealed + 'static {
    /// The values a launch takes: the tuple of each parameter's [`KernelParam::Arg`].
    type Args<'a>;
    /// The parameters, in order.
    fn params() -> Vec<RustParam>;
    /// `(View<f32>, u32)`, for messages.
    fn describe() -> String {
        format!(
            "({})",
            join(Self::params().into_iter().map(|p| p.rust_type))
        )
    }
    /// Checks every argument against `stream` and writes the values to pass into `out`;
    /// returns how many.
    #[doc(hidden)]
    fn prepare(
        args: &Self::Args<'_>,
        stream: &Stream,
        out: &mut [ParamValue; MAX_PARAMS],
    ) -> Result<usize>;
}

macro_rules! signature {
    ($($p:ident $i:tt),*) => {
        impl<$($p: KernelParam),*> sealed::Sealed for ($($p,)*) {}
        impl<$($p: KernelParam),*> KernelSignature for ($($p,)*) {
            type Args<'a> = ($($p::Arg<'a>,)*);
            fn params() -> Vec<RustParam> {
                vec![$(RustParam { rust_type: $p::rust_type(), size: $p::SIZE, kind: $p::KIND }),*]
            }
            #[allow(unused_variables, unused_mut)]
            fn prepare(
                args: &Self::Args<'_>,
                stream: &Stream,
                out: &mut [ParamValue; MAX_PARAMS],
            ) -> Result<usize> {
                let mut n = 0;
                $( out[$i] = $p::prepare(&args.$i, stream, $i)?; n += 1; )*
                Ok(n)
            }
        }
    };
}
signature!();
signature!(A 0);
signature!(A 0, B 1);
signature!(A 0, B 1, C 2);
signature!(A 0, B 1, C 2, D 3);
signature!(A 0, B 1, C 2, D 3, E 4);
signature!(A 0, B 1, C 2, D 3, E 4, F 5);
signature!(A 0, B 1, C 2, D 3, E 4, F 5, G 6);
signature!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);
signature!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8);
signature!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9);
signature!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10);
signature!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11);

/// Why Rust parameter `rust` cannot stand for PTX parameter `ptx`, if it cannot.
fn param_mismatch(ptx: &PtxParam, rust: &RustParam) -> Option<String> {
    if ptx.size != rust.size {
        return Some(format!(
            "PTX `{ptx}` has {} bytes, Rust `{}` {}",
            ptx.size, rust.rust_type, rust.size
        ));
    }
    let ok = match (ptx.kind, rust.kind) {
        (PtxParamKind::Bits | PtxParamKind::Aggregate, _) => true,
        (PtxParamKind::Float, RustParamKind::Float) => true,
        (PtxParamKind::Float, _) => false,
        (PtxParamKind::Unsigned | PtxParamKind::Signed, RustParamKind::Float) => false,
        (PtxParamKind::Unsigned | PtxParamKind::Signed, _) => true,
    };
    (!ok).then(|| {
        format!(
            "PTX `{ptx}` is {}, Rust `{}` is {}",
            match ptx.kind {
                PtxParamKind::Float => "a floating-point value",
                _ => "an integer or address",
            },
            rust.rust_type,
            match rust.kind {
                RustParamKind::Float => "a floating-point value",
                RustParamKind::Int => "an integer",
                RustParamKind::Address => "a device address",
            }
        )
    })
}

/// Finds entry `name` among `entries` (as [`ptx_signatures`] parsed them) and checks its
/// parameter list against `rust` ([`check_signature`]); [`Error::MissingKernel`], listing the
/// entries there are, when it is absent.
pub(crate) fn check_entry(entries: &[PtxEntry], name: &str, rust: &[RustParam]) -> Result<()> {
    let e = entries
        .iter()
        .find(|e| e.name == name)
        .ok_or_else(|| Error::MissingKernel {
            kernel: name.to_string(),
            entries: entries
                .iter()
                .map(|e| e.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })?;
    check_signature(e, rust)
}

/// Checks the PTX parameter list of `entry` against `rust`: [`Error::KernelSignatureMismatch`]
/// naming the kernel, both signatures and the first difference; [`Error::PtxSignature`] when
/// the PTX declaration could not be read.
pub fn check_signature(entry: &PtxEntry, rust: &[RustParam]) -> Result<()> {
    let ptx = entry.params.as_ref().map_err(|e| Error::PtxSignature {
        kernel: entry.name.clone(),
        detail: e.clone(),
    })?;
    let mismatch = |detail: String| Error::KernelSignatureMismatch {
        kernel: entry.name.clone(),
        ptx: format!("({})", join(ptx.iter().map(|p| p.to_string()))),
        rust: format!("({})", join(rust.iter().map(|p| p.rust_type.clone()))),
        detail,
    };
    if ptx.len() != rust.len() {
        return Err(mismatch(format!(
            "the PTX entry has {} parameter(s), the Rust signature {}",
            ptx.len(),
            rust.len()
        )));
    }
    for (i, (p, r)) in ptx.iter().zip(rust).enumerate() {
        if let Some(why) = param_mismatch(p, r) {
            return Err(mismatch(format!("parameter {i}: {why}")));
        }
    }
    Ok(())
}

// `Module`, its `Kernel`s and the keep-alive that unloads it live in the crate-internal
// `loaded.rs`, below `device` (a `Device` owns the module it was opened with); the methods that
// need the layers above (typed handles) are here.
pub use crate::loaded::Module;
pub(crate) use crate::loaded::ModuleInner;

impl Module {
    /// The parsed PTX declaration of entry `name`; [`Error::MissingKernel`] if there is none.
    pub fn entry(&self, name: &str) -> Result<&PtxEntry> {
        self.inner.kernel(name)?;
        self.inner
            .entries
            .get(name)
            .ok_or_else(|| Error::MissingKernel {
                kernel: name.to_string(),
                entries: self.entry_names().collect::<Vec<_>>().join(", "),
            })
    }

    /// The untyped kernel `name` (attributes, [`Kernel::set_max_dynamic_shared_memory`], or
    /// [`crate::launch::launch_raw`] with a `Device` of the same context).
    /// Errors: [`Error::MissingKernel`], listing the entries.
    pub fn untyped_kernel(&self, name: &str) -> Result<&Kernel> {
        self.inner.kernel(name)
    }

    /// A typed handle of entry `name` with parameter list `Sig`, after checking the entry's PTX
    /// parameter list against `Sig`: the same number of parameters (at most 12), each of the
    /// same size in bytes, and of a compatible class (`.f32`/`.f64` take `f32`/`f64`;
    /// `.u`/`.s` integers take integers, views and [`DevicePtr`]; `.b` bits and `.b8 [N]`
    /// aggregates take any type of their size). Signedness is not checked (LLVM writes `.u` for
    /// signed integers too).
    ///
    /// What the check cannot see, because PTX does not declare it: the element type behind a
    /// pointer (a `View<u8>` or a `DevicePtr<u64>` passes for a `.u64 .ptr` parameter the kernel
    /// reads as `f32`), read versus write (a [`View`] passes where the kernel writes), pointer
    /// versus integer (a plain `u64` passes for a pointer parameter and a view for a `.u64`
    /// length; `.ptr` is not required), lengths, and what the kernel does. Those are the contract
    /// of the `unsafe` [`TypedKernel::launch`].
    ///
    /// Errors: [`Error::MissingKernel`] (listing the entries); [`Error::KernelSignatureMismatch`]
    /// naming the kernel, the PTX and the Rust signature and the first difference;
    /// [`Error::PtxSignature`] if the entry's declaration could not be parsed.
    pub fn kernel<Sig: KernelSignature>(&self, name: &str) -> Result<TypedKernel<Sig>> {
        let kernel = self.inner.kernel(name)?.clone();
        check_signature(self.entry(name)?, &Sig::params())?;
        Ok(TypedKernel {
            static_name: intern(name),
            kernel,
            module: self.inner.clone(),
            _sig: PhantomData,
        })
    }
}

/// Interns kernel names for the `&'static str` fields of launch errors: each distinct name is
/// leaked once per process (kernel names are few).
fn intern(name: &str) -> &'static str {
    static NAMES: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut names = NAMES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(n) = names.get(name) {
        return n;
    }
    let n: &'static str = Box::leak(name.to_string().into_boxed_str());
    names.insert(n);
    n
}

/// A kernel of a [`Module`] whose parameter list was checked against `Sig` (see
/// [`Module::kernel`]). Keeps the module loaded. Cheap to clone.
pub struct TypedKernel<Sig> {
    kernel: Kernel,
    static_name: &'static str,
    module: Arc<ModuleInner>,
    _sig: PhantomData<fn(Sig)>,
}

impl<Sig> Clone for TypedKernel<Sig> {
    fn clone(&self) -> Self {
        Self {
            kernel: self.kernel.clone(),
            static_name: self.static_name,
            module: self.module.clone(),
            _sig: PhantomData,
        }
    }
}

impl<Sig: KernelSignature> fmt::Debug for TypedKernel<Sig> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TypedKernel {}{}", self.kernel.name(), Sig::describe())
    }
}

impl<Sig: KernelSignature> TypedKernel<Sig> {
    /// The entry name.
    pub fn name(&self) -> &str {
        self.kernel.name()
    }

    /// The untyped kernel (attributes, shared-memory limits).
    pub fn untyped(&self) -> &Kernel {
        &self.kernel
    }

    /// What a launch of this kernel may use now: the device's limits and the function's own
    /// shared-memory attributes (see [`LaunchLimits`]).
    pub fn limits(&self) -> LaunchLimits {
        LaunchLimits::from_capabilities(&self.module.caps, &self.kernel)
    }

    /// Launches the kernel with `config` on `stream` (`cuLaunchKernelEx`, with the cluster and
    /// PDL attributes of `config`).
    ///
    /// Before anything is queued it checks, in this order:
    /// - `stream` belongs to the module's context ([`Error::WrongContext`]) and the context is
    ///   not poisoned ([`Error::ContextPoisoned`]);
    /// - every [`View`]/[`ViewMut`] argument is bound to `stream` ([`Error::WrongStream`]), so
    ///   the stream-ordered free of its buffer follows the kernel;
    /// - `config` against the device's and the function's limits ([`LaunchConfig::check`]: zero
    ///   or oversized grid/block, clusters, shared memory), where dynamic shared memory may go
    ///   up to the device's opt-in limit (`max_shared_mem_per_block_optin`) minus the kernel's
    ///   static shared memory: above the function's current
    ///   `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` (48 KiB by default) the attribute is
    ///   raised (`cuFuncSetAttribute`) before the launch; it is never lowered here.
    ///
    /// The launch is recorded for [`Error::ContextPoisoned`] reports. A launch the driver
    /// rejects is [`Error::Launch`], naming the kernel and its configuration.
    ///
    /// # Safety
    /// The types cannot say what the kernel does with its arguments. The caller guarantees:
    /// - every memory access of the kernel with these arguments stays inside the views passed
    ///   (reads only through [`View`]s, writes only through [`ViewMut`]s, within their lengths)
    ///   and, for [`DevicePtr`]/`u64` addresses, inside live device allocations that are ordered
    ///   on `stream` and outlive the kernel;
    /// - with `config.pdl` (PDL), the kernel may start while the previous kernel on `stream` still
    ///   runs (and, if that kernel lets its dependents launch before its own
    ///   `griddepcontrol.wait`, while the kernels before it still run): before its
    ///   `griddepcontrol.wait` it neither reads memory those kernels write (read after write),
    ///   nor writes memory they read (write after read) or write (write after write). After the
    ///   wait every earlier kernel on `stream` has completed and its writes are visible.
    ///
    /// Argument count, sizes and classes, stream binding and launch limits are checked and are
    /// not the caller's concern.
    pub unsafe fn launch<'a>(
        &self,
        stream: &Stream,
        config: &LaunchConfig,
        args: Sig::Args<'a>,
    ) -> Result<()> {
        // SAFETY: the caller's contract; launched on the stream the views are checked against.
        unsafe { self.launch_bound(stream, stream, config, &args) }
    }

    /// [`TypedKernel::launch`] with the views checked against `bound` and the kernel queued on
    /// `on` (a task graph's private capture stream, issue 19, item 2).
    ///
    /// # Safety
    /// As [`TypedKernel::launch`] with `stream = bound`; and `on` is `bound` or a stream
    /// capturing a graph that is replayed only after `bound`'s earlier work and before its later
    /// work while the views' buffers live.
    pub(crate) unsafe fn launch_bound(
        &self,
        bound: &Stream,
        on: &Stream,
        config: &LaunchConfig,
        args: &Sig::Args<'_>,
    ) -> Result<()> {
        let stream = on;
        let inner = &*self.module;
        if stream.context_raw() != inner.ctx.cu_ctx() || bound.context_raw() != inner.ctx.cu_ctx() {
            return Err(Error::WrongContext {
                what: "TypedKernel::launch",
            });
        }
        inner.state.check("cuLaunchKernelEx")?;
        let mut values = [ParamValue::new(0u8); MAX_PARAMS];
        let n = Sig::prepare(args, bound, &mut values)?;
        let mut limits = self.limits();
        let raisable = limits.smem_optin.saturating_sub(limits.kernel_static_smem);
        limits.kernel_max_dynamic_smem = limits.kernel_max_dynamic_smem.max(raisable);
        config.check(self.static_name, &limits)?;
        let dynamic = config.shared_mem_bytes as usize;
        if dynamic > self.kernel.max_dynamic_shared_memory() {
            self.kernel.raise_max_dynamic_shared_memory(dynamic)?;
        }
        let mut ptrs = [std::ptr::null_mut::<c_void>(); MAX_PARAMS];
        for (p, v) in ptrs.iter_mut().zip(&values[..n]) {
            *p = v.as_ptr();
        }
        // SAFETY: the parameter list was checked against the PTX when the handle was made (one
        // value of each parameter's size, in order); `values` outlives the call; views are bound
        // to `bound`, which `stream` is or is replayed in order with (contract); the caller
        // guarantees the kernel's accesses (see `# Safety`).
        unsafe {
            launch_in_context(
                &inner.ctx,
                &inner.state,
                &self.kernel,
                stream,
                config,
                &mut ptrs[..n],
            )
        }
    }
}
