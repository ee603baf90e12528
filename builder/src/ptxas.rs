//! Finding ptxas and reading the resources of each kernel from its `-v` report.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{Arch, BuildError};

/// Override: the ptxas to use (a path or a name on `PATH`).
pub const ENV_PTXAS: &str = "PTXAS";

/// One kernel's resources as `ptxas -v` reports them for the target architecture.
#[derive(Clone, Default, Debug, PartialEq, Eq)]
pub struct KernelResources {
    /// The kernel's entry name.
    pub name: String,
    /// Registers per thread.
    pub registers: u32,
    /// Static shared memory, bytes per block (dynamic shared memory is not included).
    pub smem_bytes: u32,
    /// Stack frame, bytes per thread.
    pub stack_bytes: u32,
    /// Register spill stores, bytes per thread.
    pub spill_stores: u32,
    /// Register spill loads, bytes per thread.
    pub spill_loads: u32,
}

/// The PyPI `nvidia-cuda-nvcc` version `cargo xtask setup` installs: the newest CUDA 13.0 update,
/// matching the GPU machines' driver (580.x, CUDA 13.0), so ptxas checks the PTX as the driver's
/// own JIT (CUDA 13.0) will see it.
pub const PINNED_NVCC_VERSION: &str = "13.0.88";

/// The CUDA release (`release X.Y` of `ptxas --version`) the builder is tested with.
pub const TESTED_PTXAS_RELEASE: &str = "13.0";

/// Where `cargo xtask setup` installs the PyPI package nvidia-cuda-nvcc
/// [`PINNED_NVCC_VERSION`]: `$HOME/.cache/warpline/cuda-nvcc-<version>`.
pub fn install_dir() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    PathBuf::from(home).join(format!(".cache/warpline/cuda-nvcc-{PINNED_NVCC_VERSION}"))
}

/// The pinned ptxas that `cargo xtask setup` installs: `install_dir()/nvidia/cu13/bin/ptxas`.
pub fn pinned_path() -> PathBuf {
    install_dir().join("nvidia/cu13/bin/ptxas")
}

/// The `release X.Y` of `ptxas --version` (e.g. `"13.0"`), `None` when it cannot be run.
pub fn release(ptxas: &Path) -> Option<String> {
    let out = Command::new(ptxas).arg("--version").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = text.split("release ").nth(1)?;
    Some(rest.split(',').next()?.trim().to_string())
}

/// The first ptxas that runs (`--version` succeeds): `$PTXAS`, then the pinned setup install
/// ([`pinned_path`]), then an older unpinned setup install (`~/.cache/warpline/cuda-nvcc`), then
/// `ptxas` on `PATH`.
pub fn find() -> Option<PathBuf> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    let candidates = [
        std::env::var(ENV_PTXAS)
            .ok()
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        Some(pinned_path()),
        Some(PathBuf::from(home).join(".cache/warpline/cuda-nvcc/nvidia/cu13/bin/ptxas")),
        Some(PathBuf::from("ptxas")),
    ];
    candidates.into_iter().flatten().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    })
}

/// Assembles the PTX file `ptx` for `arch` (`ptxas -arch=<arch> -v -o /dev/null`) and returns
/// each kernel's resources.
///
/// # Errors
/// [`BuildError::Ptxas`] when ptxas cannot be started or rejects the module (with its output).
pub fn assemble(ptxas: &Path, ptx: &Path, arch: Arch) -> Result<Vec<KernelResources>, BuildError> {
    Ok(assemble_report(ptxas, ptx, arch)?.kernels)
}

/// How ptxas labelled a diagnostic line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// `ptxas ... warning : ...`.
    Warning,
    /// `ptxas info : (Cnnnn) ...`: a numbered note, e.g. C7508 "setmaxnreg ignored" or C7515
    /// "wgmma serialized", which ptxas prints at info level.
    Info,
}

/// One ptxas warning, or one numbered (`(Cnnnn)`) info note.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxasDiagnostic {
    /// Warning or numbered info note.
    pub severity: Severity,
    /// The code ptxas gives (`"C7515"`), if any.
    pub code: Option<String>,
    /// The PTX line it names, if any.
    pub line: Option<u32>,
    /// ptxas's line, as printed.
    pub text: String,
}

