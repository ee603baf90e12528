//! `--json`: one JSON object on stdout per run, success or failure (see the binary's docs).

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{json, Value};
use warpline::Device;

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether `--json` was given.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Records whether `--json` was given.
pub fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// The subcommand's name in `argv` (the first word that is not a flag or a global flag's value).
pub fn command_name(argv: &[String]) -> String {
    let mut skip = false;
    let mut name: Option<String> = None;
    for a in argv.iter().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        if ["--seed", "--device", "--trace", "--timeline"].contains(&a.as_str()) {
            skip = true;
            continue;
        }
        if !a.starts_with('-') {
            match name {
                // `mgpu SUB`: the subcommand is part of the name (issue 19, item 19).
                Some(n) if n == "mgpu" => return format!("mgpu {a}"),
                Some(n) => return n,
                None if a == "mgpu" => name = Some(a.clone()),
                None => return a.clone(),
            }
        }
    }
    name.unwrap_or_else(|| "warpline".into())
}

/// Versions of warpline and the crates whose behaviour the figures depend on.
fn versions() -> Value {
    json!({
        "warpline": env!("CARGO_PKG_VERSION"),
        "cudarc": "0.19 (driver API, cuda-13000 bindings, dynamic loading)",
        "contract_hash": format!("{:#018x}", warpline_gpu::CONTRACT_HASH),
    })
}

/// The device's description: name, compute capability, SMs, copy engines, memory, driver.
pub fn device(dev: &Device) -> Value {
    let c = dev.capabilities();
    let driver = dev
        .driver_version()
        .map(|(a, b)| format!("{a}.{b}"))
        .unwrap_or_else(|e| format!("unknown ({e})"));
    json!({
        "ordinal": dev.ordinal(),
        "name": c.name,
        "compute_capability": format!("{}.{}", c.compute_capability.0, c.compute_capability.1),
        "sm_count": c.sm_count,
        "copy_engines": c.async_engines,
        "total_mem_bytes": c.total_mem,
        "driver_cuda_api": driver,
    })
}

/// Prints the success object, if `--json`.
pub fn print_success(name: &str, seed: u64, global: &super::Global, results: Value) {
    if !enabled() {
        return;
    }
    let v = json!({
        "command": name,
        "ok": true,
        "seed": seed,
        "versions": versions(),
        "global_options": {
            "device": global.device,
            "seed": global.seed,
            "trace": global.trace.as_ref().map(|p| p.display().to_string()),
            "timeline": global.timeline.as_ref().map(|p| p.display().to_string()),
        },
        "results": results,
    });
    println!("{v}");
}

/// Prints the failure object (always valid JSON, even for flag errors).
pub fn print_failure(name: Option<&str>, seed: Option<u64>, kind: &str, message: &str, code: i32) {
    let v = json!({
        "command": name,
        "ok": false,
        "seed": seed,
        "versions": versions(),
        "error": {"kind": kind, "message": message.trim_end()},
        "exit_code": code,
    });
    println!("{v}");
}

#[cfg(test)]
mod tests {
    use super::command_name;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn issue19_item19_json_command_names_the_mgpu_subcommand() {
        assert_eq!(
            command_name(&argv("warpline --json mgpu allreduce --iters 3")),
            "mgpu allreduce"
        );
        assert_eq!(
            command_name(&argv("warpline mgpu --json peer-bw")),
            "mgpu peer-bw"
        );
        assert_eq!(
            command_name(&argv("warpline --device 1 mgpu info")),
            "mgpu info"
        );
        assert_eq!(command_name(&argv("warpline --json mgpu")), "mgpu");
        assert_eq!(command_name(&argv("warpline --seed 3 gemm --m 4")), "gemm");
        assert_eq!(command_name(&argv("warpline --json")), "warpline");
    }
}
