//! Helpers for tests and benches: GPU discovery that skips with a reason, fresh random inputs.

use rand::Rng;

/// The environment variable that turns every GPU skip into a failure (`WARPLINE_REQUIRE_GPU=1`):
/// skipping without a driver is right for CI, but on a GPU host a skip would hide a test that
/// never ran. gpu-bundle's run.sh and scripts/device-run.sh set it.
pub const REQUIRE_GPU_ENV: &str = "WARPLINE_REQUIRE_GPU";

/// True when [`REQUIRE_GPU_ENV`] is `1`.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).as_deref() == Ok("1")
}

/// Reports that the GPU part of `test` does not run, for `reason`: prints `SKIPPED ...`, or,
/// when `require` is true, panics so that the test fails.
pub fn skip_or_fail(test: &str, reason: impl std::fmt::Display, require: bool) {
    if require {
        panic!("{test} would be skipped ({reason}), but {REQUIRE_GPU_ENV}=1 requires the GPU");
    }
    eprintln!("SKIPPED {test}: {reason}");
}

/// [`skip_or_fail`] with `require` read from [`REQUIRE_GPU_ENV`].
pub fn skip(test: &str, reason: impl std::fmt::Display) {
    skip_or_fail(test, reason, gpu_required());
}

/// The environment variable choosing the GPU of tests and benches (`WARPLINE_DEVICE=1`; the CLI
/// reads it too, `--device` overrides it there). Default 0.
pub const DEVICE_ENV: &str = "WARPLINE_DEVICE";

/// The GPU ordinal of [`DEVICE_ENV`], 0 when it is unset. Panics (failing the test) on a value
/// that is not an ordinal, rather than silently testing GPU 0.
pub fn device_ordinal() -> usize {
    match std::env::var(DEVICE_ENV) {
        Ok(v) => v
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{DEVICE_ENV}={v:?} is not a GPU ordinal")),
        Err(_) => 0,
    }
}

/// Opens the GPU of [`device_ordinal`] (default 0), or prints why the GPU part of `test` is
/// skipped and returns `None` (no CUDA driver on this machine, or no device).
pub fn gpu_or_skip(test: &str) -> Option<warpline::Device> {
    device_or_skip(test, "", warpline::Device::open(device_ordinal()))
}

/// The opened device, or `None` after [`skip`] when there is no driver or no device; any other
/// error fails `test`.
fn device_or_skip(
    test: &str,
    how: &str,
    opened: warpline::Result<warpline::Device>,
) -> Option<warpline::Device> {
    match opened {
        Ok(dev) => Some(dev),
        Err(e @ (warpline::Error::NoDriver | warpline::Error::NoDevice { .. })) => {
            skip(test, e);
            None
        }
        Err(e) => panic!("{test}: opening GPU {}{how} failed: {e}", device_ordinal()),
    }
}

/// The environment variable that turns the skips of two-GPU tests into failures
/// (`WARPLINE_REQUIRE_GPUS=2`). Separate from [`REQUIRE_GPU_ENV`] so that a run on a one-GPU
/// machine with `WARPLINE_REQUIRE_GPU=1` still passes (the two-GPU tests skip there); the
/// two-GPU run (`scripts/device-run.sh mgpu`) sets both.
pub const REQUIRE_GPUS_ENV: &str = "WARPLINE_REQUIRE_GPUS";

/// Opens GPUs 0 and 1 as a [`warpline::multi::DeviceSet`], or prints why the two-GPU part of
/// `test` is skipped and returns `None` (no driver, fewer than 2 GPUs). Skips fail when
/// `WARPLINE_REQUIRE_GPUS=2`, or with `WARPLINE_REQUIRE_GPU=1` when there is no GPU at all.
pub fn two_gpus_or_skip(test: &str) -> Option<warpline::multi::DeviceSet> {
    let need_two = std::env::var(REQUIRE_GPUS_ENV)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n >= 2);
    let n = match warpline::multi::device_count() {
        Ok(n) => n,
        Err(e) => {
            skip_or_fail(test, e, need_two || gpu_required());
            return None;
        }
    };
    if n < 2 {
        skip_or_fail(
            test,
            format!(
                "needs 2 GPUs, the driver reports {n} (set {REQUIRE_GPUS_ENV}=2 to fail instead)"
            ),
            need_two || (n == 0 && gpu_required()),
        );
        return None;
    }
    Some(
        warpline::multi::DeviceSet::open(&[0, 1])
            .unwrap_or_else(|e| panic!("{test}: opening GPUs 0 and 1 failed: {e}")),
    )
}

