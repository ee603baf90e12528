//! Driver wrappers: see [`super`]. Each function wraps one `cu*` call.
