#!/usr/bin/env python3
"""cuDNN reference for warpline's attention forward (issue 23; benches/attention.rs).

Runs torch SDPA (torch.nn.functional.scaled_dot_product_attention) with the cuDNN backend only
(torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)) on the bench's shapes B x H x S x D,
causal and not, BF16 (--dtype fp16 for FP16), scale 1/sqrt(D), and prints rows in the format of
benches/attention.rs, so both run in one GPU session:

    cargo bench --bench attention && python3 scripts/torch_attention.py

SDPA takes [B, H, S, D]; the tensors are made as [B, S, H, D] (FlashAttention's layout, the one
warpline reads) and transposed, a view, as FlashAttention's own benchmarks do. TFLOP/s counts
4 B H S^2 D, halved for causal (FlashAttention's convention). Timing: warm-up, then 15 rounds of
10 launches between CUDA events, median. --flash adds torch's flash backend (FlashAttention-2)
as a second row per shape; --csv adds machine-readable rows (benches/attention.rs runs this script
after its own rows and prints warpline / cuDNN ratios from them).

Prints 'SKIPPED: <reason>' and exits 0 when torch, CUDA or the cuDNN SDPA backend is missing.
"""
import argparse
import sys

try:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
except Exception as e:  # noqa: BLE001
    print(f"SKIPPED: torch not importable ({e})")
    sys.exit(0)

REPS, BATCH, WARM_MS = 15, 10, 300.0


def median_ms(fn):
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    warm = torch.cuda.Event(enable_timing=True)
    warm.record()
    while True:
        fn()
        end.record()
        end.synchronize()
        if warm.elapsed_time(end) >= WARM_MS:
            break
    times = []
    for _ in range(REPS):
        start.record()
        for _ in range(BATCH):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / BATCH)
    times.sort()
    return times[REPS // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="16x16x2048x128,4x16x8192x128,16x32x2048x64",
                    help="BxHxSxD,...")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--flash", action="store_true", help="also time the flash (FA2) backend")
    ap.add_argument("--csv", action="store_true",
                    help="also print each row as 'csv,B,H,S,D,causal,kernel,ms,tflops' "
                         "(read by benches/attention.rs)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: CUDA not available")
        return
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()} (torch {torch.__version__}, "
          f"cuDNN {torch.backends.cudnn.version()}), {args.dtype}")
    print(f"{'B x H x S x D':>22} {'causal':>7} {'kernel':>10} {'ms':>10} {'TFLOP/s':>10}")
    backends = [("cuDNN", SDPBackend.CUDNN_ATTENTION)]
    if args.flash:
        backends.append(("torch-FA2", SDPBackend.FLASH_ATTENTION))
    torch.manual_seed(23)
    for shape in args.shapes.split(","):
        b, h, s, d = (int(x) for x in shape.split("x"))
        q, k, v = (torch.randn(b, s, h, d, device=dev, dtype=dtype).transpose(1, 2)
                   for _ in range(3))
        for causal in (False, True):
            flops = 4 * b * h * s * s * d / (2 if causal else 1)
            for name, backend in backends:
                try:
                    with sdpa_kernel(backend):
                        def fn():
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                        t = median_ms(fn)
                except Exception as e:  # noqa: BLE001
                    print(f"{b} x {h} x {s} x {d} causal={causal} {name}: SKIPPED ({e})")
                    continue
                print(f"{f'{b} x {h} x {s} x {d}':>22} {str(causal).lower():>7} {name:>10} "
                      f"{t:>10.3f} {flops / t / 1e9:>10.1f}")
                if args.csv:
                    print(f"csv,{b},{h},{s},{d},{str(causal).lower()},{name},{t},{flops / t / 1e9}")


if __name__ == "__main__":
    main()
