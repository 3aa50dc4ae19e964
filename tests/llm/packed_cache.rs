//! The packed-rows cache (`data::PackedCache`): a corpus tokenized once, its rows read back
//! mapped and equal to tokenizing again; any change of data, tokenizer or row length is
//! another entry; a broken entry is rebuilt; processes (here threads) racing to build one
//! build it once; a cache that cannot be written still gives the rows.

use std::path::{Path, PathBuf};

use neuron_pc::data::{load_packed, CacheOutcome, PackedCache, Tokenizer};

fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("npc-packed-cache-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/llama-tok"))
        .unwrap()
}

fn corpus(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("corpus.jsonl");
    let docs = [
        r#"{"text": "The lazy device records every operation and compiles the step graph."}"#,
        r#"{"prompt": "Q: where do tensors stay?", "completion": " On the accelerator."}"#,
        r#"{"text": "A training loop marks a step; the cache keeps the executable."}"#,
    ];
    std::fs::write(&path, docs.repeat(5).join("\n") + extra).unwrap();
    path
}

fn built(o: &CacheOutcome) -> &Path {
    match o {
        CacheOutcome::Built(p) => p,
        CacheOutcome::Hit(p) => panic!("expected a build, got a hit on {}", p.display()),
    }
}

#[test]
fn a_corpus_is_tokenized_once_and_read_back_mapped() {
    let dir = scratch("once");
    let tok = tokenizer();
    let data = corpus(&dir, "");
    let cache = PackedCache::new(dir.join("cache"));
    let fresh = load_packed(&data, &tok, 16, true).unwrap();
    let (a, first) = cache.load(&data, &tok, 16, true).unwrap();
    let entry = built(&first).to_path_buf();
    assert!(entry.is_file());
    assert_eq!(a, fresh);
    let (b, second) = cache.load(&data, &tok, 16, true).unwrap();
    assert_eq!(second, CacheOutcome::Hit(entry.clone()));
    assert_eq!(b, fresh);
    assert!(b.rows() > 4);
    // a mapped batch, wrapping, is the in-memory one
    let n = b.rows();
    assert_eq!(b.batch(n - 1, 3), fresh.batch(n - 1, 3));
    // every input is part of the key
    let other_len = built(&cache.load(&data, &tok, 12, true).unwrap().1).to_path_buf();
    let no_masks = built(&cache.load(&data, &tok, 16, false).unwrap().1).to_path_buf();
    let changed = corpus(&dir, "\n{\"text\": \"one more\"}");
    let (c, outcome) = cache.load(&changed, &tok, 16, true).unwrap();
    let changed_entry = built(&outcome).to_path_buf();
    assert_eq!(c, load_packed(&changed, &tok, 16, true).unwrap());
    let entries = [&entry, &other_len, &no_masks, &changed_entry];
    for (i, a) in entries.iter().enumerate() {
        for b in &entries[i + 1..] {
            assert_ne!(a, b);
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_truncated_entry_is_rebuilt_and_an_unwritable_cache_still_gives_the_rows() {
    let dir = scratch("broken");
    let tok = tokenizer();
    let data = corpus(&dir, "");
    let fresh = load_packed(&data, &tok, 16, false).unwrap();
    let cache = PackedCache::new(dir.join("cache"));
    let (_, outcome) = cache.load(&data, &tok, 16, false).unwrap();
    let entry = built(&outcome).to_path_buf();
    let bytes = std::fs::read(&entry).unwrap();
    std::fs::write(&entry, &bytes[..bytes.len() - 7]).unwrap();
    let (rows, outcome) = cache.load(&data, &tok, 16, false).unwrap();
    assert_eq!(built(&outcome), entry);
    assert_eq!(rows, fresh);
    assert_eq!(std::fs::read(&entry).unwrap(), bytes, "rewritten whole");
    // a file where the cache directory should be
    let blocked = PackedCache::new(data.clone());
    let (rows, outcome) = blocked.load(&data, &tok, 16, false).unwrap();
    built(&outcome);
    assert_eq!(rows, fresh);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn processes_racing_for_one_entry_build_it_once() {
    let dir = scratch("race");
    let data = corpus(&dir, "");
    let cache = PackedCache::new(dir.join("cache"));
    let outcomes: Vec<CacheOutcome> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let (cache, data) = (cache.clone(), data.clone());
                s.spawn(move || cache.load(&data, &tokenizer(), 16, true).unwrap().1)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let builds = outcomes
        .iter()
        .filter(|o| matches!(o, CacheOutcome::Built(_)))
        .count();
    assert_eq!(builds, 1, "{outcomes:?}");
    std::fs::remove_dir_all(dir).unwrap();
}