impl PtxasDiagnostic {
    /// Whether this diagnostic means slow or wrong code, which fails a build by default
    /// ([`crate::PtxBuilder::deny_ptxas_warnings`]):
    /// - every "Potential Performance Loss" note: `setmaxnreg` ignored (C7508: no register count
    ///   at entry; and the other reasons ptxas gives) and wgmma serialized (C7509 to C7515: extern
    ///   calls, a pipeline crossing a function call, too few registers, non-wgmma instructions
    ///   touching the accumulators or inputs between issue and wait, ill-formed pipeline stages);
    /// - every other ptxas warning except the `Advisory:` ones (e.g. a multicast on `sm_90`
    ///   rather than `sm_90a`, which is correct and, on Hopper, not slower).
    pub fn is_harmful(&self) -> bool {
        if self.text.contains("Potential Performance Loss") {
            return true;
        }
        if let Some(c) = &self.code {
            if c.starts_with("C75") {
                return true;
            }
        }
        self.severity == Severity::Warning && !self.text.contains("Advisory:")
    }
}

/// A kernel whose register spills (up to `max_bytes` of spill stores and of spill loads per
/// thread) do not fail the build ([`PtxBuilder::allow_spills`](crate::PtxBuilder::allow_spills)):
/// for spills outside the hot loop, measured to cost nothing, with the reason kept beside it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpillAllowance {
    /// The entry's name.
    pub kernel: String,
    /// Most bytes of spill stores, and of spill loads, per thread.
    pub max_bytes: u32,
}

/// What `ptxas -v` said about one module.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtxasReport {
    /// Each kernel's resources.
    pub kernels: Vec<KernelResources>,
    /// Every warning and numbered note, in output order.
    pub diagnostics: Vec<PtxasDiagnostic>,
}

impl PtxasReport {
    /// The reasons this module is slow or wrong: each harmful diagnostic
    /// ([`PtxasDiagnostic::is_harmful`]) and each kernel that spills registers to local memory.
    pub fn problems(&self) -> Vec<String> {
        self.problems_allowing(&[])
    }

    /// As [`Self::problems`], except that a kernel named in `allowed` may spill up to its
    /// number of bytes (stores and loads each) before its spills count.
    pub fn problems_allowing(&self, allowed: &[SpillAllowance]) -> Vec<String> {
        let mut out: Vec<String> = self
            .diagnostics
            .iter()
            .filter(|d| d.is_harmful())
            .map(|d| d.text.clone())
            .collect();
        for k in &self.kernels {
            let limit = allowed
                .iter()
                .find(|a| a.kernel == k.name)
                .map_or(0, |a| a.max_bytes);
            if k.spill_stores > limit || k.spill_loads > limit {
                out.push(format!(
                    "kernel `{}` spills registers: {} bytes spill stores, {} bytes spill loads per thread",
                    k.name, k.spill_stores, k.spill_loads
                ));
            }
        }
        out
    }
}

/// The warnings and numbered notes of ptxas's output: lines with `warning` in ptxas's label, and
/// `info` lines that carry a `(Cnnnn)` code.
pub fn parse_diagnostics(text: &str) -> Vec<PtxasDiagnostic> {
    let mut out = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if !trimmed.starts_with("ptxas") {
            continue;
        }
        let (label, body) = trimmed.split_once(':').unwrap_or((trimmed, ""));
        let body = body.trim();
        let code = body
            .strip_prefix('(')
            .and_then(|b| b.split_once(')'))
            .map(|(c, _)| c.to_string())
            .filter(|c| {
                c.len() > 1 && c.starts_with('C') && c[1..].chars().all(|d| d.is_ascii_digit())
            });
        let severity = if label.contains("warning") {
            Severity::Warning
        } else if label.contains("info") && code.is_some() {
            Severity::Info
        } else {
            continue;
        };
        let line_no = label
            .split("line ")
            .nth(1)
            .and_then(|l| l.split(';').next())
            .and_then(|l| l.trim().parse().ok());
        out.push(PtxasDiagnostic {
            severity,
            code,
            line: line_no,
            text: trimmed.to_string(),
        });
    }
    out
}

/// [`assemble`] with the whole report: resources and every warning / numbered note.
///
/// # Errors
/// [`BuildError::Ptxas`] when ptxas cannot be started or rejects the module (with its output).
pub fn assemble_report(ptxas: &Path, ptx: &Path, arch: Arch) -> Result<PtxasReport, BuildError> {
    let out = Command::new(ptxas)
        .arg(format!("-arch={}", arch.name()))
        .args(["-v", "-o", "/dev/null"])
        .arg(ptx)
        .output()
        .map_err(|e| BuildError::Ptxas {
            message: format!("running {}: {e}", ptxas.display()),
        })?;
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(BuildError::Ptxas {
            message: format!(
                "ptxas rejected {} for {}:\n{text}",
                ptx.display(),
                arch.name()
            ),
        });
    }
    Ok(PtxasReport {
        kernels: parse_report(&text),
        diagnostics: parse_diagnostics(&text),
    })
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let i = line.find(unit)?;
    line[..i].split_whitespace().next_back()?.parse().ok()
}

