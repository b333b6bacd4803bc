"""Hostile CIFF files: every size, count, id and length a CIFF file states is checked before it is used.

Each file is built here, a few dozen bytes. ``lsr import-ciff`` must exit 1 with one line naming the file,
the record and the value, and write nothing (no output, no temporary folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lsr.cli import main

pytest.importorskip("google.protobuf")
ciff = pytest.importorskip("lsr.interop.ciff")


def _write(path: Path, lists=(), docs=None, *, tail: bytes = b"", **header) -> Path:
    """A CIFF file: ``lists`` of (term, [(docid gap, tf)], df or None), ``docs`` of (docid, collection
    docid) (default one record per doc id of the postings), header fields overriding the counts."""
    m = ciff.messages()
    if docs is None:
        docs = [(i, f"D{i}") for i in range(2)]
    header = {"version": 1, "num_postings_lists": len(lists), "num_doc_records": len(docs), **header}
    with open(path, "wb") as fh:
        ciff.write_delimited(fh, m["Header"](**header))
        for term, postings, df in lists:
            pl = m["PostingsList"](term=term, df=len(postings) if df is None else df, cf=sum(t for _, t in postings))
            for gap, tf in postings:
                pl.postings.add(docid=gap, tf=tf)
            ciff.write_delimited(fh, pl)
        for docid, name in docs:
            ciff.write_delimited(fh, m["DocRecord"](docid=docid, collection_docid=name, doclength=1))
        fh.write(tail)
    return path


def _lsr_description(vocab_size: int, scale: float = 1.0) -> str:
    return "lsr export; lsr=" + json.dumps({"scale": scale, "vocab_size": vocab_size, "metadata": {}})


def _refused(tmp_path: Path, capsys, path: Path, *wanted: str, extra: tuple[str, ...] = ()) -> str:
    """import-ciff exits 1 with one line holding the file and ``wanted``, and leaves tmp_path as it was."""
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["import-ciff", str(path), "--out", str(tmp_path / "out"), *extra]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"lsr import-ciff: error: CIFF file {path}: "), err
    for text in wanted:
        assert text in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written, no temporary left
    return err


@pytest.mark.parametrize("docid", [2, 10_000_000, 2_000_000_000])
def test_a_doc_id_beyond_the_header_is_refused_not_invented(tmp_path, capsys, docid):
    path = _write(tmp_path / "x.ciff", [("5", [(0, 1)], None), ("7", [(docid, 1)], None)])
    _refused(tmp_path, capsys, path, f"postings list 1 (term '7'): posting 0 names doc id {docid}",
             "num_doc_records is 2")


def test_a_doc_id_summed_past_the_header_is_refused(tmp_path, capsys):
    path = _write(tmp_path / "x.ciff", [("5", [(1, 1), (1, 2)], None)])  # doc ids 1, 2 of 0..1
    _refused(tmp_path, capsys, path, "postings list 0 (term '5'): posting 1 names doc id 2, not below 2")


def test_a_doc_id_beyond_the_header_is_refused_in_protobuf_layout(tmp_path, capsys):
    """The postings field first: the reader falls back to protobuf's parser and checks the same."""
    m = ciff.messages()
    pl = m["PostingsList"](term="5", df=1, cf=1)
    pl.postings.add(docid=10_000_000, tf=1)
    head = m["PostingsList"](term="5", df=1, cf=1).SerializeToString()
    data = pl.SerializeToString()
    path = tmp_path / "x.ciff"
    with open(path, "wb") as fh:
        ciff.write_delimited(fh, m["Header"](version=1, num_postings_lists=1, num_doc_records=1))
        ciff.write_delimited(fh, data[len(head):] + head)
        ciff.write_delimited(fh, m["DocRecord"](docid=0, collection_docid="D0", doclength=1))
    _refused(tmp_path, capsys, path, "postings list 0 (term '5'): posting 0 names doc id 10000000")


@pytest.mark.parametrize("postings, wanted", [
    ([(1, 1), (0, 1)], "posting 1 has doc id gap 0: doc ids must increase"),
    ([(-3, 1)], "posting 0 names doc id -3"),
    ([(0, 0)], "posting 0 has tf 0"),
    ([(0, -4)], "posting 0 has tf -4"),
])
def test_bad_postings_are_refused(tmp_path, capsys, postings, wanted):
    path = _write(tmp_path / "x.ciff", [("5", postings, None)])
    _refused(tmp_path, capsys, path, f"postings list 0 (term '5'): {wanted}")


def test_df_must_count_the_postings(tmp_path, capsys):
    path = _write(tmp_path / "x.ciff", [("5", [(0, 1)], None), ("6", [(0, 1)], 1000)])
    _refused(tmp_path, capsys, path, "postings list 1 (term '6'): df is 1000 but 1 postings follow")


@pytest.mark.parametrize("terms", [("7", "7"), ("7", "07")])
def test_a_term_in_two_postings_lists_is_refused_not_summed(tmp_path, capsys, terms):
    path = _write(tmp_path / "x.ciff", [(terms[0], [(0, 1)], None), ("9", [(1, 1)], None), (terms[1], [(1, 2)], None)])
    _refused(tmp_path, capsys, path, f"postings list 2 (term '{terms[1]}'): term id 7 already has postings list 0")


