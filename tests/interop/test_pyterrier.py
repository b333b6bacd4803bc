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


def _searched(index, encoder, texts, k, flt):
    """Searcher.search of the tiny index with ``flt``: per query the (docno, float64 score) hits, best first."""
    import numpy as np

    from lsr.index.inverted import InvertedIndex
    from lsr.search.searcher import Searcher

    idx = InvertedIndex.load(index.path, device="cpu")
    scores, doc_idx = Searcher(idx, device="cpu").search(encoder.encode_query(texts), k=k, filter=flt)
    return [[(idx.docnos[d], float(np.float32(s))) for s, d in zip(row_s, row_d) if d >= 0]
            for row_s, row_d in zip(scores.numpy(), doc_idx.numpy())]


def _hits(res, qid):
    rows = res[res.qid == qid]
    assert rows["rank"].tolist() == list(range(len(rows)))
    return list(zip(rows.docno.tolist(), rows.score.tolist()))


def test_a_retriever_filter_and_a_filter_column_equal_searcher_search(tiny_pt_index):
    import numpy as np

    from lsr.search.filters import DocFilter

    index, encoder = tiny_pt_index
    texts = ["cells proteins", "cells fold", "vitamin cells"]
    topics = pd.DataFrame({"qid": ["q1", "q2", "q3"], "query": texts})
    plain = index.retriever(encoder, k=4, device="cpu")(topics)
    # one filter for every query: a DocFilter or a boolean mask over the documents
    deny = DocFilter.deny(["d3"])
    res = index.retriever(encoder, k=4, device="cpu", filter=deny)(topics)
    want = _searched(index, encoder, texts, 4, deny)
    assert [_hits(res, q) for q in ("q1", "q2", "q3")] == want
    assert "d3" not in set(res.docno) and "d3" in set(plain.docno)
    mask = np.array([True, False, True, False])   # d1, d3
    masked = index.retriever(encoder, k=4, device="cpu", filter=mask)(topics)
    assert set(masked.docno) <= {"d1", "d3"}
    assert [_hits(masked, q) for q in ("q1", "q2", "q3")] == _searched(index, encoder, texts, 4, DocFilter.mask(mask))
    # a filter column: one per query (None / NaN: unfiltered), the same DocFilter twice
    only = DocFilter.allow(["d2", "d4"])
    column = topics.assign(filter=[only, None, only])
    res = index.retriever(encoder, k=4, device="cpu")(column)
    assert [_hits(res, q) for q in ("q1", "q2", "q3")] == _searched(index, encoder, texts, 4, [only, None, only])
    assert set(res[res.qid != "q2"].docno) <= {"d2", "d4"} and _hits(res, "q2") == _hits(plain, "q2")
    nan = topics.assign(filter=[float("nan"), only, pd.NA])
    res = index.retriever(encoder, k=4, device="cpu", filter=deny)(nan)   # both: a document passes both
    assert [_hits(res, q) for q in ("q1", "q2", "q3")] == _searched(index, encoder, texts, 4,
                                                                    [deny, deny & only, deny])


def test_bad_retriever_filters_are_one_line_errors(tiny_pt_index):
    from lsr.search.filters import DocFilter

    index, encoder = tiny_pt_index
    with pytest.raises(ValueError, match=r"^filter is a int; give a DocFilter"):
        index.retriever(encoder, k=2, device="cpu", filter=3)
    topics = pd.DataFrame({"qid": ["q1", "q2"], "query": ["cells", "vitamin"], "filter": [None, 7]}, dtype=object)
    with pytest.raises(ValueError, match=r"^the 'filter' of qid 'q2' is a int; give a DocFilter"):
        index.retriever(encoder, k=2, device="cpu")(topics)
    unknown = topics.assign(filter=[DocFilter.allow(["d9"]), None])
    with pytest.raises(ValueError, match=r"^1 docno\(s\) of the allow list are not in the index \('d9'\)"):
        index.retriever(encoder, k=2, device="cpu")(unknown)
    ignored = topics.assign(filter=[DocFilter.allow(["d9", "d1"], missing="ignore"), None])
    res = index.retriever(encoder, k=2, device="cpu")(ignored)
    assert res[res.qid == "q1"].docno.tolist() == ["d1"]


def test_an_expression_on_an_index_without_metadata_is_refused(tiny_pt_index):
    pytest.importorskip("lsr.index.filter_expr")
    index, encoder = tiny_pt_index
    topics = pd.DataFrame({"qid": ["q1"], "query": ["cells"], "filter": ["year >= 2015"]})
    with pytest.raises(ValueError, match="reads metadata columns, and this index has none"):
        index.retriever(encoder, k=2, device="cpu")(topics)
