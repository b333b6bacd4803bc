from __future__ import annotations

import gzip
import json
import shutil
from collections import Counter

import numpy as np
import pytest

from lsr.data.sources import read_topics_tsv
from lsr.interop.anserini import (
    load_vocab,
    read_anserini_documents,
    read_anserini_queries,
    write_anserini_queries,
    write_jsonl_vectors,
)
from lsr.sparse import SparseVectors

ENCODED = "msmarco-passage/splade-encoded-queries"
TOY = "splade-samples/seismic-toy"


@pytest.fixture(scope="module")
def vocab_list(data_dir):
    return (data_dir / "bert-base-uncased/vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def dev_queries(data_dir):
    return read_anserini_queries(data_dir / ENCODED / "topics.msmarco-passage.dev-subset.splade-pp-ed.tsv.gz",
                                 data_dir / "bert-base-uncased/vocab.txt")


def _plain_counts(path):
    """Reference parse: Counter over str.split() per line."""
    out = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            qid, _, toks = line.rstrip("\n").partition("\t")
            out[qid] = Counter(toks.split())
    return out


@pytest.mark.slow
def test_dev_small_queries_load(dev_queries, data_dir):
    topics = read_topics_tsv(data_dir / "msmarco-passage/topics.msmarco-passage.dev-subset.txt")
    assert len(dev_queries) == 6980
    assert dev_queries.ids == list(topics)  # same qids, same order as the dev-small topics
    assert dev_queries.vocab_size == 30522
    assert int(dev_queries.lengths.min()) > 0
    assert 30 < dev_queries.nnz / len(dev_queries) < 60  # SPLADE++ queries: ~44 terms each


def test_counts_match_a_plain_parse(data_dir, vocab_list):
    path = data_dir / ENCODED / "topics.dl19-passage.splade-pp-ed.tsv.gz"
    vectors = read_anserini_queries(path, vocab_list, scale=None)
    expected = _plain_counts(path)
    assert vectors.ids == list(expected)
    term_id = {t: i for i, t in enumerate(vocab_list)}
    assert vectors.to_dicts(vocab_list) == [{t: float(c) for t, c in sorted(cnt.items(), key=lambda kv: term_id[kv[0]])}
                                            for cnt in expected.values()]
    scaled = read_anserini_queries(path, vocab_list)  # default scale 1000
    assert np.allclose(scaled.values.numpy(), vectors.values.numpy() / 1000, rtol=1e-6)


def test_weights_match_float_splade_vectors(dev_queries, data_dir, vocab_list):
    rows = dict(zip(dev_queries.ids, dev_queries.to_dicts(vocab_list)))
    lines = (data_dir / TOY / "queries.jsonl").read_text().splitlines()
    assert len(lines) == 5
    for line in lines:
        obj = json.loads(line)
        floats, ours = obj["vector"], rows[str(obj["id"])]
        assert set(ours) == set(floats)
        ratio = np.array([ours[t] / floats[t] for t in floats])
        big = np.array([floats[t] >= 0.1 for t in floats])
        assert abs(np.median(ratio) - 1) < 0.005
        assert np.all(np.abs(ratio[big] - 1) < 0.03)
        assert max(abs(ours[t] - floats[t]) for t in floats) < 0.005


def test_unknown_tokens(tmp_path, vocab_list):
    path = tmp_path / "q.tsv"
    path.write_text("7\tthe the zzzunknownzzz cat\n8\tdog\n")
    with pytest.raises(ValueError, match=r"q.tsv:1: token 'zzzunknownzzz' of '7'"):
        read_anserini_queries(path, vocab_list)
    v = read_anserini_queries(path, vocab_list, scale=2, unknown="drop")
    assert v.to_dicts(vocab_list) == [{"the": 1.0, "cat": 0.5}, {"dog": 0.5}]


def test_vocab_forms(tmp_path, data_dir, vocab_list):
    expected = {t: i for i, t in enumerate(vocab_list)}
    tok_dir = data_dir / "bert-base-uncased"
    assert load_vocab(tok_dir / "vocab.txt") == expected
    assert load_vocab(tok_dir) == expected
    assert load_vocab(vocab_list) == expected
    json_only = tmp_path / "tok"
    json_only.mkdir()
    shutil.copy(tok_dir / "tokenizer.json", json_only)
    assert load_vocab(json_only) == expected
    transformers = pytest.importorskip("transformers")
    assert load_vocab(transformers.AutoTokenizer.from_pretrained(str(tok_dir))) == expected
    with pytest.raises(ValueError, match="appears twice"):
        load_vocab(["a", "b", "a"])


def test_read_seismic_documents(data_dir, vocab_list):
    path = data_dir / TOY / "documents.jsonl"
    docs = read_anserini_documents(path, vocab_list)
    objs = [json.loads(line) for line in path.read_text().splitlines()]
    assert docs.ids == [str(o["id"]) for o in objs] and len(docs) == 20
    assert int(docs.lengths[18]) == 0  # passage 18 has an empty vector
    for row, obj in zip(docs.to_dicts(vocab_list), objs):
        assert row == {t: float(np.float32(w)) for t, w in obj["vector"].items()}


def test_jsonl_vectors_round_trip(tmp_path, data_dir, vocab_list):
    docs = read_anserini_documents(data_dir / TOY / "documents.jsonl", vocab_list)
    write_jsonl_vectors(docs, tmp_path / "docs.jsonl.gz", vocab_list, contents=[f"text {i}" for i in range(20)])
    with gzip.open(tmp_path / "docs.jsonl.gz", "rt") as f:
        first = json.loads(f.readline())
    assert set(first) == {"id", "contents", "vector"} and first["contents"] == "text 0"
    assert read_anserini_documents(tmp_path / "docs.jsonl.gz", vocab_list).equal(docs)
    # integer-quantized (Anserini -impact), read back through a folder of files
    (tmp_path / "coll").mkdir()
    write_jsonl_vectors(docs[:10], tmp_path / "coll/part0.jsonl", vocab_list, scale=100)
    write_jsonl_vectors(docs[10:], tmp_path / "coll/part1.jsonl", vocab_list, scale=100)
    line = json.loads((tmp_path / "coll/part0.jsonl").read_text().splitlines()[0])
    assert all(isinstance(w, int) and w > 0 for w in line["vector"].values())
    back = read_anserini_documents(tmp_path / "coll", vocab_list, scale=100)
    assert back.ids == docs.ids
    dense_diff = (back.to_dense() - docs.to_dense()).abs()
    assert float(dense_diff.max()) <= 0.005 + 1e-6  # rounding to 1/100, terms below 0.005 dropped


def test_anserini_queries_round_trip(tmp_path, data_dir, vocab_list):
    path = data_dir / ENCODED / "topics.dl20.splade-pp-ed.tsv.gz"
    queries = read_anserini_queries(path, vocab_list)
    write_anserini_queries(queries, tmp_path / "q.tsv.gz", vocab_list)
    assert _plain_counts(tmp_path / "q.tsv.gz") == _plain_counts(path)
    assert read_anserini_queries(tmp_path / "q.tsv.gz", vocab_list).equal(queries)


def test_chunked_reading_gives_the_same_vectors(data_dir, vocab_list):
    path = data_dir / ENCODED / "topics.dl19-passage.splade-pp-ed.tsv.gz"
    whole = read_anserini_queries(path, vocab_list)
    assert read_anserini_queries(path, vocab_list, chunk_rows=5).equal(whole)  # 43 queries -> 9 chunks
    with pytest.raises(ValueError, match="duplicate id '0'"):  # the same docs in two chunks
        read_anserini_documents([data_dir / TOY / "documents.jsonl"] * 2, vocab_list, chunk_rows=3)


def test_float_queries_quantize(tmp_path, vocab_list):
    v = SparseVectors.from_dicts([{"cat": 1.2345, "dog": 0.0004}], vocab=load_vocab(vocab_list), ids=["q1"])
    write_anserini_queries(v, tmp_path / "q.tsv", vocab_list, scale=100)
    assert (tmp_path / "q.tsv").read_text() == "q1\t" + " ".join(["cat"] * 123) + "\n"  # dog rounds to 0
