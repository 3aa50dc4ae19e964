//! One training document, as every reader of text data gives it (JSON lines and plain text in
//! `text.rs`, Hugging Face's Arrow and Parquet files in `datasets.rs`).

/// One training document.
#[derive(Clone, Debug, PartialEq)]
pub enum Document {
    /// Every token is predicted.
    Text(String),
    /// Only the completion is predicted; the prompt is its context.
    Pair {
        /// The context the completion follows (labels -100).
        prompt: String,
        /// The text the model learns to produce.
        completion: String,
    },
}
