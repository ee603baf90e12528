//! Memory: stream-ordered memory pools, device buffers bound to a stream, pinned host buffers.

mod buffer;
mod pinned;
mod pool;
pub mod reaper;
pub(crate) mod staging;

pub use buffer::{DeviceBuffer, DeviceView, DeviceViewMut};
pub use pinned::PinnedBuffer;
pub use pool::MemPool;
