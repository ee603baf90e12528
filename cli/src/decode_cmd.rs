//! `warpline decode` (issue 21): one LLM decode step of `warpline::decode` (Llama-3.1-8B layer
//! shapes by default, `--small` for the test dims), `--layers` layers with their own random
//! weights, a paged KV cache, timed per variant (a plain, b PDL, c PDL + prefetch, d graph,
//! e graph + PDL + prefetch) against the HBM floor measured in the same run: the same table as
//! `benches/decode_step.rs`, through the same library functions (`decode::bench`).
//! `--timeline` / `--trace` draw / write the `%globaltimer` timeline of one step of the last
//! variant asked for (one row per kernel: the part before `griddepcontrol.wait`, then the rest).
//! `--verify` runs one more step, variant e, with random caches and ragged positions, against
//! the f64 reference (`decode::reference::step`, rounding to bf16 where the GPU stores bf16),
//! with the bound of `tests/decode_step.rs`: `|got - want| <= |want| / 32 + rms(want) / 64`.
//! Flags are checked before the device opens.

use clap::Args;
use serde_json::{json, Value};
use warpline::decode::bench::{
    build_step, parse_gemm_config, run_case, timeline, timeline_trace, Case,
};
use warpline::decode::reference::{
    normal_bf16, step as reference_step, LayerWeights, RefCache, Rounding,
};
use warpline::decode::step::{AttnForm, DecodeStep, HostLayer, StepConfig, Variant};
use warpline::decode::DecodeDims;
use warpline::kernels::DecodeConfig;
use warpline::{bf16, Error};

use super::{cli_json, say, usage, CliResult, Ctx};

/// Longest KV length the command accepts (positions are u32 and the RoPE table covers them).
const MAX_KV_LEN: usize = 1 << 20;
/// Most layers the command accepts.
const MAX_LAYERS: usize = 256;

#[derive(Args)]
pub struct DecodeArgs {
    /// Sequences in the batch (1 to 64).
    #[arg(long)]
    batch: usize,
    /// Tokens each sequence attends over, the new one included (its position is kv-len - 1;
    /// 1 to 2^20).
    #[arg(long)]
    kv_len: usize,
    /// Layers, each with its own weights and caches (1 to 256).
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Tokens per KV-cache page.
    #[arg(long, default_value_t = 16)]
    page: usize,
    /// Variants to time: letters of `abcde` (e.g. `ce`), or `all`.
    #[arg(long, default_value = "all")]
    variant: String,
    /// The test dims (hidden 256, 4 query heads, 2 KV heads, head dim 64, intermediate 512)
    /// instead of Llama-3.1-8B's.
    #[arg(long)]
    small: bool,
    /// One step of variant e with random caches and ragged positions against the f64 CPU
    /// reference (at Llama-8B dims this takes seconds of CPU time and about 1 GB of host memory
    /// per layer).
    #[arg(long)]
    verify: bool,
    /// Timed repetitions (the median is reported), each of 10 steps.
    #[arg(long, default_value_t = 7)]
    reps: usize,
    /// One decode-GEMM form for every GEMM of the step (the per-GEMM defaults step aside):
    /// `_`-joined tokens `w4|w8|w16` (warps), `ksN` (k-split), `u2|u4` (unroll), `r1|r2` (row
    /// tiles), `pa|nopa` (A prefetch), `pf|nopf` (L2 hint), e.g. `w8_u2_r2_pa`.
    #[arg(long, value_name = "FORM")]
    gemm: Option<String>,
    /// The qkv GEMM's form (tokens as for --gemm), over --gemm and the default.
    #[arg(long, value_name = "FORM")]
    gemm_qkv: Option<String>,
    /// The o_proj GEMM's form.
    #[arg(long, value_name = "FORM")]
    gemm_o: Option<String>,
    /// The gate_up GEMM's form.
    #[arg(long, value_name = "FORM")]
    gemm_gu: Option<String>,
    /// The down GEMM's form.
    #[arg(long, value_name = "FORM")]
    gemm_down: Option<String>,
    /// The GEMMs that run as swap-AB tensor-core GEMMs (issue 20): none, all, or a
    /// comma-separated list of qkv, o_proj, gate_up, down (default: all); applied after the
    /// --gemm forms (a GEMM given a --gemm form is otherwise a decode GEMM).
    #[arg(long, value_name = "LIST")]
    swap_ab: Option<String>,
    /// The decode attention's form: `tc` (tensor cores, fed by TMA; pages of 8, 16, 32 or a
    /// multiple of 32 tokens) or `cuda` (CUDA cores, any page size). Default: `tc` where the
    /// page size allows it, else `cuda`.
    #[arg(long, value_name = "FORM")]
    attn: Option<String>,
    /// Keep the RMSNorms as kernels instead of fusing them into the GEMMs around them (by
    /// default fused up to 32 sequences; the fusion needs every GEMM to be a swap-AB GEMM,
    /// without that they are kernels anyway).
    #[arg(long)]
    unfused_norm: bool,
}

