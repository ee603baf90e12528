//! The trace outputs on synthetic timings (runs in CI, no GPU): the Chrome trace JSON's structure
//! and the timeline picture (PNG dimensions, not blank; SVG written).

use serde_json::Value;
use warpline::trace::timeline::{height_for, render_rgb, write_timeline, TimelineOptions};
use warpline::trace::{chrome_json, write_chrome_json, Span, Stage, Trace, TrackKind};

/// A pipeline-shaped trace: 3 streams, 16 batches of alloc, H2D 2.4 ms, kernel 0.1 ms,
/// D2H 1.2 ms, free, batch i on stream i % 3, H2Ds back to back (one copy engine per direction).
fn synthetic() -> Trace {
    let mut t = Trace {
        clock: "synthetic".into(),
        ..Trace::default()
    };
    let proc = "GPU 0: synthetic";
    for s in 0..3 {
        t.add_track(0, proc, &format!("pipeline stream {s}"), TrackKind::Stream)
            .unwrap();
    }
    for b in 0..16usize {
        let h2d = 50.0 + 2400.0 * b as f64;
        let stages = [
            (Stage::Alloc, "alloc", h2d - 20.0, 20.0),
            (Stage::H2d, "H2D", h2d, 2400.0),
            (Stage::Kernel, "kernel", h2d + 2400.0, 100.0),
            (Stage::D2h, "D2H", h2d + 2500.0, 1200.0),
            (Stage::Free, "free", h2d + 3700.0, 5.0),
        ];
        for (stage, what, start, dur) in stages {
            t.spans.push(Span {
                track: b % 3,
                stage,
                name: format!("{what} batch {b}"),
                start_us: start,
                dur_us: dur,
                args: vec![("batch".into(), b.to_string())],
            });
        }
    }
    t.with_copy_rows()
}

#[test]
fn chrome_trace_has_complete_events_and_named_tracks() {
    let trace = synthetic();
    let v = chrome_json(&trace);
    // Round trip through text: what a viewer would read.
    let v: Value = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().expect("traceEvents array");
    let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), trace.spans.len());
    for e in &complete {
        assert!(e["name"].is_string() && e["cat"].is_string(), "{e}");
        assert!(e["ts"].as_f64().unwrap() >= 0.0, "{e}");
        assert!(e["dur"].as_f64().unwrap() >= 0.0, "{e}");
        assert!(e["pid"].is_u64() && e["tid"].is_u64(), "{e}");
    }
    // ts and dur are µs: batch 1's H2D starts 2450 µs in and lasts 2400 µs.
    let h2d1 = complete
        .iter()
        .find(|e| e["name"] == "H2D batch 1" && e["tid"] == 2)
        .expect("H2D batch 1 on stream 1");
    assert_eq!(h2d1["ts"].as_f64(), Some(2450.0));
    assert_eq!(h2d1["dur"].as_f64(), Some(2400.0));
    assert_eq!(h2d1["cat"], "H2D");
    // Every tid used by a complete event has a thread_name; the process is named.
    let names: Vec<(u64, String)> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for e in &complete {
        let tid = e["tid"].as_u64().unwrap();
        assert!(names.iter().any(|(t, _)| *t == tid), "tid {tid} unnamed");
    }
    assert!(names.iter().any(|(_, n)| n == "pipeline stream 0"));
    assert!(names.iter().any(|(_, n)| n == "copy H2D (all streams)"));
    assert!(events
        .iter()
        .any(|e| e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == 0));
    assert_eq!(v["displayTimeUnit"], "ms");
}

#[test]
fn copy_rows_repeat_every_copy_once() {
    let t = synthetic();
    let rows: Vec<usize> = (0..t.tracks.len())
        .filter(|&i| t.tracks[i].kind == TrackKind::CopyEngine)
        .collect();
    assert_eq!(rows.len(), 2);
    for (row, stage) in rows.iter().zip([Stage::H2d, Stage::D2h]) {
        let n = t.spans.iter().filter(|s| s.track == *row).count();
        assert_eq!(n, 16);
        assert!(t
            .spans
            .iter()
            .filter(|s| s.track == *row)
            .all(|s| s.stage == stage));
    }
    // Idempotent.
    assert_eq!(t.clone().with_copy_rows(), t);
}

