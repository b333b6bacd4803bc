"""Filters in served requests (lsr.serve.filters): a request's ``"filter"`` gets the answer ``Searcher.search``
gives with the same DocFilter, each request of a batch its own (unfiltered ones on the path they always took),
and a bad filter one line naming the field, never an error for the rest of its batch."""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from lsr.search import Searcher
from lsr.search.filters import DocFilter
from lsr.serve import create_app
from lsr.serve.filters import MAX_FILTER_DEPTH, MAX_FILTER_DOCNOS, MAX_FILTER_NODES, parse_filter
from tests.serve.conftest import TEXTS, K, get, post_all


def hits(engine, scores, idx) -> list[dict]:
    out = []
    for s, d in zip(scores.cpu().numpy(), idx.cpu().numpy()):
        keep = d >= 0
        out.append({"docnos": [engine.index.docnos[j] for j in d[keep]], "scores": s[keep].tolist()})
    return out


def filtered_reference(app, vectors, k: int, flt) -> list[dict]:
    """A Searcher of its own over the served index, searched with ``flt`` (a DocFilter, a list, or None)."""
    engine = app.state.engine
    searcher = Searcher(engine.index, device="cpu", backend=engine.searcher.backend)
    return hits(engine, *searcher.search(vectors, k=k, filter=flt))


@pytest.fixture(scope="module")
def served(bm25):
    app = create_app(bm25["index"], bm25["model"], device="cpu", max_batch=64, max_wait_ms=200, k=K)
    vectors = app.state.engine.encoder.encode_query(TEXTS[:8])
    top = hits(app.state.engine, *app.state.engine.searcher.search(vectors, k=50))
    pool = sorted({d for h in top for d in h["docnos"]})   # documents these queries match: the filters matter
    return app, vectors, top, pool


def test_filtered_requests_equal_searcher_search_with_the_same_filter(served):
    app, vectors, top, pool = served
    allow, deny = pool[::3], [d for h in top for d in h["docnos"][:5]]
    cases = [
        ({"allow": allow}, DocFilter.allow(allow)),
        ({"deny": deny}, DocFilter.deny(deny)),
        ({"and": [{"allow": allow}, {"deny": deny}]}, DocFilter.allow(allow) & DocFilter.deny(deny)),
        ({"or": [{"allow": allow[:10]}, {"allow": pool[1::3]}, {"allow": ["nope"], "missing": "ignore"}]},
         DocFilter.allow(allow[:10]) | DocFilter.allow(pool[1::3])),
        ({"not": {"allow": pool}}, ~DocFilter.allow(pool)),
        ({"allow": allow + ["not-a-docno"], "missing": "ignore"}, DocFilter.allow(allow)),
        ({"allow": []}, DocFilter.allow([])),
    ]
    responses = asyncio.run(post_all(app, [{"queries": TEXTS[:8], "filter": body} for body, _ in cases]))
    for (body, flt), r in zip(cases, responses):
        assert r.status_code == 200, (body, r.json())
        want = filtered_reference(app, vectors, K, flt)
        assert r.json()["results"] == want, json.dumps(body)[:80]
        assert want != filtered_reference(app, vectors, K, None)   # each filter changes some query's answer
    assert all(not h["docnos"] for h in responses[-1].json()["results"])   # nothing allowed: no hits
    allowed = set(allow)
    assert all(set(h["docnos"]) <= allowed for h in responses[0].json()["results"])


