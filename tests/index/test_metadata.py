"""Metadata columns beside an index (lsr.index.metadata): JSONL (BOM, .gz) and Parquet corpora joined onto the
docnos, the refusals of bad files, the stamp that ties metadata.parquet to its index, and ``lsr index --metadata``
end to end (a SciFact slice, BM25 on CPU; a sharded index in global doc order)."""

from __future__ import annotations

import gzip
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lsr.cli import main
from lsr.index import InvertedIndex, ShardedIndex
from lsr.index.filter_expr import parse_filter
from lsr.index.metadata import index_docnos, load_metadata, metadata_from_corpus, save_metadata
from lsr.storage.shards import write_vectors
from lsr.testing import random_collection, write_scifact_slice

ROWS = [{"_id": "d2", "year": 2012, "lang": "de", "open": True, "score": 0.5, "title": "T2", "text": "two"},
        {"_id": "d0", "year": 2010, "lang": "en", "open": False, "score": 1.5, "title": "T0", "text": "zero"},
        {"_id": "other", "year": 1999, "lang": "fr", "open": True, "score": 2.0, "title": "T9", "text": "not indexed"},
        {"_id": "d1", "year": None, "lang": "en", "open": None, "score": None, "title": "T1", "text": "one"}]
DOCNOS = ["d0", "d1", "d2", "d3"]   # d3 is not in the file


def _jsonl(path, rows, bom=False):
    data = "\n".join(json.dumps(r) for r in rows).encode() + b"\n"
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes((b"\xef\xbb\xbf" if bom else b"") + data)
    return path


