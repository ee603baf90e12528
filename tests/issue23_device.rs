//! Issue 23's device-library addition on its own: the register-A wgmma
//! (`wgmma::mma_async_rs_m64n128k16_f32_bf16`) fed through `AFragment::from_acc_bf16` from the
//! FP32 accumulator layout, with an MN-major (`imm-trans-b = 1`), 128-byte-swizzled B in two
//! 64-column chunks: exactly the path of attention's `O += P V`, checked in isolation against
//! an f64 product (kernel `rs_wgmma_check`, `contract::attention::RS_CHECK_KERNEL`). If the
//! attention tests fail and this passes, the fault is not in the fragment mapping or V's
//! descriptor.
//!
//! GPU test: skips without a driver or an sm_90a device (unless `WARPLINE_REQUIRE_GPU=1`).

use rand::SeedableRng;
use warpline::launch::LaunchConfig;
use warpline::module::{View, ViewMut};
use warpline::{bf16, MemPool};
use warpline_gpu::contract::attention as ac;
use warpline_suite::support::{gemm_seed, gpu_or_skip, normal};

#[test]
fn register_a_wgmma_with_mn_major_swizzled_b_matches_f64() {
    let test = "register_a_wgmma_with_mn_major_swizzled_b_matches_f64";
    let Some(dev) = gpu_or_skip(test) else {
        return;
    };
    if dev.capabilities().compute_capability != (9, 0) {
        warpline_suite::support::skip(test, "the device is not compute capability 9.0 (sm_90a)");
        return;
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(gemm_seed(test));
    let module = dev.load_module(warpline::SM90A_PTX).unwrap();
    let k = module
        .kernel::<(View<f32>, View<u16>, ViewMut<f32>)>(ac::RS_CHECK_KERNEL)
        .unwrap();
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let a = normal(&mut rng, 64 * 16);
    let b: Vec<u16> = normal(&mut rng, 16 * 128)
        .into_iter()
        .map(|x| bf16::from_f32(x).to_bits())
        .collect();
    let mut da = pool.alloc_async::<f32>(&s, a.len()).unwrap();
    da.copy_from_host(&a).unwrap();
    let mut db = pool.alloc_async::<u16>(&s, b.len()).unwrap();
    db.copy_from_host(&b).unwrap();
    let mut dd = pool.alloc_async::<f32>(&s, 64 * 128).unwrap();
    dd.copy_from_host(&vec![f32::NAN; 64 * 128]).unwrap();
    // SAFETY: rs_wgmma_check reads a[..64 * 16], b[..16 * 128] and writes d[..64 * 128] (its
    // contract), one CTA of RS_CHECK_THREADS threads with RS_CHECK_SMEM_BYTES.
    unsafe {
        k.launch(
            &s,
            &LaunchConfig::linear(1, ac::RS_CHECK_THREADS, ac::RS_CHECK_SMEM_BYTES as u32),
            (da.as_view(), db.as_view(), dd.as_view_mut()),
        )
    }
    .unwrap();
    let mut d = vec![0f32; 64 * 128];
    dd.copy_to_host(&mut d).unwrap();
    let mut worst = 0f64;
    for r in 0..64 {
        for c in 0..128 {
            let (mut want, mut abs) = (0f64, 0f64);
            for kk in 0..16 {
                let x = bf16::from_f32(a[r * 16 + kk]).to_f64();
                let y = bf16::from_bits(b[kk * 128 + c]).to_f64();
                want += x * y;
                abs += (x * y).abs();
            }
            let got = d[r * 128 + c] as f64;
            // Products of BF16 values are exact in FP32; 16 FP32 additions.
            let bound = 1e-5 * abs + 1e-6;
            let err = (got - want).abs();
            assert!(
                err <= bound,
                "D[{r}][{c}] = {got}, want {want} (error {err:e} > {bound:e}): the A fragment \
                 mapping or B's MN-major descriptor is wrong"
            );
            worst = worst.max(err / bound);
        }
    }
    eprintln!("{test}: worst error {worst:.3} of the bound");
}
