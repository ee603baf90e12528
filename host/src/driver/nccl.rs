//! NCCL wrappers (cudarc's `nccl` feature, loaded at run time): see [`super`]. Each function
//! wraps exactly one `nccl*` call of `cudarc::nccl::result` and names it in its error
//! ([`Error::Nccl`]). Callers must have checked [`crate::multi::nccl::library_available`] first:
//! cudarc panics when a call is made without the library.
//!
//! Sources: NCCL API, "Communicator Creation and Management Functions" (`ncclGetUniqueId`,
//! `ncclCommInitRankConfig`, `ncclCommInitAll`, `ncclCommGetAsyncError`,
//! `ncclCommAbort`), "Collective Communication Functions" (`ncclAllReduce`), "Group Calls"
//! (`ncclGroupStart`, `ncclGroupEnd`), "Types" (`ncclConfig_t`, `NCCL_CONFIG_INITIALIZER`), and
//! the user guide's "Communicator Creation and Destruction / nonblocking" section: with
//! `blocking = 0` a call may return `ncclInProgress`, and the caller polls
//! `ncclCommGetAsyncError` until the state is no longer `ncclInProgress` before using the
//! communicator again.

use std::ffi::{c_int, c_uint, c_void};

use cudarc::driver::sys as cu;
use cudarc::nccl::{result, sys};

use crate::error::{Error, Result};

fn nccl(call: &'static str, r: Result<result::NcclStatus, result::NcclError>) -> Result<()> {
    r.map(|_| ()).map_err(|e| Error::Nccl {
        call,
        result: format!("{:?}", e.0),
    })
}

/// Whether an NCCL call finished (`ncclSuccess`) or, on a nonblocking communicator, is still
/// running in the background (`ncclInProgress`; poll [`comm_get_async_error`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    /// `ncclSuccess`.
    Done,
    /// `ncclInProgress`.
    InProgress,
}

fn nccl_progress(
    call: &'static str,
    r: Result<result::NcclStatus, result::NcclError>,
) -> Result<Progress> {
    match r {
        Ok(result::NcclStatus::InProgress) => Ok(Progress::InProgress),
        Ok(_) => Ok(Progress::Done),
        Err(e) => Err(Error::Nccl {
            call,
            result: format!("{:?}", e.0),
        }),
    }
}

/// `NCCL_VERSION(X, Y, Z)` of `nccl.h` (2.8 and older: `X*1000 + Y*100 + Z`; newer:
/// `X*10000 + Y*100 + Z`), e.g. 22803 for 2.28.3.
pub(crate) const fn nccl_version_code(major: u32, minor: u32, patch: u32) -> u32 {
    if major <= 2 && minor <= 8 {
        major * 1000 + minor * 100 + patch
    } else {
        major * 10000 + minor * 100 + patch
    }
}