/// Parses the text of `ptxas -v` into one [`KernelResources`] per `Compiling entry function`.
/// Lines it does not know are ignored; a missing figure is 0.
pub fn parse_report(text: &str) -> Vec<KernelResources> {
    let mut out: Vec<KernelResources> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelResources {
                name,
                ..Default::default()
            });
        } else if let Some(k) = out.last_mut() {
            if line.contains("bytes stack frame") {
                k.stack_bytes = number_before(line, " bytes stack frame").unwrap_or(0);
                k.spill_stores = number_before(line, " bytes spill stores").unwrap_or(0);
                k.spill_loads = number_before(line, " bytes spill loads").unwrap_or(0);
            } else if line.contains(" registers") {
                k.registers = number_before(line, " registers").unwrap_or(0);
                k.smem_bytes = number_before(line, " bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

/// A fixed-width table, one kernel a row (registers; static smem, stack, spills in bytes).
pub fn table(arch: Arch, kernels: &[KernelResources]) -> String {
    let mut s = format!(
        "{:<28} {:>9} {:>12} {:>12} {:>12} {:>12}\n",
        format!("kernel ({})", arch.name()),
        "registers",
        "static smem",
        "stack frame",
        "spill stores",
        "spill loads"
    );
    for k in kernels {
        s += &format!(
            "{:<28} {:>9} {:>12} {:>12} {:>12} {:>12}\n",
            k.name, k.registers, k.smem_bytes, k.stack_bytes, k.spill_stores, k.spill_loads
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_verbose_report() {
        let text = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'ws_vector_add' for 'sm_90'\n\
ptxas info    : Function properties for ws_vector_add\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 40 registers, used 1 barriers, 64 bytes smem\n\
ptxas info    : Compiling entry function 'fill' for 'sm_90'\n\
ptxas info    : Function properties for fill\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 4 registers, used 0 barriers\n";
        let r = parse_report(text);
        assert_eq!(r.len(), 2);
        let k = &r[0];
        assert_eq!(k.name, "ws_vector_add");
        assert_eq!(
            (
                k.registers,
                k.smem_bytes,
                k.stack_bytes,
                k.spill_stores,
                k.spill_loads
            ),
            (40, 64, 8, 4, 12)
        );
        assert_eq!(
            r[1],
            KernelResources {
                name: "fill".into(),
                registers: 4,
                ..Default::default()
            }
        );
        let t = table(Arch::Sm90, &r);
        assert!(t.starts_with("kernel (sm_90)"));
        assert_eq!(t.lines().count(), 3);
    }

    #[test]
    fn issue22_item02_diagnostics_are_parsed_and_judged() {
        let text = "ptxas info    : (C7508) Potential Performance Loss: 'setmaxnreg' ignored; unable to determine register count at entry.\n\
ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in the function 'k'\n\
ptxas m.ptx, line 218; warning : Advisory: '.multicast::cluster' modifier on instruction 'cp.async.bulk{.tensor}' should be used on .target 'sm_90a'\n\
ptxas m.ptx, line 7; warning : Double is not supported. Demoting to float\n\
ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
ptxas info    : Function properties for k\n\
    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads\n\
ptxas info    : Used 255 registers, used 1 barriers\n";
        let d = parse_diagnostics(text);
        assert_eq!(d.len(), 4, "{d:?}");
        assert_eq!(d[0].code.as_deref(), Some("C7508"));
        assert_eq!(d[0].severity, Severity::Info);
        assert_eq!(d[1].code.as_deref(), Some("C7515"));
        assert_eq!((d[2].severity, d[2].line), (Severity::Warning, Some(218)));
        assert_eq!(d[3].line, Some(7));
        assert_eq!(
            d.iter().map(|d| d.is_harmful()).collect::<Vec<_>>(),
            [true, true, false, true]
        );
        let report = PtxasReport {
            kernels: parse_report(text),
            diagnostics: d,
        };
        let p = report.problems();
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p[0].contains("C7508") && p[1].contains("C7515"), "{p:?}");
        assert!(p[3].contains("`k` spills registers: 8 bytes"), "{p:?}");
        let clean = "ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";
        let report = PtxasReport {
            kernels: parse_report(clean),
            diagnostics: parse_diagnostics(clean),
        };
        assert!(report.problems().is_empty());
    }

    #[test]
    fn empty_report_has_no_kernels() {
        assert!(parse_report("ptxas info : 0 bytes gmem\n").is_empty());
    }
}
