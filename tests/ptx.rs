//! Checks on the PTX module that need no GPU: it assembles for sm_90 with ptxas, and each kernel
//! uses the instructions its design rests on.

use warpline_suite::support::{
    assert_compiled_without_spills, entry_body, ptxas_report, ptxas_report_sm90a,
};

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

// ------------------------------------------------------------------------------------------------
// Finding 12 (device part): PDL consumers read nothing the primary may write before the wait.
// ------------------------------------------------------------------------------------------------

/// Registers of a PTX `operand` list (`%rd8`, `[%rd12+4]`, `{%r1, %r2}` ...).
fn registers(operands: &str) -> Vec<&str> {
    operands
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '%' || c == '_'))
        .filter(|t| t.starts_with('%'))
        .collect()
}

/// The loads (any `ld` but `ld.param`, and `cp.async`/`prefetch` reads) in `body` textually before
/// the first `marker` whose address is derived from the kernel parameter `param` (the register
/// `ld.param` loads it into, and every register an instruction computes from a derived one).
/// Textual order is the order of the straight-line prologue the PTX emits before the marker.
fn param_loads_before(body: &str, param: &str, marker: &str) -> Vec<String> {
    let end = body
        .find(marker)
        .unwrap_or_else(|| panic!("`{marker}` not found in:\n{body}"));
    let mut derived: Vec<String> = Vec::new();
    let mut loads = Vec::new();
    for line in body[..end].lines() {
        let inst = line.trim().trim_end_matches(';');
        if inst.is_empty() || inst.starts_with("//") || inst.starts_with('.') {
            continue;
        }
        // Drop a predicate guard (`@%p1 ...`).
        let inst = if inst.starts_with('@') {
            inst.split_once(char::is_whitespace)
                .map_or("", |x| x.1)
                .trim()
        } else {
            inst
        };
        let Some((op, operands)) = inst.split_once(char::is_whitespace) else {
            continue;
        };
        if op.starts_with("ld.param") {
            if operands.contains(&format!("[{param}]")) {
                derived.extend(registers(operands).first().map(|r| r.to_string()));
            }
            continue;
        }
        let regs = registers(operands);
        let reads_derived = regs.iter().skip(1).any(|r| derived.iter().any(|d| d == r));
        let is_load =
            op.starts_with("ld.") || op.starts_with("cp.async") || op.starts_with("prefetch");
        if is_load {
            // The address is the bracketed operand.
            let addr = operands.split('[').nth(1).unwrap_or("");
            if registers(addr)
                .iter()
                .any(|r| derived.iter().any(|d| d == r))
            {
                loads.push(inst.to_string());
            }
        } else if reads_derived {
            if let Some(dst) = regs.first() {
                derived.push(dst.to_string());
            }
        }
    }
    loads
}

#[test]
fn finding_12_param_load_checker_sees_a_load_hoisted_above_the_wait() {
    // The old pdl_consumer prologue, as rustc emitted it: scale[first] loaded before the wait.
    let old = "\
        ld.param.b64 	%rd8, [pdl_consumer_param_1];
        cvta.to.global.u64 	%rd2, %rd8;
        mul.wide.u32 	%rd10, %r3, %r2;
        shl.b64 	%rd11, %rd10, 2;
        add.s64 	%rd12, %rd2, %rd11;
        @%p1 ld.global.b32 	%r5, [%rd12];
        griddepcontrol.wait;";
    let found = param_loads_before(old, "pdl_consumer_param_1", "griddepcontrol.wait");
    assert_eq!(found, ["ld.global.b32 \t%r5, [%rd12]"]);
    assert!(param_loads_before(old, "pdl_consumer_param_0", "griddepcontrol.wait").is_empty());
}

