//! Shared memory: the dynamic shared-memory window and typed 32-bit shared addresses.
//!
//! Shared memory is addressed here by its 32-bit `.shared` window address, which is what `cp.async`,
//! `mbarrier`, `mapa` and `ld/st.shared` take (PTX ISA §5.1.5). There is no language feature for
//! shared memory in Rust (rust-lang/rust#135516), so the window is declared in module-scope PTX.

use core::arch::{asm, global_asm};
use core::marker::PhantomData;

global_asm!(".extern .shared .align 128 .b8 warpline_dyn_smem[];");

/// Shared-window address of the CTA's dynamic shared memory (128-byte aligned). Its size is the
/// `sharedMemBytes` of the launch. Needs the declaration that [`crate::kernel_module!`] emits.
#[inline(always)]
pub fn dynamic_smem_base() -> u32 {
    let addr: u32;
    // SAFETY: takes the address of a symbol; no memory is touched.
    unsafe {
        asm!("mov.u32 {a}, warpline_dyn_smem;", a = out(reg32) addr, options(nomem, nostack, pure))
    };
    addr
}

/// Bytes of dynamic shared memory this launch gave the CTA (special register `%dynamic_smem_size`,
/// PTX ISA 8.0 §10): the `sharedMemBytes` of the launch.
#[inline(always)]
pub fn dynamic_smem_size() -> u32 {
    let bytes: u32;
    // SAFETY: reading a special register.
    unsafe {
        asm!("mov.u32 {b}, %dynamic_smem_size;", b = out(reg32) bytes, options(nomem, nostack, pure))
    };
    bytes
}

/// A typed shared-memory address: `addr` is a byte address in the `.shared` window.
/// Loads and stores are `unsafe`: the caller guarantees the address lies inside the CTA's shared
/// memory, is aligned for `T` (16 bytes for the vector forms) and is not raced on.
pub struct Shared<T> {
    addr: u32,
    _t: PhantomData<T>,
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Shared<T> {}

impl<T> Shared<T> {
    /// Wraps a shared-window byte address.
    #[inline(always)]
    pub const fn at(addr: u32) -> Self {
        Self {
            addr,
            _t: PhantomData,
        }
    }
    /// The shared-window byte address.
    #[inline(always)]
    pub const fn addr(self) -> u32 {
        self.addr
    }
    /// The address `count` elements of `T` further on.
    #[inline(always)]
    pub const fn add(self, count: u32) -> Self {
        Self::at(self.addr + count * core::mem::size_of::<T>() as u32)
    }
}

impl Shared<f32> {
    /// `ld.shared.f32`.
    ///
    /// # Safety
    /// See [`Shared`].
    #[inline(always)]
    pub unsafe fn load(self) -> f32 {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            let v: f32;
            asm!("ld.shared.f32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) self.addr, options(nostack));
            v
        }
    }
    /// `st.shared.f32`.
    ///
    /// # Safety
    /// See [`Shared`].
    #[inline(always)]
    pub unsafe fn store(self, v: f32) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            asm!("st.shared.f32 [{a}], {v};", v = in(reg32) v, a = in(reg32) self.addr, options(nostack));
        }
    }
    /// `ld.shared.v4.f32` of the 16-byte vector at this address (16-byte aligned).
    ///
    /// # Safety
    /// See [`Shared`].
    #[inline(always)]
    pub unsafe fn load_v4(self) -> [f32; 4] {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            let (x, y, z, w): (f32, f32, f32, f32);
            asm!("ld.shared.v4.f32 {{{x}, {y}, {z}, {w}}}, [{a}];",
                x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
                a = in(reg32) self.addr, options(nostack));
            [x, y, z, w]
        }
    }
    /// `st.shared.v4.f32` of a 16-byte vector at this address (16-byte aligned).
    ///
    /// # Safety
    /// See [`Shared`].
    #[inline(always)]
    pub unsafe fn store_v4(self, v: [f32; 4]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            asm!("st.shared.v4.f32 [{a}], {{{x}, {y}, {z}, {w}}};",
                x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3],
                a = in(reg32) self.addr, options(nostack));
        }
    }
}

impl Shared<f32> {
    /// `st.shared.v2.f32` of an 8-byte vector at this address (8-byte aligned).
    ///
    /// # Safety
    /// See [`Shared`].
    #[inline(always)]
    pub unsafe fn store_v2(self, v: [f32; 2]) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            asm!("st.shared.v2.f32 [{a}], {{{x}, {y}}};", x = in(reg32) v[0], y = in(reg32) v[1],
                a = in(reg32) self.addr, options(nostack));
        }
    }
}

impl Shared<u32> {
    /// `ld.shared.b32` (4-byte aligned). An `asm` the compiler neither hoists nor merges: a
    /// value read again later is read again from shared memory, not kept in a register.
    ///
    /// # Safety
    /// See [`Shared`].
    #[inline(always)]
    pub unsafe fn load(self) -> u32 {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            let v: u32;
            asm!("ld.shared.b32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) self.addr, options(nostack));
            v
        }
    }
    /// `st.shared.b32` (4-byte aligned), e.g. two packed 16-bit values.
    ///
    /// # Safety
    /// See [`Shared`].
    #[inline(always)]
    pub unsafe fn store(self, v: u32) {
        // SAFETY: the caller upholds this function's `# Safety` contract.
        unsafe {
            asm!("st.shared.b32 [{a}], {v};", v = in(reg32) v, a = in(reg32) self.addr, options(nostack));
        }
    }
}

/// `st.global.v4.f32`: a 16-byte store to global memory.
///
/// # Safety
/// `dst` is a 16-byte aligned global address of 4 writable floats.
#[inline(always)]
pub unsafe fn store_global_v4(dst: *mut f32, v: [f32; 4]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("st.global.v4.f32 [{p}], {{{x}, {y}, {z}, {w}}};",
            x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3],
            p = in(reg64) dst, options(nostack));
    }
}

/// `st.global.f32`.
///
/// # Safety
/// `dst` is a 4-byte aligned global address of a writable float.
#[inline(always)]
pub unsafe fn store_global(dst: *mut f32, v: f32) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("st.global.f32 [{p}], {v};", v = in(reg32) v, p = in(reg64) dst, options(nostack));
    }
}

/// `st.global.v2.f32`: an 8-byte store of two floats to global memory (PTX ISA 8.3 §9.7.9.9
/// `st`, vector form).
///
/// # Safety
/// `dst` is an 8-byte aligned global address of 2 writable floats that no other thread accesses
/// concurrently.
#[inline(always)]
pub unsafe fn store_global_v2(dst: *mut f32, v: [f32; 2]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("st.global.v2.f32 [{p}], {{{x}, {y}}};", x = in(reg32) v[0], y = in(reg32) v[1],
            p = in(reg64) dst, options(nostack));
    }
}

/// `st.global.b64`: an 8-byte store to global memory (PTX ISA 8.3 §9.7.9.9 `st`), e.g. four
/// packed BF16/FP16 values (two [`super::math::pack_bf16x2`] words, the first in the low half).
///
/// # Safety
/// `dst` is an 8-byte aligned global address of 8 writable bytes that no other thread accesses
/// concurrently.
#[inline(always)]
pub unsafe fn store_global_b64(dst: *mut u64, v: u64) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("st.global.b64 [{p}], {v};", v = in(reg64) v, p = in(reg64) dst, options(nostack));
    }
}