/// `n` fresh uniform random floats in [-1, 1).
pub fn random_f32(n: usize) -> Vec<f32> {
    let mut rng = rand::rng();
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// The text of one `.entry` of the embedded PTX module, up to the next entry.
/// Panics if `name` is not an entry.
pub fn entry_body(name: &str) -> &'static str {
    let ptx = warpline::PTX;
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("{name} is not an entry of the module"));
    let rest = &ptx[start..];
    let end = rest[1..].find(".entry ").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

/// ptxas as the builder finds it (`warpline_builder::ptxas::find`): `$PTXAS`, then the pinned copy
/// `cargo xtask setup` installs, then an older unpinned one, then `ptxas` on PATH.
fn ptxas() -> std::path::PathBuf {
    warpline_builder::ptxas::find()
        .expect("ptxas not found: run `cargo xtask setup` (installs it from PyPI nvidia-cuda-nvcc) or set PTXAS")
}

/// Assembles the embedded PTX module for sm_90 (`ptxas -arch=sm_90 -v`), panics on failure, and
/// returns ptxas's verbose report.
pub fn ptxas_report() -> String {
    let dir = std::env::temp_dir().join(format!(
        "warpline-ptxas-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("warpline_gpu.ptx");
    std::fs::write(&file, warpline::PTX).unwrap();
    let out = std::process::Command::new(ptxas())
        .args(["-arch=sm_90", "-v", "-o", "/dev/null"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "ptxas failed:\n{log}");
    log
}

/// Assembles the sm_90a module ([`warpline::SM90A_PTX`]) with `ptxas -arch=sm_90a -v`, panics on
/// failure, and returns ptxas's verbose report (warnings included). Assembled once per test
/// process (several tests read the report).
pub fn ptxas_report_sm90a() -> String {
    static REPORT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    REPORT.get_or_init(assemble_sm90a).clone()
}

fn assemble_sm90a() -> String {
    let dir = std::env::temp_dir().join(format!(
        "warpline-ptxas-sm90a-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("warpline_gpu_sm90a.ptx");
    std::fs::write(&file, warpline::SM90A_PTX).unwrap();
    let out = std::process::Command::new(ptxas())
        .args(["-arch=sm_90a", "-v", "-o", "/dev/null"])
        .arg(&file)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "ptxas -arch=sm_90a failed:\n{log}");
    log
}

/// Asserts that ptxas's `report` compiled `kernel` for sm_90 with no spill stores.
pub fn assert_compiled_without_spills(report: &str, kernel: &str) {
    let at = report
        .find(&format!("Compiling entry function '{kernel}' for 'sm_90'"))
        .unwrap_or_else(|| panic!("{kernel} not compiled:\n{report}"));
    let spill = report[at..]
        .lines()
        .find(|l| l.contains("spill stores"))
        .unwrap_or_else(|| panic!("no spill line for {kernel}:\n{report}"));
    assert!(spill.contains(" 0 bytes spill stores"), "{kernel}: {spill}");
}

/// Opens GPU 0 on a fresh context of its own ([`warpline::Device::open_in_new_context`]), or
/// prints why the GPU part of `test` is skipped and returns `None`.
pub fn gpu_in_new_context_or_skip(test: &str) -> Option<warpline::Device> {
    device_or_skip(
        test,
        " in a new context",
        warpline::Device::open_in_new_context(device_ordinal()),
    )
}

/// The seed of a randomised GEMM test: `WARPLINE_SEED` if set, else a fresh one; printed with
/// `label` so that a failure can be replayed.
pub fn gemm_seed(label: &str) -> u64 {
    use rand::Rng;
    let s = std::env::var("WARPLINE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    eprintln!("{label} seed: {s} (WARPLINE_SEED={s} replays it)");
    s
}

/// A bench's shape string, `N` unsigned dimensions joined by `x` (`"128x4096x4096"`, each part
/// trimmed); `None` for anything else.
pub fn parse_dims<const N: usize>(s: &str) -> Option<[usize; N]> {
    let d: Vec<usize> = s
        .split('x')
        .map(|x| x.trim().parse().ok())
        .collect::<Option<_>>()?;
    d.try_into().ok()
}

/// `n` standard normal samples (Box-Muller).
pub fn normal(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<f32> {
    use rand::Rng;
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.random();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

/// A `rows x cols` matrix of normal samples with row pitch `pitch` (elements), padding NaN,
/// uploaded to a new buffer of `pool` on `stream`. Returns the buffer and the host values
/// (rounded to `T` and widened; padding NaN). Panics on allocation or copy errors (tests only).
pub fn upload<T: warpline::kernels::tc_gemm::TcInput>(
    pool: &warpline::MemPool,
    stream: &warpline::Stream,
    rng: &mut rand::rngs::StdRng,
    rows: usize,
    cols: usize,
    pitch: usize,
) -> (warpline::DeviceBuffer<T>, Vec<f32>) {
    let vals = normal(rng, rows * cols);
    let len = (rows - 1) * pitch + cols;
    let mut host = vec![f32::NAN; len];
    scatter_pitched(&mut host, &vals, cols, pitch, |v| T::from_f32(v).to_f32());
    let typed: Vec<T> = host.iter().map(|&v| T::from_f32(v)).collect();
    let mut buf = pool.alloc_async::<T>(stream, len).unwrap();
    buf.copy_from_host(&typed).unwrap();
    (buf, host)
}

/// Writes the row-major `vals` (rows of `cols`) into `host` at row pitch `pitch`, each value
/// passed through `round` (the element type's rounding); the padding is left as it is.
fn scatter_pitched(
    host: &mut [f32],
    vals: &[f32],
    cols: usize,
    pitch: usize,
    round: impl Fn(f32) -> f32,
) {
    if cols == 0 {
        return;
    }
    for (r, row) in vals.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            host[r * pitch + c] = round(v);
        }
    }
}

/// A GEMM test's C: `len` elements, all NaN unless `values`, in which case the `rows x cols`
/// block at row pitch `pitch` holds normal samples rounded to `O` (padding stays NaN), uploaded
/// to a new buffer of `pool` on `stream`. Returns the buffer and the host values (widened). The
/// samples are drawn only with `values` (so a case with `beta == 0` leaves `rng` as it was).
/// Panics on allocation or copy errors (tests only).
#[allow(clippy::too_many_arguments)]
pub fn upload_c<I, O>(
    pool: &warpline::MemPool,
    stream: &warpline::Stream,
    rng: &mut rand::rngs::StdRng,
    rows: usize,
    cols: usize,
    pitch: usize,
    len: usize,
    values: bool,
) -> (warpline::DeviceBuffer<O>, Vec<f32>)
where
    I: warpline::kernels::tc_gemm::TcInput,
    O: warpline::kernels::tc_gemm::TcOutput<I>,
{
    let mut host = vec![f32::NAN; len];
    if values {
        let v = normal(rng, rows * cols);
        scatter_pitched(&mut host, &v, cols, pitch, |x| O::from_f32(x).to_f32());
    }
    let mut buf = pool.alloc_async::<O>(stream, len).unwrap();
    buf.copy_from_host(&host.iter().map(|&v| O::from_f32(v)).collect::<Vec<_>>())
        .unwrap();
    (buf, host)
}

/// A hand-written sm_90 module with one kernel, `y[i] = a * x[i] + y[i]` for `i < n`.
pub const SAXPY_PTX: &str = r#"
// saxpy, written by hand
.version 8.0
.target sm_90
.address_size 64

.visible .entry saxpy(
	.param .u64 .ptr .align 1 saxpy_param_0,
	.param .u64 .ptr .align 1 saxpy_param_1,
	.param .f32 saxpy_param_2,
	.param .u32 saxpy_param_3
)
{
	.reg .pred 	%p<2>;
	.reg .b32 	%r<6>;
	.reg .f32 	%f<5>;
	.reg .b64 	%rd<8>;

	ld.param.u64 	%rd1, [saxpy_param_0];
	ld.param.u64 	%rd2, [saxpy_param_1];
	ld.param.f32 	%f1, [saxpy_param_2];
	ld.param.u32 	%r1, [saxpy_param_3];
	mov.u32 	%r2, %ctaid.x;
	mov.u32 	%r3, %ntid.x;
	mov.u32 	%r4, %tid.x;
	mad.lo.s32 	%r5, %r2, %r3, %r4;
	setp.ge.u32 	%p1, %r5, %r1;
	@%p1 bra 	$L__done;
	cvta.to.global.u64 	%rd3, %rd1;
	cvta.to.global.u64 	%rd4, %rd2;
	mul.wide.u32 	%rd5, %r5, 4;
	add.s64 	%rd6, %rd3, %rd5;
	add.s64 	%rd7, %rd4, %rd5;
	ld.global.f32 	%f2, [%rd6];
	ld.global.f32 	%f3, [%rd7];
	fma.rn.f32 	%f4, %f1, %f2, %f3;
	st.global.f32 	[%rd7], %f4;
$L__done:
	ret;
}
"#;

/// Runs the ignored test `name` of the current test binary in a child process with `env` (after
/// removing `CUDA_DEVICE_MAX_CONNECTIONS` and `CUDA_MODULE_LOADING`, which the driver reads once
/// at initialisation), echoing its output, and fails unless it exits successfully within
/// `limit`: a hang is a failure, never a hung test. With `done_marker`, a child that printed that
/// line counts as finished and is killed if it has not exited 10 s later (a child whose stream
/// stays blocked on purpose cannot tear its context down).
pub fn run_child_test(
    name: &str,
    env: &[(&str, &str)],
    limit: std::time::Duration,
    done_marker: Option<&str>,
) {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([name, "--exact", "--ignored", "--nocapture"])
        .env_remove("CUDA_DEVICE_MAX_CONNECTIONS")
        .env_remove("CUDA_MODULE_LOADING")
        .stdout(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            println!("{line}");
            let _ = tx.send(line);
        }
    });
    let mut deadline = Instant::now() + limit;
    let mut marked = false;
    loop {
        while let Ok(line) = rx.try_recv() {
            if !marked && done_marker.is_some_and(|m| line.contains(m)) {
                marked = true;
                deadline = Instant::now() + Duration::from_secs(10);
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "{name} with {env:?} failed: {status}");
            assert!(
                done_marker.is_none() || marked,
                "{name} exited without printing its marker"
            );
            return;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            assert!(marked, "{name} with {env:?} hung for {limit:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Row pitch of `cols` one-byte (FP8) elements rounded up to 16 bytes, plus `extra` 16-byte
/// units (TMA's pitch rule, with padding a kernel must skip).
pub fn pitch8(cols: usize, extra: usize) -> usize {
    cols.next_multiple_of(16) + 16 * extra
}

/// Row pitch of `cols` elements of `O` rounded up to 16 bytes, plus one 16-byte unit.
pub fn pitch_out<O>(cols: usize) -> usize {
    let per = 16 / size_of::<O>();
    cols.next_multiple_of(per) + per
}

/// A `rows x cols` FP8 matrix of `spread * N(0, 1)` values rounded to `T`, row pitch `pitch`,
/// the padding the NaN code (a kernel that read it would produce NaN). Returns the codes and
/// their decoded values (padding NaN).
pub fn fp8_matrix<T: warpline::kernels::tc_gemm::Fp8Input>(
    rng: &mut rand::rngs::StdRng,
    rows: usize,
    cols: usize,
    pitch: usize,
    spread: f32,
) -> (Vec<T>, Vec<f32>) {
    let vals = normal(rng, rows * cols);
    let len = (rows - 1) * pitch + cols;
    let mut codes = vec![T::from_f32(f32::NAN); len];
    let mut host = vec![f32::NAN; len];
    for r in 0..rows {
        for c in 0..cols {
            let q = T::from_f32(spread * vals[r * cols + c]);
            codes[r * pitch + c] = q;
            host[r * pitch + c] = q.to_f32();
        }
    }
    (codes, host)
}

#[cfg(test)]
mod tests {
    use super::skip_or_fail;

    #[test]
    fn a_skip_only_prints_when_the_gpu_is_not_required() {
        skip_or_fail("probe", "no CUDA driver", false);
    }

    #[test]
    #[should_panic(expected = "WARPLINE_REQUIRE_GPU=1 requires the GPU")]
    fn a_skip_fails_when_the_gpu_is_required() {
        skip_or_fail("probe", "no CUDA driver", true);
    }

    #[test]
    fn parse_dims_takes_exactly_n_unsigned_dimensions() {
        assert_eq!(
            super::parse_dims::<3>("128x4096x4096"),
            Some([128, 4096, 4096])
        );
        assert_eq!(
            super::parse_dims::<4>(" 16 x16x2048x 128"),
            Some([16, 16, 2048, 128])
        );
        for bad in [
            "",
            "128x4096",
            "128x4096x4096x1",
            "12ax4096x4096",
            "-1x2x3",
            "1xx2",
        ] {
            assert_eq!(super::parse_dims::<3>(bad), None, "{bad:?}");
        }
    }
}
