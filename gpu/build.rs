//! Hashes `src/contract.rs` (FNV-1a 64 of its bytes) into `WARPLINE_CONTRACT_HASH`, which
//! `CONTRACT_HASH` reads: the host build (rlib) and the PTX build (cdylib) of this crate each carry
//! the hash of the contract they were compiled with, and the host refuses a PTX module whose hash
//! differs from its own.

fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn main() {
    let path = "src/contract.rs";
    println!("cargo:rerun-if-changed={path}");
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    println!("cargo:rustc-env=WARPLINE_CONTRACT_HASH={}", fnv1a64(&bytes));
}