/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`): "not set, use NCCL's default".
pub(crate) const CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// The `magic` of `NCCL_CONFIG_INITIALIZER`.
pub(crate) const CONFIG_MAGIC: c_uint = 0xcafe_beef;

/// The `version` of `NCCL_CONFIG_INITIALIZER` for the layout of cudarc's `ncclConfig_t`.
///
/// cudarc 0.19.10 with feature `nccl-02030` (what `nccl` selects) aliases `ncclConfig_t` to
/// `ncclConfig_v22800` with the fields of NCCL 2.30.0-2.30.4's `nccl.h` (up to `maxP2pPeers`;
/// 2.30.5+ appends `graphStreamOrdering`). NCCL reads `min(config.size, its own sizeof)` bytes
/// and fills the fields of releases newer than `version` with its defaults
/// (`parseCommConfig` in `src/init.cc`), so this layout with `version` 2.30.3 is what that
/// header's initializer produces, and it is read correctly by the 2.28.3 library (which copies
/// its first 80 bytes: every field it knows) as well as by 2.30.x.
pub(crate) const CONFIG_VERSION: c_uint = nccl_version_code(2, 30, 3);

/// `ncclConfig_t config = NCCL_CONFIG_INITIALIZER;` for cudarc's layout: `size` =
/// `sizeof(ncclConfig_t)`, `magic` = 0xcafebeef, `version` = [`CONFIG_VERSION`], every `int`
/// attribute `NCCL_CONFIG_UNDEF_INT`, every pointer `NCCL_CONFIG_UNDEF_PTR` (null).
///
/// The struct literal names every field, so a cudarc update that changes the layout fails to
/// compile here instead of passing NCCL a wrong `size`/`version`.
pub(crate) fn config_initializer() -> sys::ncclConfig_t {
    let u = CONFIG_UNDEF_INT;
    sys::ncclConfig_t {
        size: std::mem::size_of::<sys::ncclConfig_t>(),
        magic: CONFIG_MAGIC,
        version: CONFIG_VERSION,
        blocking: u,
        cgaClusterSize: u,
        minCTAs: u,
        maxCTAs: u,
        netName: std::ptr::null(),
        splitShare: u,
        trafficClass: u,
        commName: std::ptr::null(),
        collnetEnable: u,
        CTAPolicy: u,
        shrinkShare: u,
        nvlsCTAs: u,
        nChannelsPerNetPeer: u,
        nvlinkCentricSched: u,
        graphUsageMode: u,
        numRmaCtx: u,
        maxP2pPeers: u,
    }
}

/// `ncclGetVersion` (e.g. 22803 for 2.28.3).
pub(crate) fn get_version() -> Result<i32> {
    result::get_nccl_version().map_err(|e| Error::Nccl {
        call: "ncclGetVersion",
        result: format!("{:?}", e.0),
    })
}

/// `ncclGetUniqueId`: the 128-byte id rank 0 hands to every rank of a new communicator.
pub(crate) fn get_unique_id() -> Result<sys::ncclUniqueId> {
    result::get_uniqueid().map_err(|e| Error::Nccl {
        call: "ncclGetUniqueId",
        result: format!("{:?}", e.0),
    })
}

/// `ncclCommInitAll`: one communicator per device of `ordinals`, all in this process.
pub(crate) fn comm_init_all(ordinals: &[c_int]) -> Result<Vec<sys::ncclComm_t>> {
    let mut comms = vec![std::ptr::null_mut(); ordinals.len()];
    // SAFETY: `comms` has one slot per ordinal; the ordinals are valid devices (checked by the
    // caller, which opened them).
    nccl("ncclCommInitAll", unsafe {
        result::comm_init_all(
            comms.as_mut_ptr(),
            ordinals.len() as c_int,
            ordinals.as_ptr(),
        )
    })?;
    Ok(comms)
}

/// `ncclCommInitRankConfig` on the current device (make the rank's context current first).
/// Returns the handle NCCL wrote (possibly non-null even on error: abort it) and the call's
/// outcome; with `config.blocking == 0` a successful call is usually
/// [`Progress::InProgress`] and the caller polls [`comm_get_async_error`].
pub(crate) fn comm_init_rank_config(
    nranks: c_int,
    id: sys::ncclUniqueId,
    rank: c_int,
    config: &mut sys::ncclConfig_t,
) -> (sys::ncclComm_t, Result<Progress>) {
    let mut comm = std::ptr::null_mut();
    // SAFETY: valid out-pointer; `config` is a live, initialised `ncclConfig_t` (see
    // `config_initializer`), read during the call only; rank < nranks is checked by the caller.
    let r = unsafe { result::comm_init_rank_config(&mut comm, nranks, id, rank, config) };
    (comm, nccl_progress("ncclCommInitRankConfig", r))
}

/// `ncclCommGetAsyncError`: the communicator's state (`ncclSuccess`, `ncclInProgress`, or the
/// error of a background operation). The call's own failure is [`Error::Nccl`].
///
/// # Safety
/// `comm` is a live communicator (not aborted).
pub(crate) unsafe fn comm_get_async_error(comm: sys::ncclComm_t) -> Result<sys::ncclResult_t> {
    let mut state = sys::ncclResult_t::ncclSuccess;
    nccl(
        "ncclCommGetAsyncError",
        sys::ncclCommGetAsyncError(comm, &mut state).result(),
    )?;
    Ok(state)
}

/// `ncclCommAbort`.
///
/// # Safety
/// `comm` is live and not used afterwards.
pub(crate) unsafe fn comm_abort(comm: sys::ncclComm_t) -> Result<()> {
    nccl("ncclCommAbort", result::comm_abort(comm))
}

/// `ncclCommSplit(parent, color, key, newcomm, config)` (NCCL API, "Communicator Creation and
/// Management Functions"). The split is a job of the *parent*: on a nonblocking parent it runs on
/// NCCL's helper thread and returns [`Progress::InProgress`]; poll the parent with
/// [`comm_get_async_error`]. NCCL stores the child's handle into `*newcomm` (an atomic release
/// store) when the job ends, so `newcomm` must stay valid until then (`ncclCommInitRankFunc` in
/// `src/init.cc`); it is NULL until the split has fully completed.
///
/// # Safety
/// `parent` is live and ready (not `ncclInProgress`); `newcomm` points at a slot that outlives
/// the split job (leak it if the job may still run); `config` is a live, initialised
/// `ncclConfig_t` (see [`config_initializer`]).
pub(crate) unsafe fn comm_split(
    parent: sys::ncclComm_t,
    color: c_int,
    key: c_int,
    newcomm: *mut sys::ncclComm_t,
    config: &mut sys::ncclConfig_t,
) -> Result<Progress> {
    nccl_progress(
        "ncclCommSplit",
        sys::ncclCommSplit(parent, color, key, newcomm, config).result(),
    )
}

/// `ncclAllReduce` with a NULL communicator, inside a group only: NCCL's argument check
/// (`CommCheck` in `ncclEnqueueCheck`) fails with `ncclInvalidArgument` and records the error as
/// the group's (`ncclGroupErrCheck`), so the following `ncclGroupEnd` returns it and discards
/// every task queued in the group instead of launching them (`ncclGroupEndInternal` in
/// `src/group.cc`). This is how a group that warpline cannot complete for every rank is
/// cancelled rather than launched with a rank missing. Returns what NCCL returned (an error).
pub(crate) fn poison_open_group() -> Result<Progress> {
    // SAFETY: NCCL checks the NULL communicator before it touches any pointer.
    nccl_progress("ncclAllReduce (group cancel)", unsafe {
        result::all_reduce(
            std::ptr::null(),
            std::ptr::null_mut(),
            0,
            sys::ncclDataType_t::ncclFloat32,
            sys::ncclRedOp_t::ncclSum,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    })
}

/// `ncclAllReduce` of `count` f32 with `ncclSum`, enqueued on `stream` ([`Progress::InProgress`]
/// only on a nonblocking communicator).
///
/// # Safety
/// `send` and `recv` hold `count` f32 of the communicator's device (they may be equal: in
/// place), live until the operation completes on `stream`; `comm` is live; when one thread
/// drives several communicators, the calls are inside `ncclGroupStart`/`ncclGroupEnd`.
pub(crate) unsafe fn all_reduce_sum_f32(
    send: cu::CUdeviceptr,
    recv: cu::CUdeviceptr,
    count: usize,
    comm: sys::ncclComm_t,
    stream: cu::CUstream,
) -> Result<Progress> {
    nccl_progress(
        "ncclAllReduce",
        result::all_reduce(
            send as *const c_void,
            recv as *mut c_void,
            count,
            sys::ncclDataType_t::ncclFloat32,
            sys::ncclRedOp_t::ncclSum,
            comm,
            stream as sys::cudaStream_t,
        ),
    )
}

/// `ncclGroupStart`.
pub(crate) fn group_start() -> Result<()> {
    nccl("ncclGroupStart", result::group_start())
}

/// `ncclGroupEnd` ([`Progress::InProgress`] when a nonblocking communicator of the group is
/// still working: poll each with [`comm_get_async_error`]).
pub(crate) fn group_end() -> Result<Progress> {
    nccl_progress("ncclGroupEnd", result::group_end())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn version_code_follows_the_nccl_h_macro() {
        assert_eq!(nccl_version_code(2, 28, 3), 22803);
        assert_eq!(nccl_version_code(2, 30, 3), 23003);
        assert_eq!(nccl_version_code(2, 8, 4), 2804);
        assert_eq!(CONFIG_VERSION, 23003);
    }

    #[test]
    fn config_initializer_matches_nccl_config_initializer() {
        let c = config_initializer();
        // size_t, 2 x unsigned, 4 x int, ptr, 2 x int, ptr, 9 x int, padded to 8: 96 bytes (LP64).
        assert_eq!(c.size, size_of::<sys::ncclConfig_t>());
        assert_eq!(c.size, 96);
        assert_eq!(c.magic, 0xcafe_beef);
        assert_eq!(c.version, 23003);
        assert!(c.netName.is_null() && c.commName.is_null());
        let ints = [
            c.blocking,
            c.cgaClusterSize,
            c.minCTAs,
            c.maxCTAs,
            c.splitShare,
            c.trafficClass,
            c.collnetEnable,
            c.CTAPolicy,
            c.shrinkShare,
            c.nvlsCTAs,
            c.nChannelsPerNetPeer,
            c.nvlinkCentricSched,
            c.graphUsageMode,
            c.numRmaCtx,
            c.maxP2pPeers,
        ];
        assert!(ints.iter().all(|&v| v == i32::MIN), "{ints:?}");
        // The prefix NCCL 2.28.3's ncclConfig_v22800 reads (80 bytes) has its offsets.
        assert_eq!(offset_of!(sys::ncclConfig_t, magic), 8);
        assert_eq!(offset_of!(sys::ncclConfig_t, version), 12);
        assert_eq!(offset_of!(sys::ncclConfig_t, blocking), 16);
        assert_eq!(offset_of!(sys::ncclConfig_t, netName), 32);
        assert_eq!(offset_of!(sys::ncclConfig_t, splitShare), 40);
        assert_eq!(offset_of!(sys::ncclConfig_t, commName), 48);
        assert_eq!(offset_of!(sys::ncclConfig_t, nvlinkCentricSched), 76);
        assert_eq!(offset_of!(sys::ncclConfig_t, maxP2pPeers), 88);
    }
}
