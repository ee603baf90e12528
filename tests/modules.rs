//! User PTX modules and typed kernels (issue 10): the PTX signature parser and the mismatch
//! errors (CPU, always run), and typed launches through a second module on the GPU (skipped
//! without a driver): results checked against poison, wrong streams, contexts and too much
//! shared memory refused before anything is launched.

use warpline::launch::{launch_raw, LaunchConfig};
use warpline::module::{
    check_signature, ptx_signatures, DevicePtr, KernelSignature, PtxParamKind, View, ViewMut,
};
use warpline::{params, Device, Error, MemPool};
use warpline_gpu::contract::signal as sigc;
use warpline_suite::support::{gpu_in_new_context_or_skip, gpu_or_skip, SAXPY_PTX};

type SaxpySig = (View<f32>, ViewMut<f32>, f32, u32);
type CopySig = (View<u32>, ViewMut<u32>, u32);
type FillSig = (ViewMut<u32>, u32, u32, u64);

/// Poison for outputs: a NaN whose bits no kernel here writes.
const POISON: u32 = 0x7FC0_DEAD;

// ------------------------------------------------------------------------------------------------
// CPU: the PTX signature parser and the checks
// ------------------------------------------------------------------------------------------------

#[test]
fn parser_reads_every_entry_of_warpline_ptx() {
    let entries = ptx_signatures(warpline::PTX);
    let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, warpline::device::ptx_entries(warpline::PTX));
    for name in [sigc::COPY_KERNEL, sigc::BUSY_FILL_KERNEL, "ws_vector_add"] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    for e in &entries {
        let params = e
            .params
            .as_ref()
            .unwrap_or_else(|err| panic!("{}: {err}", e.name));
        assert!(!params.is_empty(), "{}", e.describe());
    }
    let copy = entries
        .iter()
        .find(|e| e.name == sigc::COPY_KERNEL)
        .unwrap();
    assert_eq!(copy.describe(), "ws_copy_u32(.u64 .ptr, .u64 .ptr, .u32)");
    let p = copy.params.as_ref().unwrap();
    assert_eq!(p[0].name, "ws_copy_u32_param_0");
    assert!(p[0].pointer && p[0].size == 8 && p[0].kind == PtxParamKind::Unsigned);
    assert!(!p[2].pointer && p[2].size == 4);
    let fill = entries
        .iter()
        .find(|e| e.name == sigc::BUSY_FILL_KERNEL)
        .unwrap();
    assert_eq!(fill.describe(), "ws_busy_fill(.u64 .ptr, .u32, .u32, .u64)");
    // The typed signatures of the tests match warpline's own entries.
    check_signature(copy, &CopySig::params()).unwrap();
    check_signature(fill, &FillSig::params()).unwrap();
    // Raw addresses are allowed for pointer parameters too.
    check_signature(copy, &<(u64, DevicePtr<u32>, u32)>::params()).unwrap();
}

#[test]
fn parser_handles_hand_written_forms() {
    let ptx = r#"
.version 8.0
.target sm_90
.address_size 64
.extern .entry elsewhere(.param .u32 x)
/* .visible .entry commented_out(.param .u32 a) */
.visible .entry saxpy( .param .u64 .ptr .global .align 16 p0, .param .f32 p1 ) { ret; }
.entry no_params
{
	ret;
}
.entry empty_parens() { ret; }
.weak .entry packed(
	.param .align 4 .b8 packed_param_0[12], // a struct by value
	.param .s64 packed_param_1,
	.param .b16 packed_param_2,
	.param .f64 packed_param_3
)
{ ret; }
.entry broken(.param .pred p) { ret; }
"#;
    let entries = ptx_signatures(ptx);
    let names: Vec<_> = entries.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        ["saxpy", "no_params", "empty_parens", "packed", "broken"]
    );
    assert_eq!(entries[0].describe(), "saxpy(.u64 .ptr, .f32)");
    assert_eq!(entries[1].params, Ok(vec![]));
    assert_eq!(entries[2].params, Ok(vec![]));
    let packed = entries[3].params.as_ref().unwrap();
    assert_eq!(packed[0].kind, PtxParamKind::Aggregate);
    assert_eq!((packed[0].size, packed[0].align), (12, Some(4)));
    assert_eq!(packed[1].kind, PtxParamKind::Signed);
    assert_eq!(packed[2].kind, PtxParamKind::Bits);
    assert_eq!(packed[3].kind, PtxParamKind::Float);
    assert_eq!(
        entries[3].describe(),
        "packed(.align 4 .b8 [12], .s64, .b16, .f64)"
    );
    // .b16 takes any 2-byte value; .s64 any 8-byte integer or address; .f64 only f64.
    let e = check_signature(&entries[3], &<(u64, i64, u16, f64)>::params()).unwrap_err();
    assert!(
        matches!(&e, Error::KernelSignatureMismatch { detail, .. } if detail.contains("parameter 0") && detail.contains("12 bytes")),
        "{e}"
    );
    let e = check_signature(&entries[4], &<(u8,)>::params()).unwrap_err();
    assert!(
        matches!(&e, Error::PtxSignature { kernel, detail } if kernel == "broken" && detail.contains(".pred")),
        "{e}"
    );
    check_signature(&entries[1], &<()>::params()).unwrap();
    // An array whose byte size overflows is a parse error, not a wrapped size (or a panic).
    let huge = ptx_signatures(".entry huge(.param .b64 p[4611686018427387905]) { ret; }");
    let err = huge[0].params.as_ref().unwrap_err();
    assert!(err.contains("overflows"), "{err}");
}