/// The step's GEMM forms from the flags, checked before the device opens: the form for every
/// GEMM and each GEMM's own (for [`StepConfig::set_gemm_forms`]).
type GemmForms = (Option<DecodeConfig>, [Option<DecodeConfig>; 4]);

fn gemm_forms(args: &DecodeArgs) -> CliResult<GemmForms> {
    let parse = |flag: &str, label: &str, base| {
        parse_gemm_config(label, base).map_err(|e| usage(format!("--{flag} {label:?}: {e}")))
    };
    let all = args
        .gemm
        .as_deref()
        .map(|l| parse("gemm", l, StepConfig::default_gemm(args.batch)))
        .transpose()?;
    let base = all.unwrap_or(StepConfig::default_gemm(args.batch));
    let mut roles = [None; 4];
    for (role, (flag, label)) in [
        ("gemm-qkv", &args.gemm_qkv),
        ("gemm-o", &args.gemm_o),
        ("gemm-gu", &args.gemm_gu),
        ("gemm-down", &args.gemm_down),
    ]
    .into_iter()
    .enumerate()
    {
        if let Some(l) = label {
            roles[role] = Some(parse(flag, l, base)?);
        }
    }
    Ok((all, roles))
}

pub fn run(ctx: &Ctx, args: DecodeArgs) -> CliResult<Value> {
    let variants =
        Variant::parse_set(&args.variant).map_err(|e| usage(format!("--variant: {e}")))?;
    if !(1..=64).contains(&args.batch) {
        return Err(usage(format!("--batch {}: allowed 1 to 64", args.batch)));
    }
    if !(1..=MAX_KV_LEN).contains(&args.kv_len) {
        return Err(usage(format!(
            "--kv-len {}: allowed 1 to {MAX_KV_LEN}",
            args.kv_len
        )));
    }
    if !(1..=MAX_LAYERS).contains(&args.layers) {
        return Err(usage(format!(
            "--layers {}: allowed 1 to {MAX_LAYERS}",
            args.layers
        )));
    }
    if args.reps == 0 || args.reps > 1000 {
        return Err(usage(format!("--reps {}: allowed 1 to 1000", args.reps)));
    }
    let (gemm_all, gemm_roles) = gemm_forms(&args)?;
    let swap_ab = args
        .swap_ab
        .as_deref()
        .map(StepConfig::parse_swap_ab)
        .transpose()
        .map_err(|e| usage(format!("--swap-ab: {e}")))?;
    let attn_form = args
        .attn
        .as_deref()
        .map(|a| AttnForm::parse(a).map_err(|e| usage(format!("--attn {a:?}: {e}"))))
        .transpose()?;
    let mut dims = if args.small {
        DecodeDims::small()
    } else {
        DecodeDims::llama3_8b()
    };
    dims.page_size = args.page;
    dims.validate().map_err(|e| usage(e.to_string()))?;
    let case = Case {
        batch: args.batch,
        kv_len: args.kv_len,
    };
    // Memory, before anything is made: per layer the weights (bf16) and the K and V caches
    // (bf16, every sequence at capacity); on the host the weights once more (and, with
    // --verify, the f32 weights and the f64 caches of the reference).
    let d = &dims;
    let layer_weights = (d.qkv_rows() as u64 * d.hidden as u64)
        .checked_add(d.hidden as u64 * d.q_width() as u64)
        .and_then(|w| w.checked_add(3 * d.intermediate as u64 * d.hidden as u64))
        .and_then(|w| w.checked_add(2 * d.hidden as u64));
    let cache_elems = (args.kv_len.div_ceil(args.page) as u64)
        .checked_mul((args.batch * args.page * d.kv_heads * d.head_dim) as u64);
    let layers = args.layers as u64;
    let device_bytes = layer_weights
        .zip(cache_elems)
        .and_then(|(w, c)| w.checked_add(2 * c)?.checked_mul(2)?.checked_mul(layers));
    let host_bytes = layer_weights.zip(cache_elems).and_then(|(w, c)| {
        let per_layer = if args.verify {
            // bf16 + f32 weights, f32 + f64 + bf16 caches (K and V).
            w.checked_mul(6)?
                .checked_add(c.checked_mul(2 * (4 + 8 + 2))?)?
        } else {
            w.checked_mul(2)?
        };
        per_layer.checked_mul(layers)
    });
    super::check_host_memory("decode", host_bytes)?;

    let dev = ctx.open()?;
    super::check_device_memory(
        &dev,
        "decode (weights and KV caches of every layer)",
        device_bytes.unwrap_or(u64::MAX),
    )?;
    let device = cli_json::device(&dev);
    let copy = warpline::bandwidth::d2d_copy_gbps(&dev, 1 << 30, 10)?;
    say!(
        "decode step {}x{}, {} layers, {dims:?}, device copy {copy:.0} GB/s (floor = weight + KV bytes / copy)",
        case.batch,
        case.kv_len,
        args.layers
    );
    // With --verify the reference needs the weights in f32: they are drawn once, as the
    // reference's, and the timed step runs on the same values.
    let reference_weights: Option<Vec<LayerWeights>> = args.verify.then(|| {
        (0..args.layers)
            .map(|l| LayerWeights::random(&dims, ctx.seed.wrapping_add(100 * l as u64 + 1)))
            .collect()
    });
    let weights: Vec<HostLayer> = match &reference_weights {
        Some(lw) => lw.iter().map(HostLayer::from_reference).collect(),
        None => (0..args.layers)
            .map(|l| HostLayer::random(&dims, ctx.seed.wrapping_add(1 + l as u64)))
            .collect(),
    };
    let mut step = build_step(&dev, &dims, case, &weights, |c| {
        c.stamps = ctx.tracing();
        c.set_gemm_forms(gemm_all, gemm_roles);
        if let Some(set) = swap_ab {
            c.swap_ab = set;
        }
        if let Some(a) = attn_form {
            c.attention = a;
        }
        if args.unfused_norm {
            c.fuse_norm = false;
        }
    })?;
    let forms: Vec<String> = (0..4)
        .map(|r| {
            if step.config().swap_ab[r] {
                "swapab".to_string()
            } else {
                step.config().gemm_for(r).label()
            }
        })
        .collect();
    say!(
        "GEMM forms: qkv {}, o_proj {}, gate_up {}, down {}; attention {}; RMSNorm {}",
        forms[0],
        forms[1],
        forms[2],
        forms[3],
        step.config().attention.name(),
        if step.norm_fused() {
            "fused into the GEMMs"
        } else {
            "as kernels"
        }
    );
    let rows = run_case(&step, case, &variants, copy, args.reps, 10)?;
    say!(
        "{:>22} {:>6} {:>12} {:>12} {:>12} {:>8}",
        "variant",
        "splits",
        "us/step",
        "us/layer",
        "floor us/l",
        "floor/x"
    );
    for r in &rows {
        say!(
            "{:>22} {:>6} {:>12.1} {:>12.1} {:>12.1} {:>8.3}",
            r.variant,
            r.splits,
            r.us_per_step,
            r.us_per_layer,
            r.floor_us_per_layer,
            r.floor_ratio
        );
    }
    let mut trace_out = Value::Null;
    if ctx.tracing() {
        let v = *variants.last().unwrap_or(&Variant::GraphPdlPrefetch);
        let t = timeline(&mut step, v)?;
        let title = format!(
            "decode step {}x{}, {} layers, variant {}",
            case.batch,
            case.kv_len,
            args.layers,
            v.label()
        );
        let written = ctx.write_trace_outputs(&timeline_trace(&t, &title)?, &title)?;
        trace_out = json!({ "variant": v.label(), "kernels": t, "outputs": written });
    }
    drop(weights);
    let verified = if let Some(lw) = &reference_weights {
        let worst = verify(&mut step, lw, case, ctx.seed)?;
        say!("verified: one step (variant e) against the f64 reference, worst error {worst:.3} of the bound");
        json!({ "worst_of_bound": worst })
    } else {
        Value::Null
    };
    Ok(json!({
        "device": device,
        "copy_gbps": copy,
        "dims": format!("{dims:?}"),
        "rows": rows,
        "gemm_forms": forms,
        "timeline": trace_out,
        "verified": verified,
    }))
}

