//! NCCL through cudarc's `nccl` feature, loaded at run time (NCCL API: "Communicator Creation
//! and Management", "Collective Communication Functions", "Group Calls").
//!
//! - **Finding the library.** cudarc opens `libnccl.so` (and a few other names, not
//!   `libnccl.so.2`) on first use and panics when none loads. [`library_available`] probes first
//!   and returns [`Error::NcclUnavailable`] instead; every constructor here calls it before any
//!   NCCL function. Override: point [`NCCL_LIB_ENV`] (`WARPLINE_NCCL_LIB`) at the library file
//!   (say the PyPI wheel's `nvidia/nccl/lib/libnccl.so.2`): [`override_library_dir`] makes a
//!   folder with a `libnccl.so` link to it, which must be on `LD_LIBRARY_PATH` when the process
//!   starts (the dynamic loader reads it once); the `warpline` CLI re-runs itself with it.
//! - **NVLS stays off.** [`disable_nvls_unless_set`] sets `NCCL_NVLS_ENABLE=0` before any
//!   communicator is created (every constructor calls it), unless the user set the variable;
//!   child processes inherit it. warpline never enables NVLS and never calls `cuMulticastCreate`.
//! - **One process, several GPUs:** [`Communicator::init_all`] (`ncclCommInitAll`); collectives
//!   of one thread over several GPUs go inside one group ([`all_reduce_sum_group`]:
//!   `ncclGroupStart` / `ncclGroupEnd`), as NCCL requires.
//! - **One process per GPU:** rank 0 makes an [`NcclId`] (`ncclGetUniqueId`), hands it to the
//!   other processes (hex text: [`NcclId::to_hex`], the CLI passes it in [`NCCL_ID_ENV`]), and every
//!   process calls [`Communicator::init_rank`] (`ncclCommInitRank`). This is the path to many
//!   hosts: the id carries rank 0's bootstrap address, and NCCL finds InfiniBand/RoCE transports
//!   between hosts by itself; only the hand-over of the id (MPI, a file, ssh, a job launcher)
//!   changes.
//! - **Graphs.** warpline keeps NCCL outside CUDA graphs: NCCL's documentation warns that
//!   capturing collectives of several GPUs driven by one thread can deadlock, and the two ways
//!   out are one capturing thread per GPU or no NCCL in the graph. Capturing each GPU's compute
//!   into its own graph (with collectives launched between graph launches) is the intended form;
//!   it is not implemented yet.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::device::{bind_context, defer_error, Device};
use crate::driver::nccl as raw;
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;
use crate::stream::Stream;

use super::DeviceSet;

/// Environment variable naming the NCCL library file to use when `libnccl.so` is not on the
/// loader's path (see the module docs).
pub const NCCL_LIB_ENV: &str = "WARPLINE_NCCL_LIB";

/// Environment variable in which the `warpline` CLI hands the [`NcclId`] (hex, 256 digits) to the
/// processes it starts for the one-process-per-GPU form.
pub const NCCL_ID_ENV: &str = "WARPLINE_NCCL_ID";

/// The NVLS switch of NCCL (`NCCL_NVLS_ENABLE`): warpline keeps it at 0.
pub const NVLS_ENV: &str = "NCCL_NVLS_ENABLE";

/// The library names cudarc tries, in order.
pub fn library_candidates() -> Vec<String> {
    cudarc::get_lib_name_candidates("nccl")
}

/// `Ok` when an NCCL library can be loaded (probed once per process, without calling into it).
/// Errors: [`Error::NcclUnavailable`] with the names tried and how to point warpline at a library.
pub fn library_available() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: loading a shared library runs its initialisers; libnccl's are the library's own
    // (the same happens on cudarc's first NCCL call).
    let present = *PRESENT.get_or_init(|| unsafe { cudarc::nccl::sys::is_culib_present() });
    if present {
        return Ok(());
    }
    let hint = match std::env::var_os(NCCL_LIB_ENV) {
        Some(p) => format!(
            "{NCCL_LIB_ENV}={} is set, but the loader reads LD_LIBRARY_PATH only when a process \
             starts: run through the `warpline` CLI (it re-runs itself with the folder from \
             override_library_dir on LD_LIBRARY_PATH), or export LD_LIBRARY_PATH=<a folder with \
             a libnccl.so link to it> before starting the program",
            PathBuf::from(p).display()
        ),
        None => format!(
            "install NCCL (libnccl.so on the loader's path, e.g. /usr/lib/x86_64-linux-gnu), or \
             set {NCCL_LIB_ENV}=/path/to/libnccl.so.2 (the PyPI wheel nvidia-nccl-cu12/cu13 ships \
             nvidia/nccl/lib/libnccl.so.2) and run through the `warpline` CLI, or put a folder \
             with a libnccl.so link on LD_LIBRARY_PATH"
        ),
    };
    Err(Error::NcclUnavailable {
        tried: library_candidates().join(", "),
        hint,
    })
}