#[test]
fn timeline_png_has_the_expected_size_and_is_not_blank() {
    let trace = synthetic();
    let opts = TimelineOptions::default();
    let (rgb, (w, h)) = render_rgb(&trace, &opts).unwrap();
    assert_eq!((w, h), (opts.width, height_for(&trace)));
    assert_eq!(rgb.len(), (w * h * 3) as usize);
    let px = |x: u32, y: u32| {
        let i = ((y * w + x) * 3) as usize;
        (rgb[i], rgb[i + 1], rgb[i + 2])
    };
    let white = (0..h)
        .flat_map(|y| (0..w).map(move |x| (x, y)))
        .filter(|&(x, y)| px(x, y) == (255, 255, 255))
        .count();
    let total = (w * h) as usize;
    assert!(
        white < total * 95 / 100,
        "almost blank: {white} of {total} white"
    );
    assert!(white > total / 5, "no background: {white} of {total} white");
    // Each stage's colour appears (bars drawn at 0.85 opacity over white, so look for the hue).
    let (r, g, b) = Stage::H2d.rgb();
    let blend = |c: u8| (c as f64 * 0.85 + 255.0 * 0.15).round() as i32;
    let near = |p: (u8, u8, u8)| {
        (p.0 as i32 - blend(r)).abs() <= 3
            && (p.1 as i32 - blend(g)).abs() <= 3
            && (p.2 as i32 - blend(b)).abs() <= 3
    };
    let h2d_px = (0..h)
        .flat_map(|y| (0..w).map(move |x| (x, y)))
        .filter(|&(x, y)| near(px(x, y)))
        .count();
    assert!(h2d_px > 1000, "H2D bars missing: {h2d_px} pixels");
    // Text was rendered (the embedded font): dark pixels in the label column.
    let dark_labels = (0..h)
        .flat_map(|y| (0..150).map(move |x| (x, y)))
        .filter(|&(x, y)| {
            let p = px(x, y);
            p.0 < 100 && p.1 < 100 && p.2 < 100
        })
        .count();
    assert!(
        dark_labels > 200,
        "row labels missing: {dark_labels} dark pixels"
    );
}

