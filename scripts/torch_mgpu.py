#!/usr/bin/env python3
"""Same-run references for `warpline mgpu` (issue 13): torch peer copies GPU0<->GPU1 (copy_ on a
stream, CUDA-event timed) and torch.distributed NCCL all-reduce bus bandwidth 1 MiB..1 GiB with
2 processes. Prints 'SKIPPED: <reason>' and exits 0 when torch or 2 GPUs are missing.
NVLS stays off: NCCL_NVLS_ENABLE=0 (and the torch/NVSHMEM multicast switches) are set here and
inherited by the worker processes. Usage: python3 scripts/torch_mgpu.py [peer] [allreduce]"""
import os, sys
for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(k, v)
try:
    import torch
except Exception as e:  # noqa: BLE001
    print(f"SKIPPED: torch not importable ({e})"); sys.exit(0)
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    print("SKIPPED: needs 2 CUDA GPUs"); sys.exit(0)
SIZES = [1 << (20 + 2 * k) for k in range(6)]

def peer(iters=20):
    print("torch peer copies GPU0<->GPU1 (copy_ on a stream), GB/s")
    for n in (1 << 20, 64 << 20, 1 << 30):
        a = [torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}") for i in (0, 1)]
        b = [torch.empty(n, dtype=torch.uint8, device=f"cuda:{i}") for i in (1, 0)]
        s = [torch.cuda.Stream(device=i) for i in (0, 1)]
        def run(both):
            for _ in range(2):
                with torch.cuda.stream(s[0]): b[0].copy_(a[0], non_blocking=True)
            torch.cuda.synchronize(0); torch.cuda.synchronize(1)
            st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            st.record(s[0]); s[1].wait_event(st)
            for _ in range(iters):
                with torch.cuda.stream(s[0]): b[0].copy_(a[0], non_blocking=True)
                if both:
                    with torch.cuda.stream(s[1]): b[1].copy_(a[1], non_blocking=True)
            e1 = torch.cuda.Event(); e1.record(s[1]); s[0].wait_event(e1); en.record(s[0]); en.synchronize()
            return n * iters * (2 if both else 1) / (st.elapsed_time(en) * 1e-3) / 1e9
        print(f"{n:>12} one-way {run(False):8.1f} both {run(True):8.1f}")

def _worker(rank, world, iters, port):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    if rank == 0:
        print("torch.distributed NCCL all-reduce f32, 2 processes (one GPU each), rank 0's timing; GB/s")
        print(f"{'bytes':>12} {'time us':>12} {'algbw':>10} {'busbw':>10}")
    for n in SIZES:
        x = torch.ones(n // 4, device=f"cuda:{rank}")
        for _ in range(3): dist.all_reduce(x)
        torch.cuda.synchronize()
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        for _ in range(iters): dist.all_reduce(x)
        en.record(); en.synchronize()
        t = st.elapsed_time(en) * 1e-3 / iters
        alg = n / t / 1e9
        if rank == 0: print(f"{n:>12} {t*1e6:>12.1f} {alg:>10.1f} {alg * 2 * (world - 1) / world:>10.1f}")
    dist.destroy_process_group()

def allreduce(iters=20):
    try:
        import torch.multiprocessing as mp
        mp.spawn(_worker, args=(2, iters, 29517), nprocs=2, join=True)
    except Exception as e:  # noqa: BLE001
        print(f"SKIPPED: torch.distributed all-reduce failed ({e})")

# mp.spawn re-imports this file in each child: only the parent runs the measurements.
if __name__ == "__main__":
    what = sys.argv[1:] or ["peer", "allreduce"]
    if "peer" in what:
        peer()
    if "allreduce" in what:
        allreduce()
