//! Chrome trace / Perfetto JSON ("Trace Event Format"): `{"traceEvents": [...]}` with one
//! complete event (`"ph": "X"`, `ts` and `dur` in µs) per span, `pid` = device ordinal, `tid` =
//! track, and metadata events (`"ph": "M"`: `process_name`, `thread_name`, `thread_sort_index`)
//! naming them. Opens in ui.perfetto.dev and chrome://tracing.

use std::path::Path;

use serde::Serialize;
use serde_json::{json, Map, Value};

use super::model::Trace;
use crate::error::{Error, Result};

#[derive(Serialize)]
struct Complete<'a> {
    name: &'a str,
    cat: &'static str,
    ph: &'static str,
    ts: f64,
    dur: f64,
    pid: u32,
    tid: u32,
    args: Map<String, Value>,
}

/// The trace as a Chrome trace JSON value.
pub fn chrome_json(trace: &Trace) -> Value {
    let mut events = Vec::with_capacity(trace.spans.len() + 3 * trace.tracks.len());
    let mut named = std::collections::HashSet::new();
    for (i, t) in trace.tracks.iter().enumerate() {
        if named.insert(t.pid) {
            events.push(
                json!({"name": "process_name", "ph": "M", "pid": t.pid, "tid": 0,
                "args": {"name": t.process}}),
            );
        }
        events.push(
            json!({"name": "thread_name", "ph": "M", "pid": t.pid, "tid": t.tid,
            "args": {"name": t.name}}),
        );
        events.push(
            json!({"name": "thread_sort_index", "ph": "M", "pid": t.pid, "tid": t.tid,
            "args": {"sort_index": i}}),
        );
    }
    for s in &trace.spans {
        let Some(t) = trace.tracks.get(s.track) else {
            continue;
        };
        let args = s
            .args
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        let ev = Complete {
            name: &s.name,
            cat: s.stage.name(),
            ph: "X",
            ts: s.start_us,
            dur: s.dur_us,
            pid: t.pid,
            tid: t.tid,
            args,
        };
        events.push(serde_json::to_value(ev).unwrap_or(Value::Null));
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": concat!("warpline ", env!("CARGO_PKG_VERSION")),
            "clock": trace.clock,
            "unanchored_spans": trace.unanchored,
        }
    })
}

/// Writes [`chrome_json`] to `path`. Errors: [`Error::TraceOutput`].
pub fn write_chrome_json(trace: &Trace, path: &Path) -> Result<()> {
    let text = serde_json::to_string(&chrome_json(trace)).map_err(|e| Error::TraceOutput {
        path: path.display().to_string(),
        detail: e.to_string(),
    })?;
    std::fs::write(path, text).map_err(|e| Error::TraceOutput {
        path: path.display().to_string(),
        detail: e.to_string(),
    })
}
