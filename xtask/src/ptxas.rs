//! Finding ptxas and turning its `-v` report into a per-kernel table.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where `cargo xtask setup` installs the PyPI package nvidia-cuda-nvcc.
pub fn install_dir() -> PathBuf {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    PathBuf::from(home).join(".cache/warpline/cuda-nvcc")
}

/// `$PTXAS`, then the setup install, then `ptxas` on PATH.
pub fn find() -> Option<PathBuf> {
    let candidates = [
        std::env::var("PTXAS").ok().map(PathBuf::from),
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

/// One kernel's resources as ptxas reports them for sm_90.
#[derive(Default, Debug)]
pub struct KernelReport {
    pub name: String,
    pub registers: u32,
    pub smem_bytes: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

/// Assembles `ptx` for sm_90 (`ptxas -arch=sm_90 -v`); fails on any ptxas error.
pub fn assemble(ptxas: &Path, ptx: &Path) -> Result<Vec<KernelReport>, String> {
    let out = Command::new(ptxas)
        .args(["-arch=sm_90", "-v", "-o", "/dev/null"])
        .arg(ptx)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("ptxas rejected {}:\n{text}", ptx.display()));
    }
    Ok(parse(&text))
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let i = line.find(unit)?;
    line[..i].split_whitespace().next_back()?.parse().ok()
}

fn parse(text: &str) -> Vec<KernelReport> {
    let mut out: Vec<KernelReport> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or_default().to_string();
            out.push(KernelReport {
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

/// A fixed-width table, one kernel a row.
pub fn table(kernels: &[KernelReport]) -> String {
    let mut s = format!(
        "{:<28} {:>9} {:>12} {:>12} {:>12} {:>12}\n",
        "kernel (sm_90)", "registers", "static smem", "stack frame", "spill stores", "spill loads"
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
        let text = "ptxas info    : Compiling entry function 'ws_vector_add' for 'sm_90'\n\
ptxas info    : Function properties for ws_vector_add\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 40 registers, used 1 barriers, 64 bytes smem\n";
        let k = &parse(text)[0];
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
    }
}
