"""Tokenization in worker processes: the same ids as in-process tokenization, the same shards from
encode_corpus (also across a crash and resume), and refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from lsr.encode.splade.checkpoint import TextTokenizer
from lsr.encode.splade.encoder import SpladeEncoder
from lsr.encode.tokenize.pool import CHUNK, TokenizerPool, default_workers, token_arrays
from lsr.testing import save_tiny_mlm


@pytest.fixture(scope="module")
def texts(data_dir) -> list[str]:
    with open(data_dir / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    # more than two chunks, so the order of the workers' results matters; an empty text too
    out = [f"{r['title']} {r['text']}" for r in rows[: 2 * CHUNK + 100]]
    out[7] = ""
    return out


@pytest.mark.slow
def test_pool_matches_in_process_tokenization(data_dir, texts):
    from transformers import AutoTokenizer

    tok = TextTokenizer(AutoTokenizer.from_pretrained(data_dir / "bert-base-uncased"), 128)
    flat, lengths = tok(texts)
    assert flat.dtype == np.int32 and lengths.dtype == np.int64 and len(lengths) == len(texts)
    assert lengths.max() == 128 and lengths[7] == 2  # truncation on; [CLS] [SEP] for the empty text
    rust_flat, rust_lengths = token_arrays(tok._fast, texts)  # real text, some non-ASCII: the Rust ids exactly
    np.testing.assert_array_equal(lengths, rust_lengths)
    np.testing.assert_array_equal(flat, rust_flat)
    with tok.pool(2) as pool:
        got_flat, got_lengths = pool(texts)
        np.testing.assert_array_equal(got_lengths, lengths)
        np.testing.assert_array_equal(got_flat, flat)
        by_workers = pool.texts_by_workers
        assert by_workers == len(texts)
        helped_flat, helped_lengths = pool(texts, local=tok)  # the caller takes chunks too
        np.testing.assert_array_equal(helped_lengths, lengths)
        np.testing.assert_array_equal(helped_flat, flat)
        assert by_workers <= pool.texts_by_workers <= 2 * len(texts)
        empty_flat, empty_lengths = pool([])
        assert empty_flat.size == 0 and empty_lengths.size == 0
    with pytest.raises(ValueError, match="positive"):
        TokenizerPool("{}", 8, 0)
    assert default_workers() >= 0


def test_prepare_with_a_pool_and_kind_check(tmp_path, data_dir, texts):
    model = save_tiny_mlm("bert", tmp_path / "bert", data_dir)
    enc = SpladeEncoder.from_pretrained(model, device="cpu", max_length_doc=64, max_length_query=16)
    want = enc.prepare(texts[:300], "doc", batch_size=32)
    pool = enc.tokenizer_pool("doc", 2)
    try:
        got = enc.prepare(texts[:300], "doc", batch_size=32, pool=pool)
        with pytest.raises(ValueError, match="'doc' texts, not 'query'"):
            enc.prepare(texts[:3], "query", pool=pool)
    finally:
        pool.close()
    assert (got.n, got.n_tokens, got.n_slots) == (want.n, want.n_tokens, want.n_slots)
    for a, b in zip(got.batches, want.batches, strict=True):
        assert a.input_ids.equal(b.input_ids) and a.attention_mask.equal(b.attention_mask) and a.rows.equal(b.rows)


@pytest.mark.slow
def test_worker_errors_are_raised_not_lost(data_dir):
    from transformers import AutoTokenizer


    tok = TextTokenizer(AutoTokenizer.from_pretrained(data_dir / "bert-base-uncased"), 16)
    pool = tok.pool(1)
    try:
        with pytest.raises(TypeError, match="texts must be strings: sequence item 1"):
            pool(["a text", 2])  # refused before anything is sent
        with pytest.raises(RuntimeError, match="tokenizer worker: TypeError"):
            pool(["fine", "a lone surrogate \ud800"])  # Rust refuses it in the worker, which stays usable
        with pytest.raises(TypeError):
            tok(["a lone surrogate \ud800"])  # (as in this process)
        assert pool(["still serving"])[1].tolist() == [4]
        texts = [f"text number {i}" for i in range(9)]
        want = token_arrays(tok._fast, texts)
        pool.chunk = 2  # chunks of 2: the next chunk is in the worker's pipe when one fails
        for bad, error in (("\ud800", RuntimeError), (None, TypeError)):
            for at in (0, 3, 8):
                with pytest.raises(error):
                    pool(texts[:at] + [bad] + texts[at:])
                for got, ref in zip(pool(texts), want):  # the answers still owed were read: in step
                    np.testing.assert_array_equal(got, ref)
        pool._all[0].proc.kill()
        pool._all[0].proc.wait()
        with pytest.raises(RuntimeError, match="died"):
            pool(["after a crash"])
    finally:
        pool.close()
    with pytest.raises(RuntimeError, match="closed"):
        pool(["x"])
    with TokenizerPool("not a tokenizer", 16, 1) as broken, pytest.raises(RuntimeError, match="died"):
        broken(["the worker could not load its tokenizer"])


AWKWARD = ["", "x\x00y", "na\u00efve caf\u00e9 \u00c9COLE", "emoji \U0001F600\U0001F469\u200d\U0001F52C!", "\u4e2d\u6587 text",
           "\u2028\ufeff\U000E0001 tags", "e\u0301 combining", "\u05e9\u05dc\u05d5\u05dd rtl", "tab\tnew\nline\r",
           "ALL CAPS, punctuation... (brackets) [MASK] #hash", "word " * 400, "\u03a3\u03a3 sigma",
           "supercalifragilisticexpialidocious" * 20]


def test_awkward_texts_and_chunk_edges_match_in_process_ids(data_dir):
    from transformers import AutoTokenizer


    tok = TextTokenizer(AutoTokenizer.from_pretrained(data_dir / "bert-base-uncased"), 64)
    texts = AWKWARD * 4
    want_flat, want_lengths = token_arrays(tok._fast, texts)  # the Rust ids
    assert want_lengths[AWKWARD.index("word " * 400)] == 64  # truncated
    # chunks of 5 texts: every edge case lands at a chunk edge somewhere; pipes shrunk: messages larger than the
    # pipe go in parts
    with tok.pool(2, chunk=5, pipe_bytes=4096) as pool:
        for part in (texts, texts[:1], texts[:5], texts[:6], [AWKWARD[-1] * 300] * 12):  # (too big to go ahead)
            flat, lengths = pool(part)
            ref_flat, ref_lengths = (want_flat, want_lengths) if part is texts else token_arrays(tok._fast, part)
            np.testing.assert_array_equal(lengths, ref_lengths)
            np.testing.assert_array_equal(flat, ref_flat)
            assert flat.dtype == np.int32 and lengths.dtype == np.int64


def test_pipes_of_unknown_size_send_nothing_ahead(data_dir):
    from transformers import AutoTokenizer


    tok = TextTokenizer(AutoTokenizer.from_pretrained(data_dir / "bert-base-uncased"), 64)
    texts = AWKWARD * 2
    with tok.pool(2, chunk=3, pipe_bytes=None) as pool:  # pipes left alone (no F_SETPIPE_SZ / F_GETPIPE_SZ: macOS)
        assert all(w.capacity == 0 for w in pool._all)
        for got, want in zip(pool(texts), token_arrays(tok._fast, texts)):
            np.testing.assert_array_equal(got, want)