@pytest.mark.parametrize("pad", [False, True], ids=["unpadded", "padded"])
def test_a_batch_mixing_filtered_and_unfiltered_requests(bm25, pad, monkeypatch):
    """Texts and vectors, filtered and not, each with its own k, in one batch: every request gets its own filter
    and the unfiltered rows are searched as an unfiltered batch is (padded to a power of two when padding)."""
    app = create_app(bm25["index"], bm25["model"], device="cpu", max_batch=64, max_wait_ms=300, k=K, pad_batches=pad)
    engine = app.state.engine
    vectors = engine.encoder.encode_query(TEXTS[:7])
    token_rows = [{engine.encoder.vocab[t]: w for t, w in row.items()} for row in vectors.to_dicts()]
    top = hits(engine, *engine.searcher.search(vectors, k=40))
    allow = sorted({d for h in top for d in h["docnos"][1::2]})
    deny = [d for h in top for d in h["docnos"][:3]]
    f_allow, f_deny = DocFilter.allow(allow), DocFilter.deny(deny)
    # request -> (body, its rows of `vectors`, its filter, its k)
    plan = [({"query": TEXTS[0], "k": 5}, [0], None, 5),
            ({"queries": TEXTS[1:3], "filter": {"allow": allow}}, [1, 2], f_allow, K),
            ({"vectors": token_rows[3:4], "filter": {"deny": deny}, "k": 7}, [3], f_deny, 7),
            ({"vectors": token_rows[4:6]}, [4, 5], None, K),
            ({"query": TEXTS[6], "filter": {"deny": deny, "missing": "error"}, "k": 3}, [6], f_deny, 3)]
    calls = []
    search = engine.searcher.search

    def spy(queries, *args, **kwargs):
        calls.append((len(queries), kwargs.get("filter") is not None))
        return search(queries, *args, **kwargs)

    monkeypatch.setattr(engine.searcher, "search", spy)
    responses = asyncio.run(post_all(app, [body for body, *_ in plan]))
    monkeypatch.undo()
    assert [r.status_code for r in responses] == [200] * len(plan)
    per_row = [None, f_allow, f_allow, f_deny, None, None, f_deny]   # the filter of each row of `vectors`
    want = filtered_reference(app, vectors, K, per_row)
    for (body, rows, flt, k), r in zip(plan, responses):
        assert r.json()["results"] == [{"docnos": want[q]["docnos"][:k], "scores": want[q]["scores"][:k]}
                                       for q in rows], body
    unfiltered = filtered_reference(app, vectors, K, None)
    assert responses[3].json()["results"] == unfiltered[4:6]   # the unfiltered answers are the plain search's
    assert responses[1].json()["results"] != unfiltered[1:3]
    stats = asyncio.run(get(app, "/stats")).json()
    assert stats["batches"] == 1, stats["batches"]
    # one batch: its 3 unfiltered rows searched without a filter (padded to 4 as an unfiltered batch of 3 is),
    # its 4 filtered rows with one filter each (unpadded)
    assert calls == [(4 if pad else 3, False), (4, True)], calls


def test_a_bad_docno_is_that_requests_error_not_its_batchs(served):
    app, vectors, top, pool = served
    bodies = [{"query": TEXTS[0], "filter": {"allow": [pool[0], "nope", "nada"]}},
              {"query": TEXTS[1], "filter": {"deny": pool[:3]}}, {"query": TEXTS[2]}]
    bad, ok, plain = asyncio.run(post_all(app, bodies))
    assert bad.status_code == 422
    assert bad.json()["error"].startswith("filter: 2 docno(s) of the allow list are not in the index ('nope', 'nada')")
    assert "missing='ignore'" in bad.json()["error"]
    assert ok.json()["results"] == filtered_reference(app, vectors[1:2], K, DocFilter.deny(pool[:3]))
    assert plain.json()["results"] == filtered_reference(app, vectors[2:3], K, None)


