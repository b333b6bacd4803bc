"""Hostile data files and dataset specs: each is refused with one line naming the file, the line or row and the
field, instead of being converted, read as empty, glued into a text or raised as a TypeError / AttributeError."""

from __future__ import annotations

import json

import pytest

from lsr.cli import main
from lsr.data.sources import load_dataset
from lsr.interop.anserini import read_anserini_documents
from tests.conftest import REPO

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

GOOD = {"_id": "d1", "title": "", "text": "apple pie"}
# (row 2 of the file, the field the error names, what it says about it)
BAD_ROWS = [
    ({"_id": "d2", "title": "", "text": 7}, "text", "a number 7"),
    ({"_id": "d2", "title": ""}, "text", "text"),
    ({"_id": "d2", "title": "", "text": None}, "text", "missing or null"),
    ({"_id": "d2", "title": "", "text": ["apple"]}, "text", "a JSON array"),
    ({"_id": "d2", "title": 3, "text": "pie"}, "title", "a number 3"),
]


def _one_line_error(call) -> str:
    with pytest.raises(ValueError) as e:
        call()
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def _docs(spec):
    return lambda: list(load_dataset(spec).docs_iter())


@pytest.mark.parametrize("row, field, said", BAD_ROWS)
def test_jsonl_rows_with_a_missing_or_non_string_text_are_refused_naming_file_line_and_field(tmp_path, row, field,
                                                                                              said):
    lines = json.dumps(GOOD) + "\n" + json.dumps(row) + "\n"
    (tmp_path / "corpus.jsonl").write_text(lines)
    msg = _one_line_error(_docs(str(tmp_path / "corpus.jsonl")))    # a Parquet / JSONL spec
    assert "corpus.jsonl:2: " in msg and field in msg and said in msg
    beir = tmp_path / "beir"
    beir.mkdir()
    (beir / "corpus.jsonl").write_text(lines)
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "pie"}\n')
    msg = _one_line_error(_docs(str(beir)))                          # a BEIR folder
    assert "corpus.jsonl:2: " in msg and field in msg and said in msg


