#!/usr/bin/env python3
"""The peer of train_llama's "tokenized and packed at N tokens/s" (scripts/bench data): Hugging
Face's Python `tokenizers` (Rust inside, `encode_batch` on every core) on the same JSON-lines
corpus and tokenizer.json, each document followed by the end token, then packed into rows with
position ids restarting per document and labels as train_llama's --document-masks (NumPy).
Prints one line: `tokens_per_s N`, the rows' tokens over the time from reading the file to
the last row.

  python scripts/reference/tokenize_pack.py TOKENIZER_DIR CORPUS.jsonl SEQ_LEN
"""
import json
import os
import sys
import time

import numpy as np
from tokenizers import Tokenizer


def main():
    directory, corpus, seq = sys.argv[1], sys.argv[2], int(sys.argv[3])
    tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json")) as f:
        eos = tokenizer.token_to_id(json.load(f)["eos_token"])
    start = time.perf_counter()
    with open(corpus) as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    docs = [e.ids + [eos] for e in tokenizer.encode_batch(texts)]
    ids = np.fromiter((t for d in docs for t in d), dtype=np.int32)
    # position within the document, restarting at each document and each row
    starts = np.zeros(len(ids), dtype=bool)
    starts[np.cumsum([0] + [len(d) for d in docs[:-1]])] = True
    rows = len(ids) // seq
    ids, starts = ids[: rows * seq], starts[: rows * seq]
    starts[::seq] = True
    index = np.arange(len(ids))
    positions = index - np.maximum.accumulate(np.where(starts, index, 0))
    labels = np.where(starts, -100, ids)
    elapsed = time.perf_counter() - start
    assert positions.shape == labels.shape == (rows * seq,)
    print(f"tokens_per_s {rows * seq / elapsed:.0f}")


if __name__ == "__main__":
    main()
