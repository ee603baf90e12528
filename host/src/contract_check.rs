//! Refuses a PTX module built from another launch contract than the host's (a stale module).
//!
//! `gpu/build.rs` hashes `gpu/src/contract.rs` (FNV-1a 64); the host build carries that value as
//! `warpline_gpu::CONTRACT_HASH` and the PTX module as the global `warpline_contract_hash`, which
//! rustc emits as `.visible .global .align 8 .b8 warpline_contract_hash[8] = {b0, ..., b7};`
//! (little-endian bytes). A scalar form (`.u64`/`.b64 ... = value;`) is read too.
//!
//! Also the table of the kernels the host launches ([`KERNEL_SPECS`], re-exported as
//! `warpline::kernels::KERNEL_SPECS`): pure data of the contract, kept here (below `device`,
//! whose `open` reads it) so that `device` imports nothing of `kernels`.

use crate::error::Error;

/// A kernel of the module that the host launches, with the dynamic shared memory it needs.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    /// Entry name.
    pub name: &'static str,
    /// Dynamic shared memory per CTA, bytes.
    pub dyn_smem_bytes: usize,
}

/// Every kernel the host launches; `Device::open` checks each is present and fits, and sets its
/// max dynamic shared memory attribute to `dyn_smem_bytes` (the largest launch of the kernel uses:
/// `cluster_tile_gemm` uses less for clusters of 2 or more).
pub const KERNEL_SPECS: &[KernelSpec] = &[
    KernelSpec {
        name: warpline_gpu::contract::vector_add::KERNEL,
        dyn_smem_bytes: warpline_gpu::contract::vector_add::SMEM_BYTES,
    },
    KernelSpec {
        name: warpline_gpu::contract::gemm::CLUSTER_KERNEL,
        dyn_smem_bytes: warpline_gpu::contract::gemm::SMEM_BYTES,
    },
    KernelSpec {
        name: warpline_gpu::contract::gemm::PLAIN_KERNEL,
        dyn_smem_bytes: warpline_gpu::contract::gemm::SMEM_BYTES,
    },
    // PDL kernels (issue 4).
    KernelSpec {
        name: warpline_gpu::contract::pdl::PRODUCER_KERNEL,
        dyn_smem_bytes: 0,
    },
    KernelSpec {
        name: warpline_gpu::contract::pdl::EARLY_TRIGGER_KERNEL,
        dyn_smem_bytes: 0,
    },
    KernelSpec {
        name: warpline_gpu::contract::pdl::CONSUMER_KERNEL,
        dyn_smem_bytes: 0,
    },
    KernelSpec {
        name: warpline_gpu::contract::pdl::CONSUMER_NO_WAIT_KERNEL,
        dyn_smem_bytes: 0,
    },
    KernelSpec {
        name: warpline_gpu::contract::pdl::CHAIN_STEP_KERNEL,
        dyn_smem_bytes: 0,
    },
    KernelSpec {
        name: warpline_gpu::contract::pdl::PRIMARY_GEMM_KERNEL,
        dyn_smem_bytes: warpline_gpu::contract::pdl::GEMM_SMEM_BYTES,
    },
    KernelSpec {
        name: warpline_gpu::contract::pdl::SECONDARY_GEMM_KERNEL,
        dyn_smem_bytes: warpline_gpu::contract::pdl::GEMM_SMEM_BYTES,
    },
];

/// The PTX global that holds the contract hash of the module.
pub(crate) const CONTRACT_HASH_SYMBOL: &str = "warpline_contract_hash";

