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
//! - **NVLS stays off.** Every constructor first checks `NCCL_NVLS_ENABLE=0`
//!   ([`require_nvls_off`], an error otherwise); the `warpline` CLI sets it at the top of `main`
//!   ([`disable_nvls_unless_set`], `unsafe`: the environment may only be written while no other
//!   thread reads it), and child processes inherit it. warpline never enables NVLS and never
//!   calls `cuMulticastCreate`.
//! - **One process, several GPUs:** [`Communicator::init_all`] (`ncclCommInitAll`); collectives
//!   of one thread over several GPUs go inside one group ([`all_reduce_sum_group`]:
//!   `ncclGroupStart` / `ncclGroupEnd`), as NCCL requires.
//! - **One process per GPU:** rank 0 makes an [`NcclId`] (`ncclGetUniqueId`), hands it to the
//!   other processes (hex text: [`NcclId::to_hex`], the CLI passes it in [`NCCL_ID_ENV`]), and every
//!   process calls [`Communicator::init_rank`] (`ncclCommInitRank`). This is the path to many
//!   hosts: the id carries rank 0's bootstrap address, and NCCL finds InfiniBand/RoCE transports
//!   between hosts by itself; only the hand-over of the id (MPI, a file, ssh, a job launcher)
//!   changes.
//! - **No hang at init.** [`Communicator::init_rank`] creates a *nonblocking* communicator
//!   (`ncclCommInitRankConfig` with `ncclConfig_t.blocking = 0`, the rest as
//!   `NCCL_CONFIG_INITIALIZER`) and polls `ncclCommGetAsyncError` until it is no longer
//!   `ncclInProgress`, for at most [`init_timeout`] ([`INIT_TIMEOUT_ENV`], default
//!   [`DEFAULT_INIT_TIMEOUT`]); on timeout it calls `ncclCommAbort` and returns
//!   [`Error::NcclTimeout`]. `NCCL_COMM_BLOCKING=1` would make NCCL ignore `blocking = 0`, so
//!   `init_rank` refuses it ([`COMM_BLOCKING_ENV`]).
//! - **Blocking collectives (issue 24).** NCCL has no call that makes a communicator blocking
//!   again, and every collective of a nonblocking one goes through a helper thread that NCCL
//!   starts at each group end (`ncclGroupEndInternal`, `src/group.cc`), polled here with
//!   `ncclCommGetAsyncError`: 1 MiB all-reduces took 100-114 us against PyTorch's 28.9 us
//!   (issue 13). So by default ([`CollectivesMode::Blocking`], [`COLLECTIVES_ENV`]) `init_rank`
//!   then splits the ready nonblocking communicator into a *blocking* child (`ncclCommSplit`,
//!   color 0, key = rank, a config with `blocking = 1`, no resource sharing) and keeps only the
//!   child. The split is a job of the parent (`ncclAsyncLaunch` with the parent in
//!   `ncclCommInitChildComm`, `src/init.cc`), so on the nonblocking parent it also runs on the
//!   helper thread and returns `ncclInProgress`: warpline polls the parent with the same bound,
//!   and on timeout aborts the parent, which also aborts the child's init (NCCL links the child's
//!   abort flag to the parent's until the child's init has succeeded). On success the parent is
//!   aborted (a local call; the child no longer shares anything with it). PyTorch's
//!   ProcessGroupNCCL and nccl-tests also run their collectives on blocking communicators.
//!   `WARPLINE_NCCL_COLLECTIVES=nonblocking` keeps the old path (collectives on the nonblocking
//!   communicator, each polled back to back for the first 2 ms, then sleeping; same bound).
//!   What a blocking communicator cannot bound: connections NCCL makes lazily at the first
//!   collective of each algorithm (`NCCL_RUNTIME_CONNECT=1`, its default) wait for the peer; a
//!   peer that dies between init and then makes that call wait. `NCCL_RUNTIME_CONNECT=0` makes
//!   every connection inside the bounded init.
//!   [`Communicator::init_all`] stays blocking (`ncclCommInitAll`): all its ranks are in this
//!   process and created by this one call, so no rank can fail to join.
//! - **No half-launched group (issue 24).** [`all_reduce_sum_group`] checks every rank (not
//!   aborted or timed out, its context bound and healthy, its buffer on its stream, lengths)
//!   before `ncclGroupStart`. If a rank still fails inside the group, the group is cancelled (an
//!   invalid NCCL call makes `ncclGroupEnd` discard every queued task instead of launching the
//!   other ranks alone) and every communicator of the group is aborted (`ncclCommAbort`) and
//!   marked: later use returns [`Error::NcclAborted`]. Every wait of [`Communicator`]'s drop is
//!   bounded by the communicator's timeout.
//! - **Graphs.** warpline keeps NCCL outside CUDA graphs: NCCL's documentation warns that
//!   capturing collectives of several GPUs driven by one thread can deadlock, and the two ways
//!   out are one capturing thread per GPU or no NCCL in the graph. Each GPU's compute is captured
//!   into graphs of its own and the all-reduces are issued between graph launches, ordered by
//!   events ([`super::bench::DataParallelConfig::graphs`]).

use std::cell::Cell;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

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

/// Environment variable with the bound, in seconds, of [`Communicator::init_rank`] (its init and
/// split together), of later nonblocking NCCL calls of its communicator, and of the waits of
/// [`Communicator::synchronize`] and of its drop: a positive decimal number, e.g. `300` or `0.5`.
pub const INIT_TIMEOUT_ENV: &str = "WARPLINE_NCCL_INIT_TIMEOUT_S";

/// The bound of [`Communicator::init_rank`] when [`INIT_TIMEOUT_ENV`] is not set: 120 s.
pub const DEFAULT_INIT_TIMEOUT: Duration = Duration::from_secs(120);

/// Environment variable choosing how [`Communicator::init_rank`]'s collectives run:
/// `blocking` (the default) or `nonblocking` ([`CollectivesMode`]).
pub const COLLECTIVES_ENV: &str = "WARPLINE_NCCL_COLLECTIVES";

/// How the collectives of a [`Communicator::init_rank`] communicator run (its initialisation
/// is nonblocking and bounded either way).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CollectivesMode {
    /// A blocking child of the nonblocking communicator (`ncclCommSplit` with `blocking = 1`):
    /// collectives are enqueued by the calling thread, as PyTorch and nccl-tests do.
    #[default]
    Blocking,
    /// The nonblocking communicator itself: each collective goes through NCCL's helper thread and
    /// `ncclInProgress` is polled away (bounded) before the call returns.
    Nonblocking,
}

