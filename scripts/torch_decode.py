#!/usr/bin/env python3
"""PyTorch reference for warpline's decode step (issue 21; benches/decode_step.rs).

The same Llama-3.1-8B-shaped layer as warpline::decode (hidden 4096, 32 q / 8 KV heads, head dim
128, intermediate 14336, RMSNorm eps 1e-5, RoPE theta 500000 rotate-half, paged KV cache
[pages, kv_heads, 16, d] with a block table per sequence, bf16), NL layers with their own
weights, B sequences each attending over L tokens (the new token at position L - 1).

Bench mode (default): a contiguous KV cache [B, kv, L, d] and SDPA with enable_gqa (PyTorch at
its best: no page gather; `--paged` benches the paged layer of the check mode instead). Per case
BxL it prints eager and CUDA-graph us per step and per layer, the HBM
floor per layer (weight + KV bytes over the device copy bandwidth measured in the same run) and
floor / measured, the same columns as benches/decode_step.rs. Run it right after the warpline
bench on the same machine.
    python3 scripts/torch_decode.py [--cases 1x1024,8x1024,8x4096,32x4096,64x2048] [--layers 4]

Check mode: loads the .npy files warpline wrote (WARPLINE_DECODE_NPY=DIR cargo bench --bench
decode_step), runs the same step in PyTorch in bf16 and in float64, and compares warpline's
output (out.npy) with the float64 result. It passes when warpline's max abs error is at most
1.5 x PyTorch-bf16's own max abs error against float64 plus 2^-7 of the output's RMS, i.e.
warpline is as accurate as PyTorch's bf16 path (the stated bf16 bound). Writes torch_out.npy.
    python3 scripts/torch_decode.py --check DIR

Prints 'SKIPPED: <reason>' and exits 0 when torch or CUDA is missing.
"""
import argparse
import math
import os
import sys

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except Exception as e:  # noqa: BLE001
    print(f"SKIPPED: torch/numpy not importable ({e})")
    sys.exit(0)


class Dims:
    def __init__(self, hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, page=16,
                 theta=500000.0, eps=1e-5):
        self.hidden, self.heads, self.kv_heads, self.head_dim = hidden, heads, kv_heads, head_dim
        self.inter, self.page, self.theta, self.eps = inter, page, theta, eps


def rmsnorm(x, w, eps):
    xf = x.to(torch.float32) if x.dtype != torch.float64 else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (w * y.to(x.dtype)) if x.dtype != torch.float64 else w * y


def rope(x, pos, d, theta):
    # x: [B, heads, d]; rotate half, angle pos * theta^(-2j/d)
    half = d // 2
    j = torch.arange(half, device=x.device, dtype=torch.float64)
    ang = pos.to(torch.float64)[:, None] * theta ** (-2.0 * j / d)
    cos, sin = ang.cos().to(x.dtype)[:, None, :], ang.sin().to(x.dtype)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)


