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
