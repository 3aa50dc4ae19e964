//! The dataset files users bring (`data::read_documents`): what Hugging Face `datasets` and
//! `pyarrow` wrote (`scripts/fixtures/datasets_formats.py`) reads as the documents the fixture
//! script put in, in order; a file without the columns, a null, a DatasetDict or a file that is
//! not one is one error line naming it.

use std::path::{Path, PathBuf};

use neuron_pc::data::{read_documents, Document};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/datasets")
}

/// The fixture script's documents: (texts, pairs).
fn expected() -> (Vec<Document>, Vec<Document>) {
    let text = std::fs::read_to_string(fixtures().join("expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let texts = v["text"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| Document::Text(t.as_str().unwrap().to_string()))
        .collect();
    let pairs = v["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Document::Pair {
            prompt: p[0].as_str().unwrap().to_string(),
            completion: p[1].as_str().unwrap().to_string(),
        })
        .collect();
    (texts, pairs)
}

fn error(path: &Path) -> String {
    read_documents(path).unwrap_err().to_string()
}

#[test]
fn save_to_disk_directories_and_arrow_files_read_their_documents_in_order() {
    let (texts, pairs) = expected();
    assert_eq!(texts.len(), 10);
    // Two shards: the order of state.json's data files is the dataset's order.
    assert_eq!(
        read_documents(&fixtures().join("text-arrow")).unwrap(),
        texts
    );
    assert_eq!(
        read_documents(&fixtures().join("pairs-arrow")).unwrap(),
        pairs
    );
    // One stream on its own, and one split of a DatasetDict.
    let second = fixtures().join("text-arrow/data-00001-of-00002.arrow");
    assert_eq!(read_documents(&second).unwrap(), texts[5..]);
    let test = read_documents(&fixtures().join("splits/test")).unwrap();
    assert_eq!(test, texts[..3]);
    // The Arrow IPC file format (`ARROW1` magic), which pyarrow also writes.
    let file = fixtures().join("text-file.arrow");
    assert_eq!(read_documents(&file).unwrap(), texts);
}

#[test]
fn parquet_files_read_with_snappy_zstd_row_groups_and_large_strings() {
    let (texts, pairs) = expected();
    // `Dataset.to_parquet`: snappy, row groups of 4 rows (3 groups).
    assert_eq!(
        read_documents(&fixtures().join("text.parquet")).unwrap(),
        texts
    );
    // pyarrow: zstd, large_string columns.
    assert_eq!(
        read_documents(&fixtures().join("pairs.parquet")).unwrap(),
        pairs
    );
    // A Hub repository: data/train-0000{0,1}-of-00002.parquet, in name order.
    assert_eq!(read_documents(&fixtures().join("hub")).unwrap(), texts);
}

#[test]
fn bad_dataset_files_are_one_error_naming_the_file() {
    let e = error(&fixtures().join("no-text.parquet"));
    assert!(e.contains("no-text.parquet"), "{e}");
    assert!(
        e.contains("\"text\" column") && e.contains("body, id"),
        "{e}"
    );
    let e = error(&fixtures().join("nulls.parquet"));
    assert!(e.contains("row 2: \"text\" is null"), "{e}");
    let e = error(&fixtures().join("gzip.parquet"));
    assert!(e.contains("gzip.parquet: compressed with gzip"), "{e}");
    assert!(e.contains("compression=\"zstd\""), "{e}");
    let e = error(&fixtures().join("splits"));
    assert!(e.contains("DatasetDict of splits (train, test)"), "{e}");
    assert!(e.contains("splits/train"), "{e}");
    // A text file named .parquet, and a JSON file named .arrow.
    let dir = std::env::temp_dir().join(format!("npc-dataset-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fake = dir.join("fake.parquet");
    std::fs::write(&fake, "text,id\nhello,1\n").unwrap();
    let e = error(&fake);
    assert!(e.contains("fake.parquet: not a Parquet file"), "{e}");
    let fake = dir.join("fake.arrow");
    std::fs::write(&fake, "{\"text\": \"hello\"}\n").unwrap();
    let e = error(&fake);
    assert!(e.contains("fake.arrow: not an Arrow IPC stream"), "{e}");
    let e = error(&dir.join("missing.parquet"));
    assert!(e.contains("missing.parquet: cannot read"), "{e}");
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let e = error(&empty);
    assert!(e.contains("without state.json"), "{e}");
    assert!(!e.contains('\n'), "{e}");
    std::fs::remove_dir_all(dir).unwrap();
}
