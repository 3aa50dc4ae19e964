//! Content-addressed store.