/// Parses a value of [`COLLECTIVES_ENV`] (`None`: unset, [`CollectivesMode::Blocking`]):
/// `blocking` or `nonblocking`, any case, surrounding white space ignored. Errors:
/// [`Error::BadShape`] naming the variable and the allowed values.
pub fn parse_collectives_mode(value: Option<&str>) -> Result<CollectivesMode> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("blocking") => Ok(CollectivesMode::Blocking),
        Some("nonblocking") => Ok(CollectivesMode::Nonblocking),
        Some(_) => Err(Error::BadShape {
            what: "WARPLINE_NCCL_COLLECTIVES",
            detail: format!(
                "{:?}; allowed: blocking (the default) or nonblocking",
                value.unwrap_or_default()
            ),
        }),
    }
}

/// [`COLLECTIVES_ENV`] as [`parse_collectives_mode`] reads it. Errors: as that function (also
/// for a value that is not UTF-8).
pub fn collectives_mode() -> Result<CollectivesMode> {
    match std::env::var(COLLECTIVES_ENV) {
        Ok(v) => parse_collectives_mode(Some(&v)),
        Err(std::env::VarError::NotPresent) => parse_collectives_mode(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::BadShape {
            what: "WARPLINE_NCCL_COLLECTIVES",
            detail: format!("{v:?} is not UTF-8; allowed: blocking or nonblocking"),
        }),
    }
}

/// Parses a value of [`INIT_TIMEOUT_ENV`] (`None`: unset, [`DEFAULT_INIT_TIMEOUT`]): seconds as a
/// positive, finite decimal number of at most one year. Errors: [`Error::BadShape`] naming the
/// variable and what is allowed.
pub fn parse_init_timeout(value: Option<&str>) -> Result<Duration> {
    let Some(v) = value else {
        return Ok(DEFAULT_INIT_TIMEOUT);
    };
    let secs: f64 = v.trim().parse().unwrap_or(f64::NAN);
    if !(secs > 0.0 && secs <= 365.0 * 86400.0) {
        return Err(Error::BadShape {
            what: "WARPLINE_NCCL_INIT_TIMEOUT_S",
            detail: format!(
                "{v:?}; allowed: seconds, a positive decimal number up to 31536000 (one year), \
                 e.g. 120 or 0.5"
            ),
        });
    }
    Ok(Duration::from_secs_f64(secs))
}

/// The bound of [`Communicator::init_rank`]: [`INIT_TIMEOUT_ENV`] if set, else
/// [`DEFAULT_INIT_TIMEOUT`]. Errors: as [`parse_init_timeout`] (also for a value that is not
/// UTF-8).
pub fn init_timeout() -> Result<Duration> {
    match std::env::var(INIT_TIMEOUT_ENV) {
        Ok(v) => parse_init_timeout(Some(&v)),
        Err(std::env::VarError::NotPresent) => parse_init_timeout(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::BadShape {
            what: "WARPLINE_NCCL_INIT_TIMEOUT_S",
            detail: format!("{v:?} is not UTF-8; allowed: seconds, e.g. 120"),
        }),
    }
}

/// Polls `ncclCommGetAsyncError` on `comm` until its state is not `ncclInProgress` (NCCL user
/// guide, nonblocking communicators), with [`poll_bounded`]'s back-off and bound. Errors:
/// [`Error::NcclTimeout`] (nothing aborted here; `action` says what the caller does),
/// [`Error::Nccl`] with the state when the background operation failed.
fn poll_ready(
    comm: cudarc::nccl::sys::ncclComm_t,
    call: &'static str,
    rank_world: (usize, usize),
    since: Instant,
    timeout: Duration,
    action: &'static str,
) -> Result<()> {
    use cudarc::nccl::sys::ncclResult_t as R;
    poll_bounded(call, rank_world, since, timeout, action, || {
        // SAFETY: a live communicator (the caller aborts it only after this returns).
        match unsafe { raw::comm_get_async_error(comm) }? {
            R::ncclSuccess => Ok(Some(())),
            R::ncclInProgress => Ok(None),
            state => Err(Error::Nccl {
                call,
                result: format!("{state:?} (state from ncclCommGetAsyncError)"),
            }),
        }
    })
}

/// Calls `probe` until it returns a value or an error: yielding the thread between calls for
/// the first [`SPIN_FOR`] (an enqueue that returned `ncclInProgress` is usually ready within
/// microseconds, and a sleep would add its latency to every small collective), then sleeping
/// 50 us doubling to 10 ms, for at most `timeout` after `since`. Errors: `probe`'s, or
/// [`Error::NcclTimeout`] naming `call`, the rank and `action` (what the caller does about it).
fn poll_bounded<T>(
    call: &'static str,
    (rank, world): (usize, usize),
    since: Instant,
    timeout: Duration,
    action: &'static str,
    mut probe: impl FnMut() -> Result<Option<T>>,
) -> Result<T> {
    let mut nap = Duration::from_micros(50);
    loop {
        if let Some(v) = probe()? {
            return Ok(v);
        }
        let waited = since.elapsed();
        if waited >= timeout {
            return Err(Error::NcclTimeout {
                call,
                rank,
                world,
                waited,
                action,
                env: INIT_TIMEOUT_ENV,
            });
        }
        if waited < SPIN_FOR {
            std::thread::yield_now();
            continue;
        }
        std::thread::sleep(nap.min(timeout - waited));
        nap = (nap * 2).min(Duration::from_millis(10));
    }
}