def layer(dm, w, kc, vc, h, pos, bt, max_len):
    """One decode layer; h [B, hidden]; kc/vc [pages, kv, P, d] updated in place."""
    B = h.shape[0]
    H, KV, d, P = dm.heads, dm.kv_heads, dm.head_dim, dm.page
    x = rmsnorm(h, w["attn_norm"], dm.eps)
    qkv = x @ w["wqkv"].t()
    q = rope(qkv[:, :H * d].view(B, H, d), pos, d, dm.theta)
    k = rope(qkv[:, H * d:(H + KV) * d].view(B, KV, d), pos, d, dm.theta)
    v = qkv[:, (H + KV) * d:].view(B, KV, d)
    page = bt.gather(1, (pos // P)[:, None].long())[:, 0].long()
    row = (pos % P).long()
    kc[page, :, row, :] = k
    vc[page, :, row, :] = v
    npages = (max_len + P - 1) // P
    # Gather each sequence's pages: [B, npages, KV, P, d] -> [B, KV, npages * P, d]
    kk = kc[bt[:, :npages].long()].permute(0, 2, 1, 3, 4).reshape(B, KV, npages * P, d)
    vv = vc[bt[:, :npages].long()].permute(0, 2, 1, 3, 4).reshape(B, KV, npages * P, d)
    t = torch.arange(npages * P, device=h.device)
    mask = (t[None, :] <= pos[:, None])[:, None, None, :]  # [B, 1, 1, T]
    g = H // KV
    kk = kk.repeat_interleave(g, dim=1)
    vv = vv.repeat_interleave(g, dim=1)
    o = F.scaled_dot_product_attention(q[:, :, None, :], kk, vv, attn_mask=mask)
    o = o.reshape(B, H * d)
    h = h + o @ w["wo"].t()
    x = rmsnorm(h, w["ffn_norm"], dm.eps)
    act = F.silu(x @ w["w_gate"].t()) * (x @ w["w_up"].t())
    return h + act @ w["w_down"].t()


def layer_dense(dm, w, kc, vc, h, pos, L):
    """The bench's fair PyTorch layer: a contiguous KV cache [B, kv, Lmax, d] (no page gather),
    every sequence at length L (the bench's case), and SDPA with enable_gqa (torch's fused
    kernels, no repeat_interleave): PyTorch at its best for this shape, as anchors.md measured."""
    B = h.shape[0]
    H, KV, d = dm.heads, dm.kv_heads, dm.head_dim
    x = rmsnorm(h, w["attn_norm"], dm.eps)
    qkv = x @ w["wqkv"].t()
    q = rope(qkv[:, :H * d].view(B, H, d), pos, d, dm.theta)
    k = rope(qkv[:, H * d:(H + KV) * d].view(B, KV, d), pos, d, dm.theta)
    v = qkv[:, (H + KV) * d:].view(B, KV, d)
    b = torch.arange(B, device=h.device)
    kc[b, :, pos] = k
    vc[b, :, pos] = v
    o = F.scaled_dot_product_attention(q[:, :, None, :], kc[:, :, :L], vc[:, :, :L], enable_gqa=True)
    o = o.reshape(B, H * d)
    h = h + o @ w["wo"].t()
    x = rmsnorm(h, w["ffn_norm"], dm.eps)
    act = F.silu(x @ w["w_gate"].t()) * (x @ w["w_up"].t())
    return h + act @ w["w_down"].t()


def step(dm, ws, caches, h, pos, bt, max_len):
    for w, (kc, vc) in zip(ws, caches):
        h = layer(dm, w, kc, vc, h, pos, bt, max_len)
    return h


def copy_gbps(n=1 << 30, reps=10):
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); b.copy_(a); e.record(); e.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return 2 * n / (ts[len(ts) // 2] * 1e-3) / 1e9


def time_us(fn, reps=7, iters=10):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record(); e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3 / iters)
    ts.sort()
    return ts[len(ts) // 2]


def bench(cases, nl, paged=False):
    dm = Dims()
    dev = "cuda"
    bw = copy_gbps()
    print(f"torch decode step: Llama-3.1-8B layer, {nl} layers, device copy {bw:.0f} GB/s, torch {torch.__version__}")
    H, KV, d, hid, I = dm.heads, dm.kv_heads, dm.head_dim, dm.hidden, dm.inter
    gen = torch.Generator(device=dev).manual_seed(1)

    def mat(n, k):
        return (torch.randn(n, k, device=dev, generator=gen) / math.sqrt(k)).to(torch.bfloat16)

    ws = [dict(attn_norm=torch.ones(hid, device=dev, dtype=torch.bfloat16),
               wqkv=mat((H + 2 * KV) * d, hid), wo=mat(hid, H * d),
               ffn_norm=torch.ones(hid, device=dev, dtype=torch.bfloat16),
               w_gate=mat(I, hid), w_up=mat(I, hid), w_down=mat(hid, I)) for _ in range(nl)]
    wbytes = sum(t.numel() * 2 for t in ws[0].values())
    print(f"{'case':>9} {'variant':>14} {'us/step':>10} {'us/layer':>10} {'floor us/l':>11} {'floor/x':>8}")
    for (B, L) in cases:
        npages = (L + dm.page - 1) // dm.page
        pos = torch.full((B,), L - 1, device=dev, dtype=torch.int64)
        h = torch.randn(B, hid, device=dev, generator=gen).to(torch.bfloat16)
        floor = (wbytes + B * L * KV * d * 2 * 2) / (bw * 1e9) * 1e6
        if paged:
            caches = [(torch.full((B * npages, KV, dm.page, d), 0.01, device=dev, dtype=torch.bfloat16),
                       torch.full((B * npages, KV, dm.page, d), 0.01, device=dev, dtype=torch.bfloat16))
                      for _ in range(nl)]
            bt = torch.arange(B * npages, device=dev, dtype=torch.int32).view(B, npages)
            run = lambda: step(dm, ws, caches, h, pos, bt, L)  # noqa: E731
        else:
            caches = [(torch.full((B, KV, npages * dm.page, d), 0.01, device=dev, dtype=torch.bfloat16),
                       torch.full((B, KV, npages * dm.page, d), 0.01, device=dev, dtype=torch.bfloat16))
                      for _ in range(nl)]

            def run():
                x = h
                for w, (kc, vc) in zip(ws, caches):
                    x = layer_dense(dm, w, kc, vc, x, pos, L)
                return x
        eager = time_us(run)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                run()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = run()  # noqa: F841
        graph = time_us(g.replay)
        for name, us in (("eager", eager), ("cuda graph", graph)):
            print(f"{f'{B}x{L}':>9} {name:>14} {us:>10.1f} {us / nl:>10.1f} {floor:>11.1f} {floor * nl / us:>8.3f}")
        del caches, g
        torch.cuda.empty_cache()


def check(dirname):
    ld = lambda n: np.load(os.path.join(dirname, f"{n}.npy"))  # noqa: E731
    v = ld("dims")
    dm = Dims(int(v[0]), int(v[1]), int(v[2]), int(v[3]), int(v[4]), int(v[5]), float(v[6]), float(v[7]))
    nl = int(v[8])
    dev = "cuda"
    pos = torch.tensor(ld("positions"), device=dev).long()
    bt = torch.tensor(ld("block_table"), device=dev).long()
    max_len = int(pos.max().item()) + 1
    res = {}
    for dt in (torch.float64, torch.bfloat16):
        ws = [{n: torch.tensor(ld(f"l{l}_{n}"), device=dev, dtype=dt)
               for n in ("attn_norm", "wqkv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")}
              for l in range(nl)]
        caches = [(torch.tensor(ld(f"l{l}_k_cache"), device=dev, dtype=dt),
                   torch.tensor(ld(f"l{l}_v_cache"), device=dev, dtype=dt)) for l in range(nl)]
        h = torch.tensor(ld("x"), device=dev, dtype=dt)
        res[dt] = step(dm, ws, caches, h, pos, bt, max_len).to(torch.float64)
    want = res[torch.float64]
    ours = torch.tensor(ld("out"), device=dev, dtype=torch.float64)
    np.save(os.path.join(dirname, "torch_out.npy"), res[torch.bfloat16].float().cpu().numpy())
    rms = want.pow(2).mean().sqrt().item()
    e_ours = (ours - want).abs().max().item()
    e_torch = (res[torch.bfloat16] - want).abs().max().item()
    bound = 1.5 * e_torch + rms / 128
    ok = e_ours <= bound and bool(torch.isfinite(ours).all())
    print(f"check {dirname}: B={pos.numel()} layers={nl} rms(out)={rms:.4f}")
    print(f"  max |warpline - float64| = {e_ours:.5f}; max |torch bf16 - float64| = {e_torch:.5f}; bound 1.5 x torch + rms/128 = {bound:.5f}")
    print(f"  max |warpline - torch bf16| = {(ours - res[torch.bfloat16]).abs().max().item():.5f}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="1x1024,8x1024,8x4096,32x4096,64x2048")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--check", default=None)
    ap.add_argument("--paged", action="store_true",
                    help="bench the paged-cache layer (page gather + repeat_interleave) instead of the contiguous SDPA one")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device")
        return 0
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    if a.check:
        return check(a.check)
    cases = [tuple(int(x) for x in c.split("x")) for c in a.cases.split(",")]
    with torch.no_grad():
        bench(cases, a.layers, a.paged)
    return 0


if __name__ == "__main__":
    with torch.no_grad():
        sys.exit(main())
