//! [`MultiTaskGraph::enqueue`]: binds a [`MultiTaskGraph`] (defined in `ordering`, which builds
//! and checks it without a GPU) to the streams and signals of a [`DeviceSet`]. It lives here, in
//! the layer above both, so that `ordering` imports nothing of `multi` (issue 22, item 11).

use crate::error::{Error, Result};
use crate::ordering::{GraphRun, MultiTaskGraph, Signal};
use crate::stream::Stream;

use super::DeviceSet;

impl MultiTaskGraph {
    /// Checks the graph ([`MultiTaskGraph::check`] with the set's peer matrix), then enqueues one
    /// run: `streams[i]` is lane i (a stream of the lane's GPU), `signals[j]` slot j (a
    /// [`Signal`] made on the slot's home GPU). Returns at once; wait with
    /// [`crate::ordering::synchronize_timeout`].
    /// Errors: those of `check`, [`Error::LengthMismatch`], [`Error::WrongContext`] for a stream
    /// or signal on another GPU than declared, errors of kernel closures, [`Error::Cuda`].
    pub fn enqueue(
        &self,
        set: &DeviceSet,
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<GraphRun> {
        self.check(set.peer_matrix())?;
        if streams.len() != self.lanes.len() || signals.len() != self.signals.len() {
            return Err(Error::LengthMismatch {
                what: "MultiTaskGraph bindings",
                detail: format!(
                    "{} streams for {} lanes and {} signals for {} slots; one each is needed",
                    streams.len(),
                    self.lanes.len(),
                    signals.len(),
                    self.signals.len()
                ),
            });
        }
        for (s, (_, g)) in streams.iter().zip(&self.lanes) {
            if set.index_of_stream(s)? != *g {
                return Err(Error::WrongContext {
                    what: "MultiTaskGraph: a lane's stream is not on the lane's GPU",
                });
            }
        }
        for (s, (_, g)) in signals.iter().zip(&self.signals) {
            if set.index_of_context(s.context().cu_ctx(), "MultiTaskGraph signal")? != *g {
                return Err(Error::WrongContext {
                    what: "MultiTaskGraph: a signal is not on its slot's home GPU",
                });
            }
        }
        let devs = self
            .lanes
            .iter()
            .map(|(_, g)| set.device(*g))
            .collect::<Result<Vec<&crate::Device>>>()?;
        self.graph.enqueue_on(&devs, streams, signals)
    }
}
