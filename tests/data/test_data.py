from __future__ import annotations

import json
import re
import shutil
import sys
import time
from collections import Counter

import pytest

from lsr.data.sources import DatasetUnavailableError, load_dataset, read_beir_qrels, read_topics_tsv, read_trec_qrels


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No downloads, and an empty ir_datasets home: only shipped / local files can be used."""
    home = tmp_path / "irds_home"
    monkeypatch.setenv("LSR_OFFLINE", "1")
    monkeypatch.setenv("IR_DATASETS_HOME", str(home))
    return home


def _n_qrels(qrels):
    return sum(len(d) for d in qrels.values())


def test_beir_scifact_folder(data_dir):
    ds = load_dataset(str(data_dir / "scifact"))
    docs = list(ds.docs_iter())
    assert len(docs) == ds.n_docs == 5183
    assert len({d for d, _ in docs}) == 5183
    assert len(ds.queries) == 300 and _n_qrels(ds.qrels) == 339
    assert set(ds.queries) == set(ds.qrels)
    # text is title + " " + abstract, as in Pyserini's flat BEIR indexes
    raw = json.loads((data_dir / "scifact/corpus.jsonl").open().readline())
    assert docs[0] == (raw["_id"], f"{raw['title']} {raw['text']}".strip())
    # queries are the ones in the test qrels, texts as in queries.jsonl
    topics = read_topics_tsv(data_dir / "scifact/topics.beir-v1.0.0-scifact.test.tsv")
    assert ds.queries == topics


def test_beir_split_forms(data_dir):
    train = load_dataset(f"{data_dir / 'scifact'}:train")
    assert (len(train.queries), _n_qrels(train.qrels)) == (809, 919)
    assert load_dataset(str(data_dir / "scifact"), split="train").qrels == train.qrels
    with pytest.raises(FileNotFoundError, match=r"no dev.tsv; available splits: \['test', 'train'\]"):
        load_dataset(str(data_dir / "scifact"), split="dev")


def test_builtin_ids_resolve_offline(offline, data_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "ir_datasets", None)  # shipped files only: importing it would fail
    t0 = time.perf_counter()
    dev = load_dataset("msmarco-passage/dev/small")
    assert (len(dev.queries), _n_qrels(dev.qrels)) == (6980, 7437)
    assert dev.queries == read_topics_tsv(data_dir / "msmarco-passage/topics.msmarco-passage.dev-subset.txt")
    dl19 = load_dataset("msmarco-passage/trec-dl-2019/judged")
    assert len(dl19.queries) == 43 and _n_qrels(dl19.qrels) == 9260
    assert Counter(g for d in dl19.qrels.values() for g in d.values()) == {0: 5158, 1: 1601, 2: 1804, 3: 697}
    assert len(load_dataset("msmarco-passage/trec-dl-2020").queries) == 200
    dl20 = load_dataset("msmarco-passage", split="trec-dl-2020/judged")
    assert len(dl20.queries) == 54 and set(dl20.queries) == set(dl20.qrels)
    sci = load_dataset("beir/scifact/test")
    assert (len(sci.queries), _n_qrels(sci.qrels), sci.n_docs) == (300, 339, 5183)
    assert time.perf_counter() - t0 < 20


def test_msmarco_docs_missing_is_explained(offline):
    ds = load_dataset("msmarco-passage/dev/small")
    with pytest.raises(DatasetUnavailableError, match="docs for msmarco-passage need ir_datasets' collection "
                                                      "or a local collection.tsv"):
        next(ds.docs_iter())


def test_lsr_data_env_var(offline, monkeypatch, tmp_path, data_dir):
    root = tmp_path / "lsr_data" / "msmarco-passage"
    root.mkdir(parents=True)
    (root / "topics.dl19-passage.txt").write_text("1\tfirst query\n2\t second query \n3\tunjudged\n")
    (root / "qrels.dl19-passage.txt").write_text("1 Q0 p1 3\n2 Q0 p2 0\n")
    (root / "collection.tsv").write_text("p1\tpassage one\np2\tpassage two\n")
    monkeypatch.setenv("LSR_DATA", str(tmp_path / "lsr_data"))
    ds = load_dataset("msmarco-passage/trec-dl-2019/judged")
    assert ds.queries == {"1": "first query", "2": "second query"}
    assert ds.qrels == {"1": {"p1": 3}, "2": {"p2": 0}}
    assert list(ds.docs_iter()) == [("p1", "passage one"), ("p2", "passage two")]
    # dev/small is not in this data folder: ir_datasets is asked, which may not download
    with pytest.raises(DatasetUnavailableError):
        load_dataset("msmarco-passage/dev/small")


def test_unavailable_ir_datasets_id_fails_fast(offline):
    t0 = time.perf_counter()
    with pytest.raises(DatasetUnavailableError) as err:
        load_dataset("beir/nfcorpus/test")
    assert time.perf_counter() - t0 < 10
    msg = str(err.value)
    assert "downloads are disabled" in msg and "nfcorpus.zip" in msg
    assert re.search(r"place it at \S+nfcorpus", msg) and "IR_DATASETS_HOME" in msg and "local folder" in msg


def test_failed_download_is_explained(monkeypatch, tmp_path):
    pytest.importorskip("ir_datasets")
    monkeypatch.delenv("LSR_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setenv("IR_DATASETS_HOME", str(tmp_path))
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):  # a closed local port: no network
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    for var in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(DatasetUnavailableError,
                       match=r"(?s)the download failed: (Proxy|Connection)Error.*nfcorpus.zip"):
        load_dataset("beir/nfcorpus", split="test")
    with pytest.raises(DatasetUnavailableError, match="downloads are disabled"):
        load_dataset("beir/nfcorpus/test", download=False)


def test_unknown_specs(tmp_path):
    with pytest.raises(ValueError, match="neither an existing folder nor a known ir_datasets id"):
        load_dataset("no-such-collection/xyz")
    with pytest.raises(FileNotFoundError, match="not a dataset folder"):
        load_dataset(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="neither a BEIR folder"):
        load_dataset(str(tmp_path))


def test_tsv_folder(tmp_path):
    (tmp_path / "collection.tsv").write_bytes(b"d1\t first doc\r\nd2\tsecond doc\t\n\nd3\tcarriage\rreturn\n")
    (tmp_path / "queries.dev.tsv").write_text("q1\tquery one\nq2\tquery two\n")
    (tmp_path / "qrels.dev.tsv").write_text("q1\t0\td2\t1\n")
    ds = load_dataset(f"{tmp_path}:dev")
    assert ds.n_docs == 3
    assert list(ds.docs_iter()) == [("d1", "first doc"), ("d2", "second doc"), ("d3", "carriage\rreturn")]
    assert ds.queries == {"q1": "query one", "q2": "query two"}  # unjudged queries are kept
    assert ds.qrels == {"q1": {"d2": 1}}
    assert load_dataset(str(tmp_path), split="dev").queries == ds.queries
    with pytest.raises(FileNotFoundError, match="queries.tsv"):
        load_dataset(str(tmp_path))


def test_duplicates_raise(tmp_path, data_dir):
    (tmp_path / "t.tsv").write_text("1\ta\n2\tb\n1\tc\n")
    with pytest.raises(ValueError, match=r"t.tsv:3: duplicate query id '1'"):
        read_topics_tsv(tmp_path / "t.tsv")
    (tmp_path / "q.txt").write_text("1 0 d 1\n1 0 d 0\n")
    with pytest.raises(ValueError, match=r"q.txt:2: duplicate .*'d'"):
        read_trec_qrels(tmp_path / "q.txt")
    beir = tmp_path / "beir"
    shutil.copytree(data_dir / "scifact", beir, ignore=shutil.ignore_patterns("*.txt", "*.tsv", "train*"))
    shutil.copy(data_dir / "scifact/qrels/test.tsv", beir / "qrels/test.tsv")
    with (beir / "corpus.jsonl").open("a") as f:
        f.write(json.dumps({"_id": "4983", "title": "again", "text": "dup"}) + "\n")
    ds = load_dataset(str(beir))
    with pytest.raises(ValueError, match="duplicate doc id '4983'"):
        list(ds.docs_iter())


def test_qrels_readers(data_dir):
    beir = read_beir_qrels(data_dir / "scifact/qrels/test.tsv")
    trec = read_trec_qrels(data_dir / "scifact/qrels.beir-v1.0.0-scifact.test.txt")
    assert beir == trec and _n_qrels(beir) == 339
    dl20 = read_trec_qrels(data_dir / "msmarco-passage/qrels.dl20-passage.txt")
    assert len(dl20) == 54 and _n_qrels(dl20) == 11386