/// For [`NCCL_LIB_ENV`]: a folder (under the temporary directory) holding `libnccl.so`, a link to
/// the named file, to put on `LD_LIBRARY_PATH` of a process started afterwards. `Ok(None)` when
/// the variable is not set. Errors: [`Error::BadShape`] when the file does not exist or the link
/// cannot be made.
pub fn override_library_dir() -> Result<Option<PathBuf>> {
    let Some(lib) = std::env::var_os(NCCL_LIB_ENV).map(PathBuf::from) else {
        return Ok(None);
    };
    let bad = |detail: String| Error::BadShape {
        what: "WARPLINE_NCCL_LIB",
        detail,
    };
    let lib = lib.canonicalize().map_err(|e| {
        bad(format!(
            "{}: {e}; allowed: the path of an existing libnccl.so.N",
            lib.display()
        ))
    })?;
    let dir = std::env::temp_dir().join(format!("warpline-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
    let link = dir.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    #[cfg(unix)]
    std::os::unix::fs::symlink(&lib, &link)
        .map_err(|e| bad(format!("link {} -> {}: {e}", link.display(), lib.display())))?;
    #[cfg(not(unix))]
    std::fs::copy(&lib, &link).map_err(|e| bad(format!("{}: {e}", link.display())))?;
    Ok(Some(dir))
}

/// Sets `NCCL_NVLS_ENABLE=0` in this process's environment unless it is set already (the user's
/// value wins; a value other than `0` is reported on stderr, since NVLS must stay off on the shared
/// machines, see `docs/multi-gpu.md`). Returns the value in effect. Called by every constructor of
/// this module before NCCL creates a communicator, and inherited by child processes.
///
/// The environment is process-wide: call it before starting threads that read the environment.
pub fn disable_nvls_unless_set() -> String {
    match std::env::var(NVLS_ENV) {
        Ok(v) => {
            if v != "0" {
                eprintln!(
                    "warning: {NVLS_ENV}={v} was set by the user; warpline keeps NVLS off itself \
                     and never enables it (NVLink multicast must stay off on shared machines)"
                );
            }
            v
        }
        Err(_) => {
            std::env::set_var(NVLS_ENV, "0");
            "0".into()
        }
    }
}

/// NCCL's version (`ncclGetVersion`: 22803 for 2.28.3). Errors: [`Error::NcclUnavailable`],
/// [`Error::Nccl`].
pub fn version() -> Result<i32> {
    library_available()?;
    raw::get_version()
}

/// The 128-byte id of a new communicator (`ncclUniqueId`), made by rank 0 and handed to every
/// other rank.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct NcclId(pub [u8; 128]);

impl std::fmt::Debug for NcclId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NcclId({}...)", &self.to_hex()[..16])
    }
}

impl NcclId {
    /// A fresh id (`ncclGetUniqueId`; it opens rank 0's bootstrap socket). Errors:
    /// [`Error::NcclUnavailable`], [`Error::Nccl`].
    pub fn new() -> Result<Self> {
        library_available()?;
        disable_nvls_unless_set();
        let id = raw::get_unique_id()?;
        let mut b = [0u8; 128];
        for (o, i) in b.iter_mut().zip(id.internal.iter()) {
            *o = *i as u8;
        }
        Ok(Self(b))
    }

