//! Checks on the PTX module that need no GPU: it assembles for sm_90 with ptxas, and each kernel
//! uses the instructions its design rests on.

use warpline_suite::support::{assert_compiled_without_spills, entry_body, ptxas_report};

#[test]
fn module_assembles_for_sm_90_without_spills() {
    let report = ptxas_report();
    for kernel in warpline::device::ptx_entries(warpline::PTX) {
        assert_compiled_without_spills(&report, &kernel);
    }
}

#[test]
fn ws_vector_add_uses_cp_async_and_mbarriers() {
    let body = entry_body("ws_vector_add");
    for needle in [
        "cp.async.cg.shared.global",
        "cp.async.commit_group",
        "cp.async.wait_group",
        "mbarrier.init",
        "mbarrier.try_wait.parity",
        "mbarrier.arrive",
        "st.global.v4.f32",
        "ld.shared.v4.f32",
    ] {
        assert!(body.contains(needle), "ws_vector_add lacks `{needle}`");
    }
}
