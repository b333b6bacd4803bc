"""CIFF export/import: protobuf wire format, gap encoding, round trips up to quantisation, CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lsr.cli import main
from lsr.sparse import SparseVectors
from lsr.testing import random_collection, write_scifact_slice
from tests.conftest import DATA, REPO

pytest.importorskip("google.protobuf")
ciff = pytest.importorskip("lsr.interop.ciff")


def _quantised(v: SparseVectors, scale: float) -> SparseVectors:
    """What a CIFF round trip may give back: round(w * scale) / scale, zeros dropped."""
    q = (np.rint(v.values.numpy().astype(np.float64) * scale) / scale).astype(np.float32)
    return SparseVectors.from_coo(v.row_ids(), v.indices, q, len(v), v.ids, v.vocab_size)


def _collection(seed: int) -> SparseVectors:
    v = random_collection(57, 301, seed, density=0.05)
    vals = v.values.clone()
    vals[::7] = 0.004  # rounds to 0 at scale 100: these postings must disappear
    return SparseVectors(v.indptr, v.indices, vals, v.ids, v.vocab_size)


@pytest.mark.parametrize("scale", [100.0, 7.5])
def test_round_trip_equals_the_quantised_vectors(tmp_path, scale):
    v = _collection(3)
    ciff.write_ciff(v, tmp_path / "a.ciff", scale=scale)  # no vocabulary: decimal term ids
    back, info = ciff.read_ciff(tmp_path / "a.ciff")
    assert info["scale"] == scale and back.equal(_quantised(v, scale))
    assert back.nnz < v.nnz or scale != 100.0
    words = [f"w{(i * 37) % 301:03d}x" for i in range(301)]  # term order in the file != id order
    ciff.write_ciff(v, tmp_path / "b.ciff", scale=scale, vocab=words)
    back, _ = ciff.read_ciff(tmp_path / "b.ciff", vocab=words)
    assert back.equal(_quantised(v, scale))
    with pytest.raises(FileExistsError, match="overwrite"):
        ciff.write_ciff(v, tmp_path / "b.ciff")


def _messages_of(path):
    m = ciff.messages()
    with open(path, "rb") as fh:
        header = ciff.read_delimited(fh, m["Header"], "header")
        lists = [ciff.read_delimited(fh, m["PostingsList"], "pl") for _ in range(header.num_postings_lists)]
        docs = [ciff.read_delimited(fh, m["DocRecord"], "doc") for _ in range(header.num_doc_records)]
        assert fh.read() == b""
    return header, lists, docs


def test_file_layout_is_ciff(tmp_path):
    m = ciff.messages()
    # wire bytes fixed by the CIFF .proto field numbers and types
    assert m["Posting"](docid=3, tf=5).SerializeToString() == b"\x08\x03\x10\x05"
    assert m["PostingsList"](term="a", df=1, cf=2).SerializeToString() == b"\x0a\x01a\x10\x01\x18\x02"
    assert m["DocRecord"](docid=1, collection_docid="d", doclength=4).SerializeToString() == b"\x08\x01\x12\x01d\x18\x04"
    v = _collection(5)
    words = [f"t{i}" for i in range(301)]
    ciff.write_ciff(v, tmp_path / "x.ciff", vocab=words, metadata={"kind": "test"})
    header, lists, docs = _messages_of(tmp_path / "x.ciff")
    q = _quantised(v, 100.0)
    assert header.version == 1 and header.num_doc_records == header.total_docs == 57
    assert header.num_postings_lists == int((torch.bincount(q.indices, minlength=301) > 0).sum())
    assert "round(weight * 100)" in header.description and '"scale": 100.0' in header.description
    assert [pl.term for pl in lists] == sorted(pl.term for pl in lists)
    dense = q.to_dense().numpy()
    for pl in lists:
        col = dense[:, words.index(pl.term)]
        true_docs = np.flatnonzero(col)
        raw = np.array([p.docid for p in pl.postings])
        assert (raw == np.diff(true_docs, prepend=0)).all()  # gap encoded
        assert [p.tf for p in pl.postings] == np.rint(col[true_docs] * 100).astype(int).tolist()
        assert pl.df == len(true_docs) and pl.cf == sum(p.tf for p in pl.postings)
    assert [d.collection_docid for d in docs] == v.ids and [d.docid for d in docs] == list(range(57))
    lengths = np.rint(dense * 100).sum(1).astype(int)
    assert [d.doclength for d in docs] == lengths.tolist() and header.total_terms_in_collection == lengths.sum()


def test_foreign_ciff_needs_a_vocabulary_and_keeps_term_frequencies(tmp_path):
    m = ciff.messages()
    path = tmp_path / "lucene.ciff"
    with open(path, "wb") as fh:
        ciff.write_delimited(fh, m["Header"](version=1, num_postings_lists=2, num_doc_records=3,
                                              description="Anserini export"))
        for term, gaps, tfs in (("zeta", [0, 2], [3, 1]), ("alpha", [1], [2])):
            pl = m["PostingsList"](term=term, df=len(gaps), cf=sum(tfs))
            for g, t in zip(gaps, tfs):
                pl.postings.add(docid=g, tf=t)
            data = pl.SerializeToString()
            if term == "alpha":  # the postings field first: valid protobuf, read by the fallback parser
                head = m["PostingsList"](term=term, df=1, cf=2).SerializeToString()
                data = data[len(head):] + head
            ciff.write_delimited(fh, data)
        for i, name in enumerate(["D0", "D1", "D2"]):
            ciff.write_delimited(fh, m["DocRecord"](docid=i, collection_docid=name, doclength=1))
    with pytest.raises(ValueError, match="pass the vocabulary"):
        ciff.read_ciff(path)
    vec, info = ciff.read_ciff(path, vocab=["alpha", "beta", "zeta"])
    assert info["scale"] == 1.0 and vec.ids == ["D0", "D1", "D2"] and vec.vocab_size == 3
    assert vec.to_dense().tolist() == [[0, 0, 3], [2, 0, 0], [0, 0, 1]]
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ValueError, match="truncated|ends"):
        ciff.read_ciff(path, vocab=["alpha", "beta", "zeta"])


def test_cli_round_trip_searches_like_the_quantised_index(tmp_path, capsys):
    from lsr.data.sources import load_dataset
    from lsr.encode.bm25.lexical import LexicalEncoder
    from lsr.index.inverted import InvertedIndex
    from lsr.search.searcher import Searcher

    write_scifact_slice(tmp_path / "scifact", DATA, n_queries=10, n_other=60)
    run = tmp_path / "run"
    assert main(["run", str(REPO / "configs" / "scifact-bm25.yaml"), "--set", f"data.dataset={tmp_path / 'scifact'}",
                 "--set", f"output={run}", "--set", "device=cpu"]) == 0
    out = tmp_path / "bm25.ciff"
    assert main(["export-ciff", str(run / "index"), "--out", str(out), "--vocab", str(run / "encoder")]) == 0
    assert main(["export-ciff", str(run / "index"), "--out", str(out)]) == 1  # never overwrites unasked
    assert "exists" in capsys.readouterr().err
    assert main(["import-ciff", str(out), "--out", str(tmp_path / "idx"), "--index",
                 "--vocab", str(run / "encoder"), "--device", "cpu"]) == 0
    assert main(["import-ciff", str(out), "--out", str(tmp_path / "vec"), "--vocab", str(run / "encoder")]) == 0

    original = InvertedIndex.load(run / "index")
    quantised = InvertedIndex.build(_quantised(original.docs, 100.0), device="cpu", metadata=original.metadata)
    imported = InvertedIndex.load(tmp_path / "idx")
    assert imported.docnos == original.docnos and imported.metadata == original.metadata
    encoder = LexicalEncoder.load(run / "encoder")
    ds = load_dataset(str(tmp_path / "scifact"), "test")
    queries = encoder.encode_query(list(ds.queries.values()), ids=list(ds.queries))
    want = Searcher(quantised, device="cpu").search(queries, k=50, query_metadata=encoder.describe())
    got = Searcher(imported, device="cpu").search(queries, k=50, query_metadata=encoder.describe())
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and (want[1][:, 0] >= 0).all()
    from lsr.storage.shards import read_manifest, read_vectors

    assert read_vectors(tmp_path / "vec").equal(quantised.docs)
    assert json.loads(json.dumps(read_manifest(tmp_path / "vec")["metadata"])) == original.metadata


@pytest.mark.parametrize("seed", [0, 1])
def test_bulk_postings_coding_equals_protobuf(seed):
    from lsr.interop.ciff_postings import decode_postings, encode_postings, split_postings_field

    m = ciff.messages()
    rng = np.random.default_rng(seed)
    n = 300
    big = rng.integers(0, 2**31 - 1, n)  # every varint length, 1 to 5 bytes
    gaps = np.where(rng.random(n) < 0.5, rng.integers(0, 200, n), big)
    gaps[0] = 0  # docid 0: proto3 omits the field
    tfs = np.where(rng.random(n) < 0.3, big[::-1], rng.integers(0, 3, n))  # tf 0 is omitted too
    pl = m["PostingsList"](term="t\u00e9rm", df=n, cf=int(tfs.sum()))
    for g, t in zip(gaps.tolist(), tfs.tolist()):
        pl.postings.add(docid=g, tf=t)
    want = pl.SerializeToString()
    head = m["PostingsList"](term="t\u00e9rm", df=n, cf=int(tfs.sum())).SerializeToString()
    buf, offsets = encode_postings(gaps, tfs)
    assert head + buf.tobytes() == want and offsets[-1] == buf.size
    start, end = split_postings_field(want)
    assert (start, end) == (len(head), len(want))
    # three lists in one buffer (postings 0..99, none, 100..299), as the reader batches them
    regions = np.r_[0, offsets[100], offsets[100]]
    gaps_got, tfs_got, counts = decode_postings(buf, regions)
    assert (gaps_got == gaps).all() and (tfs_got == tfs).all() and counts.tolist() == [100, 0, 200]
    assert decode_postings(buf[:-1], np.zeros(1, np.int64)) is None  # cut inside a varint
    assert decode_postings(buf, np.r_[0, offsets[100] + 1]) is None  # a region starting mid-entry
    tail = np.frombuffer(head, np.uint8)
    assert decode_postings(np.r_[buf, tail], np.zeros(1, np.int64)) is None  # other fields after


def test_splade_vectors_export_with_the_model_vocabulary(tmp_path):
    pytest.importorskip("transformers")
    from lsr.encode.splade.encoder import SpladeEncoder

    model = DATA / "models" / "splade-tiny"
    enc = SpladeEncoder.from_pretrained(model, device="cpu")
    docs = enc.encode_document(["The capital of France is Paris.", "Cells divide by mitosis."], ids=["a", "b"])
    ciff.write_ciff(docs, tmp_path / "s.ciff", metadata=enc.describe())  # tokens from the model folder
    _, lists, _ = _messages_of(tmp_path / "s.ciff")
    terms = {pl.term for pl in lists}
    assert {"paris", "france", "cells"} <= terms and not any(t.isdigit() for t in terms)
    back, info = ciff.read_ciff(tmp_path / "s.ciff", vocab=model)
    assert back.equal(_quantised(docs, 100.0)) and info["metadata"] == enc.describe()
