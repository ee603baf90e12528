//! Shared support for warpline's integration tests (`tests/`) and benches (`benches/`).

pub mod support;
