//! NCCL wrappers (cudarc's `nccl` feature, loaded at run time): see [`super`]. Each function
//! wraps exactly one `nccl*` call of `cudarc::nccl::result` and names it in its error
//! ([`Error::Nccl`]). Callers must have checked [`crate::multi::nccl::library_available`] first:
//! cudarc panics when a call is made without the library.
//!
//! Sources: NCCL API, "Communicator Creation and Management Functions" (`ncclGetUniqueId`,
//! `ncclCommInitRank`, `ncclCommInitAll`, `ncclCommAbort`), "Collective Communication Functions" (`ncclAllReduce`), "Group
//! Calls" (`ncclGroupStart`, `ncclGroupEnd`).

use std::ffi::{c_int, c_void};

use cudarc::driver::sys as cu;
use cudarc::nccl::{result, sys};

use crate::error::{Error, Result};

fn nccl(call: &'static str, r: Result<result::NcclStatus, result::NcclError>) -> Result<()> {
    r.map(|_| ()).map_err(|e| Error::Nccl {
        call,
        result: format!("{:?}", e.0),
    })
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

/// `ncclCommInitRank` on the current device (make the rank's context current first).
pub(crate) fn comm_init_rank(
    nranks: c_int,
    id: sys::ncclUniqueId,
    rank: c_int,
) -> Result<sys::ncclComm_t> {
    let mut comm = std::ptr::null_mut();
    // SAFETY: valid out-pointer; rank < nranks is checked by the caller.
    nccl("ncclCommInitRank", unsafe {
        result::comm_init_rank(&mut comm, nranks, id, rank)
    })?;
    Ok(comm)
}

/// `ncclCommAbort`.
///
/// # Safety
/// `comm` is live and not used afterwards.
pub(crate) unsafe fn comm_abort(comm: sys::ncclComm_t) -> Result<()> {
    nccl("ncclCommAbort", result::comm_abort(comm))
}

/// `ncclAllReduce` of `count` f32 with `ncclSum`, enqueued on `stream`.
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
) -> Result<()> {
    nccl(
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

/// `ncclGroupEnd`.
pub(crate) fn group_end() -> Result<()> {
    nccl("ncclGroupEnd", result::group_end())
}
