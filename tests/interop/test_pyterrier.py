"""lsr inside PyTerrier (no Java): pt.Experiment over lsr's indexer/retriever equals ``lsr run``."""

from __future__ import annotations

import pandas as pd
import pytest

from lsr.cli import main
from lsr.data.sources import load_dataset
from lsr.testing import write_scifact_slice
from tests.conftest import DATA, REPO

pt = pytest.importorskip("pyterrier")
lsr_pt = pytest.importorskip("lsr.interop.pyterrier")

METRICS = ["RR@10", "nDCG@10", "R@1000"]


def _frames(dataset_dir, split="test"):
    ds = load_dataset(str(dataset_dir), split)
    return pd.DataFrame(list(lsr_pt.get_corpus_iter(ds))), lsr_pt.get_topics(ds), lsr_pt.get_qrels(ds)


def _lsr_run(config, tmp_path, *overrides):
    import json

    out = tmp_path / "lsr-run"
    args = ["run", str(REPO / "configs" / config), "--set", f"output={out}", "--set", "device=cpu"]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 0
    return json.loads((out / "metrics.json").read_text())


def _experiment(retriever, topics, qrels):
    import ir_measures

    # strings would be read as trec_eval names: pass the ir_measures objects that lsr's names parse to
    res = pt.Experiment([retriever], topics, qrels, [ir_measures.parse_measure(m) for m in METRICS], names=["lsr"])
    return {m: float(res[m].iloc[0]) for m in METRICS}


@pytest.mark.slow
def test_bm25_experiment_equals_lsr_run(tmp_path):
    from lsr.encode.bm25.lexical import LexicalEncoder

    expected = _lsr_run("scifact-bm25.yaml", tmp_path)
    docs, topics, qrels = _frames(DATA / "scifact")
    encoder = LexicalEncoder(k1=0.9, b=0.4)
    index = lsr_pt.LsrIndex(tmp_path / "new" / "folder" / "pt-index")
    index.indexer(encoder, device="cpu").index(docs)  # fits the encoder on the documents
    retriever = index.retriever(encoder, k=1000, device="cpu")
    got = _experiment(retriever, topics, qrels)
    assert got == pytest.approx(expected["metrics"], abs=1e-12)
    res = retriever(topics.head(3))
    assert list(res.columns[:2]) == ["qid", "query"] and {"docno", "score", "rank"} <= set(res.columns)
    first = res[res.qid == topics.qid.iloc[0]]
    assert not pt.java.started()  # the whole path is Java-free
    assert first["rank"].tolist() == list(range(len(first))) and first.score.is_monotonic_decreasing
    with pytest.raises(FileExistsError, match="overwrite=True"):
        index.indexer(encoder).index(docs.head(2))


@pytest.mark.slow
def test_splade_experiment_equals_lsr_run_on_a_slice(tmp_path):
    model = DATA / "models" / "splade-tiny"
    write_scifact_slice(tmp_path / "scifact", DATA, n_queries=8, n_other=30)
    expected = _lsr_run("quickstart.yaml", tmp_path, f"data.dataset={tmp_path / 'scifact'}", f"encoder.model={model}")
    docs, topics, qrels = _frames(tmp_path / "scifact")
    index = lsr_pt.LsrIndex(tmp_path / "pt-index")
    index.indexer(str(model), device="cpu").index(iter(docs.to_dict("records")))
    retriever = index.retriever(str(model), k=1000, device="cpu")
    got = _experiment(retriever, topics, qrels)
    assert got == pytest.approx(expected["metrics"], abs=1e-12)
    assert got["nDCG@10"] > 0.3  # a trained model, not an empty result

    # pyt_splade-style columns: pre-encoded query_toks / toks give the same ranking
    encoder = retriever.encoder
    q_toks = lsr_pt.query_encoder(encoder)(topics)
    assert isinstance(q_toks.query_toks.iloc[0], dict) and q_toks.query_toks.iloc[0]
    pd.testing.assert_frame_equal(retriever(q_toks).drop(columns="query_toks"), retriever(topics))
    d_toks = lsr_pt.doc_encoder(encoder)(docs.head(12))
    toks_index = lsr_pt.LsrIndex(tmp_path / "toks-index")
    toks_index.indexer(encoder).index(d_toks)
    a = toks_index.retriever(encoder, k=5)(topics)
    b = lsr_pt.LsrIndex(tmp_path / "text-index").indexer(encoder).index(docs.head(12))
    b = lsr_pt.LsrIndex(b).retriever(encoder, k=5)(topics)
    pd.testing.assert_frame_equal(a, b)


def test_unfitted_bm25_retriever_says_what_to_do(tmp_path):
    from lsr.encode.bm25.lexical import LexicalEncoder
    from lsr.pyterrier import LsrIndex

    assert LsrIndex is lsr_pt.LsrIndex  # the short name of the interop module
    with pytest.raises(ValueError, match="not fitted"):
        lsr_pt.LsrIndex(tmp_path / "i").retriever(LexicalEncoder())


