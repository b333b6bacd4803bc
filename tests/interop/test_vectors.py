"""``lsr.interop.vectors``: what a pre-encoded vector path holds is decided in one place, for ``lsr run`` (its
torchrun job too) and ``lsr search`` alike: lsr folders, Anserini token queries, pyserini JSON documents (a file or
a folder of them)."""

from __future__ import annotations

import pytest

from lsr.interop.anserini import read_anserini_documents, write_anserini_queries, write_jsonl_vectors
from lsr.interop.vectors import is_vector_folder, read_doc_vectors, read_query_vectors, recorded_encoder
from lsr.storage.shards import write_vectors

TOY = "splade-samples/seismic-toy/documents.jsonl"


@pytest.fixture(scope="module")
def vocab(data_dir):
    return data_dir / "bert-base-uncased/vocab.txt"


@pytest.fixture(scope="module")
def docs(data_dir, vocab):
    return read_anserini_documents(data_dir / TOY, vocab)


def test_an_lsr_folder_is_read_with_its_recorded_encoder(tmp_path, docs):
    write_vectors(tmp_path / "vec", docs, metadata={"kind": "splade", "model": "m"})
    assert is_vector_folder(tmp_path / "vec") and not is_vector_folder(tmp_path)
    assert read_doc_vectors(tmp_path / "vec").equal(docs) and read_query_vectors(tmp_path / "vec").equal(docs)
    assert recorded_encoder(tmp_path / "vec") == {"kind": "splade", "model": "m"}


def test_pyserini_documents_as_a_file_or_a_folder_of_files(tmp_path, data_dir, docs, vocab):
    assert read_doc_vectors(data_dir / TOY, vocab).equal(docs)
    write_jsonl_vectors(docs[:7], tmp_path / "coll/part0.jsonl", vocab)
    write_jsonl_vectors(docs[7:], tmp_path / "coll/part1.jsonl.gz", vocab)
    assert not is_vector_folder(tmp_path / "coll") and recorded_encoder(tmp_path / "coll") is None
    assert read_doc_vectors(tmp_path / "coll", vocab).equal(docs)
    with pytest.raises(ValueError, match="read as pyserini JSON document vectors: give their vocabulary"):
        read_doc_vectors(tmp_path / "coll")


def test_anserini_queries_need_their_vocabulary_and_take_a_scale(tmp_path, docs, vocab):
    write_anserini_queries(docs[:3], tmp_path / "q.tsv", vocab, scale=100)
    default, scaled = read_query_vectors(tmp_path / "q.tsv", vocab), read_query_vectors(tmp_path / "q.tsv", vocab, 100)
    assert scaled.ids == docs.ids[:3] and float((scaled.to_dense() - docs[:3].to_dense()).abs().max()) <= 0.005 + 1e-6
    assert default.values.sum() * 10 == pytest.approx(scaled.values.sum())  # the Anserini default scale is 1000
    assert recorded_encoder(tmp_path / "q.tsv") is None
    with pytest.raises(ValueError, match=r"q.tsv is read as Anserini token queries: give their vocabulary"):
        read_query_vectors(tmp_path / "q.tsv")


def test_a_folder_that_holds_no_vectors_says_what_lsr_expects(tmp_path):
    (tmp_path / "empty").mkdir()
    for read in (read_doc_vectors, read_query_vectors):
        with pytest.raises(FileNotFoundError, match="not an lsr vector directory"):
            read(tmp_path / "empty")