#[test]
fn mismatches_name_kernel_and_both_signatures() {
    let saxpy = ptx_signatures(SAXPY_PTX)
        .into_iter()
        .find(|e| e.name == "saxpy")
        .unwrap();
    check_signature(&saxpy, &SaxpySig::params()).unwrap();
    // Count.
    let e = check_signature(&saxpy, &<(View<f32>, ViewMut<f32>, f32)>::params()).unwrap_err();
    let m = e.to_string();
    for want in [
        "saxpy",
        "(.u64 .ptr, .u64 .ptr, .f32, .u32)",
        "(View<f32>, ViewMut<f32>, f32)",
        "4 parameter(s), the Rust signature 3",
    ] {
        assert!(m.contains(want), "{want} missing from {m}");
    }
    // Size: a u64 where the PTX has .u32.
    let e = check_signature(&saxpy, &<(View<f32>, ViewMut<f32>, f32, u64)>::params()).unwrap_err();
    assert!(
        matches!(&e, Error::KernelSignatureMismatch { detail, .. } if detail.contains("parameter 3")),
        "{e}"
    );
    // Class: an integer where the PTX has .f32, a float where it has an address.
    let e = check_signature(&saxpy, &<(View<f32>, ViewMut<f32>, u32, u32)>::params()).unwrap_err();
    assert!(
        e.to_string().contains("floating-point") && e.to_string().contains("parameter 2"),
        "{e}"
    );
    let e = check_signature(&saxpy, &<(f64, ViewMut<f32>, f32, u32)>::params()).unwrap_err();
    assert!(e.to_string().contains("parameter 0"), "{e}");
}