def test_a_term_in_two_postings_lists_is_refused_with_a_vocabulary(tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("alpha\nbeta\n")
    path = _write(tmp_path / "x.ciff", [("beta", [(0, 1)], None), ("beta", [(1, 1)], None)])
    _refused(tmp_path, capsys, path, "postings list 1 (term 'beta'): term id 1 already has postings list 0",
             extra=("--vocab", str(vocab)))


@pytest.mark.parametrize("term, description, wanted", [
    ("2000000000", "", "term id 2000000000 is not below 262144"),
    ("10", _lsr_description(10), "term id 10 is not below 10 (the vocab_size the lsr description records)"),
    ("3", _lsr_description(2_000_000_000), "header: vocab_size 2000000000 in the lsr description is not an integer"),
    ("x", "", "term 'x' is not a term id: pass the vocabulary"),
])
def test_a_term_id_beyond_the_vocabulary_is_refused(tmp_path, capsys, term, description, wanted):
    path = _write(tmp_path / "x.ciff", [(term, [(0, 1)], None)], description=description)
    _refused(tmp_path, capsys, path, wanted, extra=("--index", "--device", "cpu"))


def test_a_term_outside_the_given_vocabulary_names_the_file(tmp_path, capsys):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("alpha\nbeta\n")
    path = _write(tmp_path / "x.ciff", [("gamma", [(0, 1)], None)])
    _refused(tmp_path, capsys, path, "postings list 0: term 'gamma' is not in the vocabulary",
             extra=("--vocab", str(vocab)))


@pytest.mark.parametrize("length", [100 * 10**9, 2**63, 2**70 - 1])
def test_a_lying_length_prefix_is_refused_before_reading(tmp_path, capsys, length):
    prefix = bytearray()
    while length >= 0x80:
        prefix.append((length & 0x7F) | 0x80)
        length >>= 7
    prefix.append(length)
    path = _write(tmp_path / "x.ciff", docs=[], num_postings_lists=1, tail=bytes(prefix) + b"\x0a\x015")
    _refused(tmp_path, capsys, path, "postings list 0:", "length prefix")


@pytest.mark.parametrize("field, value, wanted", [
    ("num_postings_lists", -1, "header: num_postings_lists is -1, a count must be >= 0"),
    ("num_doc_records", -2, "header: num_doc_records is -2"),
    ("num_doc_records", 2_000_000_000, "num_doc_records 2000000000 messages cannot fit in the"),
    ("num_postings_lists", 1_000_000, "header: num_postings_lists 1000000"),
])
def test_header_counts_are_checked_against_the_file(tmp_path, capsys, field, value, wanted):
    path = _write(tmp_path / "x.ciff", [("5", [(0, 1)], None)], **{field: value})
    _refused(tmp_path, capsys, path, wanted)


def test_bytes_after_the_last_record_mean_wrong_counts(tmp_path, capsys):
    path = _write(tmp_path / "x.ciff", [("5", [(0, 1)], None)], tail=b"\x00\x00")
    _refused(tmp_path, capsys, path, "2 bytes follow the last doc record", "do not describe the whole file")


def test_a_postings_list_counted_as_a_doc_record_is_refused(tmp_path, capsys):
    """Too small a num_postings_lists: protobuf would parse the next list as a DocRecord without a word."""
    path = _write(tmp_path / "x.ciff", [("5", [(0, 1)], None), ("6", [(1, 1)], None)], num_postings_lists=1)
    _refused(tmp_path, capsys, path, "doc record 0 holds fields a CIFF DocRecord does not have",
             "num_postings_lists / num_doc_records")


@pytest.mark.parametrize("docs, wanted", [
    ([(0, "D0"), (0, "D1")], "doc record 1 ('D1'): docid 0 already has doc record 0, so docid 1 has none"),
    ([(0, "D0"), (5, "D1")], "doc record 1 ('D1'): docid 5 is outside 0..1"),
    ([(0, "D0"), (1, "D0")], "doc record 1: collection_docid 'D0' repeats doc record 0"),
    ([(0, "D0"), (1, "")], "doc record 1: collection_docid ''"),
])
def test_doc_records_cover_each_doc_id_once_with_a_usable_docno(tmp_path, capsys, docs, wanted):
    path = _write(tmp_path / "x.ciff", [("5", [(0, 1), (1, 1)], None)], docs)
    _refused(tmp_path, capsys, path, wanted)


@pytest.mark.parametrize("scale", [0, -1, "100"])
def test_the_recorded_scale_is_checked(tmp_path, capsys, scale):
    description = "lsr=" + json.dumps({"scale": scale, "vocab_size": 10, "metadata": {}})
    path = _write(tmp_path / "x.ciff", [("5", [(0, 1)], None)], description=description)
    _refused(tmp_path, capsys, path, f"the scale in the header's lsr description is {scale!r}")


def test_a_valid_file_still_reads(tmp_path, capsys):
    """The same builder with consistent values: read as before (the checks refuse only what is wrong)."""
    path = _write(tmp_path / "x.ciff", [("5", [(0, 2), (1, 1)], None), ("9", [(1, 3)], None)],
                  description=_lsr_description(12, scale=2.0))
    assert main(["import-ciff", str(path), "--out", str(tmp_path / "out")]) == 0
    vectors, info = ciff.read_ciff(path)
    assert vectors.ids == ["D0", "D1"] and vectors.vocab_size == 12 and info["scale"] == 2.0
    assert vectors.to_dicts([str(i) for i in range(12)]) == [{"5": 1.0}, {"5": 0.5, "9": 1.5}]