def test_an_explicitly_empty_text_is_still_a_document(tmp_path):
    rows = [GOOD, {"_id": "d2", "title": "", "text": ""}, {"_id": "d3", "text": "no title"}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert list(load_dataset(str(tmp_path / "c.jsonl")).docs_iter()) == [("d1", "apple pie"), ("d2", ""),
                                                                          ("d3", "no title")]


def test_a_json_array_file_is_read_and_its_rows_named(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps([GOOD, {"_id": "d2", "text": "b"}]))
    assert list(load_dataset(str(path)).docs_iter()) == [("d1", "apple pie"), ("d2", "b")]
    path.write_text(json.dumps([GOOD, {"_id": "d2", "text": 2}]))
    assert "c.json row 1: the text ('text') field is a number 2" in _one_line_error(_docs(str(path)))


@pytest.mark.parametrize("column, values, said", [
    ("text", [1, 2], "row 0: the text ('text') field is a number 1"),
    ("text", ["a", None], "row 1: the text ('text') field is missing or null"),
    ("_id", [1.0, float("nan")], "row 0: the doc id must be a string or an integer, got float 1.0"),
])
def test_parquet_columns_of_the_wrong_type_are_refused_naming_the_row(tmp_path, column, values, said):
    table = {"_id": ["d1", "d2"], "text": ["a", "b"], column: values}
    pq.write_table(pa.table(table), tmp_path / "c.parquet")
    msg = _one_line_error(_docs(str(tmp_path / "c.parquet")))
    assert f"c.parquet {said}" in msg


def test_parquet_queries_and_qrels_tables_are_checked_too(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps(GOOD) + "\n")
    pq.write_table(pa.table({"_id": ["q1"], "text": [5]}), tmp_path / "q.parquet")
    msg = _one_line_error(lambda: load_dataset(f"{tmp_path / 'c.jsonl'}?queries={tmp_path / 'q.parquet'}"))
    assert "q.parquet row 0: the query text ('text') field is a number 5" in msg
    pq.write_table(pa.table({"query-id": ["q1", None], "corpus-id": ["d1", "d1"], "score": [1, 1]}),
                   tmp_path / "qrels.parquet")
    msg = _one_line_error(lambda: load_dataset(f"{tmp_path / 'c.jsonl'}?qrels={tmp_path / 'qrels.parquet'}"))
    assert "qrels.parquet row 1: the query id is null" in msg    # not the query 'None'
    pq.write_table(pa.table({"query-id": ["q1"], "corpus-id": ["d1"], "score": [0.5]}), tmp_path / "qrels.parquet")
    msg = _one_line_error(lambda: load_dataset(f"{tmp_path / 'c.jsonl'}?qrels={tmp_path / 'qrels.parquet'}"))
    assert "qrels.parquet row 0: the relevance grade must be an integer, got 0.5" in msg


@pytest.mark.parametrize("line, said", [('{"_id": "d2", "te', "invalid JSON"), ("[1, 2]", "expected a JSON object")])
def test_a_malformed_jsonl_line_is_named_by_file_and_line(tmp_path, line, said):
    (tmp_path / "c.jsonl").write_text("\n".join([json.dumps(GOOD), "", json.dumps({**GOOD, "_id": "d3"}), line]))
    assert f"c.jsonl:4: {said}" in _one_line_error(_docs(str(tmp_path / "c.jsonl")))
    (tmp_path / "q.jsonl").write_text('{"_id": "q1", "text": "pie"}\n' + line + "\n")
    spec = f"{tmp_path / 'c.jsonl'}?queries={tmp_path / 'q.jsonl'}"
    assert f"q.jsonl:2: {said}" in _one_line_error(lambda: load_dataset(spec))


@pytest.mark.parametrize("name", ["collection.tsv", "queries.tsv"])
def test_a_tsv_row_with_an_extra_column_is_refused_not_glued_into_the_text(tmp_path, name):
    files = {"collection.tsv": "d1\tapple pie\n", "queries.tsv": "q1\tpie\n"}
    files[name] += "x2\tsome text\tstray column\n"
    for file, text in files.items():
        (tmp_path / file).write_text(text)
    msg = _one_line_error(_docs(str(tmp_path)))
    assert f"{name}:2: expected " in msg and "got 3 tab-separated columns" in msg


@pytest.mark.parametrize("spec, said", [
    ("hf:", "expected hf:ORG/NAME"),
    ("irds:", "has nothing after 'irds:'"),
    ("irds:beir/scifact/test", "ir_datasets ids take no prefix: use 'beir/scifact/test'"),
    ("hf:name?bad", "options after '?' are key=value pairs"),
    ("hf:org/name?bad", "options after '?' are key=value pairs"),
])
def test_malformed_dataset_specs_get_a_one_line_hint(tmp_path, capsys, spec, said):
    assert said in _one_line_error(lambda: load_dataset(spec, download=False))
    out = tmp_path / "run"
    assert main(["run", str(REPO / "configs" / "scifact-bm25.yaml"), "--set", f"data.dataset={spec}",
                 "--set", f"output={out}", "--set", "device=cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert said in err and "\n" not in err and "Error" not in err


@pytest.mark.parametrize("line, said", [
    ('{"id": "d1", "vector": [1, 2]}', "'vector' must be a JSON object {token: weight}, got a JSON array"),
    ('{"id": "d1", "vector": "pie"}', "'vector' must be a JSON object"),
    ('[1, 2]', "expected an Anserini vector line"),
    ('{"id": null, "vector": {"pie": 1}}', "'id' must be a string or an integer, got null"),
    ('{"id": "d1", "vector": {"pie": true}}', "the weight of 'pie' in 'd1' must be a number"),
    ('{"id": "d1", "vector": {"pie": NaN}}', "the weight of 'pie' in 'd1' is nan"),
])
def test_anserini_vectors_of_the_wrong_json_type_are_named_by_file_and_line(tmp_path, line, said):
    path = tmp_path / "v.jsonl"
    path.write_text('{"id": "d0", "vector": {"apple": 2}}\n' + line + "\n")
    msg = _one_line_error(lambda: read_anserini_documents(path, ["[PAD]", "apple", "pie"]))
    assert msg.startswith(f"{path}:2: ") and said in msg


def test_lsr_index_on_a_json_file_says_what_it_expects_and_how_to_index_it(tmp_path, capsys):
    path = tmp_path / "v.jsonl"
    path.write_text('{"id": "d0", "vector": {"apple": 2}}\n')
    assert main(["index", "--vectors", str(path), "--out", str(tmp_path / "idx"), "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert "expects a vector folder written by lsr encode" in err and "inputs.doc_vectors" in err
    assert "corrupt" not in err and "\n" not in err and not (tmp_path / "idx").exists()


def _tsv_folder(folder, collection: str, queries: str = "q1\tapple\n"):
    folder.mkdir()
    (folder / "collection.tsv").write_text(collection)
    (folder / "queries.tsv").write_text(queries)
    return folder


@pytest.mark.parametrize("header", ["id\ttext", "docid\ttext", "_id\ttext", "pid\tpassage", "DOCNO\tcontents"])
def test_a_tsv_collection_header_row_is_skipped_not_indexed(tmp_path, caplog, capsys, header):
    """Column names in the first row of a TSV collection (and of its topics) are not a document (or a query); the
    document count excludes it too: a distributed encoding cuts its units from that count."""
    folder = _tsv_folder(tmp_path / "tsv", f"{header}\nd1\tapple pie\nd2\tbanana split\n", "qid\tquery\nq1\tapple\n")
    with caplog.at_level("INFO", logger="lsr.data.readers"):
        ds = load_dataset(str(folder))
        assert list(ds.docs_iter()) == [("d1", "apple pie"), ("d2", "banana split")]
    assert ds.n_docs == 2 and ds.queries == {"q1": "apple"}
    assert "collection.tsv:1: skipping the header row" in caplog.text and "queries.tsv:1" in caplog.text
    (tmp_path / "v" / ".lsr-encode").mkdir(parents=True)   # the units of an unfinished distributed encoding
    assert main(["encode", "--dataset", str(folder), "--out", str(tmp_path / "v"), "--device", "cpu"]) == 0
    assert json.loads((tmp_path / "v" / "manifest.json").read_text())["n_rows"] == 2


@pytest.mark.parametrize("first", ["id\tapple pie", "d0\ttext", "doc\ttext", "id7\tpassage"])
def test_a_first_tsv_row_that_is_not_column_names_stays_a_document(tmp_path, first):
    ds = load_dataset(str(_tsv_folder(tmp_path / "tsv", f"{first}\nd1\tapple pie\n")))
    assert list(ds.docs_iter())[0] == tuple(first.split("\t")) and ds.n_docs == 2
