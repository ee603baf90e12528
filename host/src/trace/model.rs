//! A resolved trace: tracks (one per stream, copy direction or stamped kernel) and spans on one
//! clock, µs. Plain data: tests build it from synthetic timings.

use serde::Serialize;

use crate::error::{Error, Result};

/// What a span was doing (one colour each in the timeline).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Stream-ordered allocation (`cuMemAllocFromPoolAsync`).
    Alloc,
    /// Host to device copy.
    H2d,
    /// A kernel.
    Kernel,
    /// Device to host copy.
    D2h,
    /// Stream-ordered free (`cuMemFreeAsync`).
    Free,
    /// Device to device copy.
    Copy,
    /// A stream waiting: a signal wait, or an event wait for a task on another stream.
    Wait,
    /// A signal set or add.
    Signal,
    /// A host callback (`cuLaunchHostFunc`): the stream is blocked while it runs.
    Host,
    /// A sequence of launches (a [`crate::Chain`] run or graph replay).
    Launch,
    /// `%globaltimer` stamps of a kernel's CTAs.
    Stamps,
}

impl Stage {
    /// Every stage, in legend order.
    pub const ALL: [Stage; 11] = [
        Stage::Alloc,
        Stage::H2d,
        Stage::Kernel,
        Stage::D2h,
        Stage::Free,
        Stage::Copy,
        Stage::Wait,
        Stage::Signal,
        Stage::Host,
        Stage::Launch,
        Stage::Stamps,
    ];

    /// Short name (Chrome trace category, legend).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Alloc => "alloc",
            Stage::H2d => "H2D",
            Stage::Kernel => "kernel",
            Stage::D2h => "D2H",
            Stage::Free => "free",
            Stage::Copy => "D2D copy",
            Stage::Wait => "wait",
            Stage::Signal => "signal set/add",
            Stage::Host => "host callback",
            Stage::Launch => "launches",
            Stage::Stamps => "CTA stamps",
        }
    }

    /// Colour, RGB.
    pub fn rgb(self) -> (u8, u8, u8) {
        match self {
            Stage::Alloc => (160, 160, 160),
            Stage::H2d => (31, 119, 180),
            Stage::Kernel => (44, 160, 44),
            Stage::D2h => (255, 127, 14),
            Stage::Free => (96, 96, 96),
            Stage::Copy => (23, 190, 207),
            Stage::Wait => (214, 39, 40),
            Stage::Signal => (148, 103, 189),
            Stage::Host => (140, 86, 75),
            Stage::Launch => (188, 189, 34),
            Stage::Stamps => (227, 119, 194),
        }
    }
}

/// What a track is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TrackKind {
    /// One CUDA stream.
    Stream,
    /// One copy direction over all streams (derived from the streams' copies: the H100 has
    /// separate engines per direction; which engine the driver picks is not reported).
    CopyEngine,
    /// `%globaltimer` stamps of a kernel.
    DeviceStamps,
}

/// One row: a stream, a copy direction, or a stamped kernel.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Track {
    /// Chrome trace process id: the device ordinal.
    pub pid: u32,
    /// Process name ("GPU 0: NVIDIA H100 80GB HBM3").
    pub process: String,
    /// Chrome trace thread id (unique in the trace, from 1).
    pub tid: u32,
    /// Row name ("stream 0", a lane's name, "copy H2D (all streams)").
    pub name: String,
    /// What the row is.
    pub kind: TrackKind,
}

/// One interval on a track.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Span {
    /// Index into [`Trace::tracks`].
    pub track: usize,
    /// Stage.
    pub stage: Stage,
    /// Name shown in the viewer ("H2D batch 3").
    pub name: String,
    /// Start, µs from the trace's origin.
    pub start_us: f64,
    /// Duration, µs.
    pub dur_us: f64,
    /// Extra key/value pairs.
    pub args: Vec<(String, String)>,
}

impl Span {
    /// End, µs.
    pub fn end_us(&self) -> f64 {
        self.start_us + self.dur_us
    }
}

/// A resolved trace.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Trace {
    /// Rows.
    pub tracks: Vec<Track>,
    /// Spans, by start.
    pub spans: Vec<Span>,
    /// Spans that could not be put on the clock (events of another CUDA context).
    pub unanchored: usize,
    /// How the times were put on one clock.
    pub clock: String,
}