/// Reads the contract hash of a PTX module: `None` when the module has no (readable)
/// `warpline_contract_hash` global.
pub(crate) fn ptx_contract_hash(ptx: &str) -> Option<u64> {
    ptx.lines().find_map(|line| {
        let line = line.trim();
        if !line.contains(".global") {
            return None;
        }
        let (decl, init) = line.split_once('=')?;
        let name = decl.split_whitespace().last()?;
        let (name, array) = match name.split_once('[') {
            Some((n, len)) => (n, Some(len.trim_end_matches(']'))),
            None => (name, None),
        };
        if !name.eq_ignore_ascii_case(CONTRACT_HASH_SYMBOL) {
            return None;
        }
        let init = init.trim().trim_end_matches(';').trim();
        match array {
            Some(len) => {
                if len != "8" {
                    return None;
                }
                let bytes = init.strip_prefix('{')?.strip_suffix('}')?;
                let bytes: Vec<u8> = bytes
                    .split(',')
                    .map(|b| parse_int(b.trim()).and_then(|v| u8::try_from(v).ok()))
                    .collect::<Option<_>>()?;
                Some(u64::from_le_bytes(bytes.try_into().ok()?))
            }
            None => parse_int(init),
        }
    })
}

fn parse_int(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex.trim_end_matches(['U', 'u', 'L', 'l']), 16).ok(),
        None => s.trim_end_matches(['U', 'u', 'L', 'l']).parse().ok(),
    }
}

/// Checks that the PTX module was built from the same `contract.rs` as the host:
/// `expected` is `warpline_gpu::CONTRACT_HASH`.
///
/// # Errors
/// [`Error::ContractMismatch`] when the module's `warpline_contract_hash` differs from `expected`
/// or is absent (`ptx_hash: None`: a module from before the hash existed, or not warpline's).
pub(crate) fn check_contract(ptx: &str, expected: u64) -> Result<(), Error> {
    match ptx_contract_hash(ptx) {
        Some(h) if h == expected => Ok(()),
        ptx_hash => Err(Error::ContractMismatch {
            ptx_hash,
            host_hash: expected,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: u64 = 0x1122_3344_5566_7788;

    fn module(decl: &str) -> String {
        format!(".version 8.0\n.target sm_90\n.address_size 64\n\n{decl}\n\n.visible .entry k()\n{{\n\tret;\n}}\n")
    }

    #[test]
    fn reads_the_byte_array_form_rustc_emits() {
        let ptx = module(".visible .global .align 8 .b8 warpline_contract_hash[8] = {136, 119, 102, 85, 68, 51, 34, 17};");
        assert_eq!(ptx_contract_hash(&ptx), Some(H));
        assert!(check_contract(&ptx, H).is_ok());
    }

    #[test]
    fn reads_the_scalar_form() {
        let ptx =
            module(".visible .global .align 8 .u64 warpline_contract_hash = 1234605616436508552;");
        assert_eq!(ptx_contract_hash(&ptx), Some(H));
        let ptx = module(".global .b64 warpline_contract_hash = 0x1122334455667788;");
        assert_eq!(ptx_contract_hash(&ptx), Some(H));
    }

    #[test]
    fn a_different_hash_is_refused_with_both_values() {
        let ptx = module(".visible .global .align 8 .b8 warpline_contract_hash[8] = {136, 119, 102, 85, 68, 51, 34, 17};");
        match check_contract(&ptx, H + 1) {
            Err(Error::ContractMismatch {
                ptx_hash,
                host_hash,
            }) => {
                assert_eq!((ptx_hash, host_hash), (Some(H), H + 1));
            }
            other => panic!("expected ContractMismatch, got {other:?}"),
        }
    }

    #[test]
    fn an_absent_or_malformed_hash_is_refused() {
        for decl in [
            "",
            ".visible .global .align 8 .b8 other_global[8] = {1, 2, 3, 4, 5, 6, 7, 8};",
            ".visible .global .align 8 .b8 warpline_contract_hash[4] = {1, 2, 3, 4};",
            ".visible .global .align 8 .b8 warpline_contract_hash[8] = {1, 2, 3, 4, 5, 6, 7, 300};",
            "// .global .u64 warpline_contract_hash_x = 5;",
        ] {
            let e = check_contract(&module(decl), H).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::ContractMismatch {
                        ptx_hash: None,
                        host_hash: H
                    }
                ),
                "{decl}: {e:?}"
            );
            assert!(e.to_string().contains("rebuild"), "{e}");
        }
    }
}