@pytest.mark.gpu
def test_gpu_retriever_equals_cpu_retriever(tmp_path):
    from lsr.encode.bm25.lexical import LexicalEncoder

    write_scifact_slice(tmp_path / "scifact", DATA, n_queries=20, n_other=200)
    docs, topics, _ = _frames(tmp_path / "scifact")
    encoder = LexicalEncoder()
    index = lsr_pt.LsrIndex(tmp_path / "index")
    index.indexer(encoder, device="cuda").index(docs)
    cpu = index.retriever(encoder, k=100, device="cpu")(topics)
    gpu = index.retriever(encoder, k=100, device="cuda")(topics)
    assert len(cpu) > 0
    pd.testing.assert_frame_equal(gpu, cpu)


@pytest.fixture(scope="module")
def tiny_pt_index(tmp_path_factory):
    """A fitted BM25 encoder and its index of four documents (written through the PyTerrier indexer)."""
    from lsr.encode.bm25.lexical import LexicalEncoder

    encoder = LexicalEncoder()
    docs = pd.DataFrame({"docno": ["d1", "d2", "d3", "d4"],
                         "text": ["cells divide", "protein folds", "cells fold proteins", "vitamin d"]})
    index = lsr_pt.LsrIndex(tmp_path_factory.mktemp("pt") / "index")
    index.indexer(encoder, device="cpu").index(docs)
    return index, encoder


@pytest.mark.parametrize("bad", [None, float("nan"), 42, pd.NA])
def test_a_query_that_is_not_text_is_named_by_qid_and_column(tiny_pt_index, bad):
    """astype(str) had searched for the text "None" / "nan" / "42" (or raised AttributeError on None)."""
    index, encoder = tiny_pt_index
    topics = pd.DataFrame({"qid": ["q1", "q2"], "query": ["cells", bad]}, dtype=object)
    with pytest.raises(ValueError, match=r"^the 'query' of qid 'q2' (is missing|is a int)") as e:
        index.retriever(encoder, k=2, device="cpu")(topics)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="the 'query' of qid 'q2'"):
        lsr_pt.query_encoder(encoder)(topics)
    good = index.retriever(encoder, k=2, device="cpu")(topics.head(1))   # the retriever still works
    assert good.docno.tolist()[0] in {"d1", "d3"}


def test_missing_qids_docnos_and_document_texts_are_refused(tiny_pt_index, tmp_path):
    index, encoder = tiny_pt_index
    with pytest.raises(ValueError, match=r"^a 'qid' is missing \(None / NaN\)"):
        index.retriever(encoder, k=2, device="cpu")(pd.DataFrame({"qid": [None], "query": ["cells"]}))
    docs = pd.DataFrame({"docno": ["d1", "d2"], "text": ["cells", None]})
    with pytest.raises(ValueError, match=r"^the 'text' of docno 'd2' is missing"):
        lsr_pt.LsrIndex(tmp_path / "a").indexer(encoder, device="cpu").index(docs)
    with pytest.raises(ValueError, match=r"^a 'docno' is missing"):
        lsr_pt.LsrIndex(tmp_path / "b").indexer(encoder, device="cpu").index([{"docno": None, "text": "x"}])
    with pytest.raises(ValueError, match=r"^the 'text' of docno 'd2' is missing"):
        lsr_pt.doc_encoder(encoder)(docs)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("kwargs,message", [
    ({"k": 0}, "k must be >= 1, got 0"), ({"k": -5}, "k must be >= 1, got -5"),
    ({"k": 2.5}, "k must be an integer >= 1, got 2.5"), ({"k": True}, "k must be an integer >= 1, got True"),
    ({"k": "10"}, "k must be an integer >= 1, got '10'"), ({"backend": "cuda"}, "backend must be one of auto, torch, gpu"),
    ({"device": "gpu"}, "device must be None or"),
])
def test_bad_retriever_arguments_are_refused_at_construction(tiny_pt_index, kwargs, message):
    index, encoder = tiny_pt_index
    with pytest.raises(ValueError, match=f"^{message}".replace("(", r"\(").replace(")", r"\)")):
        index.retriever(encoder, **kwargs)


def test_bad_indexer_and_encoder_arguments_are_refused_at_construction(tiny_pt_index, tmp_path):
    import numpy as np

    index, encoder = tiny_pt_index
    assert index.retriever(encoder, k=np.int64(3)).k == 3   # numpy's integers are integers
    with pytest.raises(ValueError, match=r"^block_size must be a power of two in \[1, 1048576\], got 3"):
        lsr_pt.LsrIndex(tmp_path / "i").indexer(encoder, block_size=3)
    with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got 0"):
        lsr_pt.LsrIndex(tmp_path / "i").indexer(encoder, batch_size=0)
    with pytest.raises(ValueError, match=r"^fields must be a non-empty list of column names, got 'text'"):
        lsr_pt.LsrIndex(tmp_path / "i").indexer(encoder, fields="text")
    with pytest.raises(ValueError, match=r"^batch_size must be >= 1, got -1"):
        lsr_pt.query_encoder(encoder, batch_size=-1)
