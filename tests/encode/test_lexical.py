"""BM25 lexical encoder and its Lucene-EnglishAnalyzer-like analyzer, on CPU with real SciFact data."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from lsr.encode.bm25.analyzer import ENGLISH_STOP_WORDS, EnglishAnalyzer, porter_stem, tokenize
from lsr.encode.bm25.lexical import LexicalEncoder, lucene_norm_lengths
from lsr.sparse import SparseVectors

TINY = [
    "The cat sat on the mat.",
    "Cats and dogs: running dogs run faster than the cat's owner runs.",
    "COVID-19 patients showed elevated IL-6 levels in 2020.",
    # long enough (> 24 terms) for Lucene's lossy length norm to differ from the exact length
    " ".join(f"word{i % 13} filler{i % 7}" for i in range(30)) + " cat dog",
]


def _scifact(data_dir: Path) -> tuple[list[str], list[str], dict[str, str], dict[str, dict[str, int]]]:
    root = data_dir / "scifact"
    docs = [json.loads(line) for line in (root / "corpus.jsonl").open(encoding="utf-8")]
    queries = {q["_id"]: q["text"] for q in map(json.loads, (root / "queries.jsonl").open(encoding="utf-8"))}
    qrels: dict[str, dict[str, int]] = {}
    for line in (root / "qrels" / "test.tsv").read_text().splitlines()[1:]:
        qid, docno, grade = line.split("\t")
        qrels.setdefault(qid, {})[docno] = int(grade)
    # BEIR "flat" indexing, as in Pyserini: title and text in one field
    return [d["title"] + " " + d["text"] for d in docs], [d["_id"] for d in docs], queries, qrels


# ------------------------------------------------------------------------------------------ analyzer
def test_tokenizer_splits_like_lucene_standard_tokenizer() -> None:
    text = "COVID-19 patients' IL-6 (p<0.001) don't, e.g. U.S. 3.14 10,000 1:2 a:b m² β-catenin 中文abc"
    assert tokenize(text) == ["covid", "19", "patients", "il", "6", "p", "0.001", "don't", "e.g", "u.s", "3.14",
                              "10,000", "1", "2", "a:b", "m", "β", "catenin", "中", "文", "abc"]
    assert tokenize("") == [] and tokenize(" -- ... ") == []


def test_analyzer_stopwords_possessives_stems_and_numbers() -> None:
    an = EnglishAnalyzer()
    assert len(ENGLISH_STOP_WORDS) == 33
    assert an(" ".join(sorted(ENGLISH_STOP_WORDS)).upper()) == []
    assert an("Alzheimer's patients' caresses") == ["alzheim", "patient", "caress"]
    assert an("It's running; the runner RUNS") == ["run", "runner", "run"]  # "it's" -> "it" -> stopword
    assert an("COVID-19 in 2020, 3.5% of 10,000") == ["covid", "19", "2020", "3.5", "10,000"]
    assert an("___ the_one") == ["the_on"]  # underscores alone are no token; inside a word they join
    assert an.describe() == EnglishAnalyzer.from_description(an.describe()).describe()


@pytest.mark.parametrize("word, stem", [
    ("caresses", "caress"), ("ponies", "poni"), ("ties", "ti"), ("cats", "cat"), ("feed", "feed"),
    ("agreed", "agre"), ("disabled", "disabl"), ("matting", "mat"), ("mating", "mate"), ("meeting", "meet"),
    ("milling", "mill"), ("messing", "mess"), ("meetings", "meet"), ("running", "run"), ("happy", "happi"),
    ("relational", "relat"), ("generalizations", "gener"), ("hopefulness", "hope"), ("electrical", "electr"),
    ("adjustment", "adjust"), ("adoption", "adopt"), ("controll", "control"), ("rate", "rate"),
    # Lucene's departures from the published algorithm
    ("as", "as"), ("is", "is"), ("possibly", "possibl"), ("analogies", "analog"), ("pathology", "patholog"),
])
def test_porter_stems(word: str, stem: str) -> None:
    assert porter_stem(word) == stem


@pytest.mark.slow
def test_porter_equals_snowball_porter_except_lucene_departures(data_dir: Path) -> None:
    """On the whole SciFact vocabulary the Lucene port agrees with snowball's (published) Porter
    algorithm except where Lucene departs from it: words of <= 2 characters, -bli, -logi."""
    snowballstemmer = pytest.importorskip("snowballstemmer")
    reference = snowballstemmer.stemmer("porter")
    texts, _, _, _ = _scifact(data_dir)
    words = {t for text in texts for t in tokenize(text)}
    differ = [w for w in words if porter_stem(w) != reference.stemWord(w)]
    unexplained = [w for w in differ if len(w) > 2 and "bl" not in w and "log" not in w]
    assert len(words) > 30_000 and unexplained == []
    assert 0 < len(differ) < 0.01 * len(words)


# ------------------------------------------------------------------------------------------ weights
def _lucene_length_reference(n: int) -> int:
    """SmallFloat.intToByte4 then byte4ToInt, transcribed from Lucene (Java) bit by bit."""
    free = 255 - 231  # 255 - longToInt4(Integer.MAX_VALUE)
    if n < free:
        return n
    i = n - free
    if i.bit_length() < 4:
        return free + i
    shift = i.bit_length() - 4
    encoded = ((i >> shift) & 0x07) | ((shift + 1) << 3)
    bits, shift = encoded & 0x07, (encoded >> 3) - 1
    return free + ((bits | 0x08) << shift)


def test_lucene_norm_lengths_match_smallfloat() -> None:
    n = np.concatenate([np.arange(5000), [2**20 + 12345, 2**31 - 1]])
    assert lucene_norm_lengths(n).tolist() == [_lucene_length_reference(int(x)) for x in n]


@pytest.mark.parametrize("lucene", [False, True])
def test_document_weights_equal_float64_bm25(lucene: bool) -> None:
    k1, b = 1.2, 0.75
    enc = LexicalEncoder(k1, b, lucene_lengths=lucene)
    vecs = enc.fit_encode_document(TINY, ids=[f"d{i}" for i in range(len(TINY))])
    terms = [EnglishAnalyzer()(t) for t in TINY]
    n, avgdl = len(terms), sum(map(len, terms)) / len(terms)
    df = Counter(t for doc in terms for t in set(doc))
    assert enc.vocab == sorted(df) and enc.vocab_size == len(df) and enc.avgdl == pytest.approx(avgdl)
    got = vecs.to_dicts(enc.vocab)
    for doc, row in zip(terms, got, strict=True):
        dl = _lucene_length_reference(len(doc)) if lucene else len(doc)
        want = {t: math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) * tf * (k1 + 1)
                / (tf + k1 * (1 - b + b * dl / avgdl)) for t, tf in Counter(doc).items()}
        assert row.keys() == want.keys()
        for t, w in want.items():
            assert row[t] == pytest.approx(w, rel=1e-6)
    assert vecs.ids == [f"d{i}" for i in range(len(TINY))] and bool((vecs.values > 0).all())
    long_row = got[3]["cat"]
    exact = LexicalEncoder(k1, b, lucene_lengths=not lucene).fit_encode_document(TINY)
    assert long_row != exact.to_dicts(enc.vocab)[3]["cat"]  # the option matters for a long document


# Empty and stop-word-only documents have no term, so Lucene leaves them out of docCount and avgdl.
WITH_EMPTY = ["cat dog", "", "The and of.", "cat cat bird", "It is -- !!", "dogs"]


def test_collection_statistics_are_lucenes_doc_count_and_avgdl() -> None:
    """docCount = 3 (documents 0, 3 and 5 have terms), sumTotalTermFreq = 2 + 3 + 1 = 6, avgdl = 6 / 3;
    df: cat 2, dog 2, bird 1; BM25Similarity idf = ln(1 + (docCount - df + 0.5) / (df + 0.5))."""
    k1, b = 0.9, 0.4
    enc = LexicalEncoder(k1, b)
    vecs = enc.fit_encode_document(WITH_EMPTY, ids=[f"d{i}" for i in range(6)])
    assert (enc.n_docs, enc.doc_count, enc.total_length, enc.avgdl) == (6, 3, 6, 2.0)
    assert enc.vocab == ["bird", "cat", "dog"] and enc.df.tolist() == [1, 2, 2]
    idf = {"bird": math.log(1 + 2.5 / 1.5), "cat": math.log(1 + 1.5 / 2.5), "dog": math.log(1 + 1.5 / 2.5)}
    assert enc.idf().tolist() == pytest.approx([idf["bird"], idf["cat"], idf["dog"]], rel=1e-12)

    def bm25(term: str, tf: int, dl: int) -> float:
        return idf[term] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / 2.0))

    want = [{"cat": bm25("cat", 1, 2), "dog": bm25("dog", 1, 2)}, {}, {},
            {"cat": bm25("cat", 2, 3), "bird": bm25("bird", 1, 3)}, {}, {"dog": bm25("dog", 1, 1)}]
    got = vecs.to_dicts(enc.vocab)
    for row, expected in zip(got, want, strict=True):
        assert row.keys() == expected.keys() and all(row[t] == pytest.approx(w, rel=1e-6) for t, w in expected.items())
    assert enc.describe()["doc_count"] == 3 and enc.describe()["avgdl"] == 2.0
    assert LexicalEncoder(k1, b).fit(WITH_EMPTY[::-1]).describe() == enc.describe()  # order does not matter


def test_a_corpus_of_empty_documents_fits_without_terms() -> None:
    enc = LexicalEncoder().fit(["", "the of", "!!"])
    assert (enc.n_docs, enc.doc_count, enc.vocab_size, enc.avgdl) == (3, 0, 0, 1.0)
    assert enc.encode_document(["cat", ""]).lengths.tolist() == [0, 0]


def _format_1(state: dict) -> dict:
    """lexical.json as format 1 wrote it: N = every fitted document, no doc_count."""
    old = {k: v for k, v in state.items() if k != "doc_count"}
    return {**old, "format_version": 1, "avgdl": old["total_length"] / old["n_docs"]}


def test_a_format_1_fit_loads_with_its_statistics_as_saved(tmp_path: Path) -> None:
    from lsr.index.inverted import InvertedIndex
    from lsr.search.searcher import Searcher

    enc = LexicalEncoder().fit(WITH_EMPTY)
    enc.save(tmp_path / "new")
    state = json.loads((tmp_path / "new" / "lexical.json").read_text())
    assert state["format_version"] == 2 and state["doc_count"] == 3
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "lexical.json").write_text(json.dumps(_format_1(state)))
    old = LexicalEncoder.load(tmp_path / "old")
    assert (old.n_docs, old.doc_count, old.avgdl) == (6, 6, 1.0)  # N and avgdl over all six documents
    assert old.idf().tolist() == pytest.approx([math.log(1 + 5.5 / 1.5)] + [math.log(1 + 4.5 / 2.5)] * 2)
    old_described = {k: v for k, v in state.items() if k not in ("format", "format_version", "vocab", "df",
                                                                   "doc_count")} | {"avgdl": 1.0}
    assert old.describe() == old_described  # what vectors and indexes made with it recorded
    old.save(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "lexical.json").read_text())["format_version"] == 1
    # an index built with the format-1 encoder still loads and answers queries of either encoder
    docs = old.encode_document(WITH_EMPTY, ids=[f"d{i}" for i in range(6)])
    InvertedIndex.build(docs, device="cpu", metadata=old.describe()).save(tmp_path / "index")
    searcher = Searcher(InvertedIndex.load(tmp_path / "index"), device="cpu")
    for encoder in (old, enc):
        scores, idx = searcher.search(encoder.encode_query(["bird cat"]), k=2, query_metadata=encoder.describe())
        assert idx[0].tolist() == [3, 0] and scores[0, 0] > scores[0, 1] > 0


def test_lexical_json_versions_and_doc_count_are_checked(tmp_path: Path) -> None:
    enc = LexicalEncoder().fit(WITH_EMPTY)
    enc.save(tmp_path)
    state = json.loads((tmp_path / "lexical.json").read_text())
    for bad in ({"doc_count": 7}, {"doc_count": 1}, {"format_version": 3}):
        (tmp_path / "lexical.json").write_text(json.dumps({**state, **bad}))
        with pytest.raises(ValueError, match=r"corrupt: doc_count|newer lsr \(format version 3\); this lsr reads format versions 1 to 2"):
            LexicalEncoder.load(tmp_path)


def test_queries_are_term_counts_oov_dropped_empty_rows() -> None:
    enc = LexicalEncoder().fit(TINY)
    q = enc.encode_query(["running runs RUN cat", "zebra unicorn", "", "the of and"], ids=["a", "b", "c", "d"])
    assert q.ids == ["a", "b", "c", "d"] and q.vocab_size == enc.vocab_size
    assert q.lengths.tolist() == [2, 0, 0, 0]
    assert enc.decode(q) == [[("run", 3.0), ("cat", 1.0)], [], [], []]
    assert enc.decode(q, top_k=1)[0] == [("run", 3.0)]


def test_fit_is_order_and_batch_independent() -> None:
    ids = [f"d{i}" for i in range(len(TINY))]
    base = LexicalEncoder().fit_encode_document(TINY, ids)
    perm = list(range(len(TINY)))
    random.Random(0).shuffle(perm)
    shuffled = LexicalEncoder(batch_size=1).fit_encode_document((TINY[i] for i in perm), [ids[i] for i in perm])
    assert shuffled.vocab_size == base.vocab_size
    assert shuffled[np.argsort(perm).tolist()].equal(base)
    fitted = LexicalEncoder(batch_size=3).fit(iter(TINY))
    assert fitted.encode_document(TINY, ids).equal(base)


def test_encoding_unseen_documents_drops_oov_but_counts_their_length() -> None:
    enc = LexicalEncoder().fit(TINY)
    vecs = enc.encode_document(["cat", "cat zebra unicorn"])
    short, longer = vecs.to_dicts(enc.vocab)
    assert short.keys() == longer.keys() == {"cat"} and short["cat"] > longer["cat"]
    assert len(enc.encode_document([])) == 0


def test_save_load_round_trip(tmp_path: Path) -> None:
    enc = LexicalEncoder(k1=1.1, b=0.5)
    docs = enc.fit_encode_document(TINY)
    queries = ["cat running", "IL-6 levels", "nothing known here"]
    enc.save(tmp_path / "bm25")
    loaded = LexicalEncoder.load(tmp_path / "bm25")
    assert loaded.describe() == enc.describe()
    json.dumps(loaded.describe())
    assert loaded.describe()["kind"] == "bm25" and loaded.vocab == enc.vocab
    assert loaded.encode_document(TINY).equal(docs)
    assert loaded.encode_query(queries).equal(enc.encode_query(queries))
    state = json.loads((tmp_path / "bm25" / "lexical.json").read_text())
    state["vocab"][0] = "tampered"
    (tmp_path / "bm25" / "lexical.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="corrupt"):
        LexicalEncoder.load(tmp_path / "bm25")
    with pytest.raises(FileNotFoundError):
        LexicalEncoder.load(tmp_path / "missing")


def test_errors() -> None:
    enc = LexicalEncoder()
    for call in (lambda: enc.encode_document(["x"]), lambda: enc.encode_query(["x"]), lambda: enc.save("/tmp")):
        with pytest.raises(RuntimeError, match="fit"):
            call()
    with pytest.raises(ValueError, match="empty corpus"):
        enc.fit([])
    with pytest.raises(ValueError, match="k1"):
        LexicalEncoder(k1=-1)
    with pytest.raises(ValueError, match="b must"):
        LexicalEncoder(b=1.5)
    with pytest.raises(ValueError, match="duplicate id"):
        LexicalEncoder().fit_encode_document(["a b", "c d"], ids=["x", "x"])


# ------------------------------------------------------------------------------------------ quality
def _exact_run(docs: SparseVectors, queries: SparseVectors, k: int) -> dict[str, dict[str, float]]:
    """Brute-force exact inner products (float32), top-k per query."""
    scores = torch.sparse.mm(docs.to_torch_sparse(), queries.to_dense().T).T  # [Q, N]
    top, idx = scores.topk(k, dim=1)
    return {qid: {docs.ids[j]: s for s, j in zip(top[i].tolist(), idx[i].tolist(), strict=True) if s > 0}
            for i, qid in enumerate(queries.ids)}


@pytest.mark.slow
def test_scifact_bm25_quality(data_dir: Path) -> None:
    """The real quality test: Pyserini BM25 flat reports nDCG@10 0.6789, R@100 0.9253, R@1000 0.9767."""
    ir_measures = pytest.importorskip("ir_measures")
    texts, docnos, queries, qrels = _scifact(data_dir)
    enc = LexicalEncoder()
    docs = enc.fit_encode_document(texts, docnos)
    assert len(docs) == 5183
    qids = sorted(qrels, key=int)
    run = _exact_run(docs, enc.encode_query([queries[q] for q in qids], qids), k=1000)
    m = ir_measures.calc_aggregate([ir_measures.parse_measure(s) for s in ("nDCG@10", "RR@10", "R@100", "R@1000")],
                                 qrels, run)
    got = {str(k): v for k, v in m.items()}
    assert got["nDCG@10"] >= 0.66 and got["R@1000"] >= 0.97
    # Lucene lengths + Lucene analysis reproduce Pyserini to rounding; a drift flags an analysis change
    assert got["nDCG@10"] == pytest.approx(0.6789, abs=1e-3) and got["R@100"] == pytest.approx(0.9253, abs=1e-3)