    /// 256 lower-case hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`NcclId::to_hex`]'s form. Errors: [`Error::BadShape`] unless `s` is exactly 256
    /// hex digits.
    pub fn from_hex(s: &str) -> Result<Self> {
        let s = s.trim();
        let bad = |detail: String| Error::BadShape {
            what: "NCCL id (hex)",
            detail,
        };
        if s.len() != 256 {
            return Err(bad(format!(
                "{} characters; allowed: exactly 256 hex digits (128 bytes)",
                s.len()
            )));
        }
        let mut b = [0u8; 128];
        for (k, o) in b.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * k..2 * k + 2], 16).map_err(|_| {
                bad(format!(
                    "`{}` at {} is not a hex byte",
                    &s[2 * k..2 * k + 2],
                    2 * k
                ))
            })?;
        }
        Ok(Self(b))
    }

    fn raw(&self) -> cudarc::nccl::sys::ncclUniqueId {
        let mut internal = [0 as std::ffi::c_char; 128];
        for (o, i) in internal.iter_mut().zip(self.0.iter()) {
            *o = *i as std::ffi::c_char;
        }
        cudarc::nccl::sys::ncclUniqueId { internal }
    }
}

/// One NCCL communicator: a rank on one GPU, bound to one stream (its collectives are enqueued
/// there; make it a [`DeviceSet::high_priority_stream`] so they do not queue behind compute).
/// Not `Sync`: NCCL communicators must not be used by two threads at once. Dropped with
/// `ncclCommAbort` after its stream has drained (errors are kept for
/// [`Device::take_deferred_errors`]).
pub struct Communicator {
    comm: cudarc::nccl::sys::ncclComm_t,
    stream: Stream,
    rank: usize,
    world: usize,
    ordinal: usize,
}

// SAFETY: an NCCL communicator may be used from another thread than the one that made it, one
// thread at a time (NCCL API, "Thread safety"); `Communicator` is Send but not Sync.
unsafe impl Send for Communicator {}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Communicator(rank {} of {} on GPU {})",
            self.rank, self.world, self.ordinal
        )
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Drain the communicator's stream, then `ncclCommAbort` (as cudarc's own `Comm` does):
        // unlike `ncclCommDestroy`, abort never waits for the other ranks, so dropping the
        // communicators of one process one after another cannot hang. Nothing is pending by then.
        let synced = self.stream.synchronize();
        let bound = bind_context(self.stream.ctx(), "ncclCommAbort");
        // SAFETY: live communicator, its stream drained (or poisoned), not used afterwards.
        let aborted = unsafe { raw::comm_abort(self.comm) };
        if let Err(e) = synced.and(bound).and(aborted) {
            defer_error(self.stream.ctx(), &e);
        }
    }
}

impl Communicator {
    /// One communicator per GPU of `set`, all in this process (`ncclCommInitAll`), rank `i` on
    /// GPU `i`, each bound to `streams[i]` (a stream of GPU `i`).
    ///
    /// Errors, before NCCL is called: [`Error::NcclUnavailable`], [`Error::LengthMismatch`]
    /// unless there is one stream per GPU, [`Error::WrongContext`] for a stream of another GPU;
    /// then [`Error::Nccl`].
    pub fn init_all(set: &DeviceSet, streams: &[Stream]) -> Result<Vec<Communicator>> {
        library_available()?;
        if streams.len() != set.len() {
            return Err(Error::LengthMismatch {
                what: "Communicator::init_all streams",
                detail: format!(
                    "{} streams for {} GPUs; one per GPU",
                    streams.len(),
                    set.len()
                ),
            });
        }
        for (i, s) in streams.iter().enumerate() {
            if set.index_of_stream(s)? != i {
                return Err(Error::WrongContext {
                    what: "Communicator::init_all: streams[i] must belong to GPU i of the set",
                });
            }
        }
        disable_nvls_unless_set();
        let ordinals: Vec<i32> = set.devices().iter().map(|d| d.ordinal() as i32).collect();
        let comms = raw::comm_init_all(&ordinals)?;
        Ok(comms
            .into_iter()
            .zip(streams)
            .enumerate()
            .map(|(rank, (comm, s))| Communicator {
                comm,
                stream: s.clone(),
                rank,
                world: streams.len(),
                ordinal: ordinals[rank] as usize,
            })
            .collect())
    }