impl Trace {
    /// First start and last end over all spans, µs (`(0, 0)` when empty).
    pub fn extent_us(&self) -> (f64, f64) {
        let lo = self
            .spans
            .iter()
            .map(|s| s.start_us)
            .fold(f64::INFINITY, f64::min);
        let hi = self
            .spans
            .iter()
            .map(|s| s.end_us())
            .fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() && hi.is_finite() {
            (lo, hi)
        } else {
            (0.0, 0.0)
        }
    }

    /// Adds a track, returns its index. Its `tid` is one more than the largest in the trace, or,
    /// where that would pass `u32::MAX` (tracks built by hand), the smallest unused tid from 1.
    ///
    /// Errors: [`Error::TooLarge`] when every tid from 1 to `u32::MAX` is taken.
    pub fn add_track(
        &mut self,
        pid: u32,
        process: &str,
        name: &str,
        kind: TrackKind,
    ) -> Result<usize> {
        let max = self.tracks.iter().map(|t| t.tid).max().unwrap_or(0);
        let tid = match max.checked_add(1) {
            Some(t) => t,
            None => {
                let mut used: Vec<u32> = self.tracks.iter().map(|t| t.tid).collect();
                used.sort_unstable();
                used.dedup();
                // The first gap in 1, 2, 3, ... (tid 0 is the process's metadata row).
                let mut want = 1u32;
                for &u in used.iter().filter(|&&u| u >= 1) {
                    if u != want {
                        break;
                    }
                    match want.checked_add(1) {
                        Some(w) => want = w,
                        None => {
                            return Err(Error::TooLarge {
                                what: "trace tracks (every tid from 1 to 2^32 - 1 is taken)",
                                value: self.tracks.len() as u64,
                                max: u64::from(u32::MAX),
                            })
                        }
                    }
                }
                want
            }
        };
        self.tracks.push(Track {
            pid,
            process: process.to_string(),
            tid,
            name: name.to_string(),
            kind,
        });
        Ok(self.tracks.len() - 1)
    }

    /// Adds the copy-direction rows ("copy H2D (all streams)", "copy D2H (all streams)"): every
    /// H2D and D2H span of a stream track again, on its direction's row, so the picture shows
    /// when each direction of PCIe was busy. Idempotent. (Adds none if [`Trace::add_track`]
    /// fails: a trace with 2^32 - 1 tracks.)
    pub fn with_copy_rows(mut self) -> Self {
        if self.tracks.iter().any(|t| t.kind == TrackKind::CopyEngine) {
            return self;
        }
        let Some(first) = self
            .tracks
            .iter()
            .find(|t| t.kind == TrackKind::Stream)
            .cloned()
        else {
            return self;
        };
        let mut extra = Vec::new();
        for (stage, name) in [
            (Stage::H2d, "copy H2D (all streams)"),
            (Stage::D2h, "copy D2H (all streams)"),
        ] {
            let copies: Vec<Span> = self
                .spans
                .iter()
                .filter(|s| s.stage == stage && self.is_stream_track(s.track))
                .cloned()
                .collect();
            if copies.is_empty() {
                continue;
            }
            // Fails only with 2^32 - 1 tracks already there: then no copy rows are added.
            let Ok(t) = self.add_track(first.pid, &first.process, name, TrackKind::CopyEngine)
            else {
                break;
            };
            extra.extend(copies.into_iter().map(|mut s| {
                // A stream track (filtered above), so the index is in range.
                s.args
                    .push(("stream".into(), self.tracks[s.track].name.clone()));
                s.track = t;
                s
            }));
        }
        self.spans.extend(extra);
        self.spans.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        self
    }

    /// Sum of span durations of `stage` over stream tracks, µs (spans naming no track are
    /// left out).
    pub fn busy_us(&self, stage: Stage) -> f64 {
        self.spans
            .iter()
            .filter(|s| s.stage == stage && self.is_stream_track(s.track))
            .map(|s| s.dur_us)
            .sum()
    }

    /// Whether track `t` exists and is a stream's row.
    fn is_stream_track(&self, t: usize) -> bool {
        self.tracks
            .get(t)
            .is_some_and(|t| t.kind == TrackKind::Stream)
    }
}

