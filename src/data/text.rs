//! Text data for language models: documents read from JSON lines or plain text, tokenized with
//! the model's [`Tokenizer`], and packed into rows of one length (one step graph).
//!
//! - **JSON lines** (`.jsonl`, `.json`): one object per line, with a `text` field, or `prompt`
//!   and `completion` (the prompt's tokens are context, not predicted: label -100).
//! - **Plain text** (any other file): one document per paragraph (blank-line separated), as
//!   `datasets`' `text` loader with `sample_by="paragraph"`.
//! - **Hugging Face datasets** (a `save_to_disk` directory, `.arrow`, `.parquet`, or a
//!   directory of Parquet files): a `text` column, or `prompt` and `completion`.
//!
//! [`pack`] lays the tokenized documents end to end (each followed by the tokenizer's end
//! token) and cuts rows of `len` tokens. With document masks, position ids restart at each
//! document (and at each row for a document cut across rows), which
//! [`crate::models::llama::LlamaForCausalLM`] reads as a block-diagonal causal mask, and no
//! document's first token is predicted from the one before it.

use std::path::Path;

use super::{Document, PackedRows, Tokenizer};
use crate::error::{Error, Result};

/// The label of a token that is not predicted (PyTorch's `ignore_index`).
const IGNORE: i32 = -100;

/// Reads the documents of `path` (see the module documentation for the formats). Bad input is
/// one error naming the file and line (or row).
pub fn read_documents(path: &Path) -> Result<Vec<Document>> {
    if super::datasets::is_dataset(path) {
        return super::datasets::read(path);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("{}: cannot read: {e}", path.display())))?;
    let jsonl = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("jsonl") | Some("json")
    );
    if !jsonl {
        let paragraphs = text
            .split("\n\n")
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| Document::Text(p.to_string()))
            .collect();
        return Ok(paragraphs);
    }
    let mut docs = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), n + 1);
        let value: serde_json::Value = serde_json::from_str(line)
            .map_err(|e| Error::Config(format!("{}: not JSON: {e}", at())))?;
        let field = |key: &str| value.get(key).and_then(serde_json::Value::as_str);
        let doc = match (field("text"), field("prompt"), field("completion")) {
            (Some(t), _, _) => Document::Text(t.to_string()),
            (None, Some(p), Some(c)) => Document::Pair {
                prompt: p.to_string(),
                completion: c.to_string(),
            },
            _ => {
                return Err(Error::Config(format!(
                    "{}: expected a string \"text\", or \"prompt\" and \"completion\"",
                    at()
                )))
            }
        };
        docs.push(doc);
    }
    Ok(docs)
}

/// A tokenized document: its ids and the first one that is predicted.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenizedDocument {
    /// The token ids, ending with the tokenizer's end token when it has one.
    pub ids: Vec<i32>,
    /// Tokens before this index are context (a pair's prompt).
    pub predict_from: usize,
}

/// Tokenizes `docs` on every core: a text with the tokenizer's special tokens (as
/// `tokenizer(text)`); a pair's prompt the same way, followed by its completion without
/// special tokens. Each document ends with the tokenizer's end token when it has one.
pub fn tokenize(tokenizer: &Tokenizer, docs: &[Document]) -> Result<Vec<TokenizedDocument>> {
    tokenize_with_progress(tokenizer, docs, &mut |_, _| {})
}

/// The bytes of text a slice of documents tokenized at once holds, at least: enough to keep
/// every core busy, small enough that a large corpus reports its progress about 100 times.
const SLICE_BYTES: u64 = 1 << 20;

