//! The timeline picture of a [`Trace`] (feature `timeline`): one row per track (streams, then
//! copy directions and stamped kernels), one colour per [`Stage`] with a legend, the time axis in
//! µs (runs under 5 ms) or ms. PNG (plotters' bitmap backend) or SVG, chosen by the file's
//! extension. Text uses DejaVu Sans embedded in the binary (crate `dejavu`), so no system fonts
//! are needed.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::model::{Stage, Trace};
use crate::error::{Error, Result};

/// Default picture width, pixels: at 16 batches over the run each batch is about 90 px wide.
pub const DEFAULT_WIDTH: u32 = 1600;
/// Height of one row, pixels.
pub const ROW_HEIGHT: u32 = 34;
/// Widest picture, pixels.
pub const MAX_WIDTH: u32 = 16384;
/// Most rows (tracks) in a picture.
pub const MAX_ROWS: usize = 256;
/// Largest `|start|`, `|duration|` and `|end|` of a span a picture draws, µs (about 11.6 days):
/// within it f64 resolves the picture's smallest time step (1e-3 µs), so the time axis is never
/// empty, infinite or NaN.
pub const MAX_TIME_US: f64 = 1e12;

/// Picture options.
#[derive(Clone, Debug)]
pub struct TimelineOptions {
    /// Title above the chart.
    pub title: String,
    /// Width, pixels (400 to [`MAX_WIDTH`]; below 400 counts as 400).
    pub width: u32,
}

impl Default for TimelineOptions {
    fn default() -> Self {
        Self {
            title: "warpline timeline".into(),
            width: DEFAULT_WIDTH,
        }
    }
}

/// Height of the picture of `trace`, pixels: title, rows, time axis and legend (saturating).
pub fn height_for(trace: &Trace) -> u32 {
    let rows = trace.tracks.len().clamp(1, u32::MAX as usize) as u32;
    ROW_HEIGHT.saturating_mul(rows).saturating_add(170)
}

/// The picture's size, checked before anything is allocated: [`Error::TraceOutput`] above
/// [`MAX_WIDTH`] pixels or [`MAX_ROWS`] tracks, or for a span whose start, duration or end is not
/// finite or beyond [`MAX_TIME_US`] (issue 19 item 13: such spans made plotters panic).
fn picture_size(trace: &Trace, opts: &TimelineOptions, path: &Path) -> Result<(u32, u32)> {
    let in_range = |t: f64| t.is_finite() && t.abs() <= MAX_TIME_US;
    if let Some((i, s)) = trace
        .spans
        .iter()
        .enumerate()
        .find(|(_, s)| !(in_range(s.start_us) && in_range(s.dur_us) && in_range(s.end_us())))
    {
        return Err(out_err(
            path,
            format!(
                "span {i} ({:?}) starts at {} µs and lasts {} µs; allowed: finite times within +-{MAX_TIME_US:e} µs",
                s.name, s.start_us, s.dur_us
            ),
        ));
    }
    if opts.width > MAX_WIDTH || trace.tracks.len() > MAX_ROWS {
        return Err(out_err(
            path,
            format!(
                "{} px wide, {} rows; allowed: at most {MAX_WIDTH} px and {MAX_ROWS} rows",
                opts.width,
                trace.tracks.len()
            ),
        ));
    }
    Ok((opts.width.max(400), height_for(trace)))
}

fn font_ready() -> std::result::Result<(), String> {
    static READY: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            plotters::style::register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular())
                .map_err(|_| "the embedded DejaVu Sans font could not be parsed".to_string())
        })
        .clone()
}

fn out_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::TraceOutput {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}

/// Writes the picture to `path`: SVG for a `.svg` extension, PNG otherwise.
/// Errors: [`Error::TraceOutput`] (size limits, span times out of range, file system, encoder,
/// font). No trace makes it panic.
pub fn write_timeline(trace: &Trace, path: &Path, opts: &TimelineOptions) -> Result<()> {
    let size = picture_size(trace, opts, path)?;
    font_ready().map_err(|e| out_err(path, e))?;
    let svg = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if svg {
        let root = SVGBackend::new(path, size).into_drawing_area();
        draw(&root, trace, opts).map_err(|e| out_err(path, e))?;
        root.present().map_err(|e| out_err(path, e))
    } else {
        let root = BitMapBackend::new(path, size).into_drawing_area();
        draw(&root, trace, opts).map_err(|e| out_err(path, e))?;
        root.present().map_err(|e| out_err(path, e))
    }
}

