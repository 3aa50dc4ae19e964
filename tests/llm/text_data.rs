//! Text data for language models (`data::{read_documents, tokenize, pack}`): the formats, the
//! packed rows' ids, positions and labels, and packed documents computing what each computes
//! alone.

use crate::llm_check;
use crate::torch_fixture;

use std::path::PathBuf;

use neuron_pc::data::{
    pack, read_documents, tokenize, tokenize_with_progress, Document, TokenizedDocument, Tokenizer,
};
use neuron_pc::models::llama::LlamaForCausalLM;

use llm_check::{close, data, values};

fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("npc-text-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn json_lines_and_paragraphs_read_as_documents_and_bad_lines_are_named() {
    let path = write(
        "a.jsonl",
        "{\"text\": \"first\"}\n\n{\"prompt\": \"Q: 2+2?\", \"completion\": \" 4\"}\n",
    );
    let docs = read_documents(&path).unwrap();
    assert_eq!(
        docs,
        vec![
            Document::Text("first".into()),
            Document::Pair {
                prompt: "Q: 2+2?".into(),
                completion: " 4".into()
            }
        ]
    );
    let path = write("b.txt", "one\nparagraph\n\n\n  two  \n\nthree");
    let docs = read_documents(&path).unwrap();
    assert_eq!(docs.len(), 3);
    assert_eq!(docs[0], Document::Text("one\nparagraph".into()));
    for (text, needle) in [
        ("{\"text\": \"ok\"}\n{not json}\n", "b.jsonl:2: not JSON"),
        ("{\"text\": 3}\n", "b.jsonl:1: expected a string \"text\""),
        ("{\"prompt\": \"p\"}\n", "b.jsonl:1: expected"),
    ] {
        let e = read_documents(&write("b.jsonl", text))
            .unwrap_err()
            .to_string();
        assert!(e.contains(needle), "{e}");
        assert_eq!(e.lines().count(), 1);
    }
    let e = read_documents(&data("no-such.jsonl"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no-such.jsonl: cannot read"), "{e}");
}

#[test]
fn a_pair_predicts_only_its_completion_and_each_document_ends_with_the_end_token() {
    let tok = Tokenizer::from_dir(&data("llama-tok")).unwrap();
    let eos = tok.eos_token_id().unwrap();
    let docs = [
        Document::Text("The lazy device".into()),
        Document::Pair {
            prompt: "Q: cache?".into(),
            completion: " on disk".into(),
        },
    ];
    let t = tokenize(&tok, &docs).unwrap();
    let mut text = tok.encode("The lazy device").unwrap();
    text.push(eos);
    assert_eq!(
        t[0],
        TokenizedDocument {
            ids: text,
            predict_from: 0
        }
    );
    let prompt = tok.encode("Q: cache?").unwrap();
    let mut pair = prompt.clone();
    pair.extend(tok.encode_plain(" on disk").unwrap());
    pair.push(eos);
    assert_eq!(
        t[1],
        TokenizedDocument {
            ids: pair,
            predict_from: prompt.len()
        }
    );
    assert_eq!(
        tok.decode(&t[1].ids[t[1].predict_from..], true).unwrap(),
        " on disk"
    );
}

#[test]
fn a_large_corpus_reports_its_tokenizing_in_slices_and_each_document_tokenizes_as_alone() {
    const MIB: f64 = (1 << 20) as f64;
    let tok = Tokenizer::from_dir(&data("llama-tok")).unwrap();
    // 2.6 MiB of text: slices of at least 1 MiB, so three reports
    let docs: Vec<Document> = (0..35_000)
        .map(|i| match i % 3 {
            0 => Document::Pair {
                prompt: format!("Q: what is {i} squared? "),
                completion: format!("{} and some words after it to fill the line", i * i),
            },
            _ => Document::Text(format!(
                "Document {i}: the lazy device records ops until mark_step, then compiles."
            )),
        })
        .collect();
    let total: u64 = docs
        .iter()
        .map(|d| match d {
            Document::Text(t) => t.len() as u64,
            Document::Pair { prompt, completion } => (prompt.len() + completion.len()) as u64,
        })
        .sum();
    let mut reports = Vec::new();
    let sliced =
        tokenize_with_progress(&tok, &docs, &mut |done, all| reports.push((done, all))).unwrap();
    assert!((2.3 * MIB..2.8 * MIB).contains(&(total as f64)), "{total}");
    assert_eq!(reports.len(), 3, "{reports:?}");
    assert!(reports.iter().all(|&(_, all)| all == total), "{reports:?}");
    assert!(reports.windows(2).all(|w| w[0].0 < w[1].0), "{reports:?}");
    assert!(reports[0].0 >= 1 << 20, "{reports:?}");
    assert_eq!(reports.last().unwrap().0, total);
    // each document's ids as encoding it alone gives, in order
    let eos = tok.eos_token_id().unwrap();
    assert_eq!(sliced.len(), docs.len());
    for (got, doc) in sliced.iter().zip(&docs) {
        let (mut ids, predict_from) = match doc {
            Document::Text(t) => (tok.encode(t).unwrap(), 0),
            Document::Pair { prompt, completion } => {
                let mut ids = tok.encode(prompt).unwrap();
                let context = ids.len();
                ids.extend(tok.encode_plain(completion).unwrap());
                (ids, context)
            }
        };
        ids.push(eos);
        assert_eq!(*got, TokenizedDocument { ids, predict_from });
    }
}

#[test]
fn packing_cuts_rows_restarts_positions_and_masks_labels() {
    let doc = |ids: Vec<i32>, predict_from| TokenizedDocument { ids, predict_from };
    let docs = [
        doc(vec![10, 11, 12], 0),
        doc(vec![20, 21, 22, 23, 24, 25], 2),
        doc(vec![30, 31, 32, 33], 0),
    ];
    // 13 tokens: two rows of 5, three left over
    let p = pack(&docs, 5, true).unwrap();
    assert_eq!(p.rows(), 2);
    assert_eq!(p.input_ids(), [10, 11, 12, 20, 21, 22, 23, 24, 25, 30]);
    // document 2 is cut across the rows: its rest starts again at 0
    assert_eq!(p.position_ids(), [0, 1, 2, 0, 1, 0, 1, 2, 3, 0]);
    // no first token of a document in a row is predicted, nor the pair's prompt (20, 21)
    assert_eq!(
        p.labels(),
        [-100, 11, 12, -100, -100, -100, 23, 24, 25, -100]
    );
    let stream = pack(&docs, 5, false).unwrap();
    assert_eq!(stream.input_ids(), p.input_ids());
    assert_eq!(stream.position_ids(), [0, 1, 2, 3, 4, 0, 1, 2, 3, 4]);
    assert_eq!(
        stream.labels(),
        [10, 11, 12, -100, -100, 22, 23, 24, 25, 30]
    );
    // batches wrap around the rows
    let b = p.batch(1, 2);
    assert_eq!(b[0].dims(), [2, 5]);
    let ids: Vec<i32> = b[0].to_vec().unwrap();
    assert_eq!(ids, [22, 23, 24, 25, 30, 10, 11, 12, 20, 21]);
    let e = pack(&docs, 14, true).unwrap_err().to_string();
    assert!(
        e.contains("13 tokens in 3 documents, fewer than one row of 14"),
        "{e}"
    );
}

/// With document masks each packed document gets the logits it gets alone.
#[test]
fn packed_documents_compute_what_each_computes_alone() {
    let fx = torch_fixture::Fixture::load("packing");
    let tok = Tokenizer::from_dir(&data("llama-tok")).unwrap();
    let model = LlamaForCausalLM::from_pretrained(&fx.dev, &data("llama-tok")).unwrap();
    let texts = [
        "The compiler caches the step graph.",
        "Tensors stay on the device.",
        "A loop",
    ];
    let docs: Vec<Document> = texts
        .iter()
        .map(|t| Document::Text(t.to_string()))
        .collect();
    let tokens = tokenize(&tok, &docs).unwrap();
    let total: usize = tokens.iter().map(|d| d.ids.len()).sum();
    let packed = pack(&tokens, total, true).unwrap();
    let batch = packed.batch(0, 1);
    let ids = fx.dev.tensor(&batch[0]).unwrap();
    let positions = fx.dev.tensor(&batch[1]).unwrap();
    let together = values(&model.forward(&ids, Some(&positions), None).unwrap());
    let vocab = tok.vocab_size();
    let mut at = 0;
    for doc in &tokens {
        let n = doc.ids.len();
        let alone = fx.dev.from_slice(&doc.ids, &[1, n]).unwrap();
        let alone = values(&model.forward(&alone, None, None).unwrap());
        let part = &together[at * vocab..(at + n) * vocab];
        close("packed vs alone", part, &alone, 1e-5, 1e-4);
        at += n;
    }
}

/// llm.c's shards (written by NumPy: `scripts/fixtures/token_shards.py`), uint16 and uint32,
/// read in place; a bad header or size is one error naming the file.
#[test]
fn llm_c_token_shards_read_as_numpy_wrote_them() {
    let expected =
        neuron_pc::state_dict::StateDict::load(&data("shards/expected.safetensors")).unwrap();
    for name in ["gpt2", "llama3"] {
        let shard =
            neuron_pc::data::TokenShard::open(&data(&format!("shards/{name}.bin"))).unwrap();
        let want: Vec<i32> = expected.tensors[name]
            .to_f64_vec()
            .iter()
            .map(|v| *v as i32)
            .collect();
        assert_eq!(shard.len(), want.len());
        assert_eq!(shard.tokens(0, want.len()), want, "{name}");
        assert_eq!(shard.max_token(), want.iter().max().copied(), "{name}");
        // rows of 64: 15 of them; batch 14 wraps to row 0
        assert_eq!(shard.rows(64), 15);
        let b = shard.batch(14, 2, 64).unwrap();
        let ids: Vec<i32> = b[0].to_vec().unwrap();
        assert_eq!(ids[..64], want[14 * 64..15 * 64]);
        assert_eq!(ids[64..], want[..64]);
        let positions: Vec<i32> = b[1].to_vec().unwrap();
        assert_eq!(positions[..3], [0, 1, 2]);
        assert_eq!(
            b[2].to_vec::<i32>().unwrap(),
            ids,
            "every token is predicted"
        );
    }
    let bytes = std::fs::read(data("shards/gpt2.bin")).unwrap();
    for (name, contents, needle) in [
        (
            "short.bin",
            bytes[..100].to_vec(),
            "shorter than the 1024-byte header",
        ),
        (
            "cut.bin",
            bytes[..bytes.len() - 2].to_vec(),
            "the header counts 1000 tokens",
        ),
        (
            "magic.bin",
            [&[1u8, 0, 0, 0][..], &bytes[4..]].concat(),
            "magic 1 version 1",
        ),
    ] {
        let path = write(name, "");
        std::fs::write(&path, contents).unwrap();
        let e = neuron_pc::data::TokenShard::open(&path)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(name) && e.contains(needle), "{e}");
        assert_eq!(e.lines().count(), 1);
    }
}