/// One more step of variant e on `step` (built with the weights `lw`), with random caches and
/// ragged positions (drawn from `seed` in `0..kv_len`, the first sequence at `kv_len - 1`;
/// block-table pages in reverse order), against the f64 reference; returns the largest error in
/// units of the bound. Errors: [`Error::Verification`] naming the first element outside the
/// bound.
fn verify(
    step: &mut DecodeStep<'_>,
    lw: &[LayerWeights],
    case: Case,
    seed: u64,
) -> warpline::Result<f64> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed_decd);
    let dims = *step.dims();
    let cfg = *step.config();
    let layers = lw.len();
    let n = cfg.layout.cache_elems(&dims);
    let bf = |v: &[f32]| v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let mut caches = Vec::with_capacity(layers);
    for l in 0..layers {
        let s = seed.wrapping_add(1000 + 10 * l as u64);
        let (k, v) = (normal_bf16(s, n, 1.0), normal_bf16(s + 1, n, 1.0));
        step.upload_cache(l, &bf(&k), &bf(&v))?;
        caches.push(RefCache::from_f32(&k, &v));
    }
    let positions: Vec<u32> = (0..case.batch)
        .map(|b| {
            if b == 0 {
                case.kv_len as u32 - 1
            } else {
                rng.random_range(0..case.kv_len as u32)
            }
        })
        .collect();
    let cols = cfg.layout.max_pages_per_seq;
    let block_table: Vec<u32> = (0..case.batch * cols)
        .map(|i| (cfg.layout.num_pages - 1 - i) as u32)
        .collect();
    let x = normal_bf16(seed.wrapping_add(7), case.batch * dims.hidden, 1.0);
    step.set_inputs(&bf(&x), &positions, &block_table)?;
    step.poison()?;
    let g = step.capture(Variant::GraphPdlPrefetch)?;
    g.launch()?;
    step.stream().synchronize()?;
    let got = step.output()?;
    let want = reference_step(
        &dims,
        &cfg.layout,
        lw,
        &mut caches,
        &x,
        &positions,
        &block_table,
        Rounding::Bf16,
    );
    let rms = (want.iter().map(|v| v * v).sum::<f64>() / want.len().max(1) as f64).sqrt();
    let mut worst = 0.0f64;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let g = g.to_f64();
        let tol = w.abs() / 32.0 + rms / 64.0;
        if !(g.is_finite() && (g - w).abs() <= tol) {
            return Err(Error::Verification {
                detail: format!(
                    "decode step output [{}][{}]: got {g}, want {w} (bound {tol}, rms {rms})",
                    i / dims.hidden,
                    i % dims.hidden
                ),
            });
        }
        worst = worst.max((g - w).abs() / tol);
    }
    Ok(worst)
}