@pytest.mark.parametrize("name", ["bom.jsonl", "c.jsonl.gz", "c.parquet"])
def test_corpus_columns_join_onto_the_docnos(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    else:
        _jsonl(path, ROWS, bom=True)
    t = metadata_from_corpus(path, DOCNOS)
    assert t.column_names == ["year", "lang", "open", "score"]   # no id, no title / text
    assert t.column("year").to_pylist() == [2010, None, 2012, None]
    assert t.column("lang").to_pylist() == ["en", "en", "de", None]
    assert t.column("open").to_pylist() == [False, None, True, None]
    assert [t.schema.field(c).type for c in t.column_names] == [pa.int64(), pa.string(), pa.bool_(), pa.float64()]
    assert t.schema.metadata[b"lsr.missing"] == b"1"
    assert metadata_from_corpus(path, DOCNOS, ["title"]).column("title").to_pylist() == ["T0", "T1", "T2", None]


def test_integer_ids_and_dictionary_columns(tmp_path):
    _jsonl(tmp_path / "c.jsonl", [{"docno": 7, "n": 1}, {"docno": 8, "n": 2}])
    assert metadata_from_corpus(tmp_path / "c.jsonl", ["8", "7"]).column("n").to_pylist() == [2, 1]
    pq.write_table(pa.table({"id": ["a", "b"], "src": pa.array(["x", "y"]).dictionary_encode()}), tmp_path / "c.parquet")
    t = metadata_from_corpus(tmp_path / "c.parquet", ["b", "a"])
    assert t.schema.field("src").type == pa.string() and t.column("src").to_pylist() == ["y", "x"]


@pytest.mark.parametrize("rows, columns, message", [
    ([{"_id": "d0", "y": 1}, {"_id": "d0", "y": 2}], None, "id 'd0' appears more than once"),
    ([{"_id": "d0", "y": 1}], ["nope"], "has no column 'nope'; its columns are _id, y"),
    ([{"_id": "d0", "y": 1}, {"_id": "d1", "y": "x"}], None, "column 'y' mixes number and string values"),
    ([{"_id": "d0", "y": 1}, {"y": 2}], None, "row 2 has no '_id'"),
    ([{"_id": "zz", "y": 1}], None, "none of the index's 4 docnos (e.g. 'd0') is an id of this file"),
    ([{"_id": "d0", "text": "t"}], None, "no metadata columns besides the id and the text"),
    ([{"_id": "d0", "y": {"a": 1}}], ["y"], "column 'y' has type struct"),
    ([{"y": 1}], None, "no id column (one of _id, docno, docid, doc_id, id)"),
])
def test_bad_corpus_files_are_one_line_naming_the_file(tmp_path, rows, columns, message):
    path = _jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(ValueError) as e:
        metadata_from_corpus(path, DOCNOS, columns)
    assert message in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_missing_parquet_column_is_named(tmp_path):
    pq.write_table(pa.table({"_id": ["d0"], "y": [1]}), tmp_path / "c.parquet")
    with pytest.raises(ValueError, match="has no column 'lang'; its columns are _id, y"):
        metadata_from_corpus(tmp_path / "c.parquet", DOCNOS, ["y", "lang"])


@pytest.fixture
def index_dir(tmp_path):
    docs = random_collection(30, 40, seed=1)
    InvertedIndex.build(docs).save(tmp_path / "idx")
    return tmp_path / "idx"


def _meta_for(docnos, seed=0):
    rng = np.random.default_rng(seed)
    return pa.table({"year": rng.integers(2000, 2020, len(docnos)), "lang": rng.choice(["en", "de"], len(docnos))})


def test_save_and_load_round_trip(index_dir):
    docnos = index_docnos(index_dir)
    assert docnos == InvertedIndex.load(index_dir).docnos
    assert load_metadata(index_dir) is None
    table = _meta_for(docnos)
    target = save_metadata(index_dir, table)
    assert target == index_dir / "metadata.parquet"
    assert sorted(p.name for p in index_dir.iterdir() if p.name.startswith(".")) == []   # no temporary left
    back = load_metadata(index_dir, docnos)
    assert back.equals(table) and back.schema.metadata is None
    assert load_metadata(index_dir).equals(table)
    InvertedIndex.load(index_dir)   # the index still loads with the file beside it
    with pytest.raises(FileExistsError, match="metadata.parquet already exists; pass --overwrite"):
        save_metadata(index_dir, table)
    save_metadata(index_dir, _meta_for(docnos, seed=1), overwrite=True)
    assert load_metadata(index_dir, docnos).equals(_meta_for(docnos, seed=1))
    with pytest.raises(ValueError, match="29 rows, the index has 30 documents"):
        save_metadata(index_dir, table.slice(1), overwrite=True)


def test_the_stamp_catches_edited_and_foreign_files(index_dir, tmp_path):
    docnos = index_docnos(index_dir)
    save_metadata(index_dir, _meta_for(docnos))
    f = index_dir / "metadata.parquet"
    good = f.read_bytes()
    reattach = "re-attach it with `lsr index --metadata"

    table = pq.read_table(f)   # rows dropped, stamp kept (pyarrow keeps schema metadata)
    pq.write_table(table.slice(0, 20), f)
    with pytest.raises(ValueError, match="holds 20 rows, its stamp says 30") as e:
        load_metadata(index_dir)
    assert reattach in str(e.value) and str(f) in str(e.value)

    pq.write_table(table.replace_schema_metadata(None), f)   # saved by a tool that drops the stamp
    with pytest.raises(ValueError, match="has no lsr stamp"):
        load_metadata(index_dir)

    f.write_bytes(good[: len(good) // 2])   # truncated
    with pytest.raises(ValueError, match="cannot be read as Parquet") as e:
        load_metadata(index_dir)
    assert reattach in str(e.value) and "\n" not in str(e.value)

    other = tmp_path / "other"   # as many documents, other docnos: the file belongs to another index
    InvertedIndex.build(random_collection(30, 40, seed=2)).save(other)
    (other / "metadata.parquet").write_bytes(good)
    assert load_metadata(other) is not None   # the row count alone cannot tell
    with pytest.raises(ValueError, match="was made for other documents") as e:
        load_metadata(other, index_docnos(other))
    assert reattach in str(e.value)
    edited = list(docnos)
    edited[3] = "edited"
    f.write_bytes(good)
    with pytest.raises(ValueError, match="was made for other documents"):
        load_metadata(index_dir, edited)


def test_an_index_overwrite_replaces_its_metadata(index_dir):
    save_metadata(index_dir, _meta_for(index_docnos(index_dir)))
    InvertedIndex.build(random_collection(30, 40, seed=1)).save(index_dir, overwrite=True)   # metadata is ours
    assert load_metadata(index_dir) is None


def _scifact_index(tmp_path, data_dir, capsys):
    n_docs, _ = write_scifact_slice(tmp_path / "slice", data_dir)
    assert main(["encode", "--dataset", str(tmp_path / "slice"), "--out", str(tmp_path / "vec"), "--device", "cpu"]) == 0
    corpus = [json.loads(line) for line in (tmp_path / "slice" / "corpus.jsonl").read_text().splitlines()]
    rows = [{"_id": d["_id"], "n_words": len(d["text"].split()), "short": len(d["text"]) < 1200,
             "source": "even" if int(d["_id"]) % 2 == 0 else "odd"} for d in corpus[1:]]   # the first one missing
    _jsonl(tmp_path / "meta.jsonl", rows, bom=True)
    capsys.readouterr()
    return n_docs, corpus, rows


def test_lsr_index_metadata_end_to_end(tmp_path, data_dir, capsys):
    n_docs, corpus, rows = _scifact_index(tmp_path, data_dir, capsys)
    idx = tmp_path / "idx"
    assert main(["index", "--vectors", str(tmp_path / "vec"), "--out", str(idx), "--device", "cpu",
                 "--metadata", str(tmp_path / "meta.jsonl")]) == 0
    out = capsys.readouterr().out
    assert f"attached metadata columns n_words, short, source of {n_docs} documents (1 not in" in out
    docnos = InvertedIndex.load(idx).docnos
    table = load_metadata(idx, docnos)
    by_id = {r["_id"]: r for r in rows}
    assert table.column("n_words").to_pylist() == [by_id.get(d, {}).get("n_words") for d in docnos]
    mask = parse_filter("source == 'even' and n_words > 150").evaluate(table)
    want = [d in by_id and by_id[d]["source"] == "even" and by_id[d]["n_words"] > 150 for d in docnos]
    assert mask.tolist() == want and 0 < sum(want) < n_docs

    # attach to the existing index: SciFact's own corpus, the title column, asked for by name
    assert main(["index", "--out", str(idx), "--metadata", str(data_dir / "scifact" / "corpus.jsonl"),
                 "--metadata-columns", "title"]) == 1
    assert "metadata.parquet already exists; pass --overwrite" in capsys.readouterr().err
    assert main(["index", "--out", str(idx), "--metadata", str(data_dir / "scifact" / "corpus.jsonl"),
                 "--metadata-columns", "title", "--overwrite"]) == 0
    titles = {d["_id"]: d["title"] for d in corpus}
    assert load_metadata(idx, docnos).column("title").to_pylist() == [titles[d] for d in docnos]


def test_lsr_index_metadata_refusals_are_one_line(tmp_path, data_dir, capsys):
    _scifact_index(tmp_path, data_dir, capsys)
    vec, idx = str(tmp_path / "vec"), str(tmp_path / "idx")
    cases = [(["index", "--out", idx], 2, "--vectors is required"),
             (["index", "--vectors", vec, "--out", idx, "--metadata-columns", "a"], 2, "--metadata-columns needs"),
             (["index", "--out", idx, "--metadata", str(tmp_path / "meta.jsonl"), "--metadata-columns", "a,,b"], 2,
              "a comma-separated list"),
             (["index", "--out", idx, "--metadata", str(tmp_path / "meta.jsonl"), "--partitions", "2"], 2,
              "--partitions needs --vectors"),
             (["index", "--vectors", vec, "--out", idx, "--metadata", str(tmp_path / "nope.jsonl")], 1, "no such file"),
             (["index", "--vectors", vec, "--out", idx, "--metadata", str(tmp_path / "meta.jsonl"),
               "--metadata-columns", "year"], 1, "has no column 'year'")]
    for argv, rc, message in cases:
        assert main([*argv, "--device", "cpu"] if "--vectors" in argv else argv) == rc, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (argv, err)
    assert not (tmp_path / "idx").exists()   # a bad --metadata is refused before the index is written


def test_a_sharded_index_keeps_one_file_in_global_doc_order(tmp_path, capsys):
    docs = random_collection(25, 30, seed=4)
    ShardedIndex.build(docs, 3, tmp_path / "sh")
    rows = [{"docid": d, "pos": i} for i, d in enumerate(docs.ids)][::-1]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "m.parquet")
    assert main(["index", "--out", str(tmp_path / "sh"), "--metadata", str(tmp_path / "m.parquet")]) == 0
    assert index_docnos(tmp_path / "sh") == list(docs.ids) == ShardedIndex.load(tmp_path / "sh").docnos
    table = load_metadata(tmp_path / "sh", list(docs.ids))
    assert table.column("pos").to_pylist() == list(range(25))
    ShardedIndex.load(tmp_path / "sh")   # the extra file does not trouble the sharded index
    shutil.rmtree(tmp_path / "sh")
    write_vectors(tmp_path / "vec", docs)   # built with --partitions and --metadata in one command
    assert main(["index", "--vectors", str(tmp_path / "vec"), "--out", str(tmp_path / "sh"), "--partitions", "2",
                 "--device", "cpu", "--metadata", str(tmp_path / "m.parquet")]) == 0
    assert load_metadata(tmp_path / "sh", list(docs.ids)).column("pos").to_pylist() == list(range(25))


def test_lsr_search_filter_reads_the_attached_columns(tmp_path, data_dir, capsys):
    """``lsr search --filter EXPR`` on an index with metadata: the run holds only documents the expression allows,
    ranked as an unfiltered search of the same index ranks them; a bad expression is one usage line."""
    from lsr.data.runs import read_run

    n_docs, corpus, rows = _scifact_index(tmp_path, data_dir, capsys)
    idx = tmp_path / "idx"
    assert main(["index", "--vectors", str(tmp_path / "vec"), "--out", str(idx), "--device", "cpu",
                 "--metadata", str(tmp_path / "meta.jsonl")]) == 0
    base = ["search", "--index", str(idx), "--queries", str(tmp_path / "slice"), "--model",
            str(tmp_path / "vec" / "encoder"), "--device", "cpu", "--k", "20"]
    assert main([*base, "--out", str(tmp_path / "all.trec")]) == 0
    expr = "source == 'even' and n_words > 150"
    assert main([*base, "--filter", expr, "--out", str(tmp_path / "f.trec")]) == 0
    by_id = {r["_id"]: r for r in rows}
    allowed = {d for d, r in by_id.items() if r["source"] == "even" and r["n_words"] > 150}
    full, got = read_run(tmp_path / "all.trec"), read_run(tmp_path / "f.trec")
    assert got and all(set(hits) <= allowed for hits in got.values())
    for qid, hits in got.items():   # the allowed documents of the unfiltered top-20 come first, in its order
        seen = [d for d in full.get(qid, {}) if d in allowed]
        assert list(hits)[:len(seen)] == seen, qid
    capsys.readouterr()
    assert main([*base, "--filter", "year >> 3", "--out", str(tmp_path / "x.trec")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--filter: filter 'year >> 3': operator >> is not supported" in err
    assert main([*base, "--filter", "colour == 'red'", "--out", str(tmp_path / "x.trec")]) == 1
    assert "colour" in capsys.readouterr().err
