//! One LLM decode step (issue 21; `warpline::decode`): Llama-3.1-8B-shaped layers (hidden 4096,
//! 32 query / 8 KV heads, head dim 128, intermediate 14336, pages of 16) from warpline's
//! kernels, in the five variants (a plain, b PDL, c PDL + prefetch, d graph, e graph + PDL +
//! prefetch), per case `BxL` (B sequences, each attending over L tokens).
//!
//! Prints, per case and variant: µs per step, µs per layer, the HBM floor per layer (weight +
//! KV bytes over the device-copy bandwidth measured at the start of the same run) and the
//! ratio floor / measured; then the `%globaltimer` timeline of one step of variant (c) for the
//! first case (per kernel: start, first CTA past `griddepcontrol.wait`, end, and how long it ran
//! beside its predecessor).
//!
//! Environment: `WARPLINE_DECODE_CASES=BxL,...` (default the issue's 1x1024, 8x1024, 8x4096,
//! 32x4096, 64x2048), `WARPLINE_DECODE_LAYERS=NL` (default 4), `WARPLINE_DECODE_VARIANTS=abcde`
//! (default all), `WARPLINE_DECODE_SMALL=1` (the tests' small dims instead of Llama-8B),
//! `WARPLINE_DECODE_JSON=file` (rows and timeline as JSON), `WARPLINE_DECODE_SPLITS=n` (the
//! attention's KV splits), `WARPLINE_DECODE_ATTN=tc|cuda` (the attention's form, default
//! `AttnForm::for_page`: tensor cores at 16-token pages), `WARPLINE_DECODE_GEMM_QKV`, `_O`, `_GU`, `_DOWN` (one GEMM's
//! configuration label, over `WARPLINE_DECODE_GEMM`; such a GEMM is a decode GEMM),
//! `WARPLINE_DECODE_SWAPAB=none|all|qkv,o_proj,gate_up,down` (the swap-AB GEMMs, after the forms),
//! `WARPLINE_DECODE_FUSE_NORM=0|1` (the RMSNorms as kernels or fused; default fused up to 8
//! sequences), `WARPLINE_DECODE_SWAPAB_KSPLIT=q,o,gu,d` (each swap-AB GEMM's ksplit, 0 the
//! rule's), `WARPLINE_DECODE_TILED=0|1` (the swap-AB weights tiled, `StepConfig::swap_ab_tiled`),
//! `WARPLINE_DECODE_TRIGGER=wait|end` (where the swap-AB GEMMs trigger their dependents,
//! `StepConfig::swap_ab_trigger_at_wait`), `WARPLINE_DECODE_TIMELINE_PRINT=c|d,e|...` (the
//! variants whose stamped timelines of the first case are printed, default `c`; the JSON keeps
//! the last),
//! `WARPLINE_DECODE_TIMELINE=file.png`
//! (or `.svg`: the timeline picture, one row per kernel, the part before `griddepcontrol.wait`
//! in the `wait` colour; variant `WARPLINE_DECODE_TIMELINE_VARIANT`, default `e`), `WARPLINE_DECODE_NPY=dir` (also
//! write one step's inputs, weights, caches and output for `scripts/torch_decode.py --check
//! dir`, at the first case with `WARPLINE_DECODE_NPY_LAYERS` layers, default 1). Without a
//! driver it prints why it skipped and exits 0.

