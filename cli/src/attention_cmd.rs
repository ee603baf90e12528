//! `warpline attention`: the attention forward (issue 23) on random inputs, timed, with TFLOP/s
//! counted as FlashAttention counts them (`4 S_q S_k D H` per sequence, halved for causal), and
//! with `--verify` checked against the f64 references on sampled rows with FlashAttention's
//! tolerance rule. Flags are checked (by the library's own validation) before the device opens.

use clap::{Args, ValueEnum};
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use warpline::kernels::attention::reference::{
    attention_f64_multi, fwd_atol, max_abs_error, PRounding, RefProblem, LSE_ATOL,
};
use warpline::kernels::attention::{
    check_problem, Attention, AttentionMemory, AttentionOptions, AttentionProblem,
    AttentionTensors, AttnElement, SeqLens,
};
use warpline::{Error, MemPool};

use super::{cli_json, median_launch_ms, normal_f32, say, usage, CliResult, Ctx};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AttnDtype {
    Bf16,
    Fp16,
}

#[derive(Args)]
pub struct AttentionArgs {
    /// Sequences in the batch.
    #[arg(long)]
    batch: usize,
    /// Query heads.
    #[arg(long)]
    heads: usize,
    /// Key/value heads (a divisor of --heads; default: --heads).
    #[arg(long)]
    kv_heads: Option<usize>,
    /// Query rows per sequence (with --varlen: the longest).
    #[arg(long)]
    seqlen: usize,
    /// Keys per sequence (default: --seqlen; with --varlen: the longest).
    #[arg(long)]
    seqlen_k: Option<usize>,
    /// Head dimension: 64 or 128.
    #[arg(long)]
    head_dim: usize,
    /// Causal mask (bottom-right aligned).
    #[arg(long)]
    causal: bool,
    /// Variable lengths: each sequence's lengths drawn from 1..=seqlen (and 1..=seqlen_k) with
    /// the seed; the first sequence has the maxima.
    #[arg(long)]
    varlen: bool,
    /// Check sampled rows of every (sequence, head) against the f64 references.
    #[arg(long)]
    verify: bool,
    /// Element type.
    #[arg(long, value_enum, default_value_t = AttnDtype::Bf16)]
    dtype: AttnDtype,
    /// Timed launches (median).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Launch with PDL.
    #[arg(long)]
    pdl: bool,
    /// Turn the ping-pong between the consumer warpgroups off (to measure what it brings).
    #[arg(long)]
    no_pingpong: bool,
    /// Turn the in-warpgroup overlap (and the ping-pong) off: the plain per-block order.
    #[arg(long)]
    no_overlap: bool,
    /// One CTA per tile instead of the persistent grid (to measure what it brings).
    #[arg(long)]
    no_persistent: bool,
    /// Bounds-checked stores of O instead of the TMA-store epilogue (to measure what it brings).
    #[arg(long)]
    no_tma_store: bool,
}

pub fn run(ctx: &Ctx, args: AttentionArgs) -> CliResult<Value> {
    match args.dtype {
        AttnDtype::Bf16 => run_t::<warpline::bf16>(ctx, &args),
        AttnDtype::Fp16 => run_t::<warpline::f16>(ctx, &args),
    }
}