#[cfg(test)]
mod issue19_item13 {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn issue19_item13_add_track_after_tid_u32_max_takes_a_free_tid() {
        let mut t = Trace::default();
        t.tracks.push(Track {
            pid: 0,
            process: "p".into(),
            tid: u32::MAX,
            name: "hand-made".into(),
            kind: TrackKind::Stream,
        });
        let i = t.add_track(0, "p", "next", TrackKind::Stream).unwrap();
        assert_eq!((i, t.tracks[i].tid), (1, 1));
        let i = t.add_track(0, "p", "next", TrackKind::Stream).unwrap();
        assert_eq!(t.tracks[i].tid, 2);
        // A gap is found after the taken run 1, 2, then u32::MAX - 1 and u32::MAX.
        t.tracks[0].tid = u32::MAX - 1;
        t.tracks.push(Track {
            tid: u32::MAX,
            ..t.tracks[0].clone()
        });
        let i = t.add_track(0, "p", "gap", TrackKind::Stream).unwrap();
        assert_eq!(t.tracks[i].tid, 3);
        // Copy rows too (they call add_track).
        t.spans.push(Span {
            track: 0,
            stage: Stage::H2d,
            name: "H2D 0".into(),
            start_us: 1.0,
            dur_us: 2.0,
            args: vec![],
        });
        let t = t.with_copy_rows();
        let tids: std::collections::HashSet<u32> = t.tracks.iter().map(|t| t.tid).collect();
        assert_eq!(tids.len(), t.tracks.len(), "tids stay unique");
    }

    fn track() -> impl Strategy<Value = Track> {
        (
            any::<u32>(),
            prop_oneof![Just(0u32), Just(u32::MAX), Just(u32::MAX - 1), any::<u32>()],
            0usize..3,
        )
            .prop_map(|(pid, tid, k)| Track {
                pid,
                process: format!("GPU {pid}"),
                tid,
                name: format!("track {tid}"),
                kind: [
                    TrackKind::Stream,
                    TrackKind::CopyEngine,
                    TrackKind::DeviceStamps,
                ][k],
            })
    }

    /// Any f64, the special ones often.
    pub(crate) fn time() -> impl Strategy<Value = f64> {
        prop_oneof![
            Just(f64::NAN),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::MAX),
            Just(-0.0),
            -1e4f64..1e6,
            any::<f64>(),
        ]
    }

    fn span(tracks: usize) -> impl Strategy<Value = Span> {
        (
            0..tracks + 3,
            0..Stage::ALL.len(),
            time(),
            time(),
            "[a-zA-Z0-9 .]{0,12}",
        )
            .prop_map(|(track, st, start_us, dur_us, name)| Span {
                track,
                stage: Stage::ALL[st],
                name,
                start_us,
                dur_us,
                args: vec![],
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn issue19_item13_trace_model_never_panics_and_keeps_tids_unique(
            tracks in prop::collection::vec(track(), 0..6),
            spans in prop::collection::vec(span(6), 0..20),
            adds in 0usize..4,
        ) {
            let mut t = Trace { tracks, spans, ..Trace::default() };
            let before: std::collections::HashSet<u32> = t.tracks.iter().map(|t| t.tid).collect();
            for k in 0..adds {
                let i = t.add_track(0, "p", &format!("added {k}"), TrackKind::Stream).unwrap();
                // The new tid is fresh: different from every tid already there.
                let tid = t.tracks[i].tid;
                prop_assert!(tid != 0);
                prop_assert!(t.tracks[..i].iter().all(|o| o.tid != tid));
            }
            let _ = t.extent_us();
            let _ = t.busy_us(Stage::H2d);
            let with = t.clone().with_copy_rows();
            prop_assert!(with.tracks.len() >= t.tracks.len());
            prop_assert!(with.tracks.iter().skip(t.tracks.len()).all(|n| !before.contains(&n.tid)));
            let (lo, hi) = with.extent_us();
            prop_assert!(lo.is_finite() && hi.is_finite());
            let v = crate::trace::chrome_json(&with);
            prop_assert!(v["traceEvents"].is_array());
        }
    }
}