use warpline::bandwidth::d2d_copy_gbps;
use warpline::bf16;
use warpline::decode::bench::{
    build_step, export_npy, parse_gemm_config, run_case, timeline, timeline_trace, to_json, Case,
    Row,
};
use warpline::decode::reference::normal_bf16;
use warpline::decode::step::{AttnForm, HostLayer, Variant};
use warpline::decode::DecodeDims;
use warpline_suite::support::gpu_or_skip;

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn main() -> warpline::Result<()> {
    let Some(dev) = gpu_or_skip("bench decode_step") else {
        return Ok(());
    };
    let dims = if env("WARPLINE_DECODE_SMALL").as_deref() == Some("1") {
        DecodeDims::small()
    } else {
        DecodeDims::llama3_8b()
    };
    let cases = match env("WARPLINE_DECODE_CASES") {
        Some(s) => s
            .split(',')
            .map(Case::parse)
            .collect::<Result<Vec<_>, _>>()?,
        None => Case::issue_cases(),
    };
    let layers: usize = env("WARPLINE_DECODE_LAYERS").map_or(4, |v| v.parse().expect("NL"));
    let variants: Vec<Variant> = match env("WARPLINE_DECODE_VARIANTS") {
        Some(s) => Variant::parse_set(&s)?,
        None => Variant::ALL.to_vec(),
    };
    let prefetch: usize = (env("WARPLINE_DECODE_PREFETCH_MB")
        .map_or(4.0, |v| v.parse::<f64>().expect("MiB"))
        * 1048576.0) as usize;
    let gemm = match env("WARPLINE_DECODE_GEMM") {
        Some(l) => Some(parse_gemm_config(
            &l,
            warpline::decode::step::StepConfig::new(&dims, 1, 1, 1).gemm,
        )?),
        None => None,
    };
    let copy = d2d_copy_gbps(&dev, 1 << 30, 10)?;
    println!(
        "decode step: {:?}, {layers} layers, device copy {copy:.0} GB/s (floor = weight + KV bytes / copy), GEMM {}",
        dims,
        gemm.map_or("default".to_string(), |g| g.label())
    );
    let t = std::time::Instant::now();
    let weights: Vec<HostLayer> = (0..layers)
        .map(|l| HostLayer::random(&dims, 1 + l as u64))
        .collect();
    println!("weights generated in {:.1} s", t.elapsed().as_secs_f64());
    println!(
        "{:>9} {:>22} {:>6} {:>12} {:>12} {:>12} {:>8}",
        "case", "variant", "splits", "us/step", "us/layer", "floor us/l", "floor/x"
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut tl = None;
    for (ci, &case) in cases.iter().enumerate() {
        let mut step = build_step(&dev, &dims, case, &weights, |c| {
            c.stamps = ci == 0;
            c.prefetch_bytes = prefetch;
            let base = gemm.unwrap_or(c.gemm);
            let mut roles = [None; 4];
            for (role, var) in [
                "WARPLINE_DECODE_GEMM_QKV",
                "WARPLINE_DECODE_GEMM_O",
                "WARPLINE_DECODE_GEMM_GU",
                "WARPLINE_DECODE_GEMM_DOWN",
            ]
            .into_iter()
            .enumerate()
            {
                if let Some(l) = env(var) {
                    roles[role] =
                        Some(parse_gemm_config(&l, base).expect("a GEMM configuration label"));
                }
            }
            c.set_gemm_forms(gemm, roles);
            if let Some(a) = env("WARPLINE_DECODE_ATTN") {
                c.attention = AttnForm::parse(&a).expect("WARPLINE_DECODE_ATTN: tc or cuda");
            }
            if let Some(l) = env("WARPLINE_DECODE_SWAPAB") {
                c.swap_ab = warpline::decode::step::StepConfig::parse_swap_ab(&l)
                    .expect("WARPLINE_DECODE_SWAPAB: none, all or a list of o_proj, gate_up, down");
            }
            if let Some(s) = env("WARPLINE_DECODE_SPLITS") {
                c.splits = Some(s.parse().expect("WARPLINE_DECODE_SPLITS: a split count"));
            }
            if let Some(f) = env("WARPLINE_DECODE_FUSE_NORM") {
                c.fuse_norm = f != "0";
            }
            if let Some(t) = env("WARPLINE_DECODE_TILED") {
                c.swap_ab_tiled = t != "0";
            }
            if let Some(t) = env("WARPLINE_DECODE_TRIGGER") {
                c.swap_ab_trigger_at_wait = match t.as_str() {
                    "wait" => true,
                    "end" => false,
                    _ => panic!("WARPLINE_DECODE_TRIGGER: wait or end"),
                };
            }
            if let Some(l) = env("WARPLINE_DECODE_SWAPAB_KSPLIT") {
                for (r, v) in l.split(',').enumerate().take(4) {
                    let ks: u32 = v.parse().expect("WARPLINE_DECODE_SWAPAB_KSPLIT: 4 numbers");
                    c.swap_ab_ksplit[r] = (ks > 0).then_some(ks);
                }
            }
        })?;
        println!(
            "{}x{}: swap-AB GEMMs {}, RMSNorm {}",
            case.batch,
            case.kv_len,
            step.config().swap_ab_label(),
            if step.norm_fused() {
                "fused into the GEMMs"
            } else {
                "as kernels"
            }
        );
        let iters = 10;
        let r = run_case(&step, case, &variants, copy, 7, iters)?;
        for row in &r {
            println!(
                "{:>9} {:>22} {:>6} {:>12.1} {:>12.1} {:>12.1} {:>8.3}",
                format!("{}x{}", case.batch, case.kv_len),
                row.variant,
                row.splits,
                row.us_per_step,
                row.us_per_layer,
                row.floor_us_per_layer,
                row.floor_ratio
            );
        }
        let get = |v: Variant| {
            r.iter()
                .find(|x| x.variant == v.label())
                .map(|x| x.us_per_step)
        };
        if let (Some(b), Some(c)) = (get(Variant::Pdl), get(Variant::PdlPrefetch)) {
            println!("          c vs b: {:+.1}%", (b / c - 1.0) * 100.0);
        }
        if let (Some(d), Some(e)) = (get(Variant::Graph), get(Variant::GraphPdlPrefetch)) {
            println!("          e vs d: {:+.1}%", (d / e - 1.0) * 100.0);
        }
        rows.extend(r);
        if ci == 0 {
            let sms = dev.capabilities().sm_count;
            println!(
                "kernels of layer 0 (case {}x{}): grid, CTAs per SM that fit, waves over {sms} SMs",
                case.batch, case.kv_len
            );
            for k in step.kernels().iter().filter(|k| k.layer == 0) {
                let slots = (k.ctas_per_sm * sms).max(1);
                println!(
                    "  {:>9} {:>32} grid {:>6} x {:>4} threads, {:>2} CTAs/SM, {:.2} waves",
                    k.role,
                    k.kernel,
                    k.grid,
                    k.block,
                    k.ctas_per_sm,
                    k.grid as f64 / slots as f64
                );
            }
            // The printed timelines: WARPLINE_DECODE_TIMELINE_PRINT (variant letters, default
            // c); the last one printed is the one the JSON keeps.
            let printed = env("WARPLINE_DECODE_TIMELINE_PRINT").unwrap_or_else(|| "c".into());
            let mut t = Vec::new();
            for letter in printed.split(',') {
                let v = Variant::parse(letter.trim())?;
                t = timeline(&mut step, v)?;
                println!(
                    "timeline of one step, variant {}, case {}x{} (us):",
                    v.label(),
                    case.batch,
                    case.kv_len
                );
                println!(
                    "{:>5} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10}",
                    "layer", "kernel", "start", "wait", "end", "overlap", "GB/s"
                );
                // GB/s: the kernel's weight (attention: KV at capacity) bytes over wait..end.
                for (k, sk) in t.iter().zip(step.kernels()) {
                    let dt = (k.end_us - k.wait_us).max(1e-3);
                    println!(
                        "{:>5} {:>9} {:>10.2} {:>10.2} {:>10.2} {:>10.2} {:>10.0}",
                        k.layer,
                        k.role,
                        k.start_us,
                        k.wait_us,
                        k.end_us,
                        k.overlap_us,
                        sk.bytes as f64 / dt / 1e3
                    );
                }
            }
            if let Some(path) = env("WARPLINE_DECODE_TIMELINE") {
                let v = env("WARPLINE_DECODE_TIMELINE_VARIANT")
                    .map_or(Ok(Variant::GraphPdlPrefetch), |s| Variant::parse(&s))?;
                let rows = timeline(&mut step, v)?;
                let title = format!(
                    "decode step {}x{}, {layers} layers, variant {}",
                    case.batch,
                    case.kv_len,
                    v.label()
                );
                let trace = timeline_trace(&rows, &title)?;
                let opts = warpline::trace::timeline::TimelineOptions {
                    title,
                    ..Default::default()
                };
                warpline::trace::timeline::write_timeline(
                    &trace,
                    std::path::Path::new(&path),
                    &opts,
                )?;
                println!("wrote the timeline of variant {} to {path}", v.label());
            }
            tl = Some(t);
        }
    }
    if let Some(path) = env("WARPLINE_DECODE_JSON") {
        std::fs::write(&path, to_json(&dims, copy, &rows, tl.as_deref())).unwrap();
        println!("wrote {path}");
    }
    if let Some(dir) = env("WARPLINE_DECODE_NPY") {
        let nl: usize = env("WARPLINE_DECODE_NPY_LAYERS").map_or(1, |v| v.parse().expect("NL"));
        let case = cases[0];
        let w = &weights[..nl.min(weights.len())];
        let step = build_step(&dev, &dims, case, w, |c| {
            c.prefetch_bytes = prefetch;
            c.gemm = gemm.unwrap_or(c.gemm);
        })?;
        let cols = step.config().layout.max_pages_per_seq;
        // Ragged positions (1 .. L) and random caches are what the check needs; the bench's
        // constant caches would hide a wrong key order.
        let positions: Vec<u32> = (0..case.batch)
            .map(|b| ((case.kv_len - 1) as u64 * (b as u64 + 1) / case.batch as u64) as u32)
            .collect();
        let bt: Vec<u32> = (0..case.batch * cols).rev().map(|i| i as u32).collect();
        let x: Vec<bf16> = normal_bf16(11, case.batch * dims.hidden, 1.0)
            .into_iter()
            .map(bf16::from_f32)
            .collect();
        let mut step = step;
        let n = step.config().layout.cache_elems(&dims);
        for l in 0..w.len() {
            let k: Vec<bf16> = normal_bf16(20 + l as u64, n, 1.0)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            let v: Vec<bf16> = normal_bf16(40 + l as u64, n, 1.0)
                .into_iter()
                .map(bf16::from_f32)
                .collect();
            step.upload_cache(l, &k, &v)?;
        }
        export_npy(
            std::path::Path::new(&dir),
            &step,
            w,
            &x,
            &positions,
            &bt,
            Variant::GraphPdlPrefetch,
        )?;
        println!("wrote one step's inputs, weights, caches and output to {dir} (python3 scripts/torch_decode.py --check {dir})");
    }
    Ok(())
}