#[test]
fn finding_12_pdl_consumer_reads_no_global_memory_before_griddepcontrol_wait() {
    let body = entry_body(warpline_gpu::contract::pdl::CONSUMER_KERNEL);
    // Parameters: 0 buf (the producer's output), 1 scale (any previous kernel may write it),
    // 2 out, 3 n.
    for param in ["pdl_consumer_param_0", "pdl_consumer_param_1"] {
        let early = param_loads_before(body, param, "griddepcontrol.wait");
        assert!(
            early.is_empty(),
            "pdl_consumer loads from {param} before griddepcontrol.wait: {early:?}\n{body}"
        );
    }
    let prologue = &body[..body.find("griddepcontrol.wait").unwrap()];
    assert!(
        !prologue.contains("ld.global")
            && !prologue.contains("ld.b32")
            && !prologue.contains("ld.f32"),
        "pdl_consumer reads memory before griddepcontrol.wait:\n{prologue}"
    );
    // ... and it does read both after the wait.
    let after = &body[body.find("griddepcontrol.wait").unwrap()..];
    assert!(after.matches("ld.global").count() >= 2, "{after}");
}

#[test]
fn finding_12_every_pdl_kernel_that_waits_reads_its_dependent_inputs_after_the_wait() {
    use warpline_gpu::contract::pdl;
    // (kernel, parameters the previous kernel on the stream may write)
    for (kernel, params) in [
        (pdl::PRODUCER_KERNEL, &["param_0", "param_1"][..]),
        (pdl::CONSUMER_KERNEL, &["param_0", "param_1"][..]),
        (pdl::CHAIN_STEP_KERNEL, &["param_0"][..]),
        // secondary_gemm: A (= the primary's C) only; B is read before the wait by contract.
        (pdl::SECONDARY_GEMM_KERNEL, &["param_0"][..]),
    ] {
        let body = entry_body(kernel);
        for p in params {
            let param = format!("{kernel}_{p}");
            let early = param_loads_before(body, &param, "griddepcontrol.wait");
            assert!(
                early.is_empty(),
                "{kernel} reads {param} before the wait: {early:?}"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Issue 11: the sm_90a module (tensor-core GEMM) assembles for sm_90a with the instructions its
// design rests on, no wgmma serialization or register-count warnings, and no spills.
// ------------------------------------------------------------------------------------------------

#[test]
fn sm90a_module_has_wgmma_tma_and_setmaxnreg() {
    let ptx = warpline::SM90A_PTX;
    assert!(ptx.contains(".target sm_90a"), "the module is not sm_90a");
    for kernel in warpline::kernels::tc_gemm::ENTRIES {
        assert!(
            ptx.contains(&format!(".entry {kernel}(")),
            "{kernel} is not an entry of the sm_90a module"
        );
    }
    for needle in [
        "wgmma.mma_async",
        "cp.async.bulk.tensor",
        "setmaxnreg",
        "griddepcontrol.wait",
        "griddepcontrol.launch_dependents",
    ] {
        assert!(ptx.contains(needle), "the sm_90a module lacks `{needle}`");
    }
}

#[test]
fn sm90a_module_assembles_without_c75xx_warnings_or_spills() {
    let report = ptxas_report_sm90a();
    // C7508: setmaxnreg ignored (no register count at entry); C7510/C7515: wgmma serialized
    // (accumulator registers moved between issue and wait); C7511: wgmma serialized for lack of
    // registers.
    for code in ["C7508", "C7510", "C7511", "C7515"] {
        assert!(
            !report.contains(code),
            "ptxas -arch=sm_90a warns {code}:\n{report}"
        );
    }
    for kernel in warpline::kernels::tc_gemm::ENTRIES {
        let at = report
            .find(&format!("Compiling entry function '{kernel}' for 'sm_90a'"))
            .unwrap_or_else(|| panic!("{kernel} not compiled:\n{report}"));
        let rest = &report[at..];
        let end = rest[1..]
            .find("Compiling entry")
            .map_or(rest.len(), |i| i + 1);
        let section = &rest[..end];
        let spill = section
            .lines()
            .find(|l| l.contains("spill stores"))
            .unwrap_or_else(|| panic!("no spill line for {kernel}:\n{section}"));
        assert!(
            spill.contains(" 0 bytes spill stores") && spill.contains(" 0 bytes spill loads"),
            "{kernel} spills: {spill}"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// Issue 20: the decode GEMM entries (sm_90 module) stream the weights with 16-byte L1-bypassing
// read-only loads into warp MMAs, read the tokens (A) and C only after griddepcontrol.wait, and
// may read the weights (B) before it (the PDL prefetch, under `weights_early`).
// ------------------------------------------------------------------------------------------------

#[test]
fn issue20_decode_gemm_entries_use_mma_and_read_a_and_c_after_the_wait() {
    for v in warpline_gpu::contract::decode_gemm::VARIANTS {
        let body = entry_body(v.kernel);
        let mma = if v.bf16 {
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"
        } else {
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
        };
        assert!(body.contains(mma), "{}: no {mma}", v.kernel);
        assert!(
            body.contains("ld.global.nc.L1::no_allocate.v4.b32"),
            "{}: weights not streamed with 16-byte no-allocate loads",
            v.kernel
        );
        assert!(
            body.contains("griddepcontrol.launch_dependents"),
            "{}",
            v.kernel
        );
        for p in ["param_0", "param_2"] {
            let param = format!("{}_{p}", v.kernel);
            let early = param_loads_before(body, &param, "griddepcontrol.wait");
            assert!(
                early.is_empty(),
                "{} reads {param} before the wait: {early:?}",
                v.kernel
            );
        }
        let b = format!("{}_param_1", v.kernel);
        assert!(
            !param_loads_before(body, &b, "griddepcontrol.wait").is_empty(),
            "{}: no weight load before the wait (the weights_early path)",
            v.kernel
        );
    }
}

// ------------------------------------------------------------------------------------------------
// Issue 21: the decode step's kernels touch what the previous kernel writes only after
// `griddepcontrol.wait`, and write nothing before it (stamps use `red`, not `st`).
// ------------------------------------------------------------------------------------------------

#[test]
fn issue21_decode_step_kernels_read_dependent_inputs_after_the_wait() {
    use warpline_gpu::contract::{decode_gemm as gc, decode_step as sc};
    // (kernel, parameters the previous kernel may write, parameters read only by prefetch
    // before the wait)
    let mut cases: Vec<(&str, Vec<&str>, Vec<&str>)> = vec![
        (sc::RMSNORM_KERNEL, vec!["param_0"], vec![]),
        (sc::COMBINE_KERNEL, vec!["param_0", "param_1"], vec![]),
    ];
    for v in gc::EPI_VARIANTS {
        // A, C and the epilogue block (whose K/V caches the attention reads).
        cases.push((v.kernel, vec!["param_0", "param_2", "param_15"], vec![]));
    }
    for v in sc::ATTN_VARIANTS {
        // q; the caches only through cp.async.bulk.prefetch.L2 before the wait.
        cases.push((v.kernel, vec!["param_0"], vec!["param_1", "param_2"]));
    }
    for (kernel, dependent, prefetched) in cases {
        let body = entry_body(kernel);
        let wait = body
            .find("griddepcontrol.wait")
            .unwrap_or_else(|| panic!("{kernel}: no griddepcontrol.wait"));
        assert!(
            body.contains("griddepcontrol.launch_dependents"),
            "{kernel}: no launch_dependents"
        );
        assert!(
            !body[..wait].contains("st.global"),
            "{kernel} stores to global memory before the wait"
        );
        for p in dependent {
            let param = format!("{kernel}_{p}");
            let early = param_loads_before(body, &param, "griddepcontrol.wait");
            assert!(
                early.is_empty(),
                "{kernel} reads {param} before the wait: {early:?}"
            );
        }
        if kernel.starts_with("decode_gemm") {
            let b = format!("{kernel}_param_1");
            assert!(
                !param_loads_before(body, &b, "griddepcontrol.wait").is_empty(),
                "{kernel}: no weight loads before the wait (the checker saw none)"
            );
        }
        for p in prefetched {
            let param = format!("{kernel}_{p}");
            let early = param_loads_before(body, &param, "griddepcontrol.wait");
            assert!(!early.is_empty(), "{kernel}: no prefetch of {param} seen");
            for inst in early {
                assert!(
                    inst.starts_with("cp.async.bulk.prefetch.L2"),
                    "{kernel} reads {param} before the wait other than by an L2 prefetch: {inst}"
                );
            }
        }
    }
}