BAD_FILTERS = [
    ({"allow": "doc1"}, 422, "filter.allow must be a list of strings"),
    ({"allow": [1, 2]}, 422, "filter.allow must be a list of strings"),
    ({"deny": None}, 422, "filter.deny must be a list of strings"),
    ({"allow": ["a"], "missing": "skip"}, 422, "filter.missing must be 'error' or 'ignore'"),
    ({"where": "x", "missing": "ignore"}, 422, "filter.missing belongs beside 'allow' or 'deny'"),
    ({"allow": ["a"], "deny": ["b"]}, 422, "filter must hold exactly one of"),
    ({}, 422, "filter must hold exactly one of"),
    ({"allow": ["a"], "only": 1}, 422, "filter has an unknown key 'only'"),
    (["a"], 422, "filter must be an object"),
    ("year > 3", 422, "filter must be an object"),
    ({"and": []}, 422, "filter.and must be a non-empty list of filters"),
    ({"or": {"allow": ["a"]}}, 422, "filter.or must be a non-empty list of filters"),
    ({"and": [{"allow": ["a"]}, {"deny": [3]}]}, 422, "filter.and[1].deny must be a list of strings"),
    ({"not": {"or": [{"allow": []}, 5]}}, 422, "filter.not.or[1] must be an object"),
    ({"where": ""}, 422, "filter.where must be a non-empty string"),
    ({"where": 7}, 422, "filter.where must be a non-empty string"),
]


def test_bad_filter_shapes_are_one_line_errors_naming_the_field(served):
    app = served[0]
    responses = asyncio.run(post_all(app, [{"query": TEXTS[0], "filter": f} for f, _, _ in BAD_FILTERS]))
    for (flt, status, message), r in zip(BAD_FILTERS, responses):
        error = r.json()["error"]
        assert r.status_code == status and set(r.json()) == {"error"}, (flt, r.status_code, error)
        assert error.startswith(message) and "\n" not in error, (flt, error)


def test_filters_past_the_bounds_are_refused(served):
    app = served[0]
    nested = {"allow": ["a"]}
    for _ in range(MAX_FILTER_DEPTH):
        nested = {"not": nested}
    ok = {"allow": ["a"], "missing": "ignore"}
    for _ in range(MAX_FILTER_DEPTH - 1):
        ok = {"not": ok}
    long = {"and": [{"allow": [str(i) for i in range(MAX_FILTER_DOCNOS // 2 + 1)]}] * 2}
    deep, fine, big = asyncio.run(post_all(app, [{"query": TEXTS[0], "filter": f} for f in (nested, ok, long)]))
    assert deep.status_code == 413 and deep.json()["error"].startswith(
        f"filter{'.not' * (MAX_FILTER_DEPTH - 1)}.not nests filters deeper than {MAX_FILTER_DEPTH} levels")
    assert fine.status_code == 200   # 32 levels: within the bound (an even number of nots: allow "a", ignored)
    assert big.status_code == 413 and f"more than {MAX_FILTER_DOCNOS:,} docnos" in big.json()["error"]
    # 999 parts of one "or": joined as a balanced tree, resolved without recursing 999 levels
    pool = served[3]
    many = {"or": [{"allow": [pool[i % len(pool)]]} for i in range(MAX_FILTER_NODES - 1)]}
    docnos = pa.array(app.state.engine.index.docnos, type=pa.large_string())
    assert int(parse_filter(many).resolve(docnos).sum()) == min(len(pool), MAX_FILTER_NODES - 1)
    too_many = {"or": [{"allow": ["a"]}] * MAX_FILTER_NODES}
    r = asyncio.run(post_all(app, [{"query": TEXTS[0], "filter": too_many}]))[0]
    assert r.status_code == 413 and f"more than {MAX_FILTER_NODES:,} filter objects" in r.json()["error"]


def test_where_without_metadata_is_the_librarys_one_line_error(served):
    """The index has no metadata columns: a "where" filter is a 422 with the library's line."""
    app, vectors, top, pool = served
    bodies = [{"query": TEXTS[0], "filter": {"where": "year >= 2015"}},
              {"query": TEXTS[0], "filter": {"and": [{"deny": pool[:2]}, {"not": {"where": "year >= 2015"}}]}},
              {"query": TEXTS[0], "filter": {"deny": pool[:2]}}]
    responses = asyncio.run(post_all(app, bodies))
    for r in responses[:2]:
        error = r.json()["error"]
        assert r.status_code == 422 and "\n" not in error, error
        assert error.startswith("filter: filter 'year >= 2015' reads metadata columns, and this index has none"), error
    assert responses[2].status_code == 200   # in the same batch, unharmed

