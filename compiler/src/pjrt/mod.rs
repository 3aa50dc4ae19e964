//! PJRT runtime layer.
