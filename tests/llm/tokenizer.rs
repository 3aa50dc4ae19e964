//! `data::Tokenizer` against the Python `tokenizers`/`transformers` packages
//! (`scripts/fixtures/tokenizer.py`: a byte-level BPE trained on a small corpus, saved with a
//! tiny Llama in `tests/data/llama-tok/`): the same ids for text with unicode, runs of
//! whitespace and a special token written in it, and the same decoded text.

use std::path::{Path, PathBuf};

use neuron_pc::data::Tokenizer;
use neuron_pc::state_dict::StateDict;

fn data(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(rel)
}

fn utf8(sd: &StateDict, name: &str) -> String {
    let bytes: Vec<u8> = sd.tensors[name].to_vec().unwrap();
    String::from_utf8(bytes).unwrap()
}

#[test]
fn ids_and_decoded_text_equal_the_python_tokenizers() {
    let fx = StateDict::load(&data("torch/tokenizer.safetensors")).unwrap();
    let tok = Tokenizer::from_dir(&data("llama-tok")).unwrap();
    assert_eq!(tok.vocab_size(), 384);
    let eos = tok.token_to_id("<|end_of_text|>").unwrap();
    assert_eq!(
        tok.eos_token_id(),
        Some(eos),
        "tokenizer_config.json's eos_token"
    );
    let n = fx.tensors.keys().filter(|k| k.starts_with("text.")).count();
    assert!(n >= 5);
    let texts: Vec<String> = (0..n).map(|i| utf8(&fx, &format!("text.{i}"))).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let batch = tok.encode_batch(&refs).unwrap();
    for (i, text) in texts.iter().enumerate() {
        let want: Vec<i32> = fx.tensors[&format!("ids.{i}")].to_vec().unwrap();
        assert_eq!(tok.encode(text).unwrap(), want, "text {i}: {text:?}");
        assert_eq!(batch[i], want, "text {i} in a batch");
        let decoded = tok.decode(&want, false).unwrap();
        assert_eq!(decoded, utf8(&fx, &format!("decoded.{i}")), "text {i}");
    }
    // the special token written in text 3 is one id, and skipping specials drops it and BOS
    let ids = tok.encode(&texts[3]).unwrap();
    assert_eq!(ids.iter().filter(|t| **t == eos).count(), 1);
    assert_eq!(
        tok.decode(&ids, true).unwrap(),
        texts[3].replace("<|end_of_text|>", "")
    );
}

#[test]
fn a_directory_without_tokenizer_json_is_one_error() {
    let e = Tokenizer::from_dir(&data("llama-tiny"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("llama-tiny") && e.contains("no tokenizer.json"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1);
    let e = Tokenizer::from_file(&data("llama-tiny/config.json"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("not a tokenizer"), "{e}");
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn a_byte_level_bpe_trained_on_the_docs_round_trips_any_text_and_saves_its_end_token() {
    let docs = ["README.md", "docs/design.md", "docs/guide/training.md"];
    let texts: Vec<String> = docs
        .iter()
        .map(|d| std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(d)).unwrap())
        .collect();
    let t = Tokenizer::train_bpe(texts.iter(), 1024, "<|endoftext|>").unwrap();
    assert_eq!(t.vocab_size(), 1024);
    assert_eq!(t.eos_token_id(), Some(0));
    // merges learned from the text: its tokens are far fewer than its bytes
    let sample = &texts[0];
    let ids = t.encode_plain(sample).unwrap();
    assert!(
        ids.len() * 2 < sample.len(),
        "{} ids for {} bytes",
        ids.len(),
        sample.len()
    );
    // byte-level: any text comes back, characters it never saw included
    for text in [
        sample.as_str(),
        "naïve façade, 東京, emoji 🦀\n\ttabs",
        "  leading spaces",
    ] {
        let ids = t.encode_plain(text).unwrap();
        assert!(ids.iter().all(|&i| i > 0 && (i as usize) < 1024));
        assert_eq!(t.decode(&ids, false).unwrap(), text);
    }
    // saved, it reads back with the same ids and its end token named
    let dir = std::env::temp_dir().join(format!("npc-bpe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    t.save_pretrained(&dir).unwrap();
    let back = Tokenizer::from_dir(&dir).unwrap();
    assert_eq!(back.eos_token_id(), Some(0));
    assert_eq!(back.encode_plain(sample).unwrap(), ids_of(&t, sample));
    assert_eq!(back.fingerprint(), t.fingerprint());
    let _ = std::fs::remove_dir_all(&dir);
    // too small a vocabulary for the 256 byte pieces: one error
    let e = Tokenizer::train_bpe(texts.iter(), 100, "<|endoftext|>")
        .err()
        .unwrap();
    assert!(e.to_string().contains("at least 257"), "{e}");
}

fn ids_of(t: &Tokenizer, text: &str) -> Vec<i32> {
    t.encode_plain(text).unwrap()
}
