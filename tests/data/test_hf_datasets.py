"""Hugging Face ``datasets`` sources: hf: ids, local Parquet / JSONL files with a column mapping, offline errors."""

from __future__ import annotations

import json

import pytest

from lsr.data.sources import DatasetUnavailableError, load_dataset
from lsr.testing import write_scifact_slice
from tests.conftest import DATA, REPO

pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("slice") / "scifact"
    write_scifact_slice(folder, DATA, n_queries=5, n_other=20)
    return folder


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_parquet_corpus_with_column_mapping_equals_the_beir_folder(beir, tmp_path):
    docs = _rows(beir / "corpus.jsonl")
    pq.write_table(pa.table({"docid": [d["_id"] for d in docs], "heading": [d["title"] for d in docs],
                             "body": [d["text"] for d in docs]}), tmp_path / "corpus.parquet", row_group_size=7)
    queries = _rows(beir / "queries.jsonl")
    pq.write_table(pa.table({"qid": [q["_id"] for q in queries], "question": [q["text"] for q in queries]}),
                   tmp_path / "queries.parquet")
    qrels = [line.split("\t") for line in (beir / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    pq.write_table(pa.table({"query-id": [r[0] for r in qrels], "corpus-id": [r[1] for r in qrels],
                             "score": [int(r[2]) for r in qrels]}), tmp_path / "qrels.parquet")
    spec = (f"{tmp_path / 'corpus.parquet'}?id=docid&title=heading&text=body&queries={tmp_path / 'queries.parquet'}"
            f"&query_id=qid&query_text=question&qrels={tmp_path / 'qrels.parquet'}")
    got, want = load_dataset(spec), load_dataset(str(beir), "test")
    assert list(got.docs_iter()) == list(want.docs_iter()) and len(list(want.docs_iter())) == len(docs)
    assert got.queries == want.queries and got.qrels == want.qrels and got.n_docs == len(docs)


def test_jsonl_corpus_and_tsv_qrels(beir, tmp_path):
    spec = f"{beir / 'corpus.jsonl'}?queries={beir / 'queries.jsonl'}&qrels={beir / 'qrels' / 'test.tsv'}"
    got, want = load_dataset(spec), load_dataset(str(beir), "test")
    assert list(got.docs_iter()) == list(want.docs_iter())
    assert got.queries == want.queries and got.qrels == want.qrels
    only_docs = load_dataset(str(beir / "corpus.jsonl"))
    assert only_docs.queries == {} and len(list(only_docs.docs_iter())) == len(list(want.docs_iter()))


def test_lsr_run_on_a_parquet_corpus_equals_the_folder(beir, tmp_path):
    from lsr.cli import main

    docs = _rows(beir / "corpus.jsonl")
    pq.write_table(pa.table({"_id": [d["_id"] for d in docs], "title": [d["title"] for d in docs],
                             "text": [d["text"] for d in docs]}), tmp_path / "c.parquet")
    spec = f"{tmp_path / 'c.parquet'}?queries={beir / 'queries.jsonl'}&qrels={beir / 'qrels' / 'test.tsv'}"
    metrics = []
    for name, dataset in (("a", spec), ("b", str(beir))):
        out = tmp_path / name
        assert main(["run", str(REPO / "configs" / "scifact-bm25.yaml"), "--set", f"data.dataset={dataset}", "--set", f"output={out}", "--set", "device=cpu",
                     "--json", str(out / "m.json")]) == 0
        metrics.append(json.loads((out / "m.json").read_text()))
    assert metrics[0] == metrics[1] and metrics[0]["nDCG@10"] > 0


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("table", ["corpus", "queries"])
def test_null_ids_are_refused_naming_the_file_and_row(beir, tmp_path, capsys, fmt, table):
    # str(None) once made every such row the document or query 'None', and metrics were computed on it
    docs, queries = _rows(beir / "corpus.jsonl"), _rows(beir / "queries.jsonl")
    rows = docs if table == "corpus" else queries
    rows[2]["_id"] = None
    paths = {}
    for name, data in (("corpus", docs), ("queries", queries)):
        paths[name] = tmp_path / f"{name}.{fmt}"
        if fmt == "parquet":
            pq.write_table(pa.Table.from_pylist(data), paths[name])
        else:
            paths[name].write_text("".join(json.dumps(r) + "\n" for r in data))
    spec = f"{paths['corpus']}?queries={paths['queries']}&qrels={beir / 'qrels' / 'test.tsv'}"
    with pytest.raises(ValueError, match=rf"{table}\.{fmt}( row 2|:3): the (doc|query) id is null"):
        ds = load_dataset(spec)
        list(ds.docs_iter())
    from lsr.cli import main

    out = tmp_path / "run"
    assert main(["run", str(REPO / "configs" / "scifact-bm25.yaml"), "--set", f"data.dataset={spec}",
                 "--set", f"output={out}", "--set", "device=cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert "id is null" in err and "\n" not in err
    assert not (out / "run.trec").exists()


def test_bad_specs_say_what_to_fix(beir, tmp_path):
    corpus = beir / "corpus.jsonl"
    with pytest.raises(ValueError, match="unknown option 'txt'"):
        load_dataset(f"{corpus}?txt=body")
    with pytest.raises(ValueError, match=r"no (column|field) 'body' .*\?text=COLUMN"):
        list(load_dataset(f"{corpus}?text=body").docs_iter())
    with pytest.raises(ValueError, match="expected hf:ORG/NAME"):
        load_dataset("hf:scifact")


def test_hf_spec_options_pick_configs_and_splits():
    from lsr.data.hf import parse_spec

    got = parse_spec("hf:mteb/scifact")
    corpus, queries, qrels = got.corpus, got.queries, got.qrels
    assert (corpus.repo, corpus.config, corpus.split) == ("mteb/scifact", "corpus", "corpus")
    assert (queries.repo, queries.config, queries.split) == ("mteb/scifact", "queries", "queries")
    assert (qrels.repo, qrels.config, qrels.split) == ("mteb/scifact", "default", "test") and not got.streaming
    got = parse_spec("hf:BeIR/scifact?qrels=BeIR/scifact-qrels&streaming=1&text=body&revision=v1", "train")
    assert (got.qrels.repo, got.qrels.config, got.qrels.split, got.qrels.revision) == ("BeIR/scifact-qrels", None,
                                                                                     "train", "v1")
    assert got.streaming and got.columns == {"text": "body"}
    got = parse_spec("hf:org/name?queries=none&qrels=none")
    assert (got.queries, got.qrels) == (None, None)


@pytest.mark.parametrize("how", ["download=False", "HF_HUB_OFFLINE", "LSR_OFFLINE"])
def test_offline_hub_dataset_is_one_line_saying_what_to_place_where(how, monkeypatch, tmp_path):
    kwargs = {"download": False} if how == "download=False" else {}
    if how != "download=False":
        monkeypatch.setenv(how, "1")
    with pytest.raises(DatasetUnavailableError) as e:
        load_dataset("hf:lsr-test-org/no-such-dataset", **kwargs)
    msg = str(e.value)
    assert "\n" not in msg and "hf:lsr-test-org/no-such-dataset:default@test is not in the local datasets cache" in msg
    assert "datasets.load_dataset('lsr-test-org/no-such-dataset', 'default', split='test')" in msg
    assert "corpus.parquet?queries=" in msg


@pytest.mark.parametrize("streaming", [False, True])
def test_hf_id_reads_the_mteb_layout(beir, monkeypatch, streaming):
    """The Hub is replaced by in-memory tables laid out as mteb/scifact publishes them."""
    import datasets

    docs, queries = _rows(beir / "corpus.jsonl"), _rows(beir / "queries.jsonl")
    qrels = [line.split("\t") for line in (beir / "qrels" / "test.tsv").read_text().splitlines()[1:]]
    tables = {
        ("corpus", "corpus"): {k: [d[k] for d in docs] for k in ("_id", "title", "text")},
        ("queries", "queries"): {k: [q[k] for q in queries] for k in ("_id", "text")},
        ("default", "test"): {"query-id": [r[0] for r in qrels], "corpus-id": [r[1] for r in qrels],
                              "score": [int(r[2]) for r in qrels]},
    }
    seen = []

    def fake_load(repo, config=None, split=None, streaming=False, revision=None):
        seen.append((repo, config, split, streaming))
        table = datasets.Dataset.from_dict(tables[(config, split)])
        return table.to_iterable_dataset() if streaming else table

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    got = load_dataset("hf:mteb/scifact" + ("?streaming=1" if streaming else ""), "test")
    want = load_dataset(str(beir), "test")
    assert got.queries == want.queries and got.qrels == want.qrels
    assert list(got.docs_iter()) == list(want.docs_iter())
    assert got.n_docs == (None if streaming else len(docs))
    assert ("mteb/scifact", "corpus", "corpus", streaming) in seen
    assert ("mteb/scifact", "default", "test", False) in seen  # queries and qrels are small: never streamed
