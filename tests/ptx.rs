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
// Issue 22, items 5, 7, 8 and "3-D TMA": the sm_90a module's new entries carry the instructions
// they exist for (rank-3..5 TMA loads, stores, multicast loads, the tensor and L2 prefetches, the
// math functions and 8-byte stores), ptxas assembles them without spills, and every setmaxnreg
// entry starts with the register count `warpline_device::entry_registers` assumes (what the
// const check of `launch_bounds!(.., setmaxnreg = [..])` rests on).
// ------------------------------------------------------------------------------------------------

/// The text of entry `name` of the sm_90a module, up to the next entry.
fn sm90a_entry(name: &str) -> &'static str {
    let ptx = warpline::SM90A_PTX;
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("{name} is not an entry of the sm_90a module"));
    let rest = &ptx[start..];
    let end = rest[1..].find(".entry ").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

/// ptxas's report section of `kernel` (sm_90a).
fn sm90a_section<'r>(report: &'r str, kernel: &str) -> &'r str {
    section(report, kernel, "sm_90a")
}

/// ptxas's report section of `kernel` compiled for `arch`.
fn section<'r>(report: &'r str, kernel: &str, arch: &str) -> &'r str {
    let at = report
        .find(&format!("Compiling entry function '{kernel}' for '{arch}'"))
        .unwrap_or_else(|| panic!("{kernel} not compiled for {arch}:\n{report}"));
    let rest = &report[at..];
    let end = rest[1..]
        .find("Compiling entry")
        .map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

/// Registers ptxas gives the kernel of a report `section` (its "Used N registers" line).
fn used_registers(section: &str) -> u32 {
    section
        .lines()
        .find_map(|l| {
            let i = l.find("Used ")?;
            let rest = &l[i + 5..];
            rest[..rest.find(' ')?].parse::<u32>().ok()
        })
        .unwrap_or_else(|| panic!("no register line in:\n{section}"))
}