/// Splits the ready nonblocking communicator `parent` into a blocking child with the same ranks
/// (`ncclCommSplit`, color 0, key = rank, `blocking = 1`, `splitShare` left at NCCL's default 0,
/// so the child shares no resources with the parent) and returns the child; `parent` is aborted
/// in every case (it is consumed).
///
/// Bounded: the split runs on NCCL's helper thread because the parent is nonblocking, so the
/// parent is polled ([`poll_ready`]) until `since + timeout`. On timeout or failure the parent is
/// aborted, which also aborts the child's init (until that succeeds NCCL links the child's abort
/// flag to the parent, `ncclCommInitChildComm` in `src/init.cc`), and a child handle NCCL has
/// stored by then is aborted too. NCCL stores the child's handle from its helper thread when the
/// split ends; the slot it writes is leaked on the error paths, so it outlives that thread.
/// Errors: [`Error::NcclTimeout`], [`Error::Nccl`].
fn split_blocking(
    parent: cudarc::nccl::sys::ncclComm_t,
    (rank, world): (usize, usize),
    since: Instant,
    timeout: Duration,
) -> Result<cudarc::nccl::sys::ncclComm_t> {
    use std::sync::atomic::{AtomicPtr, Ordering};
    let mut config = raw::config_initializer();
    config.blocking = 1;
    let slot: &'static AtomicPtr<cudarc::nccl::sys::ncclComm> =
        Box::leak(Box::new(AtomicPtr::new(std::ptr::null_mut())));
    // SAFETY: `parent` is live and ready (its init was polled to ncclSuccess); the slot is
    // leaked until NCCL has finished with it (freed below only once the split has ended).
    let r = unsafe { raw::comm_split(parent, 0, rank as i32, slot.as_ptr(), &mut config) };
    let ready = r.and_then(|p| match p {
        raw::Progress::Done => Ok(()),
        raw::Progress::InProgress => poll_ready(
            parent,
            "ncclCommSplit",
            (rank, world),
            since,
            timeout,
            "both communicators were aborted (ncclCommAbort)",
        ),
    });
    let child = ready.and_then(|()| {
        // The parent's state can read ncclSuccess before the split job has stored the child
        // (H100, NCCL 2.28: "no communicator was returned" when the slot was read at once):
        // wait for the slot too, within the same bound, watching the parent for a failure.
        let child = poll_bounded(
            "ncclCommSplit",
            (rank, world),
            since,
            timeout,
            "both communicators were aborted (ncclCommAbort)",
            || {
                let child = slot.load(Ordering::Acquire);
                if !child.is_null() {
                    return Ok(Some(child));
                }
                // SAFETY: `parent` is live (aborted only below).
                match unsafe { raw::comm_get_async_error(parent) }? {
                    cudarc::nccl::sys::ncclResult_t::ncclSuccess
                    | cudarc::nccl::sys::ncclResult_t::ncclInProgress => Ok(None),
                    state => Err(Error::Nccl {
                        call: "ncclCommSplit",
                        result: format!(
                            "{state:?} (state of the parent from ncclCommGetAsyncError)"
                        ),
                    }),
                }
            },
        )?;
        // SAFETY: the child NCCL returned, live.
        match unsafe { raw::comm_get_async_error(child) } {
            Ok(cudarc::nccl::sys::ncclResult_t::ncclSuccess) => Ok(child),
            other => {
                // SAFETY: the child NCCL returned, not used afterwards.
                let _ = unsafe { raw::comm_abort(child) };
                slot.store(std::ptr::null_mut(), Ordering::Release);
                Err(match other {
                    Ok(state) => Error::Nccl {
                        call: "ncclCommSplit",
                        result: format!(
                            "{state:?} (state of the child from ncclCommGetAsyncError)"
                        ),
                    },
                    Err(e) => e,
                })
            }
        }
    });
    // SAFETY: `parent` is live and not used afterwards; on the error paths this also stops the
    // split (the child's abort flag is the parent's until the child's init succeeded), and
    // ncclCommAbort joins the parent's group job.
    let parent_aborted = unsafe { raw::comm_abort(parent) };
    match child {
        Ok(child) => {
            // The split ended (the child's state was read): NCCL no longer writes the slot.
            // SAFETY: made by Box::leak above, not shared with NCCL any more.
            drop(unsafe {
                Box::from_raw(slot as *const _ as *mut AtomicPtr<cudarc::nccl::sys::ncclComm>)
            });
            // The child is usable and shares nothing with the parent: a failed abort of the parent
            // (which only frees its resources) does not change the outcome.
            let _ = parent_aborted;
            Ok(child)
        }
        Err(e) => {
            let late = slot.load(Ordering::Acquire);
            if !late.is_null() {
                // SAFETY: a child NCCL stored before the parent's abort joined the split; not used
                // afterwards.
                let _ = unsafe { raw::comm_abort(late) };
            }
            Err(e)
        }
    }
}

/// How long [`poll_ready`] polls without sleeping.
const SPIN_FOR: Duration = Duration::from_millis(2);

/// NCCL's environment override of `ncclConfig_t.blocking`: NCCL reads it at a communicator's
/// init (once per process, also from its config files `NCCL_CONF_FILE`, `~/.nccl.conf`,
/// `/etc/nccl.conf`) and, when it is 0 or 1, uses it instead of the config's value.
pub const COMM_BLOCKING_ENV: &str = "NCCL_COMM_BLOCKING";

/// Whether a value of [`COMM_BLOCKING_ENV`] makes NCCL create *blocking* communicators whatever
/// `ncclConfig_t.blocking` says. NCCL parses it with `strtoll(value, NULL, 0)` (leading white
/// space, a sign, a `0x` hex or `0` octal prefix, trailing characters ignored; an out-of-range
/// number keeps the default) and applies it when the number is 0 or 1 (`src/misc/param.cc`,
/// `envConfigOverride` in `src/init.cc`); this mirrors that for the value 1.
pub fn comm_blocking_forced(value: Option<&str>) -> bool {
    let Some(v) = value else {
        return false;
    };
    let v = v.trim_start_matches([' ', '\t', '\n', '\r', '\x0b', '\x0c']);
    let (neg, v) = match v.as_bytes().first() {
        Some(b'-') => (true, &v[1..]),
        Some(b'+') => (false, &v[1..]),
        _ => (false, v),
    };
    let (radix, digits) = if let Some(h) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        (16, h)
    } else if v.starts_with('0') {
        (8, v)
    } else {
        (10, v)
    };
    let end = digits
        .find(|c: char| !c.is_digit(radix))
        .unwrap_or(digits.len());
    match i64::from_str_radix(&digits[..end], radix) {
        Ok(n) => !neg && n == 1,
        // No digits ("0x" alone is 0 for strtoll) or out of range: NCCL's default applies.
        Err(_) => false,
    }
}

/// NCCL's environment override of `ncclConfig_t.splitShare` (read like [`COMM_BLOCKING_ENV`],
/// applied whatever the value, `envConfigOverride` in `src/init.cc`). With 1, the blocking child
/// of [`Communicator::init_rank`] would share the parent's resources and abort flag, and aborting
/// the parent after the split would abort the child: refused in [`CollectivesMode::Blocking`].
pub const SPLIT_SHARE_ENV: &str = "NCCL_COMM_SPLIT_SHARE_RESOURCES";

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

/// A new folder under the temporary directory that did not exist before this call, readable and
/// writable by this user only (mode 0700 on Unix): a name another user planted first is skipped,
/// never reused, so nobody else can swap the library link inside it.
fn fresh_private_dir() -> std::io::Result<PathBuf> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut last = None;
    for attempt in 0..16u32 {
        let dir = std::env::temp_dir().join(format!(
            "warpline-nccl-{}-{nanos:x}-{attempt}",
            std::process::id()
        ));
        let mut builder = std::fs::DirBuilder::new();
        #[cfg(unix)]
        std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
        match builder.create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no free folder name")))
}

/// For [`NCCL_LIB_ENV`]: a fresh private folder (under the temporary directory, see
/// `fresh_private_dir`) holding `libnccl.so`, a link to
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
    let dir = fresh_private_dir().map_err(|e| {
        bad(format!(
            "a folder under {}: {e}",
            std::env::temp_dir().display()
        ))
    })?;
    let link = dir.join("libnccl.so");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&lib, &link)
        .map_err(|e| bad(format!("link {} -> {}: {e}", link.display(), lib.display())))?;
    #[cfg(not(unix))]
    std::fs::copy(&lib, &link).map_err(|e| bad(format!("{}: {e}", link.display())))?;
    Ok(Some(dir))
}