#[test]
fn hand_written_saxpy_assembles_for_sm_90() {
    let Some(ptxas) = warpline_builder::ptxas::find() else {
        eprintln!(
            "SKIPPED hand_written_saxpy_assembles_for_sm_90: no ptxas (run `cargo xtask setup`)"
        );
        return;
    };
    let file = std::env::temp_dir().join(format!("warpline-saxpy-{}.ptx", std::process::id()));
    std::fs::write(&file, SAXPY_PTX).unwrap();
    let out = std::process::Command::new(&ptxas)
        .args(["-arch=sm_90", "-o", "/dev/null"])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn params_owns_temporaries() {
    // `params!` used to take addresses of its arguments; with temporaries kept in a `let` they
    // dangled. It now copies the values.
    let n = 5u32;
    let p = params![n as u64, n * 2, 1.5f32];
    assert_eq!(p.map(|v| v.size()), [8, 4, 4]);
    assert_eq!(p[0], warpline::launch::ParamValue::new(5u64));
    assert_eq!(p[1], warpline::launch::ParamValue::new(10u32));
}

// ------------------------------------------------------------------------------------------------
// GPU
// ------------------------------------------------------------------------------------------------

fn expect_pattern(got: &[u32], n: usize, seed: u32) {
    for (i, &v) in got.iter().enumerate() {
        let want = if i < n {
            sigc::pattern(seed, i as u32)
        } else {
            POISON
        };
        assert_eq!(v, want, "element {i} of {} (n = {n})", got.len());
    }
}

#[test]
fn typed_kernels_of_a_second_module_run_and_check_before_launch() {
    let Some(dev) = gpu_or_skip("typed_kernels_of_a_second_module_run_and_check_before_launch")
    else {
        return;
    };
    let module = dev.load_module(warpline::PTX).unwrap();
    assert!(dev.all_kernels_loaded().unwrap());
    let fill = module.kernel::<FillSig>(sigc::BUSY_FILL_KERNEL).unwrap();
    let copy = module.kernel::<CopySig>(sigc::COPY_KERNEL).unwrap();
    assert_eq!(copy.name(), sigc::COPY_KERNEL);

    // Missing entries and mismatching signatures on the loaded module.
    let e = module.kernel::<CopySig>("no_such_kernel").unwrap_err();
    assert!(
        matches!(&e, Error::MissingKernel { entries, .. } if entries.contains(sigc::COPY_KERNEL)),
        "{e}"
    );
    let e = module
        .kernel::<(View<u32>, ViewMut<u32>, u64)>(sigc::COPY_KERNEL)
        .unwrap_err();
    assert!(matches!(e, Error::KernelSignatureMismatch { .. }), "{e}");

    let pool = MemPool::new(&dev, 0).unwrap();
    let s = dev.new_stream().unwrap();
    let (len, n, seed) = (100_003usize, 99_991usize, 0xC0FFEE);
    let mut src = pool.alloc_async::<u32>(&s, len).unwrap();
    let mut dst = pool.alloc_async::<u32>(&s, len).unwrap();
    src.fill_async(POISON).unwrap();
    dst.fill_async(POISON).unwrap();
    let grid = (n as u32).div_ceil(sigc::THREADS_PER_CTA);
    let cfg = LaunchConfig::linear(grid, sigc::THREADS_PER_CTA, 0);
    // SAFETY: ws_busy_fill writes out[i] for i < n (n <= len); ws_copy_u32 reads src[i] and
    // writes dst[i] for i < n; both views are whole buffers bound to `s`.
    unsafe {
        fill.launch(&s, &cfg, (src.as_view_mut(), n as u32, seed, 0))
            .unwrap();
        copy.launch(&s, &cfg, (src.as_view(), dst.as_view_mut(), n as u32))
            .unwrap();
    }
    let mut host = vec![0u32; len];
    dst.copy_to_host(&mut host).unwrap();
    expect_pattern(&host, n, seed);
    src.copy_to_host(&mut host).unwrap();
    expect_pattern(&host, n, seed);

    // A view of another stream: refused before launch (dst keeps its contents).
    let other = dev.new_stream().unwrap();
    let foreign = pool.alloc_async::<u32>(&other, len).unwrap();
    // SAFETY: as above; the launch is refused before anything is queued.
    let e = unsafe { copy.launch(&s, &cfg, (foreign.as_view(), dst.as_view_mut(), n as u32)) }
        .unwrap_err();
    assert!(
        matches!(e, Error::WrongStream { what } if what.contains("argument 0")),
        "{e}"
    );
    // A stream of another context: refused.
    if let Some(own) = gpu_in_new_context_or_skip("typed launch on another context") {
        let os = own.new_stream().unwrap();
        // SAFETY: refused before launch.
        let e =
            unsafe { copy.launch(&os, &cfg, (src.as_view(), dst.as_view_mut(), 1)) }.unwrap_err();
        assert!(matches!(e, Error::WrongContext { .. }), "{e}");
    }
    // Too much dynamic shared memory: refused, naming the kernel and the opt-in limit.
    let optin = dev.capabilities().max_shared_mem_per_block_optin;
    let big = LaunchConfig::linear(grid, sigc::THREADS_PER_CTA, optin as u32 + 4);
    // SAFETY: refused before launch.
    let e =
        unsafe { copy.launch(&s, &big, (src.as_view(), dst.as_view_mut(), n as u32)) }.unwrap_err();
    assert!(
        matches!(e, Error::SharedMemory { kernel, max, .. } if kernel == sigc::COPY_KERNEL && max <= optin),
        "{e}"
    );
    let zero = LaunchConfig::linear(0, sigc::THREADS_PER_CTA, 0);
    // SAFETY: refused before launch.
    let e = unsafe { copy.launch(&s, &zero, (src.as_view(), dst.as_view_mut(), n as u32)) }
        .unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    dst.copy_to_host(&mut host).unwrap();
    expect_pattern(&host, n, seed);

    // 64 KiB of dynamic shared memory (above the 48 KiB default): the attribute is raised.
    assert!(copy.untyped().max_dynamic_shared_memory() < 64 * 1024);
    dst.fill_async(POISON).unwrap();
    let wide = LaunchConfig::linear(grid, sigc::THREADS_PER_CTA, 64 * 1024);
    // SAFETY: as the first copy.
    unsafe { copy.launch(&s, &wide, (src.as_view(), dst.as_view_mut(), n as u32)) }.unwrap();
    assert!(copy.untyped().max_dynamic_shared_memory() >= 64 * 1024);
    dst.copy_to_host(&mut host).unwrap();
    expect_pattern(&host, n, seed);
    dev.check_healthy().unwrap();
}

#[test]
fn hand_written_module_through_the_documented_api() {
    let Some(dev) = gpu_or_skip("hand_written_module_through_the_documented_api") else {
        return;
    };
    let module = dev.load_module(SAXPY_PTX).unwrap();
    assert_eq!(module.entry_names().collect::<Vec<_>>(), ["saxpy"]);
    let saxpy = module.kernel::<SaxpySig>("saxpy").unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let stream = dev.new_stream().unwrap();
    let n = 70_001usize;
    let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let ys: Vec<f32> = (0..n).map(|i| 1.0 - i as f32).collect();
    let mut x = pool.alloc_async::<f32>(&stream, n).unwrap();
    let mut y = pool.alloc_async::<f32>(&stream, n + 5).unwrap();
    x.copy_from_host(&xs).unwrap();
    // y[..n] = ys, the tail poisoned: saxpy must not touch it.
    let mut init = ys.clone();
    init.extend([f32::from_bits(POISON); 5]);
    y.copy_from_host(&init).unwrap();
    let cfg = LaunchConfig::linear((n as u32).div_ceil(256), 256, 0);
    // SAFETY: saxpy reads x[i] and updates y[i] for i < n only (n <= both lengths).
    unsafe { saxpy.launch(&stream, &cfg, (x.as_view(), y.as_view_mut(), 2.0, n as u32)) }.unwrap();
    let mut out = vec![0f32; n + 5];
    y.copy_to_host(&mut out).unwrap();
    for i in 0..n {
        assert_eq!(out[i], 2.0f32.mul_add(xs[i], ys[i]), "element {i}");
    }
    for (i, v) in out.iter().enumerate().skip(n) {
        assert_eq!(v.to_bits(), POISON, "element {i} past n was written");
    }
    // A device opened with a module that lacks warpline's kernels still opens.
    // SAFETY: SAXPY_PTX has no entry named like a warpline kernel: no safe launcher runs its code.
    let own = unsafe { Device::open_with_ptx(0, SAXPY_PTX) }.unwrap();
    assert_eq!(own.kernel_names().collect::<Vec<_>>(), ["saxpy"]);
    assert!(matches!(
        own.kernel(sigc::COPY_KERNEL),
        Err(Error::MissingKernel { .. })
    ));
}

#[test]
fn launch_raw_with_a_params_array_kept_in_a_let() {
    let Some(dev) = gpu_or_skip("launch_raw_with_a_params_array_kept_in_a_let") else {
        return;
    };
    let pool = MemPool::new(&dev, 0).unwrap();
    let s = dev.new_stream().unwrap();
    let n = 4097usize;
    let mut out = pool.alloc_async::<u32>(&s, n + 3).unwrap();
    out.fill_async(POISON).unwrap();
    let k = dev.kernel(sigc::BUSY_FILL_KERNEL).unwrap();
    let p = params![out.device_ptr(), n as u32, 7u32, 0u64];
    let cfg = LaunchConfig::linear((n as u32).div_ceil(256), 256, 0);
    // SAFETY: ws_busy_fill(*mut u32, u32, u32, u64) writes out[i] for i < n (n <= len); `out`
    // is bound to `s`.
    unsafe { launch_raw(&dev, k, &s, &cfg, &p) }.unwrap();
    let mut host = vec![0u32; n + 3];
    out.copy_to_host(&mut host).unwrap();
    expect_pattern(&host, n, 7);
}
