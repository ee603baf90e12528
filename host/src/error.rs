//! warpline's error type. Every CUDA call's result is checked and lands here with the call's name;
//! every validation failure says what was wrong and what is allowed.

use cudarc::driver::DriverError;

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in warpline's host crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No CUDA driver library (libcuda.so.1) could be loaded on this machine.
    #[error("no CUDA driver on this machine (libcuda.so.1 could not be loaded); warpline's GPU path needs an NVIDIA driver and a Hopper (sm_90) GPU")]
    NoDriver,
    /// The driver is there but the requested device is not.
    #[error("no CUDA device {ordinal}: the driver reports {available} device(s)")]
    NoDevice { ordinal: usize, available: usize },
    /// The device is older than Hopper.
    #[error("{device} has compute capability {major}.{minor}; warpline's kernels need 9.0 or newer (Hopper, sm_90)")]
    ComputeCapability {
        device: String,
        major: i32,
        minor: i32,
    },
    /// A CUDA driver call failed.
    #[error("CUDA call {call} failed: {source}")]
    Cuda {
        call: &'static str,
        #[source]
        source: DriverError,
    },
    /// A sticky CUDA error (illegal address, launch failure, trap, ...) has corrupted the
    /// context: every later call on it fails, so warpline refuses further work on the device.
    #[error("the CUDA context is poisoned by a sticky error ({first}); `{call}` refused or failed. Launches queued most recently before the fault was seen (oldest first; the faulting kernel is among them): [{}]. A sticky error cannot be cleared: drop every warpline object of this device and restart the process (the context must be recreated)", .recent_launches.join("; "))]
    ContextPoisoned {
        /// The call that was refused or that reported the error.
        call: &'static str,
        /// The first sticky error seen on the context and the call that reported it.
        first: String,
        /// The launches queued last on the context before the error was seen, oldest first
        /// (kernel, grid, block, dynamic shared memory, cluster, PDL, stream).
        recent_launches: Vec<String>,
    },
    /// `cuLaunchKernelEx` rejected a launch (a non-sticky error: nothing ran).
    #[error("launch of kernel `{kernel}` with {config} failed (cuLaunchKernelEx): {source}")]
    Launch {
        kernel: String,
        /// Grid, block, dynamic shared memory, cluster and PDL of the launch.
        config: String,
        #[source]
        source: DriverError,
    },
    /// An allocation failed for lack of memory.
    #[error("{what}: out of memory: {requested} bytes asked for, {} free of {} ({source_of_figures})", .free.map_or("unknown".to_string(), |f| format!("{f} bytes")), .total.map_or("unknown".to_string(), |t| format!("{t} bytes")))]
    OutOfMemory {
        what: &'static str,
        /// Bytes asked for.
        requested: u64,
        /// Bytes free when the allocation failed, where known.
        free: Option<u64>,
        /// Total bytes, where known.
        total: Option<u64>,
        /// Where the free/total figures come from (`cuMemGetInfo`, `/proc/meminfo`).
        source_of_figures: &'static str,
    },
    /// Objects of different CUDA contexts used together (a stream with a device, buffer, pool,
    /// kernel, signal or communicator of another context).
    #[error("{what}: objects of different CUDA contexts were used together; streams, buffers, pools, kernels, signals and communicators belong to the context of the Device that made them: use ones made by the same Device (for several GPUs, the Device of the GPU the call names)")]
    WrongContext { what: &'static str },
    /// A zero-sized element type where memory of elements is allocated.
    #[error("{what}: element type `{ty}` has size 0; allocations need a type of at least 1 byte")]
    ZeroSizedType {
        what: &'static str,
        ty: &'static str,
    },
    /// PTX text with a NUL byte (the driver takes a C string).
    #[error("PTX module has a NUL byte at offset {offset}; PTX is text without NUL bytes")]
    PtxNul { offset: usize },
    /// The PTX module has no entry of that name (for warpline's own kernels: host and gpu/ out
    /// of step).
    #[error(
        "kernel `{kernel}` is not in the PTX module (entries: {entries}); {}",
        missing_kernel_hint(kernel)
    )]
    MissingKernel { kernel: String, entries: String },
    /// Input lengths disagree.
    #[error("{what}: length mismatch: {detail}")]
    LengthMismatch { what: &'static str, detail: String },
    /// A size of zero where at least one element is needed.
    #[error("{what}: empty input: at least 1 element is needed")]
    Empty { what: &'static str },
    /// A size above what the kernel or the device supports.
    #[error("{what}: {value} is too large: at most {max} is allowed")]
    TooLarge {
        what: &'static str,
        value: u64,
        max: u64,
    },
    /// Variable-length sequence offsets (`cu_seqlens`) that break the rules: `B + 1` entries,
    /// the first 0, non-decreasing (attention, issue 23).
    #[error("{what}: bad sequence offsets: {detail}")]
    BadSeqlens { what: &'static str, detail: String },
    /// A size that violates a shape rule (a multiple of a tile, say).
    #[error("{what}: {detail}")]
    BadShape { what: &'static str, detail: String },
    /// A device address without the alignment a kernel's vector accesses need.
    #[error("{what}: device address {addr:#x} is not {align}-byte aligned (the kernel uses {align}-byte accesses)")]
    Misaligned {
        what: &'static str,
        addr: u64,
        align: u64,
    },
    /// A cudarc object that warpline cannot take over as it is (`warpline::interop`): what was
    /// given and what is allowed.
    #[error("{what}: {detail}")]
    CudarcInterop { what: &'static str, detail: String },
    /// A buffer bound to one stream used on another.
    #[error("{what}: the buffer belongs to another stream; use it on its own stream or move it with DeviceBuffer::move_to_stream")]
    WrongStream { what: &'static str },
    /// A kernel asks for more shared memory than the device allows per CTA.
    #[error("kernel `{kernel}` needs {requested} bytes of shared memory per CTA; the device allows at most {max}")]
    SharedMemory {
        kernel: &'static str,
        requested: usize,
        max: usize,
    },
    /// The device or its driver cannot launch thread-block clusters.
    #[error("thread-block clusters are not supported by this device/driver (needs compute capability 9.0)")]
    ClustersUnsupported,
    /// The kernel and cluster configuration cannot be scheduled.
    #[error("kernel `{kernel}` with clusters of {cluster} CTAs cannot be scheduled ({reason}); cluster sizes that fit: {fits:?}")]
    ClusterDoesNotFit {
        kernel: &'static str,
        cluster: u32,
        reason: String,
        fits: Vec<u32>,
    },
    /// The device does not support stream-ordered memory pools.
    #[error("this device does not support stream-ordered memory pools (cuMemAllocAsync)")]
    MemoryPoolsUnsupported,
    /// Reading or writing a .npy file failed.
    #[error("{path}: {detail}")]
    Npy { path: String, detail: String },
    /// A GPU result disagrees with the CPU reference.
    #[error("verification failed: {detail}")]
    Verification { detail: String },
    /// A cluster size the kernel's tiling does not support (before asking the device).
    #[error("kernel `{kernel}`: clusters of {cluster} CTAs are not supported; supported sizes: {supported:?}")]
    UnsupportedClusterSize {
        kernel: &'static str,
        cluster: u32,
        supported: Vec<u32>,
    },
    /// A cuBLAS call failed (baselines).
    #[error("cuBLAS call {call} failed: {status}")]
    Cublas { call: &'static str, status: String },
    /// An on-stream wait (fence, signal) was requested while some kernel of the module is not
    /// loaded: loading it lazily later needs the device idle and deadlocks behind the wait.
    #[error("{what}: not every kernel of the module is loaded (cuFuncIsLoaded); on-stream waits are allowed only once every kernel is loaded, because lazy loading needs the device idle and hangs behind a pending wait (open the module with warpline's Device::open, which loads every kernel, or set CUDA_MODULE_LOADING=EAGER)")]
    ModuleNotFullyLoaded { what: &'static str },
    /// The device cannot wait on or write 64-bit values from a stream.
    #[error("{what}: this device does not support 64-bit stream memory operations (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS); use a 32-bit Signal<u32>")]
    StreamMemOps64Unsupported { what: &'static str },
    /// A task graph whose dependencies, stream order and signal set->wait edges form a cycle.
    #[error("task graph has a cycle, so its tasks would wait on each other forever: {path}; allowed: graphs whose explicit dependencies, per-stream order and signal set->wait edges form a DAG")]
    Cycle {
        /// Task indices of the cycle, in edge order (the last one has an edge to the first).
        tasks: Vec<usize>,
        /// The cycle with task labels and edge kinds.
        path: String,
    },
    /// A signal wait of a task graph that no task of the graph can satisfy.
    #[error("task graph: signal wait `{task}` on `{signal}` ({condition}) can never fire: signals start every run at 0 and no set or add of the graph satisfies it; add its producer to the graph or remove the wait")]
    UnmatchedWait {
        task: String,
        signal: String,
        condition: String,
    },
    /// A signal wait of a task graph that some legal execution leaves pending forever (issue 19,
    /// item 7): a producer that may run last can leave a value that does not satisfy it.
    #[error("task graph: signal wait `{task}` on `{signal}` ({condition}) may never fire: {why}; a wait is accepted only if every value its producers can leave (in any order that the lanes and dependencies allow, adds wrapping at 2^64, sets overwriting) satisfies it, because a value that holds only for a moment can be missed; order the producers with dependencies, or wait for a value no later producer can undo")]
    WaitMayNotFire {
        task: String,
        signal: String,
        condition: String,
        /// A legal order that leaves the wait unsatisfied.
        why: String,
    },
    /// Work did not complete within the caller's bound.
    #[error("{what} did not complete within {waited:?}; pending: [{}]; {}", .pending.join("; "), if *.released { "pending signal waits were released by writing their target values, and the streams drained" } else { "the streams are abandoned (still blocked); do not reuse them or their signals" })]
    Timeout {
        what: String,
        waited: std::time::Duration,
        /// Operations that had not completed, signal waits first.
        pending: Vec<String>,
        /// True when warpline released the pending signal waits and the work then drained.
        released: bool,
    },
    /// Programmatic Dependent Launch needs compute capability 9.0 (`griddepcontrol`, PTX ISA
    /// §9.7.12.x; `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`).
    #[error("{device} has compute capability {major}.{minor}; Programmatic Dependent Launch (PDL) needs 9.0 or newer")]
    PdlUnsupported {
        device: String,
        major: i32,
        minor: i32,
    },
    /// `Fence::guard` on a stream of the fence's own private context.
    #[error("Fence::guard: the caller's stream belongs to the fence's own internal context, so it would wait for work queued behind its own wait; guard streams of your Device, and use the internal stream only inside FenceTicket::submit")]
    FenceWaitsOnItself,
    /// Every slot of a fence is held by an open (or forgotten) ticket.
    #[error("Fence::guard: all {slots} slots are held by open tickets; submit or drop tickets first, or make the fence with Fence::with_capacity and more slots")]
    TooManyOpenTickets { slots: usize },
    /// A `Lane`, `SignalRef` or `TaskId` used with a `TaskGraph` other than the one that made it.
    #[error("{what}: {detail}; lanes, signal slots and task ids are valid only in the TaskGraph that created them")]
    ForeignHandle { what: &'static str, detail: String },
    /// A host callback of a task graph panicked (caught on the driver thread, never unwound
    /// across the FFI boundary); the run's later work still ran.
    #[error("host callback `{task}` panicked: {message}; host callbacks must not panic (the panic was caught on the driver's callback thread and the rest of the run went on)")]
    HostCallbackPanicked { task: String, message: String },
    /// A warpline call made from inside a task graph's host callback (issue 19, item 9): host
    /// callbacks run on the driver's callback thread, where CUDA calls are forbidden and waiting
    /// for GPU work never returns (the callback itself holds the stream).
    #[error("{call} was called from inside a task graph host callback; allowed there: host-only code (no warpline or CUDA call, no wait for GPU work): hand results to another thread instead")]
    InHostCallback { call: &'static str },
    /// A task graph with kernel closures given to the safe `TaskGraph::capture` (issue 19, item
    /// 1): a closure may reach memory the captured graph cannot keep alive.
    #[error("task `{task}` is a kernel closure, which TaskGraph::capture cannot check; allowed: capture graphs of signal, host, copy and gemm tasks, or use the unsafe TaskGraph::capture_unchecked and uphold its contract")]
    UncheckedCapture { task: String },
    /// A TMA tensor map description that `cuTensorMapEncodeTiled` would reject (or that the
    /// hardware cannot use), found before the driver is called: `rule` says which rule, `detail`
    /// what was given and what is allowed (CUDA driver API, `cuTensorMapEncodeTiled`).
    #[error("tensor map: {rule}: {detail}")]
    TensorMap {
        /// The rule that was broken.
        rule: TensorMapRule,
        /// What was given and what is allowed.
        detail: String,
    },
    /// A matrix row pitch that TMA cannot address: every global stride of a tensor map is a
    /// multiple of 16 bytes.
    #[error("{what}: row pitch of {pitch} elements is {} bytes, not a multiple of 16 bytes as TMA requires (a multiple of {} elements of {elem_bytes} bytes); pad the row pitch; the logical K (and M, N) may be anything", *.pitch as u64 * *.elem_bytes as u64, 16 / *.elem_bytes)]
    PitchAlignment {
        what: &'static str,
        /// Row pitch, elements.
        pitch: usize,
        /// Bytes per element.
        elem_bytes: usize,
    },
    /// sm_90a code (wgmma, setmaxnreg) runs only on compute capability 9.0 exactly.
    #[error("{device} has compute capability {major}.{minor}; the tensor-core kernels are sm_90a code (wgmma, setmaxnreg), which runs on compute capability 9.0 exactly (H100/H200)")]
    Sm90aRequired {
        device: String,
        major: i32,
        minor: i32,
    },
    /// A kernel's PTX parameter list does not match the Rust signature it was asked for.
    #[error("kernel `{kernel}`: the PTX entry takes {ptx} but the Rust signature is {rust}: {detail}; allowed: one Rust parameter per PTX parameter, of the same size in bytes (View/ViewMut/DevicePtr/u64/i64 for .u64/.s64/.b64 addresses, f32/f64 for .f32/.f64, integers for .u/.s types, any type of the size for .b types and .b8 [N] aggregates)")]
    KernelSignatureMismatch {
        kernel: String,
        /// The PTX parameter list, e.g. `(.u64 .ptr, .u32)`.
        ptx: String,
        /// The Rust signature, e.g. `(View<f32>, u32)`.
        rust: String,
        /// The first difference.
        detail: String,
    },
    /// The parameter list of a PTX entry could not be read.
    #[error("kernel `{kernel}`: its PTX parameter list could not be read: {detail}; supported: `.param [.align N] .type [.ptr [.space] [.align N]] name[[N]]` with .b/.u/.s 8..64, .f16/.bf16/.f32/.f64")]
    PtxSignature { kernel: String, detail: String },
    /// A call that may wait for the device inside the driver (a module load, a stream creation)
    /// was made while an on-stream wait is pending (stream creation first waits up to
    /// `Device::STREAM_CREATE_WAIT` for the waits to clear).
    #[error("{what}: an on-stream wait (a Fence guard or Signal wait) is pending; loading code (cuModuleLoadData/cuFuncLoad) and creating streams (cuStreamCreate) may wait for the device inside the driver, holding a lock the wait's release needs, so they would hang behind it; load modules and create streams before setting up waits, or after they are released")]
    WaitPending { what: &'static str },
    /// The PTX module was built from another `gpu/src/contract.rs` than the host (tile sizes,
    /// warp roles, shared-memory layout could differ): a stale module. `ptx_hash` is `None` when
    /// the module carries no `warpline_contract_hash`.
    #[error("the PTX module's launch contract ({}) differs from the host's ({host_hash:#018x}): the PTX is stale or from another build; rebuild it (`cargo build` rebuilds it from gpu/, or `cargo xtask build-ptx`; a WARPLINE_PTX module must be rebuilt from the same gpu/src/contract.rs)", .ptx_hash.map_or("no warpline_contract_hash in the module".to_string(), |h| format!("{h:#018x}")))]
    ContractMismatch {
        /// The module's `warpline_contract_hash`, if it has one.
        ptx_hash: Option<u64>,
        /// `warpline_gpu::CONTRACT_HASH` of the host build.
        host_hash: u64,
    },
    // Multi-GPU (issue 13; `warpline::multi`).
    /// Fewer GPUs than an operation needs.
    #[error("{what} needs {needed} GPUs; the driver reports {available}")]
    NotEnoughDevices {
        what: &'static str,
        needed: usize,
        available: usize,
    },
    /// One GPU cannot map the other's memory (`cuDeviceCanAccessPeer` = 0).
    #[error("{what}: GPU {from} cannot access the memory of GPU {to} (cuDeviceCanAccessPeer reports 0); allowed: GPUs of one DeviceSet whose peer-access matrix has from -> to (see DeviceSet::peer_matrix)")]
    PeerAccessUnavailable {
        what: &'static str,
        from: usize,
        to: usize,
    },
    /// The NCCL library could not be loaded.
    #[error("NCCL is not available: no libnccl could be loaded (tried {tried}); {hint}")]
    NcclUnavailable { tried: String, hint: String },
    /// An NCCL call failed.
    #[error("NCCL call {call} failed: {result}")]
    Nccl { call: &'static str, result: String },
    /// A nonblocking NCCL operation (`ncclInProgress`, polled with `ncclCommGetAsyncError`) did
    /// not finish within the bound, e.g. `ncclCommInitRankConfig` when another rank never joined.
    #[error("NCCL {call} (rank {rank} of {world}) did not finish within {waited:?}: another rank may never have joined or may have died; {action}. Change the bound with {env}=<seconds> or Communicator::init_rank_with_timeout")]
    NcclTimeout {
        call: &'static str,
        rank: usize,
        world: usize,
        waited: std::time::Duration,
        /// What was done about it (the communicator aborted, or left to be aborted on drop).
        action: &'static str,
        /// The environment variable of the default bound (`WARPLINE_NCCL_INIT_TIMEOUT_S`).
        env: &'static str,
    },
    /// A communicator was aborted (`ncclCommAbort`) because a grouped collective could not be
    /// launched on every rank (issue 24): the group was cancelled instead of launching the other
    /// ranks alone, and every communicator of it is unusable from then on.
    #[error("NCCL communicator rank {rank} of {world} was aborted (ncclCommAbort): {cause}; allowed: drop it and create new communicators (Communicator::init_all / init_rank)")]
    NcclAborted {
        rank: usize,
        world: usize,
        /// Why (the failure that cancelled the group, or "aborted earlier" on a later use).
        cause: String,
    },
    /// A trace or timeline could not be written (file system, encoder, font) to `path`.
    #[error("trace output {path}: {detail}")]
    TraceOutput { path: String, detail: String },
    /// A trace could not be put on one clock (events of another context, missing
    /// `%globaltimer` calibration, a stamp outside its kernel's window).
    #[error("trace clock: {detail}")]
    TraceClock { detail: String },
    /// An FP8 GEMM operand in a layout FP8 wgmma cannot read: `.e4m3`/`.e5m2` wgmma takes
    /// K-major A and B only (PTX ISA 8.3 §9.7.15.5.2, no `imm-trans` for 8-bit types), so B must
    /// be column-major, stored `N x K` row-major ("TN", as cuBLASLt FP8 also requires).
    #[error("{what}: B is {layout}; FP8 GEMM needs B column-major (K-major: stored N x K, row pitch >= K), as FP8 wgmma reads only K-major operands (PTX ISA 9.7.15.5.2) and cuBLASLt FP8 needs \"TN\"; store B transposed (a weight: once, when it is quantized)")]
    Fp8Layout { what: &'static str, layout: String },
    /// A decode step's block table is unusable (issue 21): an entry a sequence uses points
    /// outside the KV cache, or two sequences of the batch write or read the same cache slot.
    #[error("decode block table, sequence {seq}: {detail}; allowed: entries below the cache's page count, and no cache slot written by one sequence and used by another")]
    BlockTable { seq: usize, detail: String },
}

/// Attaches the name of the CUDA call to a driver error. Sticky errors (see [`is_sticky`]) become
/// [`Error::ContextPoisoned`] and poison the current context's record, so every later call on
/// that device is refused with the first error and the launches that preceded it.
pub(crate) trait CudaCall<T> {
    fn call(self, call: &'static str) -> Result<T>;
}

impl<T> CudaCall<T> for Result<T, DriverError> {
    fn call(self, call: &'static str) -> Result<T> {
        self.map_err(|source| classify(call, source))
    }
}

impl CudaCall<()> for cudarc::driver::sys::CUresult {
    fn call(self, call: &'static str) -> Result<()> {
        self.result().call(call)
    }
}

/// [`Error::Cuda`] for `source`, or [`Error::ContextPoisoned`] when it is sticky (the current
/// context is then marked poisoned).
pub(crate) fn classify(call: &'static str, source: DriverError) -> Error {
    if is_sticky(source.0) {
        match POISON_CURRENT.get() {
            Some(poison) => poison(call, source),
            None => poisoned_without_record(call, source),
        }
    } else {
        Error::Cuda { call, source }
    }
}

/// Marks the current context's record poisoned and returns its [`Error::ContextPoisoned`]
/// (`device::poison_current`). The records belong to the device layer, above this one and above
/// `driver/`, which call [`classify`]: the device layer installs this with [`set_poison_current`]
/// when it makes its first record, so this layer imports nothing above it. Before that there is
/// no record to poison.
static POISON_CURRENT: std::sync::OnceLock<fn(&'static str, DriverError) -> Error> =
    std::sync::OnceLock::new();

/// Installs the device layer's `poison_current` for [`classify`] (the first call wins; every
/// call passes the same function).
pub(crate) fn set_poison_current(poison: fn(&'static str, DriverError) -> Error) {
    let _ = POISON_CURRENT.set(poison);
}

/// [`Error::ContextPoisoned`] for a sticky `source` seen by `call` where warpline keeps no record
/// of the current context (so no launch history).
pub(crate) fn poisoned_without_record(call: &'static str, source: DriverError) -> Error {
    Error::ContextPoisoned {
        call,
        first: format!("{:?} reported by {call}", source.0),
        recent_launches: Vec::new(),
    }
}

/// True for the CUDA errors that corrupt the context for good ("sticky" errors: the context
/// cannot be used again and must be destroyed; CUDA driver API, `CUresult` documentation).
pub fn is_sticky(r: cudarc::driver::sys::CUresult) -> bool {
    use cudarc::driver::sys::CUresult as R;
    matches!(
        r,
        R::CUDA_ERROR_ILLEGAL_ADDRESS
            | R::CUDA_ERROR_LAUNCH_FAILED
            | R::CUDA_ERROR_LAUNCH_TIMEOUT
            | R::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | R::CUDA_ERROR_MISALIGNED_ADDRESS
            | R::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | R::CUDA_ERROR_INVALID_PC
            | R::CUDA_ERROR_HARDWARE_STACK_ERROR
            | R::CUDA_ERROR_ASSERT
            | R::CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

/// What to do about [`Error::MissingKernel`]: rebuild warpline's module for one of warpline's own
/// kernels, check the name or the module otherwise (issue 19, item 19).
fn missing_kernel_hint(kernel: &str) -> &'static str {
    if is_warpline_entry(kernel) {
        "it is one of warpline's kernels, so the module is stale or from another build: rebuild it (`cargo build` rebuilds it from gpu/, or `cargo xtask build-ptx`)"
    } else {
        "load a module that defines it, or use the entry name as the PTX spells it (`Module::entry_names`)"
    }
}

/// True when `kernel` is an `.entry` of one of warpline's embedded modules ([`crate::PTX`],
/// [`crate::SM90A_PTX`]), that is one of the kernels gpu/ builds. Read from the PTX text (the
/// entry names are parsed once), not from `kernels::KERNEL_SPECS`, so that this bottom layer
/// imports nothing above it and every kernel gpu/ builds is covered.
fn is_warpline_entry(kernel: &str) -> bool {
    static ENTRIES: std::sync::OnceLock<std::collections::HashSet<&'static str>> =
        std::sync::OnceLock::new();
    ENTRIES
        .get_or_init(|| {
            [crate::PTX, crate::SM90A_PTX]
                .into_iter()
                .flat_map(ptx_entry_names)
                .collect()
        })
        .contains(kernel)
}

/// The names declared by `.entry` in `ptx` (`.visible .entry name(`; PTX ISA, "Kernel and
/// Function Directives: .entry"). A plain scan: a `.entry` inside a comment would also count,
/// which at worst picks the other hint.
fn ptx_entry_names(ptx: &'static str) -> impl Iterator<Item = &'static str> {
    ptx.match_indices(".entry").filter_map(move |(at, m)| {
        let rest = &ptx[at + m.len()..];
        if !rest.starts_with(|c: char| c.is_ascii_whitespace()) {
            return None;
        }
        let rest = rest.trim_start();
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
            .unwrap_or(rest.len());
        (end > 0).then(|| &rest[..end])
    })
}

/// The rule of `cuTensorMapEncodeTiled` that a description breaks ([`Error::TensorMap`]; checked
/// by [`crate::tensor_map::TensorMapDesc::validate`], also reachable as
/// `warpline::tensor_map::TensorMapRule`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorMapRule {
    /// Rank 1 to 5, and as many dims, box dims and (rank - 1) strides.
    Rank,
    /// The global address is 16-byte aligned.
    BaseAlignment,
    /// Every global dimension is at least 1 and below 2^32.
    Dim,
    /// Every global stride is a multiple of 16 bytes, below 2^40, and at least the extent of the
    /// dimension below it (rows do not overlap).
    Stride,
    /// Every box dimension is 1 to 256, and the inner box dimension spans a multiple of 16 bytes.
    Box,
    /// With a swizzle, the inner box dimension spans at most the swizzle span (32, 64 or 128 B).
    SwizzleSpan,
    /// The element type is one TMA supports, and matches the memory's element type.
    Dtype,
    /// The elements the map can address lie inside the device view it was made from.
    Extent,
}

impl std::fmt::Display for TensorMapRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Rank => "rank",
            Self::BaseAlignment => "base address alignment",
            Self::Dim => "global dimension",
            Self::Stride => "global stride",
            Self::Box => "box dimension",
            Self::SwizzleSpan => "inner box versus swizzle span",
            Self::Dtype => "element type",
            Self::Extent => "extent within the device view",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult as R;

    #[test]
    fn finding_19_sticky_errors_are_recognised() {
        for r in [
            R::CUDA_ERROR_ILLEGAL_ADDRESS,
            R::CUDA_ERROR_LAUNCH_FAILED,
            R::CUDA_ERROR_ILLEGAL_INSTRUCTION,
            R::CUDA_ERROR_MISALIGNED_ADDRESS,
            R::CUDA_ERROR_HARDWARE_STACK_ERROR,
            R::CUDA_ERROR_INVALID_PC,
            R::CUDA_ERROR_ASSERT,
        ] {
            assert!(is_sticky(r), "{r:?}");
        }
        for r in [
            R::CUDA_ERROR_INVALID_VALUE,
            R::CUDA_ERROR_OUT_OF_MEMORY,
            R::CUDA_ERROR_NOT_READY,
            R::CUDA_ERROR_INVALID_HANDLE,
        ] {
            assert!(!is_sticky(r), "{r:?}");
        }
        // Without any context current, a non-sticky error stays Error::Cuda with its call.
        let e = classify(
            "cuMemcpyHtoDAsync",
            DriverError(R::CUDA_ERROR_INVALID_VALUE),
        );
        assert!(
            matches!(
                e,
                Error::Cuda {
                    call: "cuMemcpyHtoDAsync",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn finding_19_poisoned_message_names_culprit_and_remedy() {
        let e = Error::ContextPoisoned {
            call: "cuStreamSynchronize",
            first: "CUDA_ERROR_ILLEGAL_ADDRESS reported by cuStreamSynchronize".into(),
            recent_launches: vec![
                "ws_vector_add grid [132, 1, 1] block [384, 1, 1] smem 0 B".into()
            ],
        };
        let m = e.to_string();
        for want in [
            "ILLEGAL_ADDRESS",
            "ws_vector_add",
            "grid [132, 1, 1]",
            "restart",
        ] {
            assert!(m.contains(want), "{want} missing from {m}");
        }
        let e = Error::OutOfMemory {
            what: "device allocation",
            requested: 1 << 40,
            free: Some(123),
            total: Some(456),
            source_of_figures: "cuMemGetInfo",
        };
        let m = e.to_string();
        assert!(
            m.contains("1099511627776") && m.contains("123 bytes"),
            "{m}"
        );
    }

    /// The hint's list of warpline's kernels comes from the embedded PTX (issue 22, item 11: this
    /// layer imports nothing above it): it must still cover every kernel the host launches.
    #[test]
    fn every_launched_kernel_is_an_embedded_entry() {
        for name in crate::kernels::KERNEL_SPECS
            .iter()
            .map(|s| s.name)
            .chain(crate::kernels::tc_gemm::ENTRIES)
        {
            assert!(is_warpline_entry(name), "{name}");
        }
        assert!(!is_warpline_entry("saxpy"));
        assert!(!is_warpline_entry(""));
        assert_eq!(
            ptx_entry_names(".visible .entry a_1(\n.entry  b$2 (\n.entryx c(").collect::<Vec<_>>(),
            ["a_1", "b$2"]
        );
    }
}