fn run_t<T: AttnElement>(ctx: &Ctx, args: &AttentionArgs) -> CliResult<Value> {
    if args.reps == 0 {
        return Err(usage("--reps 0: at least 1 timed launch is needed"));
    }
    let (sq, sk) = (args.seqlen, args.seqlen_k.unwrap_or(args.seqlen));
    let (h, d) = (args.heads, args.head_dim);
    let hk = args.kv_heads.unwrap_or(h);
    let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed);
    let lens: Vec<(usize, usize)> = (0..args.batch)
        .map(|b| {
            if !args.varlen || b == 0 {
                (sq, sk)
            } else {
                (
                    rng.random_range(1..=sq.max(1)),
                    rng.random_range(1..=sk.max(1)),
                )
            }
        })
        .collect();
    let mut cu_q = vec![0i32];
    let mut cu_k = vec![0i32];
    for &(q, k) in &lens {
        let (lq, lk) = (*cu_q.last().unwrap() as i64, *cu_k.last().unwrap() as i64);
        if lq + q as i64 > i32::MAX as i64 || lk + k as i64 > i32::MAX as i64 {
            return Err(usage("the batch has more than 2^31 - 1 rows"));
        }
        cu_q.push((lq + q as i64) as i32);
        cu_k.push((lk + k as i64) as i32);
    }
    let problem = AttentionProblem {
        batch: args.batch,
        heads: h,
        kv_heads: hk,
        head_dim: d,
        seqlens: if args.varlen {
            SeqLens::Varlen {
                cu_q: &cu_q,
                cu_k: &cu_k,
            }
        } else {
            SeqLens::Fixed { q: sq, k: sk }
        },
        causal: args.causal,
        softmax_scale: None,
    };
    let (tq, tk) = (
        *cu_q.last().unwrap() as usize,
        *cu_k.last().unwrap() as usize,
    );
    // The library's checks, before the device opens (exact sizes, aligned addresses).
    let mem = AttentionMemory {
        q: (tq * h * d, 0),
        k: (tk * hk * d, 0),
        v: (tk * hk * d, 0),
        o: (tq * h * d, 0),
        lse: (tq * h, 0),
    };
    let shape = check_problem(&problem, &mem).map_err(|e| usage(e.to_string()))?;
    let dev = ctx.open()?;
    let device = cli_json::device(&dev);
    let att = Attention::new(&dev)?;
    let stream = dev.new_stream()?;
    let pool = MemPool::new(&dev, 0)?;
    let draw = |rng: &mut rand::rngs::StdRng, n: usize| -> Vec<T> {
        normal_f32(rng, n)
            .into_iter()
            .map(|x| T::from_f64(x as f64))
            .collect()
    };
    let (q, k, v) = (
        draw(&mut rng, tq * h * d),
        draw(&mut rng, tk * hk * d),
        draw(&mut rng, tk * hk * d),
    );
    let up = |x: &[T]| -> warpline::Result<warpline::DeviceBuffer<T>> {
        let mut b = pool.alloc_async::<T>(&stream, x.len())?;
        b.copy_from_host(x)?;
        Ok(b)
    };
    let (dq, dk, dv) = (up(&q)?, up(&k)?, up(&v)?);
    let mut dout = up(&vec![T::from_f64(f64::NAN); tq * h * d])?;
    let mut dlse = pool.alloc_async::<f32>(&stream, tq * h)?;
    dlse.copy_from_host(&vec![f32::NAN; tq * h])?;
    let ms = {
        let plan = att.plan(
            &stream,
            &problem,
            AttentionTensors {
                q: dq.as_view(),
                k: dk.as_view(),
                v: dv.as_view(),
                o: dout.as_view_mut(),
                lse: dlse.as_view_mut(),
            },
            AttentionOptions {
                pdl: args.pdl,
                no_pingpong: args.no_pingpong,
                no_overlap: args.no_overlap,
                no_persistent: args.no_persistent,
                max_ctas: None,
                hb_group: None,
                no_tma_store: args.no_tma_store,
            },
        )?;
        median_launch_ms(&stream, false, args.reps, &mut || plan.launch())?
    };
    let tflops = shape.flops() / ms / 1e9;
    say!(
        "attention {} B={} H={h} HK={hk} S_q={sq} S_k={sk} D={d} causal={} varlen={}: {ms:.3} ms, {tflops:.1} TFLOP/s",
        T::NAME,
        args.batch,
        args.causal,
        args.varlen
    );
    let mut verified = Value::Null;
    if args.verify {
        let mut o = vec![T::from_f64(0.0); tq * h * d];
        dout.copy_to_host(&mut o)?;
        let mut lse = vec![0f32; tq * h];
        dlse.copy_to_host(&mut lse)?;
        let f = |x: &[T]| x.iter().map(|v| v.to_f64()).collect::<Vec<_>>();
        let (qf, kf, vf) = (f(&q), f(&k), f(&v));
        let cq: Vec<usize> = cu_q.iter().map(|&x| x as usize).collect();
        let ck: Vec<usize> = cu_k.iter().map(|&x| x as usize).collect();
        let rp = RefProblem {
            q: &qf,
            k: &kf,
            v: &vf,
            cu_q: &cq,
            cu_k: &ck,
            heads: h,
            kv_heads: hk,
            head_dim: d,
            causal: args.causal,
            scale: shape.softmax_scale as f64,
            row_step: sq.div_ceil(16) | 1,
        };
        let (os, lse_ref) = attention_f64_multi(&rp, &[PRounding::Exact, T::P_ROUNDING]);
        let (mut got, mut exact, mut sp) = (Vec::new(), Vec::new(), Vec::new());
        for (i, x) in o.iter().enumerate() {
            if !os[0][i].is_nan() {
                got.push(x.to_f64());
                exact.push(os[0][i]);
                sp.push(T::from_f64(os[1][i]).to_f64());
            }
        }
        let err = max_abs_error(&got, &exact);
        let err_sp = max_abs_error(&sp, &exact);
        let atol = fwd_atol(&exact, T::P_ROUNDING);
        let mut lse_err = 0f64;
        for b in 0..args.batch {
            for head in 0..h {
                for i in 0..cq[b + 1] - cq[b] {
                    let w = lse_ref[head * tq + cq[b] + i];
                    if w.is_nan() {
                        continue;
                    }
                    let at = if args.varlen {
                        head * tq + cq[b] + i
                    } else {
                        (b * h + head) * sq + i
                    };
                    let g = lse[at] as f64;
                    let e = if g == w {
                        0.0
                    } else if g.is_finite() && w.is_finite() {
                        (g - w).abs()
                    } else {
                        f64::INFINITY
                    };
                    lse_err = lse_err.max(e);
                }
            }
        }
        let ok = err <= 2.0 * err_sp + atol && lse_err <= LSE_ATOL;
        say!(
            "verify ({} sampled elements): max|O - O_exact| {err:.3e} <= 2 * {err_sp:.3e} + {atol:.1e}: {}; max|LSE - LSE_exact| {lse_err:.1e} <= {LSE_ATOL:.0e}",
            got.len(),
            if ok { "ok" } else { "FAILED" }
        );
        if !ok {
            return Err(Error::Verification {
                detail: format!(
                    "attention: max|O - O_exact| = {err:e} (bound 2 * {err_sp:e} + {atol:e}), max|LSE - LSE_exact| = {lse_err:e} (bound {LSE_ATOL:e})"
                ),
            }
            .into());
        }
        verified =
            json!({"o_err": err, "o_err_same_precision": err_sp, "atol": atol, "lse_err": lse_err});
    }
    Ok(json!({
        "device": device,
        "dtype": T::NAME,
        "batch": args.batch, "heads": h, "kv_heads": hk, "seqlen_q": sq, "seqlen_k": sk,
        "head_dim": d, "causal": args.causal, "varlen": args.varlen,
        "ms": ms, "tflops": tflops, "flops": shape.flops(),
        "verify": verified,
    }))
}