/// Checks that NVLS (NVLink SHARP, NVLink multicast) is off for the communicators this process
/// makes: `NCCL_NVLS_ENABLE=0` in the environment, which NCCL reads at communicator creation.
/// Every constructor of this module calls it before NCCL does anything. warpline does not set the
/// variable itself from library code: writing the environment while another thread reads it is
/// undefined behaviour (`std::env::set_var`'s contract), and a library cannot know its threads.
/// Export it, or call [`disable_nvls_unless_set`] at the top of `main`, as the `warpline` CLI
/// does. Errors: [`Error::BadShape`] when the variable is unset or not `0` (NVLink multicast
/// must stay off on the shared machines, see `docs/multi-gpu.md`).
pub fn require_nvls_off() -> Result<()> {
    match std::env::var(NVLS_ENV) {
        Ok(v) if v == "0" => Ok(()),
        v => Err(Error::BadShape {
            what: "NCCL_NVLS_ENABLE",
            detail: format!(
                "{}; allowed: 0 (NVLink multicast stays off). Export NCCL_NVLS_ENABLE=0, or call \
                 the unsafe nccl::disable_nvls_unless_set at the top of main before any thread",
                match v {
                    Ok(v) => format!("set to `{v}`"),
                    Err(_) => "unset".to_string(),
                }
            ),
        }),
    }
}