/// [`tokenize`], calling `progress(bytes_done, bytes_total)` of the documents' text after each
/// slice of them (about 1% of the corpus, at least 1 MiB), for a progress bar
/// ([`crate::monitor::Work`]).
pub fn tokenize_with_progress(
    tokenizer: &Tokenizer,
    docs: &[Document],
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Vec<TokenizedDocument>> {
    let bytes = |d: &Document| match d {
        Document::Text(t) => t.len() as u64,
        Document::Pair { prompt, completion } => (prompt.len() + completion.len()) as u64,
    };
    let total: u64 = docs.iter().map(bytes).sum();
    let slice = (total / 100).max(SLICE_BYTES);
    let eos = tokenizer.eos_token_id();
    let mut out = Vec::with_capacity(docs.len());
    let (mut done, mut from) = (0u64, 0usize);
    while from < docs.len() {
        let mut to = from;
        let mut size = 0;
        while to < docs.len() && (to == from || size < slice) {
            size += bytes(&docs[to]);
            to += 1;
        }
        let part = &docs[from..to];
        let firsts: Vec<&str> = part
            .iter()
            .map(|d| match d {
                Document::Text(t) => t.as_str(),
                Document::Pair { prompt, .. } => prompt.as_str(),
            })
            .collect();
        for (doc, mut ids) in part.iter().zip(tokenizer.encode_batch(&firsts)?) {
            let predict_from = match doc {
                Document::Text(_) => 0,
                Document::Pair { completion, .. } => {
                    let context = ids.len();
                    ids.extend(tokenizer.encode_plain(completion)?);
                    context
                }
            };
            ids.extend(eos);
            out.push(TokenizedDocument { ids, predict_from });
        }
        done += size;
        progress(done, total);
        from = to;
    }
    Ok(out)
}

/// Packs `docs` into rows of `len` tokens (the tokens left over at the end, fewer than a row,
/// are dropped). With `document_masks`, position ids restart at each document and at each row
/// (the rest of a document cut across rows starts again at 0), and a document's first token
/// in a row is not predicted; without, positions run `0..len` in every row and every token
/// after the row's first is predicted (pretraining on a stream). A pair's prompt is never
/// predicted. No documents, or fewer tokens than one row, is an error.
pub fn pack(docs: &[TokenizedDocument], len: usize, document_masks: bool) -> Result<PackedRows> {
    let total: usize = docs.iter().map(|d| d.ids.len()).sum();
    if len < 2 || total < len {
        return Err(Error::Config(format!(
            "pack: {total} tokens in {} documents, fewer than one row of {len} (at least 2)",
            docs.len()
        )));
    }
    let rows = total / len;
    let mut input_ids = Vec::with_capacity(rows * len);
    let mut position_ids = Vec::with_capacity(rows * len);
    let mut labels = Vec::with_capacity(rows * len);
    'docs: for doc in docs {
        let mut position = 0;
        for (i, &id) in doc.ids.iter().enumerate() {
            if input_ids.len() == rows * len {
                break 'docs;
            }
            let column = input_ids.len() % len;
            if column == 0 && document_masks {
                position = 0;
            }
            let predicted = i >= doc.predict_from && !(document_masks && position == 0);
            input_ids.push(id);
            position_ids.push(if document_masks {
                position
            } else {
                column as i32
            });
            labels.push(if predicted { id } else { IGNORE });
            position += 1;
        }
    }
    PackedRows::new(len, input_ids, position_ids, labels)
}

/// [`read_documents`], [`tokenize`] and [`pack`] of one file: the rows a language model
/// trains or is evaluated on.
pub fn load_packed(
    path: &Path,
    tokenizer: &Tokenizer,
    len: usize,
    document_masks: bool,
) -> Result<PackedRows> {
    load_packed_with_progress(path, tokenizer, len, document_masks, &mut |_, _| {})
}

/// [`load_packed`], reporting the tokenizing's progress as [`tokenize_with_progress`] does.
pub fn load_packed_with_progress(
    path: &Path,
    tokenizer: &Tokenizer,
    len: usize,
    document_masks: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PackedRows> {
    let docs = read_documents(path)?;
    let tokens = tokenize_with_progress(tokenizer, &docs, progress)?;
    pack(&tokens, len, document_masks)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))
}
