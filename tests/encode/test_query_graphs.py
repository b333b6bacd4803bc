"""Bucketed query encoding (lsr.encode.splade.query_graphs): buckets and packs, the bucketed path against the
unbucketed one on the CPU (the sdpa twin of the padding-free body), its fallbacks, the server's stage timings;
on a GPU, the replayed CUDA graphs against the same buckets run eagerly, bit for bit."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from lsr.encode.splade import query_graphs as qg
from lsr.encode.splade.query_graphs import MAX_SLOTS, TOKEN_BUCKETS, n_sequences, pack_queries, slot_bucket, token_bucket
from tests.conftest import DATA

pytest.importorskip("transformers")
MODEL = DATA / "models" / "splade-tiny"
SCIFACT = [json.loads(line)["text"] for line in (DATA / "scifact" / "queries.jsonl").read_text().splitlines()[:80]]


def words(n_tokens: int) -> str:
    """A text of exactly n_tokens word pieces with [CLS] and [SEP] ("the" is one piece)."""
    return " ".join(["the"] * (n_tokens - 2))


@pytest.fixture(scope="module")
def encoder():
    from lsr.encode.splade.encoder import SpladeEncoder

    # varlen=True: on the CPU the padding-free body runs through its sdpa twin, so the bucketed path applies
    # (fp32; the GPU tests below build their own bf16 encoders)
    return SpladeEncoder.from_pretrained(MODEL, device="cpu", varlen=True)


def test_buckets():
    assert [slot_bucket(n) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert slot_bucket(0) is None and slot_bucket(MAX_SLOTS + 1) is None
    steps = np.diff(TOKEN_BUCKETS)
    assert (steps > 0).all() and (np.array(TOKEN_BUCKETS) % 16 == 0).all()
    assert all(b <= max(a + 16, a * 5 // 4) for a, b in zip(TOKEN_BUCKETS, TOKEN_BUCKETS[1:]))  # <= 25% padding
    for t in (1, 16, 17, 80, 81, TOKEN_BUCKETS[-1]):
        b = token_bucket(t)
        assert b >= t and (b == TOKEN_BUCKETS[0] or TOKEN_BUCKETS[TOKEN_BUCKETS.index(b) - 1] < t)
    assert token_bucket(0) is None and token_bucket(TOKEN_BUCKETS[-1] + 1) is None


@pytest.mark.parametrize("lengths", [[5], [3, 1, 7], [16], [17], [64] * 2, [2] * 9, [1] * 64])
def test_pack_layout(lengths):
    max_len = 16 if max(lengths) <= 16 else 64
    flat = np.arange(100, 100 + sum(lengths))
    p = pack_queries(flat, np.array(lengths), pad_id=0, max_len=max_len)
    T, n = sum(lengths), len(lengths)
    assert (p.n, p.slots, p.tokens) == (n, slot_bucket(n), token_bucket(T))
    assert p.n_seqs == n_sequences(p.slots, p.tokens, max_len) and p.host.size == 3 * p.tokens + p.n_seqs + 1
    ids, pos, seg, cu = (p.host[:p.tokens], p.host[p.tokens:2 * p.tokens], p.host[2 * p.tokens:3 * p.tokens],
                         p.host[3 * p.tokens:])
    seq_len = np.diff(cu)
    assert cu[0] == 0 and cu[-1] == p.tokens and (seq_len >= 0).all() and (seq_len <= max_len).all()
    assert seq_len[:n].tolist() == lengths and seq_len[n:p.slots].sum() == 0  # real texts, then empty slots
    assert ids[:T].tolist() == flat.tolist() and (ids[T:] == 0).all()
    assert (np.diff(seg) >= 0).all() and (seg[:T] < n).all() and (seg[T:] >= p.slots).all()
    assert (pos == np.arange(p.tokens) - cu[seg]).all()


def test_pack_refuses_what_fits_no_bucket():
    assert pack_queries(np.zeros(65, np.int64), np.ones(65), 0, 8) is None  # too many texts
    assert pack_queries(np.zeros(9, np.int64), np.array([9]), 0, 8) is None  # a text beyond max_len
    big = TOKEN_BUCKETS[-1] // 64 + 1
    assert pack_queries(np.zeros(64 * big, np.int64), np.full(64, big), 0, big) is None  # too many tokens


def test_every_padding_fits_its_bucket():
    """For each token bucket, the largest padding (just above the previous bucket) fits n_sequences."""
    for max_len in (8, 64):
        for i, t in enumerate(TOKEN_BUCKETS):
            lo = (TOKEN_BUCKETS[i - 1] if i else 0) + 1
            n = max(1, -(-lo // max_len))
            if n > MAX_SLOTS:
                continue
            lengths = np.full(n, lo // n)
            lengths[: lo % n] += 1
            p = pack_queries(np.zeros(lo, np.int64), lengths, 0, max_len)
            assert p is not None and p.tokens == t and np.diff(p.host[3 * t:]).max() <= max_len


def test_bucketed_path_matches_the_unbucketed_one(encoder):
    """Same terms, weights equal to float rounding (the GEMMs run at the bucket's row count); input order and
    ids kept; device_output keeps the vectors where the encoder runs."""
    texts = SCIFACT[:13] + ["a", words(30)]
    ids = [f"q{i}" for i in range(len(texts))]
    runner = encoder.query_runner()
    assert runner is not None
    got = encoder.encode_query(texts, ids=ids)
    want = encoder.encode_prepared(encoder.prepare(texts, "query"), ids=ids)
    assert got.ids == ids and torch.equal(got.indptr, want.indptr) and torch.equal(got.indices, want.indices)
    torch.testing.assert_close(got.values, want.values, rtol=1e-4, atol=1e-5)
    on_device = encoder.encode_query(texts, ids, device_output=True)
    assert on_device.device.type == encoder.device.type and on_device.to("cpu").equal(got.to("cpu"))
    packed = runner.pack(texts)
    vectors, lengths = runner.encode_packed(packed, ids)
    assert lengths.tolist() == got.lengths.tolist() and vectors.equal(got)


@pytest.mark.slow
def test_fallbacks(encoder):
    """Beyond the buckets (more texts than MAX_SLOTS, a smaller batch_size) the unbucketed path runs; more
    terms than the in-graph extraction holds are extracted after the run, with the same result."""
    many = (SCIFACT * 2)[:MAX_SLOTS + 1]
    assert encoder.query_runner().encode(many) is None
    assert encoder.encode_query(many).equal(encoder.encode_prepared(encoder.prepare(many, "query")))
    few = SCIFACT[:6]
    assert encoder.encode_query(few, batch_size=3).equal(encoder.encode_prepared(encoder.prepare(few, "query", 3)))
    ref = encoder.encode_query(few)
    small = qg.QueryGraphs(encoder, graphs=encoder.query_graphs, row_cap=2)  # (on a GPU: graphs with that capacity)
    assert small.encode(few).equal(ref)


def test_graphs_are_dropped_when_the_weights_change():
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.encode.splade.query_graphs import QueryGraphs

    enc = SpladeEncoder.from_pretrained(MODEL, device="cpu", varlen=True)
    runner = QueryGraphs(enc, graphs=False)
    runner._drop_stale_graphs()
    runner.cache.graphs[(1, 16)] = None  # a captured graph's place
    runner._drop_stale_graphs()
    assert list(runner.cache) == [(1, 16)]  # unchanged weights keep it
    with torch.no_grad():
        enc._towers["query"].model.bert.encoder.layer[0].attention.self.query.weight.mul_(1.5)  # in place
    runner._drop_stale_graphs()
    assert not len(runner.cache)


def test_cpu_default_keeps_the_padded_path():
    from lsr.encode.splade.encoder import SpladeEncoder

    enc = SpladeEncoder.from_pretrained(MODEL, device="cpu")
    assert enc.query_runner() is None  # varlen=None on the CPU: HF's padded forward, as before


def test_stage_stats():
    from lsr.serve.batcher import BatchStats

    stats = BatchStats()
    stats.record_stages({"tokenize_ms": 1.0, "encode_ms": 3.0})
    stats.record_stages({"tokenize_ms": 2.0, "encode_ms": 5.0, "json_ms": 0.5})
    d = stats.as_dict()
    assert d["stage_batches"] == 2 and d["stage_ms_total"] == {"tokenize": 3.0, "encode": 8.0, "json": 0.5}
    assert d["stage_ms_mean"] == {"tokenize": 1.5, "encode": 4.0, "json": 0.25}


@pytest.mark.slow
def test_served_answers_equal_searcher_on_the_same_vectors(encoder, tmp_path):
    """A SPLADE index served with the bucketed encoder: run_batch's answers are Searcher.search's on
    encode_query's vectors of the same batch (bit for bit), and it reports every stage's time."""
    from lsr.index.inverted import InvertedIndex
    from lsr.serve.engine import STAGES, SearchEngine, SearchRequest

    corpus = [json.loads(line) for line in (DATA / "scifact" / "corpus.jsonl").read_text().splitlines()[:80]]
    docs = encoder.encode_document([d["title"] for d in corpus], ids=[d["_id"] for d in corpus])
    index = InvertedIndex.build(docs, metadata=encoder.describe(), device=encoder.device)
    engine = SearchEngine(index, MODEL, device=str(encoder.device), k=10)
    engine.encoder.varlen = True
    texts = SCIFACT[:5] + [d["title"] for d in corpus[:3]]
    timings: dict[str, float] = {}
    answers = engine.run_batch([SearchRequest([t], None, 10) for t in texts], timings)
    assert set(timings) == {f"{s}_ms" for s in STAGES} and all(v >= 0 for v in timings.values())
    vectors = engine.encoder.encode_query(texts)
    scores, idx = engine.searcher.search(vectors, k=10, show_progress_bar=False)
    for a, s, i in zip(answers, scores.cpu().numpy(), idx.cpu().numpy()):
        hits = a["results"][0]
        n = int((i >= 0).sum())
        assert hits["docnos"] == [index.docnos[j] for j in i[:n]] and hits["scores"] == s[:n].tolist()
    assert [a["results"][0]["docnos"][0] for a in answers[5:]] == [d["_id"] for d in corpus[:3]]


# ---------------------------------------------------------------------------------------------- GPU
def _edge_batches() -> list[list[str]]:
    """Batches whose token counts sit at and just past bucket edges, of several sizes, and one of 64 texts."""
    out = []
    for n, total in ((1, 16), (1, 17), (3, 48), (3, 49), (8, 160), (8, 161), (16, 656), (33, 1008)):
        lengths = [total // n] * n
        lengths[-1] += total - sum(lengths)
        out.append([words(x) for x in lengths])
    out.append((SCIFACT * 2)[:64])
    return out


@pytest.mark.gpu
def test_gpu_graphs_equal_the_bucketed_eager_run_bit_for_bit():
    from lsr.encode.splade.encoder import SpladeEncoder

    enc = SpladeEncoder.from_pretrained(MODEL, device="cuda")  # bf16, varlen by default
    eager = SpladeEncoder.from_pretrained(MODEL, device="cuda")
    eager.query_graphs = False
    runner = enc.query_runner()
    assert runner is not None and runner.graphs and not eager.query_runner().graphs
    for texts in _edge_batches():
        got, want = enc.encode_query(texts, device_output=True), eager.encode_query(texts, device_output=True)
        assert got.device.type == "cuda" and got.equal(want), f"{len(texts)} texts"
        again = enc.encode_query(texts, device_output=True)  # a replay of the same graph
        assert again.equal(got)
    assert runner.failures == [] and all(g is not None and g.out[2] is not None for g in runner.cache.graphs.values())
    long = (SCIFACT * 2)[:65]  # beyond the largest bucket: the unbucketed path, equal in both
    assert enc.encode_query(long).equal(eager.encode_query(long))
    with torch.no_grad():  # new weights (in place): the graphs captured with the old ones are dropped
        for e in (enc, eager):
            e._towers["query"].model.bert.encoder.layer[0].attention.self.query.weight.mul_(1.5)
    texts = SCIFACT[:9]
    assert enc.encode_query(texts).equal(eager.encode_query(texts))
    # the padded HF path and the unbucketed padding-free one agree with the bucketed vectors to bf16 rounding
    texts = SCIFACT[:20]
    got = enc.encode_query(texts)
    ref = enc.encode_prepared(enc.prepare(texts, "query"))
    dense = lambda v: v.to_dense()  # noqa: E731
    torch.testing.assert_close(dense(got), dense(ref), rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_gpu_server_answers_equal_searcher_with_graphs(tmp_path):
    from lsr.encode.splade.encoder import SpladeEncoder
    from lsr.index.inverted import InvertedIndex
    from lsr.serve.engine import SearchEngine, SearchRequest

    enc = SpladeEncoder.from_pretrained(MODEL, device="cuda")
    corpus = [json.loads(line) for line in (DATA / "scifact" / "corpus.jsonl").read_text().splitlines()[:500]]
    docs = enc.encode_document([d["title"] + " " + d["text"] for d in corpus], ids=[d["_id"] for d in corpus])
    index = InvertedIndex.build(docs, metadata=enc.describe(), device="cuda")
    engine = SearchEngine(index, MODEL, device="cuda", k=10)
    engine.warmup(16)
    runner = engine.encoder.query_runner()
    assert runner.graphs and len(runner.cache.held()) > 0
    for texts in (SCIFACT[:1], SCIFACT[:7], SCIFACT[10:26]):
        answers = engine.run_batch([SearchRequest([t], None, 10) for t in texts])
        vectors = engine.encoder.encode_query(texts)
        scores, idx = engine.searcher.search(vectors, k=10, show_progress_bar=False)
        for a, s, i in zip(answers, scores.cpu().numpy(), idx.cpu().numpy()):
            n = int((i >= 0).sum())
            assert a["results"][0] == {"docnos": [index.docnos[j] for j in i[:n]], "scores": s[:n].tolist()}