    /// Rank `rank` of `world` on `dev`, bound to `stream` (a stream of `dev`), joining the
    /// communicator of `id` (`ncclCommInitRank`; blocks until every rank has joined).
    ///
    /// Errors, before NCCL is called: [`Error::NcclUnavailable`], [`Error::BadShape`] unless
    /// `rank < world`, [`Error::WrongContext`]; then [`Error::Nccl`].
    pub fn init_rank(
        dev: &Device,
        stream: &Stream,
        rank: usize,
        world: usize,
        id: &NcclId,
    ) -> Result<Communicator> {
        library_available()?;
        if rank >= world || world > i32::MAX as usize {
            return Err(Error::BadShape {
                what: "Communicator::init_rank",
                detail: format!("rank {rank} of world {world}; allowed: rank < world"),
            });
        }
        if stream.context_raw() != dev.raw_context() {
            return Err(Error::WrongContext {
                what: "Communicator::init_rank stream",
            });
        }
        disable_nvls_unless_set();
        dev.bind()?;
        let comm = raw::comm_init_rank(world as i32, id.raw(), rank as i32)?;
        Ok(Communicator {
            comm,
            stream: stream.clone(),
            rank,
            world,
            ordinal: dev.ordinal(),
        })
    }

    /// This communicator's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// The stream collectives are enqueued on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    fn check_buffer(&self, buf: &DeviceBuffer<f32>) -> Result<()> {
        if *buf.stream() != self.stream {
            return Err(Error::WrongStream {
                what: "Communicator::all_reduce_sum buffer (move it to the communicator's stream with DeviceBuffer::move_to_stream)",
            });
        }
        Ok(())
    }

    /// In-place sum over all ranks of `buf` (`ncclAllReduce`, f32, `ncclSum`), enqueued on the
    /// communicator's stream; returns at once. `buf` must be bound to that stream (move it there
    /// with [`DeviceBuffer::move_to_stream`], which orders the all-reduce after the work that
    /// produced it). Every rank must call it with the same length, in the same order of
    /// collectives. With several communicators in one thread use [`all_reduce_sum_group`].
    /// Errors: [`Error::WrongStream`]; [`Error::Nccl`].
    pub fn all_reduce_sum(&self, buf: &mut DeviceBuffer<f32>) -> Result<()> {
        self.check_buffer(buf)?;
        bind_context(self.stream.ctx(), "ncclAllReduce")?;
        // SAFETY: `buf` is a live allocation of `len` f32 bound to the communicator's stream,
        // so its free comes after the collective; in place (send == recv) is allowed.
        unsafe {
            raw::all_reduce_sum_f32(
                buf.device_ptr(),
                buf.device_ptr(),
                buf.len(),
                self.comm,
                self.stream.raw(),
            )
        }
    }
}

/// In-place sum of `bufs[i]` over the communicators `comms[i]` of one process, all driven by the
/// calling thread: the per-GPU calls go inside `ncclGroupStart` / `ncclGroupEnd` (without the group
/// the first call would wait for the others and the thread would deadlock).
/// Errors: [`Error::LengthMismatch`] (one buffer per communicator, equal lengths),
/// [`Error::WrongStream`]; then [`Error::Nccl`] (the group is always ended).
pub fn all_reduce_sum_group(
    comms: &[Communicator],
    bufs: &mut [&mut DeviceBuffer<f32>],
) -> Result<()> {
    if comms.len() != bufs.len() || bufs.iter().any(|b| b.len() != bufs[0].len()) {
        return Err(Error::LengthMismatch {
            what: "all_reduce_sum_group",
            detail: format!(
                "{} communicators, {} buffers of lengths {:?}; one buffer per communicator, all of one length",
                comms.len(),
                bufs.len(),
                bufs.iter().map(|b| b.len()).collect::<Vec<_>>()
            ),
        });
    }
    for (c, b) in comms.iter().zip(bufs.iter()) {
        c.check_buffer(b)?;
    }
    raw::group_start()?;
    let mut first = Ok(());
    for (c, b) in comms.iter().zip(bufs.iter_mut()) {
        let r = c.all_reduce_sum(b);
        if first.is_ok() {
            first = r;
        }
    }
    let ended = raw::group_end();
    first.and(ended)
}