#[test]
fn issue22_sm90a_entries_carry_the_new_instructions() {
    use warpline_gpu::contract::device_check as dc;
    for (i, rank) in ["3d", "4d", "5d"].iter().enumerate() {
        let plain = sm90a_entry(dc::COPY_KERNELS[i]);
        for needle in [
            format!(
                "cp.async.bulk.tensor.{rank}.shared::cluster.global.mbarrier::complete_tx::bytes ["
            ),
            format!("cp.async.bulk.tensor.{rank}.global.shared::cta.bulk_group"),
            format!("cp.async.bulk.prefetch.tensor.{rank}.L2.global.tile"),
            "cp.async.bulk.prefetch.L2.global".to_string(),
        ] {
            assert!(
                plain.contains(&needle),
                "{} lacks `{needle}`",
                dc::COPY_KERNELS[i]
            );
        }
        let mc = sm90a_entry(dc::COPY_MULTICAST_KERNELS[i]);
        let needle = format!(
            "cp.async.bulk.tensor.{rank}.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        );
        assert!(
            mc.contains(&needle),
            "{} lacks `{needle}`",
            dc::COPY_MULTICAST_KERNELS[i]
        );
    }
    let math = sm90a_entry(dc::MATH_KERNEL);
    for needle in [
        "sqrt.rn.f32",
        "sqrt.approx.ftz.f32",
        "rsqrt.approx.ftz.f32",
        "tanh.approx.f32",
        "ex2.approx.ftz.f32",
        "lg2.approx.ftz.f32",
        "sin.approx.ftz.f32",
        "cos.approx.ftz.f32",
        "st.global.v2.f32",
        "st.global.b64",
    ] {
        assert!(math.contains(needle), "math_check lacks `{needle}`");
    }
    let gemm = sm90a_entry(warpline_gpu::contract::batched_gemm::KERNEL);
    for needle in [
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes",
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16",
        "setmaxnreg.inc.sync.aligned.u32 232",
        "setmaxnreg.dec.sync.aligned.u32 40",
        ".maxntid 384, 1, 1",
    ] {
        assert!(gemm.contains(needle), "batched_gemm_bf16 lacks `{needle}`");
    }
    // One CTA, no cluster: no cluster barrier, no remote (mapa) release.
    for absent in ["barrier.cluster", "mapa"] {
        assert!(!gemm.contains(absent), "batched_gemm_bf16 uses `{absent}`");
    }
}

/// Issue 20: each swap-AB entry issues its own wgmma shape (`m64n{NT}k16`, weights as A,
/// tokens as B, both K-major), loads by TMA, reduces over the cluster (`mapa` +
/// `ld.shared::cluster`, between cluster barriers), keeps the PDL contract (a wait, a trigger)
/// and does not spill.
#[test]
fn issue20_swap_ab_entries_use_wgmma_tma_and_dsmem_without_spills() {
    use warpline_gpu::contract::swap_ab_gemm as c;
    let report = ptxas_report_sm90a();
    for (name, nt) in c::KERNELS.iter().zip(c::TOKEN_TILES) {
        let ptx = sm90a_entry(name);
        for needle in [
            format!("wgmma.mma_async.sync.aligned.m64n{nt}k16.f32.bf16.bf16"),
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes".into(),
            "mapa.shared::cluster.u32".into(),
            "ld.shared::cluster.v4.f32".into(),
            "barrier.cluster.arrive.release".into(),
            "griddepcontrol.wait".into(),
            "griddepcontrol.launch_dependents".into(),
            format!(".maxntid {}, 1, 1", c::THREADS_PER_CTA),
            // The fused RMSNorm's per-tile sums of squares (FLAG_NORM_OUT).
            "shfl.sync.bfly.b32".into(),
        ] {
            assert!(ptx.contains(&needle), "{name} lacks `{needle}`");
        }
        let section = sm90a_section(&report, name);
        let spill = section
            .lines()
            .find(|l| l.contains("spill stores"))
            .unwrap_or_else(|| panic!("no spill line for {name}:\n{section}"));
        assert!(
            spill.contains(" 0 bytes spill stores") && spill.contains(" 0 bytes spill loads"),
            "{name} spills: {spill}"
        );
    }
}

#[test]
fn issue22_setmaxnreg_entries_start_with_entry_registers_and_do_not_spill() {
    let report = ptxas_report_sm90a();
    let expected = warpline_device::entry_registers(384, 1);
    assert_eq!(expected, 168);
    let mut kernels: Vec<&str> = warpline::kernels::tc_gemm::ENTRIES.to_vec();
    kernels.push(warpline_gpu::contract::batched_gemm::KERNEL);
    for kernel in kernels {
        let regs = used_registers(sm90a_section(&report, kernel));
        assert_eq!(
            regs, expected,
            "{kernel}: ptxas gives {regs} registers at entry; the setmaxnreg budgets assume {expected}"
        );
    }
    for kernel in warpline_gpu::contract::device_check::COPY_KERNELS
        .iter()
        .chain(warpline_gpu::contract::device_check::COPY_MULTICAST_KERNELS.iter())
        .chain([warpline_gpu::contract::batched_gemm::KERNEL, "math_check"].iter())
    {
        let section = sm90a_section(&report, kernel);
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
// Issue 21: the decode step's kernels touch what the previous kernel writes only after
// `griddepcontrol.wait`, and write nothing before it (stamps use `red`, not `st`).
// ------------------------------------------------------------------------------------------------

#[test]
fn issue21_decode_step_kernels_read_dependent_inputs_after_the_wait() {
    use warpline_gpu::contract::{decode_gemm as gc, decode_step as sc};
    // (kernel, parameters the previous kernel may write, parameters read only by prefetch
    // before the wait)
    let mut cases: Vec<(&str, Vec<&str>, Vec<&str>)> =
        vec![(sc::RMSNORM_KERNEL, vec!["param_0"], vec![])];
    for v in gc::EPI_VARIANTS {
        // A, C and the epilogue block (whose K/V caches the attention reads).
        cases.push((v.kernel, vec!["param_0", "param_2", "param_15"], vec![]));
    }
    for v in sc::ATTN_VARIANTS {
        // q. The caches are read by the loader's bulk copies, the chunks of earlier tokens
        // possibly before its wait (by design: no kernel of the step writes them); the chunk of
        // the new token's row after it, which tests/decode_step.rs checks on the GPU (variants
        // c and e against the reference, lengths at page and chunk boundaries).
        cases.push((v.kernel, vec!["param_0"], vec![]));
        let body = entry_body(v.kernel);
        assert!(
            body.contains("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"),
            "{}: no bulk copy of the KV ring",
            v.kernel
        );
        // The tensor-core form: the same contract, its ring filled by TMA through the KV
        // tensor maps, its products on `mma.sync` fed by `ldmatrix`.
        cases.push((v.tc_kernel, vec!["param_0"], vec![]));
        let body = entry_body(v.tc_kernel);
        for needle in [
            "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes",
            "prefetch.tensormap",
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
            "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32",
        ] {
            assert!(body.contains(needle), "{}: no {needle}", v.tc_kernel);
        }
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

// ------------------------------------------------------------------------------------------------
// Issue 22, the H100 hang of `tma_copy_rank3_multicast`: rustc's `asm!` is not `convergent`, and
// LLVM had copied the `.aligned` cluster barrier after the kernel's `if tid == 0 { init }` into
// both arms of that branch (three `barrier.cluster.arrive` for two calls; lane 0 and lanes 1..31
// at different `.aligned` barriers: undefined, and a hang). `cluster::sync_cluster` is now the
// per-thread form, which stays correct wherever the compiler copies it.
// ------------------------------------------------------------------------------------------------

#[test]
fn issue22_cluster_barriers_are_per_thread() {
    for (module, ptx) in [("sm_90", warpline::PTX), ("sm_90a", warpline::SM90A_PTX)] {
        for aligned in [
            "barrier.cluster.arrive.aligned",
            "barrier.cluster.arrive.release.aligned",
            "barrier.cluster.arrive.relaxed.aligned",
            "barrier.cluster.wait.aligned",
            "barrier.cluster.wait.acquire.aligned",
        ] {
            assert!(
                !ptx.contains(aligned),
                "the {module} module uses `{aligned}`: an `asm!` barrier LLVM may copy into divergent branches"
            );
        }
    }
    use warpline_gpu::contract::device_check as dc;
    for kernel in dc::COPY_MULTICAST_KERNELS {
        let body = sm90a_entry(kernel);
        let arrives = body.matches("barrier.cluster.arrive.release;").count();
        let waits = body.matches("barrier.cluster.wait.acquire;").count();
        assert!(
            arrives >= 2 && arrives == waits,
            "{kernel}: {arrives} cluster arrives, {waits} waits (two calls of sync_cluster)"
        );
        assert!(
            body.contains(".multicast::cluster"),
            "{kernel}: no multicast load"
        );
    }
    // The tc_gemm entries (clusters of 1 or 2) keep their two cluster barriers.
    for kernel in warpline::kernels::tc_gemm::ENTRIES {
        let body = sm90a_entry(kernel);
        assert!(
            body.contains("barrier.cluster.arrive.release;")
                && body.contains("barrier.cluster.wait.acquire;"),
            "{kernel}: no per-thread cluster barrier"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// Issue 23: the attention entries (sm_90a) carry the instructions their design rests on (rank-4
// TMA loads, SS and register-A wgmma, ping-pong named barriers, quad shuffles, ex2), start with
// the setmaxnreg entry count and assemble with at most `SPILL_ALLOWANCE_BYTES` of spills.
// ------------------------------------------------------------------------------------------------

#[test]
fn issue23_attention_entries_use_register_a_wgmma_pingpong_and_spill_at_most_the_allowance() {
    let ptx = warpline::SM90A_PTX;
    let report = ptxas_report_sm90a();
    for kernel in warpline::kernels::attention::ENTRIES {
        let at = ptx
            .find(&format!(".entry {kernel}("))
            .unwrap_or_else(|| panic!("{kernel} is not an entry of the sm_90a module"));
        let body = &ptx[at..];
        let body = &body[..body[1..].find(".entry ").map_or(body.len(), |i| i + 1)];
        let dtype = if kernel.contains("bf16") {
            "bf16"
        } else {
            "f16"
        };
        let n_pv = if kernel.ends_with("d64") { 64 } else { 128 };
        for needle in [
            "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                .to_string(),
            format!("wgmma.mma_async.sync.aligned.m64n128k16.f32.{dtype}.{dtype}"),
            format!("wgmma.mma_async.sync.aligned.m64n{n_pv}k16.f32.{dtype}.{dtype}"),
            "bar.arrive".to_string(),
            "shfl.sync.bfly.b32".to_string(),
            "ex2.approx.ftz.f32".to_string(),
            "setmaxnreg.inc.sync.aligned.u32 240".to_string(),
            "setmaxnreg.dec.sync.aligned.u32 24".to_string(),
            "griddepcontrol.wait".to_string(),
        ] {
            assert!(body.contains(&needle), "{kernel} lacks `{needle}`");
        }
        // P V reads A from registers: a `{%r.., %r.., %r.., %r..}` A operand before the
        // descriptor of B.
        assert!(
            body.lines()
                .any(|l| l.contains("wgmma.mma_async") && l.contains("}, {%r")),
            "{kernel} has no register-A wgmma"
        );
        let section = sm90a_section(&report, kernel);
        assert!(
            section.contains("Used 168 registers"),
            "{kernel}:\n{section}"
        );
        let spill = section
            .lines()
            .find(|l| l.contains("spill stores"))
            .unwrap_or_else(|| panic!("no spill line for {kernel}:\n{section}"));
        // `N bytes stack frame, S bytes spill stores, L bytes spill loads`.
        let bytes = |what: &str| -> u32 {
            let before = &spill[..spill.find(what).expect("ptxas spill line")];
            before
                .trim_end()
                .rsplit([' ', ','])
                .find(|w| !w.is_empty())
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("no number before {what:?} in {spill}"))
        };
        let limit = warpline_gpu::contract::attention::SPILL_ALLOWANCE_BYTES;
        assert!(
            bytes("bytes spill stores") <= limit && bytes("bytes spill loads") <= limit,
            "{kernel} spills more than the {limit} bytes allowed: {spill}"
        );
    }
}

#[test]
fn issue21_two_attention_ctas_and_one_swap_ab_cta_fit_one_sms_registers() {
    // The decode step's 3-stage attention ring exists so that the swap-AB GEMM after the
    // attention (o_proj) puts one CTA beside two attention CTAs (contract::decode_step's shared
    // memory check); the register file must hold them too. Registers are allocated per warp in
    // units of 256 (8 per thread), 65,536 per SM.
    use warpline_gpu::contract::{decode_step as ds, swap_ab_gemm as sw};
    let per_cta = |regs: u32, threads: u32| regs.div_ceil(8) * 8 * 32 * threads.div_ceil(32);
    let attn = used_registers(section(
        &ptxas_report(),
        "decode_attn_tc_bf16_d128_g4",
        "sm_90",
    ));
    let attn_cta = per_cta(attn, ds::ATTN_TC_THREADS);
    let report = ptxas_report_sm90a();
    for (name, nt) in sw::KERNELS.iter().zip(sw::TOKEN_TILES) {
        if nt > 64 {
            continue; // one CTA per SM above 64 tokens (swap_ab_gemm::smem_target)
        }
        let gemm = per_cta(
            used_registers(sm90a_section(&report, name)),
            sw::THREADS_PER_CTA,
        );
        assert!(
            ds::ATTN_TC_CTAS_PER_SM * attn_cta + gemm <= 65536,
            "{name}: {gemm} registers beside {} attention CTAs of {attn_cta} ({attn} per thread)",
            ds::ATTN_TC_CTAS_PER_SM
        );
    }
}