/// Renders the picture into an RGB buffer (`width x height x 3` bytes), returning it and its
/// size: for tests and for callers that encode it themselves. Errors: [`Error::TraceOutput`] (as
/// [`write_timeline`]).
pub fn render_rgb(trace: &Trace, opts: &TimelineOptions) -> Result<(Vec<u8>, (u32, u32))> {
    let here = Path::new("<memory>");
    let size = picture_size(trace, opts, here)?;
    font_ready().map_err(|e| out_err(here, e))?;
    let mut buf = vec![0u8; size.0 as usize * size.1 as usize * 3];
    {
        let root = BitMapBackend::with_buffer(&mut buf, size).into_drawing_area();
        draw(&root, trace, opts).map_err(|e| out_err(here, e))?;
        root.present().map_err(|e| out_err(here, e))?;
    }
    Ok((buf, size))
}

fn rgb(stage: Stage) -> RGBColor {
    let (r, g, b) = stage.rgb();
    RGBColor(r, g, b)
}

/// The short label drawn inside a bar: the batch or piece number at the end of the name.
fn short_label(name: &str) -> Option<&str> {
    let last = name.rsplit(' ').next()?;
    (last.chars().all(|c| c.is_ascii_digit() || c == '.') && !last.is_empty()).then_some(last)
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    trace: &Trace,
    opts: &TimelineOptions,
) -> std::result::Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (w, h) = root.dim_in_pixel();
    let (main, legend) = root.split_vertically(h - 40);
    let rows = trace.tracks.len().max(1);
    let (lo, hi) = trace.extent_us();
    let ms = hi - lo > 5000.0;
    let (scale, unit) = if ms { (1e-3, "ms") } else { (1.0, "µs") };
    // From the first span (not the trace origin, which precedes setup such as allocations and
    // module loads by up to ~100 ms and would squeeze the spans into the right edge).
    let x0 = lo * scale;
    let x1 = (hi * scale).max(x0 + 1e-3);
    let pad = (x1 - x0) * 0.01;
    let label_w = 230u32.min(w / 4);
    let mut chart = ChartBuilder::on(&main)
        .caption(&opts.title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(label_w)
        .build_cartesian_2d(x0..x1 + pad, 0f64..rows as f64)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_labels(12)
        .x_desc(format!("time ({unit}) from the trace origin"))
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 15))
        .draw()
        .map_err(e)?;
    // Row r is drawn from the top: y in [rows - r - 1, rows - r].
    let y_of = |r: usize| (rows - r) as f64;
    for (r, t) in trace.tracks.iter().enumerate() {
        let (px, py) = chart.backend_coord(&(x0, y_of(r) - 0.5));
        let text = Text::new(
            t.name.clone(),
            (px.saturating_sub(label_w as i32) + 6, py - 8),
            ("sans-serif", 15).into_font().color(&BLACK),
        );
        main.draw(&text).map_err(e)?;
    }
    chart
        .draw_series(trace.spans.iter().filter(|s| s.track < rows).map(|s| {
            let top = y_of(s.track) - 0.12;
            let bottom = y_of(s.track) - 0.88;
            Rectangle::new(
                [
                    (s.start_us * scale, top),
                    ((s.end_us() * scale).max(s.start_us * scale), bottom),
                ],
                rgb(s.stage).mix(0.85).filled(),
            )
        }))
        .map_err(e)?;
    // Thin outlines so back-to-back stages of one stream stay apart.
    chart
        .draw_series(trace.spans.iter().filter(|s| s.track < rows).map(|s| {
            Rectangle::new(
                [
                    (s.start_us * scale, y_of(s.track) - 0.12),
                    (s.end_us() * scale, y_of(s.track) - 0.88),
                ],
                WHITE.stroke_width(1),
            )
        }))
        .map_err(e)?;
    for s in trace.spans.iter().filter(|s| s.track < rows) {
        let Some(label) = short_label(&s.name) else {
            continue;
        };
        let (a, py) = chart.backend_coord(&(s.start_us * scale, y_of(s.track) - 0.5));
        let (b, _) = chart.backend_coord(&(s.end_us() * scale, y_of(s.track) - 0.5));
        // i64: pixel coordinates and label widths of any size, no overflow.
        let (a, b, len) = (i64::from(a), i64::from(b), label.len() as i64);
        if b - a < 8 * len + 6 {
            continue;
        }
        // The label fits between a and b, both pixel coordinates (i32).
        let x = i32::try_from((a + b) / 2 - 4 * len).unwrap_or(0);
        let text = Text::new(
            label.to_string(),
            (x, py - 7),
            ("sans-serif", 13).into_font().color(&WHITE),
        );
        main.draw(&text).map_err(e)?;
    }
    // Legend: the stages that occur, left to right.
    let mut x = label_w as i32;
    for st in Stage::ALL {
        if !trace.spans.iter().any(|s| s.stage == st) {
            continue;
        }
        legend
            .draw(&Rectangle::new([(x, 10), (x + 16, 26)], rgb(st).filled()))
            .map_err(e)?;
        legend
            .draw(&Text::new(
                st.name(),
                (x + 22, 10),
                ("sans-serif", 15).into_font().color(&BLACK),
            ))
            .map_err(e)?;
        x += 36 + 9 * st.name().len() as i32;
    }
    Ok(())
}