#[test]
fn timeline_files_png_and_svg_are_written() {
    let trace = synthetic();
    let dir = std::env::temp_dir().join(format!("warpline-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("t.png");
    write_timeline(&trace, &png, &TimelineOptions::default()).unwrap();
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!((w, h), (1600, height_for(&trace)));
    let svg = dir.join("t.svg");
    write_timeline(&trace, &svg, &TimelineOptions::default()).unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg") && text.contains("pipeline stream 2"));
    let json = dir.join("t.json");
    write_chrome_json(&trace, &json).unwrap();
    let v: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(v["traceEvents"].as_array().is_some_and(|a| !a.is_empty()));
    if let Ok(keep) = std::env::var("WARPLINE_KEEP_TIMELINE") {
        std::fs::copy(&png, keep).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_unwritable_path_is_a_typed_error() {
    let trace = synthetic();
    let p = std::path::Path::new("/nonexistent-dir/x.png");
    let e = write_timeline(&trace, p, &TimelineOptions::default()).unwrap_err();
    assert!(matches!(e, warpline::Error::TraceOutput { .. }), "{e}");
    let e = write_chrome_json(&trace, std::path::Path::new("/nonexistent-dir/x.json")).unwrap_err();
    assert!(matches!(e, warpline::Error::TraceOutput { .. }), "{e}");
}

#[test]
fn oversized_pictures_and_dangling_tracks_are_errors_not_panics() {
    let trace = synthetic();
    let wide = TimelineOptions {
        width: u32::MAX,
        ..TimelineOptions::default()
    };
    assert!(matches!(
        render_rgb(&trace, &wide),
        Err(warpline::Error::TraceOutput { .. })
    ));
    // A span naming a track that does not exist is left out, not indexed.
    let mut t = synthetic();
    let mut stray = t.spans[0].clone();
    stray.track = t.tracks.len() + 7;
    t.spans.push(stray);
    let busy = t.busy_us(Stage::H2d);
    assert_eq!(busy, synthetic().busy_us(Stage::H2d));
    let with = t.with_copy_rows();
    let clean = synthetic().with_copy_rows();
    assert_eq!(with.tracks.len(), clean.tracks.len());
    assert_eq!(with.spans.len(), clean.spans.len() + 1);
}

// ------------------------------------------------------------------------------------------------
// Issue 19 item 13: any trace either renders or is refused with a typed error; never a panic.
// ------------------------------------------------------------------------------------------------

#[test]
fn issue19_item13_non_finite_spans_are_refused_not_panicked_on() {
    for bad in [f64::NEG_INFINITY, f64::INFINITY, f64::NAN, 1e300, -2e12] {
        for (start, dur) in [(bad, 1.0), (1.0, bad)] {
            let mut t = synthetic();
            t.spans[3].start_us = start;
            t.spans[3].dur_us = dur;
            let e = render_rgb(&t, &TimelineOptions::default()).unwrap_err();
            assert!(
                matches!(&e, warpline::Error::TraceOutput { detail, .. } if detail.contains("span 3")),
                "{e}"
            );
        }
    }
    // Far apart but in range: renders.
    let mut t = synthetic();
    t.spans[0].start_us = -1e12;
    t.spans[1].start_us = 1e12 - 1e6;
    render_rgb(&t, &TimelineOptions::default()).unwrap();
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;
    use warpline::trace::timeline::MAX_TIME_US;

    fn time() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(MAX_TIME_US),
            Just(-MAX_TIME_US),
            Just(0.0),
            -1e4f64..1e6,
            -MAX_TIME_US..MAX_TIME_US,
            any::<f64>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn issue19_item13_any_trace_renders_or_is_a_typed_error(
            names in prop::collection::vec("[a-zA-Z0-9 .]{0,40}", 0..5),
            spans in prop::collection::vec(
                (0usize..7, 0usize..Stage::ALL.len(), time(), time(), "[a-z ]{0,6}[0-9.]{0,30}"),
                0..24,
            ),
            width in prop_oneof![Just(0u32), 400u32..900, Just(warpline::trace::timeline::MAX_WIDTH + 1)],
        ) {
            let mut t = Trace::default();
            for n in &names {
                t.add_track(0, "GPU 0", n, TrackKind::Stream).unwrap();
            }
            for (track, st, start_us, dur_us, name) in spans {
                t.spans.push(Span { track, stage: Stage::ALL[st], name, start_us, dur_us, args: vec![] });
            }
            let t = t.with_copy_rows();
            let opts = TimelineOptions { width, ..TimelineOptions::default() };
            let finite = t.spans.iter().all(|s| {
                [s.start_us, s.dur_us, s.end_us()].iter().all(|v| v.is_finite() && v.abs() <= MAX_TIME_US)
            });
            match render_rgb(&t, &opts) {
                Ok((rgb, (w, h))) => {
                    prop_assert!(finite && width <= warpline::trace::timeline::MAX_WIDTH);
                    prop_assert_eq!(rgb.len(), w as usize * h as usize * 3);
                    prop_assert_eq!(h, height_for(&t));
                }
                Err(e) => {
                    prop_assert!(matches!(e, warpline::Error::TraceOutput { .. }), "{}", e);
                    prop_assert!(!finite || width > warpline::trace::timeline::MAX_WIDTH);
                }
            }
            let _ = chrome_json(&t);
        }
    }
}
