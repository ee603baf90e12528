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

/// Where `cargo xtask setup` installs the PyPI package nvidia-cuda-nvcc:
/// `$HOME/.cache/warpline/cuda-nvcc`.
pub fn install_dir() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    PathBuf::from(home).join(".cache/warpline/cuda-nvcc")
}

/// The first ptxas that runs (`--version` succeeds): `$PTXAS`, then the setup install
/// (`install_dir()/nvidia/cu13/bin/ptxas`), then `ptxas` on `PATH`.
pub fn find() -> Option<PathBuf> {
    let candidates = [
        std::env::var(ENV_PTXAS)
            .ok()
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        Some(install_dir().join("nvidia/cu13/bin/ptxas")),
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
    Ok(parse_report(&text))
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
    fn empty_report_has_no_kernels() {
        assert!(parse_report("ptxas info : 0 bytes gmem\n").is_empty());
    }
}
