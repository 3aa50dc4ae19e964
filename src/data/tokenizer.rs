//! [`Tokenizer`]: a model directory's own tokenizer (`tokenizer.json`, as `save_pretrained`
//! writes it), through Hugging Face's Rust `tokenizers` crate, the implementation the Python
//! package wraps: the same ids as `AutoTokenizer(text)["input_ids"]`.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The files of a tokenizer in a `save_pretrained` directory, copied by
/// [`Tokenizer::save_pretrained`].
const FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
];

/// A `tokenizer.json` with the end token of its `tokenizer_config.json`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    eos: Option<i32>,
    /// The end token's text, for a tokenizer made here (saved in `tokenizer_config.json`).
    eos_token: Option<String>,
    /// The directory it was read from.
    dir: Option<PathBuf>,
}

impl Tokenizer {
    /// The tokenizer of a `save_pretrained` directory: `tokenizer.json`, and the end token named
    /// by `tokenizer_config.json`'s `eos_token` (or `config.json`'s `eos_token_id`) when there
    /// is one. A directory without `tokenizer.json` is one error naming the file.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let path = dir.join("tokenizer.json");
        if !path.exists() {
            return Err(Error::Config(format!(
                "{}: no tokenizer.json (a save_pretrained directory with a fast tokenizer is \
                 expected; tokenizer.model alone is not read)",
                dir.display()
            )));
        }
        let mut t = Tokenizer::from_file(&path)?;
        let read = |name: &str| -> Option<serde_json::Value> {
            let text = std::fs::read_to_string(dir.join(name)).ok()?;
            serde_json::from_str(&text).ok()
        };
        let by_name = read("tokenizer_config.json").and_then(|c| {
            let token = match &c["eos_token"] {
                serde_json::Value::String(s) => Some(s.clone()),
                // older files: {"content": "</s>", ...}
                serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
                _ => None,
            }?;
            t.inner.token_to_id(&token).map(|id| id as i32)
        });
        let by_id = read("config.json").and_then(|c| match &c["eos_token_id"] {
            serde_json::Value::Number(n) => n.as_i64().map(|n| n as i32),
            serde_json::Value::Array(a) => a.first()?.as_i64().map(|n| n as i32),
            _ => None,
        });
        t.eos = by_name.or(by_id);
        t.dir = Some(dir.to_path_buf());
        Ok(t)
    }

    /// A `tokenizer.json` file (no end token known).
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Config(format!("{}: not a tokenizer: {e}", path.display())))?;
        Ok(Tokenizer {
            inner,
            eos: None,
            eos_token: None,
            dir: None,
        })
    }

    /// A byte-level BPE tokenizer (GPT-2's kind: any text, no unknown token) of `vocab_size`
    /// pieces trained on `texts` by the `tokenizers` crate's trainer, the one behind Python's
    /// `tokenizer.train_from_iterator`. `eos` is its end-of-text token (`<|endoftext|>`), id 0,
    /// which [`Tokenizer::save_pretrained`] names in `tokenizer_config.json` so
    /// `AutoTokenizer.from_pretrained` and [`Tokenizer::from_dir`] find it again.
    pub fn train_bpe<I, S>(texts: I, vocab_size: usize, eos: &str) -> Result<Tokenizer>
    where
        I: Iterator<Item = S> + Send,
        S: AsRef<str> + Send,
    {
        use tokenizers::models::bpe::{BpeTrainer, BPE};
        use tokenizers::models::TrainerWrapper;
        use tokenizers::pre_tokenizers::byte_level::ByteLevel;
        use tokenizers::AddedToken;
        let alphabet = ByteLevel::alphabet();
        let bytes = alphabet.len();
        if vocab_size < bytes + 1 {
            return Err(Error::Config(format!(
                "a byte-level BPE vocabulary of {vocab_size} pieces: it needs at least {} (the \
                 256 byte pieces and the end token)",
                bytes + 1
            )));
        }
        let mut trainer: TrainerWrapper = BpeTrainer::builder()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .special_tokens(vec![AddedToken::from(eos.to_string(), true)])
            .initial_alphabet(alphabet.into_iter().collect())
            .build()
            .into();
        let mut inner = tokenizers::Tokenizer::new(BPE::default());
        inner
            .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
            .with_decoder(Some(ByteLevel::default()))
            .with_post_processor(Some(ByteLevel::default().trim_offsets(false)));
        inner
            .train(&mut trainer, texts)
            .map_err(|e| Error::Config(format!("training a BPE tokenizer: {e}")))?;
        let eos_id = inner.token_to_id(eos).map(|i| i as i32);
        Ok(Tokenizer {
            inner,
            eos: eos_id,
            eos_token: Some(eos.to_string()),
            dir: None,
        })
    }

    /// A digest of everything that decides the ids: the tokenizer serialized and its end
    /// token (a [`super::PackedCache`] key).
    pub fn fingerprint(&self) -> String {
        use sha2::Digest;
        let json = self.inner.to_string(false).unwrap_or_default();
        let mut h = sha2::Sha256::new();
        h.update(json.as_bytes());
        h.update(format!("eos {:?}", self.eos).as_bytes());
        hex::encode(h.finalize())
    }

    /// The ids of `text`, special tokens added as the tokenizer's post-processor says (a
    /// beginning-of-text token for Llama 3), special tokens written in the text recognised.
    pub fn encode(&self, text: &str) -> Result<Vec<i32>> {
        self.ids(text, true)
    }

    fn ids(&self, text: &str, special: bool) -> Result<Vec<i32>> {
        let encoding = self
            .inner
            .encode(text, special)
            .map_err(|e| Error::Config(format!("tokenizer: {e}")))?;
        Ok(encoding.get_ids().iter().map(|&i| i as i32).collect())
    }

    /// The ids of `text` alone: no special tokens added (a completion after its prompt).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<i32>> {
        self.ids(text, false)
    }

    /// [`Tokenizer::encode`] of each text, on every core.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Vec<i32>>> {
        let encodings = self
            .inner
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| Error::Config(format!("tokenizer: {e}")))?;
        Ok(encodings
            .iter()
            .map(|e| e.get_ids().iter().map(|&i| i as i32).collect())
            .collect())
    }

    /// The text of `ids` (special tokens kept unless `skip_special`), as `decode` in Python.
    pub fn decode(&self, ids: &[i32], skip_special: bool) -> Result<String> {
        let ids: Vec<u32> = ids.iter().map(|&i| i.max(0) as u32).collect();
        self.inner
            .decode(&ids, skip_special)
            .map_err(|e| Error::Config(format!("tokenizer: {e}")))
    }

    /// Writes the tokenizer into `dir` beside a model's `save_pretrained` files: the files of
    /// the directory it was read from, byte for byte (or `tokenizer.json` alone for one read
    /// from a file), each atomically. In a trial run (`neuron-pc compile`) nothing is written.
    pub fn save_pretrained(&self, dir: &Path) -> Result<()> {
        if crate::trial::skip_write("tokenizer", dir) {
            return Ok(());
        }
        std::fs::create_dir_all(dir).map_err(|e| Error::io_at(dir, e))?;
        let Some(source) = &self.dir else {
            let text = self
                .inner
                .to_string(false)
                .map_err(|e| Error::Config(format!("tokenizer: {e}")))?;
            let path = dir.join(FILES[0]);
            crate::state_dict::write_atomic(&path, text.as_bytes())
                .map_err(|e| Error::io_at(&path, e))?;
            if let Some(eos) = &self.eos_token {
                // what transformers writes for a fast tokenizer of its own
                let config = serde_json::json!({
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "eos_token": eos,
                    "bos_token": eos,
                    "model_max_length": 1_000_000_000_000_000_000u64,
                });
                let path = dir.join(FILES[1]);
                crate::state_dict::write_atomic(&path, config.to_string().as_bytes())
                    .map_err(|e| Error::io_at(&path, e))?;
            }
            return Ok(());
        };
        for name in FILES {
            let from = source.join(name);
            if !from.exists() {
                continue;
            }
            let bytes = std::fs::read(&from).map_err(|e| Error::io_at(&from, e))?;
            let to = dir.join(name);
            crate::state_dict::write_atomic(&to, &bytes).map_err(|e| Error::io_at(&to, e))?;
        }
        Ok(())
    }

    /// The end-of-text token, when the directory names one.
    pub fn eos_token_id(&self) -> Option<i32> {
        self.eos
    }

    /// The id of a token written as text (`<|end_of_text|>`), if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<i32> {
        self.inner.token_to_id(token).map(|i| i as i32)
    }

    /// Pieces in the vocabulary, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