/// Sets `NCCL_NVLS_ENABLE=0` in this process's environment unless it is set already, and
/// returns the value in effect (a user's value other than `0` is kept and reported on stderr;
/// [`require_nvls_off`] then refuses to make communicators). Child processes inherit it.
///
/// # Safety
/// No other thread reads or writes the process environment during the call
/// (`std::env::set_var`'s contract): call it at the top of `main`, before any thread starts.
pub unsafe fn disable_nvls_unless_set() -> String {
    match std::env::var(NVLS_ENV) {
        Ok(v) => {
            if v != "0" {
                eprintln!(
                    "warning: {NVLS_ENV}={v} was set by the user; warpline makes no NCCL \
                     communicator unless it is 0 (NVLink multicast must stay off on shared machines)"
                );
            }
            v
        }
        Err(_) => {
            // Under the caller's contract no other thread touches the environment now.
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
    /// [`Error::NcclUnavailable`], [`Error::BadShape`] unless `NCCL_NVLS_ENABLE=0`
    /// ([`require_nvls_off`]), [`Error::Nccl`].
    pub fn new() -> Result<Self> {
        library_available()?;
        require_nvls_off()?;
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
        if s.len() != 256 || !s.is_ascii() {
            return Err(bad(format!(
                "{} bytes{}; allowed: exactly 256 hex digits (128 bytes)",
                s.len(),
                if s.is_ascii() { "" } else { ", not all ASCII" }
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
/// `ncclCommAbort` after its stream has drained, every wait bounded by the communicator's
/// timeout (errors are kept for [`Device::take_deferred_errors`]).
pub struct Communicator {
    comm: cudarc::nccl::sys::ncclComm_t,
    stream: Stream,
    rank: usize,
    world: usize,
    ordinal: usize,
    /// Made with `blocking = 0` ([`Communicator::init_rank`]): calls may return `ncclInProgress`.
    nonblocking: bool,
    /// Bound of the `ncclInProgress` polls of a nonblocking communicator.
    timeout: Duration,
    /// Usable, timed out (work may never finish, so drop aborts first) or already aborted.
    health: Cell<Health>,
    /// The [`Communicator::init_all`] call that made it (a process-unique number), `None` for
    /// [`Communicator::init_rank`]: all ranks of such a set live in this process, so a group of the
    /// whole set can be checked (lengths, every rank once) before NCCL sees it.
    set_id: Option<u64>,
}

/// What happened to a [`Communicator`] so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Health {
    Usable,
    /// A bounded poll timed out: work of this communicator may never finish.
    TimedOut,
    /// `ncclCommAbort` was called (a cancelled group); the handle must not be used again.
    Aborted,
}

/// Numbers the sets made by [`Communicator::init_all`].
static NEXT_SET_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

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
        // Inside a task graph host callback no CUDA (or NCCL) call may be made and no GPU work
        // waited for (issue 19, item 9): the drain and abort run on a thread of their own (the
        // stream's drain may wait long; the reaper's other jobs do not wait for it). If no thread
        // can be spawned, the communicator is leaked rather than aborted here.
        if crate::device::in_host_callback() {
            let moved = Communicator {
                comm: self.comm,
                stream: self.stream.clone(),
                rank: self.rank,
                world: self.world,
                ordinal: self.ordinal,
                nonblocking: self.nonblocking,
                timeout: self.timeout,
                health: Cell::new(self.health.get()),
                set_id: self.set_id,
            };
            // ManuallyDrop: a closure that fails to spawn is dropped here, and must not drop
            // (abort) the communicator on this thread.
            let moved = std::mem::ManuallyDrop::new(moved);
            let spawned = std::thread::Builder::new()
                .name("warpline-nccl-drop".into())
                .spawn(move || drop(std::mem::ManuallyDrop::into_inner(moved)));
            if let Err(e) = spawned {
                let e = Error::Nccl {
                    call: "Communicator drop",
                    result: format!("no thread for a drop inside a host callback ({e}): leaked"),
                };
                defer_error(self.stream.ctx(), &e);
            }
            return;
        }
        // Drain the communicator's stream, then `ncclCommAbort` (as cudarc's own `Comm` does):
        // unlike `ncclCommDestroy`, abort never waits for the other ranks, so dropping the
        // communicators of one process one after another cannot hang. Nothing is pending by then.
        // Every wait is bounded by the communicator's timeout (issue 24): a stream that does not
        // drain in time may hold a collective waiting for a rank that is gone, so the
        // communicator is aborted (NCCL's kernels quit) and the stream drained again, bounded.
        // After a timed-out poll, abort first; after an abort (a cancelled group), only drain.
        let bound = self.timeout;
        let drain = |s: &Stream| {
            crate::ordering::synchronize_timeout(s, bound, crate::ordering::OnTimeout::Abandon)
        };
        let health = self.health.get();
        let synced = match health {
            Health::Usable => drain(&self.stream),
            Health::TimedOut | Health::Aborted => Err(Error::Nccl {
                call: "Communicator drop",
                result: "not drained before the abort".into(),
            }),
        };
        let mut result = Ok(());
        if health != Health::Aborted {
            let bound_ctx = bind_context(self.stream.ctx(), "ncclCommAbort");
            // SAFETY: live communicator (not aborted before), its stream drained, or the
            // communicator timed out, or the drain timed out (abort makes NCCL's kernels quit);
            // not used afterwards.
            let aborted = unsafe { raw::comm_abort(self.comm) };
            self.health.set(Health::Aborted);
            result = bound_ctx.and(aborted);
        }
        if synced.is_err() {
            result = result.and(drain(&self.stream));
        }
        if let Err(e) = result {
            defer_error(self.stream.ctx(), &e);
        }
    }
}

impl Communicator {
    /// One communicator per GPU of `set`, all in this process (`ncclCommInitAll`), rank `i` on
    /// GPU `i`, each bound to `streams[i]` (a stream of GPU `i`).
    ///
    /// Errors, before NCCL is called: [`Error::NcclUnavailable`], [`Error::LengthMismatch`]
    /// unless there is one stream per GPU, [`Error::WrongContext`] for a stream of another GPU,
    /// [`Error::BadShape`] unless `NCCL_NVLS_ENABLE=0` ([`require_nvls_off`]); then
    /// [`Error::Nccl`].
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
        require_nvls_off()?;
        let ordinals: Vec<i32> = set.devices().iter().map(|d| d.ordinal() as i32).collect();
        let comms = raw::comm_init_all(&ordinals)?;
        let set_id = NEXT_SET_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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
                nonblocking: false,
                timeout: DEFAULT_INIT_TIMEOUT,
                health: Cell::new(Health::Usable),
                set_id: Some(set_id),
            })
            .collect())
    }

    /// Rank `rank` of `world` on `dev`, bound to `stream` (a stream of `dev`), joining the
    /// communicator of `id`, waiting at most [`init_timeout`] (`WARPLINE_NCCL_INIT_TIMEOUT_S`,
    /// default 120 s) for every rank to join. See [`Communicator::init_rank_with_timeout`].
    ///
    /// Errors: those of [`init_timeout`] ([`Error::BadShape`] for a bad variable), then those of
    /// [`Communicator::init_rank_with_timeout`].
    pub fn init_rank(
        dev: &Device,
        stream: &Stream,
        rank: usize,
        world: usize,
        id: &NcclId,
    ) -> Result<Communicator> {
        let timeout = init_timeout()?;
        Self::init_rank_with_timeout(dev, stream, rank, world, id, timeout)
    }

    /// Rank `rank` of `world` on `dev`, bound to `stream` (a stream of `dev`), joining the
    /// communicator of `id`; never blocks longer than about `timeout`.
    ///
    /// NCCL API followed: `ncclCommInitRankConfig` with `NCCL_CONFIG_INITIALIZER`,
    /// `blocking = 0` (a nonblocking communicator) and `splitShare = 0`, then
    /// `ncclCommGetAsyncError` polled until the state is not `ncclInProgress` (NCCL user guide,
    /// "nonblocking communicators"); on timeout, `ncclCommAbort` (which stops the background init)
    /// and an error. Then, in [`CollectivesMode::Blocking`] (the default, [`COLLECTIVES_ENV`]),
    /// `ncclCommSplit` into a blocking child polled through the parent within the same bound
    /// (the parent is aborted afterwards; see the module docs), so collectives are enqueued by
    /// the calling thread. In [`CollectivesMode::Nonblocking`] the nonblocking communicator is
    /// kept, and its collectives that return `ncclInProgress` are polled the same way, with the
    /// same bound, so they return only when NCCL has enqueued them.
    ///
    /// Errors, before NCCL is called: [`Error::NcclUnavailable`], [`Error::BadShape`] for a bad
    /// [`COLLECTIVES_ENV`], unless `rank < world` and `timeout > 0`, when [`COMM_BLOCKING_ENV`]
    /// is set to 1 (NCCL would then ignore `blocking = 0` and could wait forever), when
    /// [`SPLIT_SHARE_ENV`] is 1 in blocking mode, or unless `NCCL_NVLS_ENABLE=0`
    /// ([`require_nvls_off`]), [`Error::WrongContext`]; then [`Error::NcclTimeout`]
    /// (communicators aborted), [`Error::Nccl`] (init or split failed; handles aborted).
    pub fn init_rank_with_timeout(
        dev: &Device,
        stream: &Stream,
        rank: usize,
        world: usize,
        id: &NcclId,
        timeout: Duration,
    ) -> Result<Communicator> {
        library_available()?;
        let mode = collectives_mode()?;
        if rank >= world || world > i32::MAX as usize || timeout.is_zero() {
            return Err(Error::BadShape {
                what: "Communicator::init_rank",
                detail: format!(
                    "rank {rank} of world {world}, timeout {timeout:?}; allowed: rank < world, \
                     timeout > 0"
                ),
            });
        }
        if stream.context_raw() != dev.raw_context() {
            return Err(Error::WrongContext {
                what: "Communicator::init_rank stream",
            });
        }
        let forced = std::env::var_os(COMM_BLOCKING_ENV).map(|v| v.to_string_lossy().into_owned());
        if comm_blocking_forced(forced.as_deref()) {
            return Err(Error::BadShape {
                what: "NCCL_COMM_BLOCKING",
                detail: format!(
                    "{:?}: NCCL would make the communicator blocking, and ncclCommInitRankConfig \
                     could then wait forever for a rank that never joins; allowed: unset or 0 \
                     (Communicator::init_rank bounds the wait itself, see \
                     {INIT_TIMEOUT_ENV})",
                    forced.unwrap_or_default()
                ),
            });
        }
        let share = std::env::var_os(SPLIT_SHARE_ENV).map(|v| v.to_string_lossy().into_owned());
        // NCCL parses it as it parses NCCL_COMM_BLOCKING (strtoll, base 0).
        if mode == CollectivesMode::Blocking && comm_blocking_forced(share.as_deref()) {
            return Err(Error::BadShape {
                what: "NCCL_COMM_SPLIT_SHARE_RESOURCES",
                detail: format!(
                    "{:?}: the blocking child communicator would share the parent's abort flag, \
                     and aborting the parent after the split would abort it; allowed: unset or \
                     0, or {COLLECTIVES_ENV}=nonblocking",
                    share.unwrap_or_default()
                ),
            });
        }
        require_nvls_off()?;
        dev.bind()?;
        let mut config = raw::config_initializer();
        config.blocking = 0;
        // The blocking child made from it must share nothing with it (see split_blocking).
        config.splitShare = 0;
        let since = Instant::now();
        let (comm, r) =
            raw::comm_init_rank_config(world as i32, id.raw(), rank as i32, &mut config);
        let abort = |comm: cudarc::nccl::sys::ncclComm_t| {
            if !comm.is_null() {
                // SAFETY: the handle NCCL returned, not used afterwards; its outcome cannot
                // change the error returned.
                let _ = unsafe { raw::comm_abort(comm) };
            }
        };
        let ready = r.and_then(|p| match p {
            raw::Progress::Done => Ok(()),
            raw::Progress::InProgress => poll_ready(
                comm,
                "ncclCommInitRankConfig",
                (rank, world),
                since,
                timeout,
                "the communicator was aborted (ncclCommAbort)",
            ),
        });
        if let Err(e) = ready {
            abort(comm);
            return Err(e);
        }
        let comm = match mode {
            CollectivesMode::Nonblocking => comm,
            CollectivesMode::Blocking => split_blocking(comm, (rank, world), since, timeout)?,
        };
        Ok(Communicator {
            comm,
            stream: stream.clone(),
            rank,
            world,
            ordinal: dev.ordinal(),
            nonblocking: mode == CollectivesMode::Nonblocking,
            timeout,
            health: Cell::new(Health::Usable),
            set_id: None,
        })
    }

    /// Whether the communicator is nonblocking ([`Communicator::init_rank`] with
    /// [`CollectivesMode::Nonblocking`]) rather than blocking ([`Communicator::init_all`], or
    /// `init_rank` in the default [`CollectivesMode::Blocking`]).
    pub fn is_nonblocking(&self) -> bool {
        self.nonblocking
    }

    /// After a call returned `ncclInProgress`: polls until the communicator is ready (bounded by
    /// the communicator's timeout; a timeout marks it so that drop aborts before draining).
    fn settle(&self, call: &'static str, p: raw::Progress) -> Result<()> {
        if p == raw::Progress::Done {
            return Ok(());
        }
        let r = poll_ready(
            self.comm,
            call,
            (self.rank, self.world),
            Instant::now(),
            self.timeout,
            "the communicator is left as it is and aborted when dropped; do not use it again",
        );
        if matches!(r, Err(Error::NcclTimeout { .. })) {
            self.health.set(Health::TimedOut);
        }
        r
    }

    /// Errors: [`Error::Nccl`] after a timeout, [`Error::NcclAborted`] after an abort.
    fn check_usable(&self, call: &'static str) -> Result<()> {
        match self.health.get() {
            Health::Usable => Ok(()),
            Health::TimedOut => Err(Error::Nccl {
                call,
                result: "the communicator timed out earlier (Error::NcclTimeout); drop it and \
                         create a new one"
                    .into(),
            }),
            Health::Aborted => Err(Error::NcclAborted {
                rank: self.rank,
                world: self.world,
                cause: format!("{call} refused: aborted earlier, after a cancelled group"),
            }),
        }
    }

    /// Waits for the communicator's stream (its collectives and whatever else was queued there),
    /// at most the communicator's bound ([`init_timeout`] for `init_rank`, [`DEFAULT_INIT_TIMEOUT`]
    /// for `init_all`). Only this stream is waited for, never the whole context (a caller's
    /// stream blocked on a fence stays blocked). An event recorded now is polled with
    /// `cuEventQuery`: yielding the thread for the first 64 polls, then sleeping 20 us doubling to
    /// 200 us (as [`Stream::synchronize`] does, so a timed loop that ends with it is not
    /// stretched), until the bound.
    /// Errors: [`Error::Timeout`] (the communicator is then marked timed out: drop aborts it
    /// before draining, and later collectives are refused), [`Error::Cuda`] /
    /// [`Error::ContextPoisoned`], [`Error::InHostCallback`].
    pub fn synchronize(&self) -> Result<()> {
        crate::device::refuse_in_host_callback("Communicator::synchronize")?;
        let marker = self.stream.record_marker()?;
        let since = Instant::now();
        let mut spins = 0u32;
        let mut nap = Duration::from_micros(20);
        while !marker.is_complete()? {
            let waited = since.elapsed();
            if waited >= self.timeout {
                if self.health.get() == Health::Usable {
                    self.health.set(Health::TimedOut);
                }
                return Err(Error::Timeout {
                    what: format!("{self:?}: its stream"),
                    waited,
                    pending: vec![
                        "a collective or earlier work on the communicator's stream (another \
                         rank may be gone)"
                            .into(),
                    ],
                    released: false,
                });
            }
            if spins < 64 {
                spins += 1;
                std::thread::yield_now();
            } else {
                std::thread::sleep(nap.min(self.timeout - waited));
                nap = (nap * 2).min(Duration::from_micros(200));
            }
        }
        Ok(())
    }

    /// Whether the communicator was aborted (a grouped collective was cancelled,
    /// [`all_reduce_sum_group`]); every later call returns [`Error::NcclAborted`].
    pub fn is_aborted(&self) -> bool {
        self.health.get() == Health::Aborted
    }

    /// `ncclCommAbort` now (unless done before) and marks the communicator unusable; the
    /// stream is left to drain in drop (bounded). Errors: [`Error::Nccl`].
    fn abort_now(&self) -> Result<()> {
        if self.health.replace(Health::Aborted) == Health::Aborted {
            return Ok(());
        }
        let bound = bind_context(self.stream.ctx(), "ncclCommAbort");
        // SAFETY: live communicator, aborted once (marked above), never used afterwards
        // (check_usable refuses every later call; drop only drains the stream).
        let aborted = unsafe { raw::comm_abort(self.comm) };
        bound.and(aborted)
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
    /// produced it). For communicators of [`Communicator::init_rank`] (one rank per process or
    /// thread). The ranks of an [`Communicator::init_all`] set (several GPUs, one
    /// process) go through [`all_reduce_sum_group`], which checks the whole set.
    /// On a nonblocking communicator ([`CollectivesMode::Nonblocking`]), `ncclInProgress` is
    /// polled away with `ncclCommGetAsyncError` before returning (bounded; see
    /// [`Communicator::init_rank`]).
    ///
    /// Errors: [`Error::BadShape`] for a rank of an `init_all` set of two or more (alone, the call
    /// would wait for the other ranks forever); [`Error::WrongStream`]; [`Error::Nccl`];
    /// [`Error::NcclTimeout`].
    ///
    /// # Safety
    /// Every rank of the communicator makes the same sequence of collectives, each with a buffer
    /// of the same length (NCCL API, "Collective operations": all ranks must call with the same
    /// count). NCCL cannot check this across processes: a rank whose buffer is longer than a
    /// peer's has that peer's buffer written past its end.
    pub unsafe fn all_reduce_sum(&self, buf: &mut DeviceBuffer<f32>) -> Result<()> {
        if self.set_id.is_some() && self.world > 1 {
            return Err(Error::BadShape {
                what: "Communicator::all_reduce_sum",
                detail: format!(
                    "rank {} of an init_all set of {} GPUs in this process; allowed: \
                     all_reduce_sum_group with every rank of the set (one call alone would wait \
                     for the other ranks forever)",
                    self.rank, self.world
                ),
            });
        }
        let p = self.all_reduce_sum_enqueue(buf)?;
        self.settle("ncclAllReduce", p)
    }

    /// `ncclAllReduce` without the `ncclInProgress` poll (a group polls after `ncclGroupEnd`).
    fn all_reduce_sum_enqueue(&self, buf: &mut DeviceBuffer<f32>) -> Result<raw::Progress> {
        self.check_usable("ncclAllReduce")?;
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

/// In-place sum of `bufs[i]` over the communicators `comms[i]`: every rank of one
/// [`Communicator::init_all`] set, each exactly once, driven by the calling thread. The per-GPU
/// calls go inside `ncclGroupStart` / `ncclGroupEnd` (without the group the first call would wait
/// for the others and the thread would deadlock). All ranks are here, so the lengths NCCL relies
/// on are checked, which makes this safe (unlike [`Communicator::all_reduce_sum`]).
/// Errors, before NCCL is called: [`Error::NcclUnavailable`], [`Error::Empty`],
/// [`Error::LengthMismatch`] (one buffer per communicator, equal lengths), [`Error::BadShape`]
/// unless `comms` is a whole `init_all` set with each rank once, [`Error::Nccl`] for a communicator
/// that timed out, [`Error::NcclAborted`] for one aborted before, [`Error::WrongStream`],
/// [`Error::ContextPoisoned`] / [`Error::Cuda`] for a rank whose context cannot be made current
/// (every rank is checked before `ncclGroupStart`); then [`Error::NcclAborted`] when a rank fails
/// inside the group or the group does not end cleanly: the group is cancelled rather than
/// launched without that rank, and every communicator of `comms` is aborted (`ncclCommAbort`)
/// and refuses later calls (drop them and make new ones).
pub fn all_reduce_sum_group(
    comms: &[Communicator],
    bufs: &mut [&mut DeviceBuffer<f32>],
) -> Result<()> {
    library_available()?;
    if comms.is_empty() {
        return Err(Error::Empty {
            what: "all_reduce_sum_group communicators",
        });
    }
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
    let set = comms[0].set_id;
    let mut seen = vec![false; comms[0].world];
    for c in comms {
        let fresh = c.rank < seen.len() && !std::mem::replace(&mut seen[c.rank], true);
        if set.is_none() || c.set_id != set || c.world != comms[0].world || !fresh {
            return Err(Error::BadShape {
                what: "all_reduce_sum_group communicators",
                detail: format!(
                    "{comms:?}; allowed: every rank of one Communicator::init_all set, each once \
                     (ranks of init_rank communicators go through Communicator::all_reduce_sum)"
                ),
            });
        }
    }
    if seen.iter().any(|&s| !s) {
        return Err(Error::BadShape {
            what: "all_reduce_sum_group communicators",
            detail: format!(
                "{} of the set's {} ranks; allowed: all of them (a missing rank would never join)",
                comms.len(),
                seen.len()
            ),
        });
    }
    // Every rank is checked before ncclGroupStart (issue 24): usable, its buffer on its stream,
    // its context healthy and bindable. A rank failing inside the group would otherwise leave
    // the other ranks' collectives to launch alone and wait forever for it.
    precheck_group(comms, bufs)?;
    raw::group_start()?;
    let mut failed = None;
    for (c, b) in comms.iter().zip(bufs.iter_mut()) {
        let r = match take_injected_fault(c) {
            Some(e) => Err(e),
            None => c.all_reduce_sum_enqueue(b).map(|_| ()),
        };
        if let Err(e) = r {
            failed = Some(e);
            break;
        }
    }
    if let Some(e) = failed {
        // Cancel the group: NCCL records the invalid call's error as the group's, and
        // ncclGroupEnd then discards every queued task instead of launching them.
        let _ = raw::poison_open_group();
        let ended = raw::group_end();
        let cause = match ended {
            Err(_) => format!("{e} (the group was cancelled before launch)"),
            Ok(_) => format!("{e} (ncclGroupEnd did not report the cancel)"),
        };
        return Err(abort_group(comms, cause));
    }
    // Inside a group the calls return ncclSuccess; ncclGroupEnd reports ncclInProgress when a
    // nonblocking communicator is still working: poll each of those (NCCL user guide).
    let settled = raw::group_end().and_then(|ended| {
        if ended == raw::Progress::InProgress {
            for c in comms.iter().filter(|c| c.nonblocking) {
                c.settle("ncclGroupEnd", raw::Progress::InProgress)?;
            }
        }
        Ok(())
    });
    // A failed or unsettled group end may have launched some ranks only: abort them all.
    settled.map_err(|e| abort_group(comms, e.to_string()))
}

/// The checks [`all_reduce_sum_group`] makes on every rank before `ncclGroupStart`: the
/// communicator is usable (not timed out or aborted), its buffer is bound to its stream, and its
/// context is healthy and can be made current. Errors: [`Error::Nccl`], [`Error::NcclAborted`],
/// [`Error::WrongStream`], [`Error::ContextPoisoned`], [`Error::Cuda`].
fn precheck_group(comms: &[Communicator], bufs: &[&mut DeviceBuffer<f32>]) -> Result<()> {
    for (c, b) in comms.iter().zip(bufs.iter()) {
        c.check_usable("ncclAllReduce")?;
        c.check_buffer(b)?;
        bind_context(c.stream.ctx(), "ncclAllReduce")?;
    }
    Ok(())
}

/// Aborts every communicator of a group that could not be launched whole and returns the error
/// of the first rank ([`Error::NcclAborted`] with `cause`, plus any abort failure).
fn abort_group(comms: &[Communicator], cause: String) -> Error {
    let mut failures = Vec::new();
    for c in comms {
        if let Err(e) = c.abort_now() {
            failures.push(format!("rank {}: {e}", c.rank));
        }
    }
    let cause = if failures.is_empty() {
        format!("{cause}; every communicator of the group was aborted")
    } else {
        format!(
            "{cause}; aborting the group failed for {}",
            failures.join(", ")
        )
    };
    Error::NcclAborted {
        rank: comms[0].rank,
        world: comms[0].world,
        cause,
    }
}

/// The fault [`inject_group_fault_once`] armed: (set, rank).
static INJECTED_FAULT: std::sync::Mutex<Option<(u64, usize)>> = std::sync::Mutex::new(None);

/// Test hook (issue 24): the next [`all_reduce_sum_group`] over `comm`'s `init_all` set fails
/// `comm`'s rank *inside* the group, after the pre-check passed and after the ranks before it
/// were queued, as a rank whose context got poisoned between the check and the launch would
/// ([`Error::ContextPoisoned`] from binding it). The group must then be cancelled and every
/// communicator aborted. Only for tests; a no-op for communicators of `init_rank`.
#[doc(hidden)]
pub fn inject_group_fault_once(comm: &Communicator) {
    if let Some(set) = comm.set_id {
        *INJECTED_FAULT.lock().unwrap_or_else(|p| p.into_inner()) = Some((set, comm.rank));
    }
}

/// The injected fault for `c`, once.
fn take_injected_fault(c: &Communicator) -> Option<Error> {
    let mut armed = INJECTED_FAULT.lock().unwrap_or_else(|p| p.into_inner());
    if c.set_id.is_some() && *armed == c.set_id.map(|s| (s, c.rank)) {
        *armed = None;
        return Some(Error::Nccl {
            call: "ncclAllReduce",
            result: format!(
                "fault injected for rank {} inside the group (as a context poisoned after the \
                 pre-check)",
                c.rank
            ),
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_link_folders_are_fresh_and_private() {
        let (a, b) = (fresh_private_dir().unwrap(), fresh_private_dir().unwrap());
        assert_ne!(a, b);
        #[cfg(unix)]
        for d in [&a, &b] {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(d).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "{}: {mode:o}", d.display());
        }
        for d in [a, b] {
            std::fs::remove_dir(d).unwrap();
        }
    }

    #[test]
    fn from_hex_refuses_non_ascii_of_the_right_byte_length() {
        // 254 ASCII digits and one 2-byte character: 256 bytes, slicing at 2k would split it.
        let s = format!("{}é", "0".repeat(254));
        assert_eq!(s.len(), 256);
        assert!(matches!(NcclId::from_hex(&s), Err(Error::BadShape { .. })));
        let id = NcclId([0xab; 128]);
        assert_eq!(NcclId::from_hex(&id.to_hex()).unwrap(), id);
    }

    #[test]
    fn an_empty_group_is_an_error_not_a_panic() {
        // Without NCCL: NcclUnavailable; with it: Empty. Never a panic inside cudarc.
        let e = all_reduce_sum_group(&[], &mut []).unwrap_err();
        assert!(
            matches!(e, Error::NcclUnavailable { .. } | Error::Empty { .. }),
            "{e:?}"
        );
    }

    #[test]
    fn init_timeout_parses_seconds_and_refuses_the_rest() {
        assert_eq!(parse_init_timeout(None).unwrap(), DEFAULT_INIT_TIMEOUT);
        assert_eq!(DEFAULT_INIT_TIMEOUT, Duration::from_secs(120));
        assert_eq!(
            parse_init_timeout(Some("300")).unwrap(),
            Duration::from_secs(300)
        );
        assert_eq!(
            parse_init_timeout(Some(" 0.5 ")).unwrap(),
            Duration::from_millis(500)
        );
        for bad in ["0", "-1", "abc", "", "nan", "inf", "1e12"] {
            match parse_init_timeout(Some(bad)) {
                Err(Error::BadShape { what, detail }) => {
                    assert_eq!(what, INIT_TIMEOUT_ENV);
                    assert!(detail.contains("allowed"), "{detail}");
                    assert!(!detail.contains("  "), "no run of spaces: {detail}");
                }
                r => panic!("{bad:?}: {r:?}"),
            }
        }
    }

    #[test]
    fn nccl_comm_blocking_is_read_as_strtoll_base_0_does() {
        for forced in ["1", " +1", "\t1", "0x1", "0X01", "01", "1abc", "1.5"] {
            assert!(comm_blocking_forced(Some(forced)), "{forced:?}");
        }
        for not in [
            "",
            "0",
            "2",
            "-1",
            "abc",
            "0x",
            "x1",
            "99999999999999999999",
            " 0",
        ] {
            assert!(!comm_blocking_forced(Some(not)), "{not:?}");
        }
        assert!(!comm_blocking_forced(None));
    }

    #[test]
    fn collectives_mode_defaults_to_blocking_and_refuses_other_words() {
        assert_eq!(
            parse_collectives_mode(None).unwrap(),
            CollectivesMode::Blocking
        );
        assert_eq!(CollectivesMode::default(), CollectivesMode::Blocking);
        assert_eq!(
            parse_collectives_mode(Some("blocking")).unwrap(),
            CollectivesMode::Blocking
        );
        assert_eq!(
            parse_collectives_mode(Some("\tNONBLOCKING\n")).unwrap(),
            CollectivesMode::Nonblocking
        );
        for bad in ["", "1", "block", "non-blocking", "async"] {
            match parse_collectives_mode(Some(bad)) {
                Err(Error::BadShape { what, detail }) => {
                    assert_eq!(what, COLLECTIVES_ENV);
                    assert!(detail.contains("allowed: blocking"), "{detail}");
                }
                r => panic!("{bad:?}: {r:?}"),
            }
        }
    }

    #[test]
    fn aborted_error_names_the_rank_and_what_to_do() {
        let e = Error::NcclAborted {
            rank: 1,
            world: 2,
            cause: "injected".into(),
        }
        .to_string();
        assert!(
            e.contains("rank 1 of 2") && e.contains("ncclCommAbort"),
            "{e}"
        );
        assert!(e.contains("allowed: drop it"), "{e}");
    }

    /// Every wait of the drop path is bounded: the source of `Drop for Communicator` and of
    /// `split_blocking`/`all_reduce_sum_group` has no unbounded stream or context wait.
    #[test]
    fn no_unbounded_wait_in_the_drop_path_or_the_group() {
        let src = include_str!("nccl.rs");
        let drop_body = &src[src.find("impl Drop for Communicator").unwrap()..][..src
            [src.find("impl Drop for Communicator").unwrap()..]
            .find("\nimpl Communicator {")
            .unwrap()];
        assert!(
            !drop_body.contains(".synchronize()"),
            "unbounded wait in drop"
        );
        assert!(drop_body.contains("synchronize_timeout"));
        let group = &src[src.find("pub fn all_reduce_sum_group").unwrap()..][..src
            [src.find("pub fn all_reduce_sum_group").unwrap()..]
            .find("\n}\n")
            .unwrap()];
        let pre = group.find("precheck_group(comms, bufs)?").unwrap();
        let start = group.find("raw::group_start()").unwrap();
        assert!(pre < start, "every rank is checked before ncclGroupStart");
    }

    #[test]
    fn timeout_error_says_what_timed_out_and_how_to_change_the_bound() {
        let e = Error::NcclTimeout {
            call: "ncclCommInitRankConfig",
            rank: 1,
            world: 2,
            waited: Duration::from_secs(120),
            action: "the communicator was aborted (ncclCommAbort)",
            env: INIT_TIMEOUT_ENV,
        }
        .to_string();
        assert!(
            e.contains("ncclCommInitRankConfig") && e.contains("rank 1 of 2"),
            "{e}"
        );
        assert!(
            e.contains(INIT_TIMEOUT_ENV) && e.contains("init_rank_with_timeout"),
            "{e}"
        );
    }
}
