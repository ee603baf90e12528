//! The GPU decode step (issue 21): see [`super`].
