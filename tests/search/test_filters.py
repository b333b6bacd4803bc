"""Filtered search (lsr.search.filters, lsr.search.filtered): every route, forced through SearchConfig.filters, gives
the top-k of an index built from the allowed documents only (same bits, ties by document index), on the torch
backend and the gpu backend (TRITON_INTERPRET=1 on the CPU, tests/conftest.py); per-query filters, docno lists,
combinations, the plan --explain prints and what actually ran."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from lsr.index.inverted import InvertedIndex
from lsr.search import SearchConfig, Searcher
from lsr.search.filters import DocFilter
from lsr.search.index_cache import index_cache
from lsr.testing import random_dense_rows, seeded_generator
from tests.conftest import DEV

rand_vectors = functools.partial(random_dense_rows, device=DEV)
N_DOCS, VOCAB = 160, 40


@pytest.fixture(scope="module")
def case():
    gen = seeded_generator()
    docs = rand_vectors(N_DOCS, VOCAB, 0.2, gen, quantized=True)   # quantized weights: many tied scores
    queries = rand_vectors(12, VOCAB, 0.3, gen, quantized=True, empty_rows=1)
    return docs, queries, InvertedIndex.build(docs, device=DEV, block_size=64, postings="float32")


def reference(docs, queries, mask: np.ndarray, k: int, backend: str):
    """The top-k of an index of the allowed documents, its doc indices mapped to the whole index's."""
    rows = torch.from_numpy(np.flatnonzero(mask))
    if rows.numel() == 0:
        return torch.zeros(len(queries), k), torch.full((len(queries), k), -1, dtype=torch.int64)
    sub = InvertedIndex.build(docs[rows], device=DEV, block_size=64, postings="float32")
    s, i = Searcher(sub, backend=backend).search(queries, k)
    return s.cpu(), torch.where(i.cpu() >= 0, rows[i.cpu().clamp_min(0)], -1)


def masks() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    one = np.zeros(N_DOCS, dtype=bool)
    one[37] = True
    return {"none": np.zeros(N_DOCS, dtype=bool), "one": one, "5%": rng.random(N_DOCS) < 0.05,
            "50%": rng.random(N_DOCS) < 0.5, "95%": rng.random(N_DOCS) < 0.95, "all": np.ones(N_DOCS, dtype=bool)}


ROUTES = {"torch": ("auto", "subset", "mask"), "gpu": ("auto", "subset", "widen")}


@pytest.mark.parametrize("backend", ["torch", "gpu"])
@pytest.mark.parametrize("k", [1, 10, 200])
def test_every_route_equals_an_index_of_the_allowed_documents(case, backend, k):
    docs, queries, index = case
    for name, mask in masks().items():
        want = reference(docs, queries, mask, k, backend)
        for route in ROUTES[backend]:
            cfg = SearchConfig(backend=backend, filters={"route": route})
            s, i = Searcher(index, config=cfg).search(queries, k, filter=DocFilter.mask(mask))
            assert torch.equal(i.cpu(), want[1]), (name, route)
            assert torch.equal(s.cpu(), want[0]), (name, route)   # the same bits


def test_the_plan_routes_by_selectivity_and_is_what_runs(case):
    docs, queries, index = case
    ms = masks()
    cases = {("torch", "5%"): "subset", ("torch", "50%"): "mask", ("gpu", "5%"): "subset", ("gpu", "50%"): "widen",
             ("gpu", "all"): "all", ("gpu", "none"): "none"}
    for (backend, name), route in cases.items():
        cfg = SearchConfig(backend=backend, filters={"subset_docs": 10, "subset_fraction": 0.0})
        searcher = Searcher(index, config=cfg)
        plan = searcher.explain(queries, k=10, filter=ms[name])
        row = next(line for line in str(plan).splitlines() if line.strip().startswith("filter"))
        assert row.split()[1].rstrip(",") == route, (backend, name, row)
        assert f"{int(ms[name].sum()):,} of {N_DOCS} documents allowed" in row
        index_cache(index).ran.clear()
        searcher.search(queries, 10, filter=ms[name])
        assert index_cache(index).ran.choices("filter") == {route: 1}, (backend, name)


def test_widen_searches_deeper_until_k_allowed_documents_are_found(case):
    """Allowed documents that rank last: the first top-k' holds too few of them, the route searches 4x deeper."""
    docs, queries, index = case
    s_all, i_all = Searcher(index, backend="gpu").search(queries, N_DOCS)
    mask = np.zeros(N_DOCS, dtype=bool)
    worst = i_all[0][i_all[0] >= 0][-15:].cpu().numpy()   # query 0's 15 lowest-scoring matches (and some others)
    mask[worst] = True
    mask[np.random.default_rng(3).choice(N_DOCS, 40, replace=False)] = True
    cfg = SearchConfig(backend="gpu", filters={"route": "widen", "widen_margin": 1.0})
    s, i = Searcher(index, config=cfg).search(queries, 10, filter=mask)
    want = reference(docs, queries, mask, 10, "gpu")
    assert torch.equal(i.cpu(), want[1]) and torch.equal(s.cpu(), want[0])


@pytest.mark.parametrize("backend", ["torch", "gpu"], ids=["torch-backend", "gpu-backend"])   # ("gpu": a GPU-only mark)
def test_docno_lists_combinations_and_per_query_filters(case, backend):
    docs, queries, index = case
    docnos = index.docnos
    searcher = Searcher(index, backend=backend)
    allow = DocFilter.allow(docnos[10:90])
    deny = DocFilter.deny(docnos[40:50])
    mask = np.zeros(N_DOCS, dtype=bool)
    mask[10:40] = mask[50:90] = True
    got = searcher.search(queries, 20, filter=allow & deny)
    want = reference(docs, queries, mask, 20, backend)
    assert torch.equal(got[1].cpu(), want[1]) and torch.equal(got[0].cpu(), want[0])
    either = searcher.search(queries, 20, filter=DocFilter.allow(docnos[:5]) | ~DocFilter.deny(docnos[5:]))
    assert torch.equal(either[1].cpu(), reference(docs, queries, np.ones(N_DOCS, dtype=bool), 20, backend)[1])
    # one filter per query (None: unfiltered), the same as each query searched with its own
    per = [allow, None, deny] * 4
    s, i = searcher.search(queries, 20, filter=per)
    for q, f in enumerate(per):
        one = searcher.search(queries[q:q + 1], 20, filter=f) if f is not None else searcher.search(queries[q:q + 1], 20)
        assert torch.equal(i[q:q + 1].cpu(), one[1].cpu()) and torch.equal(s[q:q + 1].cpu(), one[0].cpu()), q


def test_a_run_holds_only_allowed_documents(case):
    docs, queries, index = case
    allowed = set(index.docnos[::3])
    run = Searcher(index).search_run(queries, 50, filter=DocFilter.allow(sorted(allowed)))
    assert run and all(set(hits) <= allowed for hits in run.values())


def test_bad_filters_are_one_line_errors(case):
    docs, queries, index = case
    searcher = Searcher(index)
    with pytest.raises(ValueError, match=r"2 docno\(s\) of the allow list are not in the index \('nope', 'nada'\)"):
        searcher.search(queries, 5, filter=DocFilter.allow([index.docnos[0], "nope", "nada"]))
    ok = searcher.search(queries, 5, filter=DocFilter.allow([index.docnos[0], "nope"], missing="ignore"))
    assert set(ok[1].flatten().tolist()) <= {0, -1}
    with pytest.raises(ValueError, match="a filter mask has 3 entries, the index 160 documents"):
        searcher.search(queries, 5, filter=np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="a filter mask is a 1-d boolean array"):
        DocFilter.mask(np.ones(N_DOCS))
    with pytest.raises(ValueError, match="2 filters for 12 queries"):
        searcher.search(queries, 5, filter=[None, DocFilter.deny([])])
    with pytest.raises(ValueError, match="filters.route=mask needs the torch backend"):
        Searcher(index, config=SearchConfig(backend="gpu", filters={"route": "mask"})).search(
            queries, 5, filter=masks()["50%"])
    with pytest.raises(ValueError, match="unknown key"):
        SearchConfig(filters={"rout": "mask"})


def test_a_sharded_index_filters_over_global_document_indices(case, tmp_path):
    from lsr.index.sharded import ShardedIndex
    from lsr.search.sharded import ShardedSearcher

    docs, queries, index = case
    ShardedIndex.build(docs, 3, tmp_path / "idx", block_size=16)
    sharded = ShardedSearcher(ShardedIndex.load(tmp_path / "idx", device=DEV), backend="torch")
    one = Searcher(index, backend="torch")
    for flt in (masks()["50%"], DocFilter.deny(index.docnos[::2]), [DocFilter.allow(index.docnos[:30]), None] * 6):
        got, want = sharded.search(queries, 15, filter=flt), one.search(queries, 15, filter=flt)
        assert torch.equal(got[1].cpu(), want[1].cpu()) and torch.equal(got[0].cpu(), want[0].cpu())


def test_lsr_search_filters_from_docno_files(case, tmp_path, capsys):
    from lsr.cli import main
    from lsr.data.runs import read_run
    from lsr.storage.shards import write_vectors

    docs, queries, index = case
    index.to("cpu").save(tmp_path / "idx")
    write_vectors(tmp_path / "q", queries.to("cpu"))
    allow, deny = tmp_path / "allow.txt", tmp_path / "deny.txt"
    allow.write_text("\ufeff" + "\n".join(index.docnos[:100]) + "\n\n", encoding="utf-8")   # a BOM, a blank line
    deny.write_text("\n".join(index.docnos[:20]) + "\n", encoding="utf-8")
    base = ["search", "--index", str(tmp_path / "idx"), "--queries", str(tmp_path / "q"), "--k", "30",
            "--device", "cpu"]
    assert main([*base, "--allow-docnos", str(allow), "--deny-docnos", str(deny), "--out", str(tmp_path / "r")]) == 0
    run = read_run(tmp_path / "r")
    allowed = set(index.docnos[20:100])
    assert run and all(set(hits) <= allowed for hits in run.values())
    want = Searcher(index.to("cpu")).search_run(queries.to("cpu"), 30, filter=DocFilter.allow(sorted(allowed)))
    assert {q: list(h) for q, h in run.items()} == {q: list(h) for q, h in want.items() if h}
    capsys.readouterr()
    assert main([*base, "--allow-docnos", str(allow), "--explain"]) == 0
    assert "filter" in capsys.readouterr().out
    deny.write_text("not-a-docno\n", encoding="utf-8")
    assert main([*base, "--deny-docnos", str(deny), "--out", str(tmp_path / "r2")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'not-a-docno'" in err and "--filter-missing ignore" in err
    assert main([*base, "--deny-docnos", str(deny), "--filter-missing", "ignore", "--out", str(tmp_path / "r2")]) == 0
    assert main([*base, "--allow-docnos", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "r3")]) == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.gpu
def test_cuda_routes_equal_an_index_of_the_allowed_documents():
    """On a GPU at a size where every route runs its real kernels (block route, several blocks): subset, widen and
    the 'all' / 'none' shortcuts against an index of the allowed documents, and the same bits twice."""
    gen = seeded_generator()
    docs = random_dense_rows(6000, 400, 0.05, gen, quantized=True, device="cuda")
    queries = random_dense_rows(64, 400, 0.05, gen, quantized=True, device="cuda")
    index = InvertedIndex.build(docs, device="cuda", block_size=1024)
    rng = np.random.default_rng(1)
    for share in (0.002, 0.3, 0.9):
        mask = rng.random(index.n_docs) < share
        rows = torch.from_numpy(np.flatnonzero(mask)).cuda()
        sub = InvertedIndex.build(docs[rows], device="cuda", block_size=1024)
        want_s, want_i = Searcher(sub, backend="gpu").search(queries, 100)
        want_i = torch.where(want_i >= 0, rows[want_i.clamp_min(0)], -1)
        for route in ("subset", "widen"):
            searcher = Searcher(index, config=SearchConfig(backend="gpu", filters={"route": route}))
            a, b = searcher.search(queries, 100, filter=mask), searcher.search(queries, 100, filter=mask)
            assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0]), (share, route)
            assert torch.equal(a[1], want_i), (share, route)
            assert torch.allclose(a[0], want_s, rtol=1e-6, atol=0), (share, route)   # (widen: the whole index's scale)


def test_lsr_search_filters_a_sharded_index(case, tmp_path, capsys):
    """``lsr search --deny-docnos`` on a sharded index folder: the run of the unsharded index with the same filter."""
    from lsr.cli import main
    from lsr.data.runs import read_run
    from lsr.index.sharded import ShardedIndex
    from lsr.storage.shards import write_vectors

    docs, queries, index = case
    ShardedIndex.build(docs.to("cpu"), 3, tmp_path / "sharded", block_size=16)
    index.to("cpu").save(tmp_path / "one")
    write_vectors(tmp_path / "q", queries.to("cpu"))
    (tmp_path / "deny.txt").write_text("\n".join(index.docnos[::3]) + "\n", encoding="utf-8")
    runs = {}
    for name in ("sharded", "one"):
        assert main(["search", "--index", str(tmp_path / name), "--queries", str(tmp_path / "q"), "--k", "25",
                     "--device", "cpu", "--backend", "torch", "--deny-docnos", str(tmp_path / "deny.txt"),
                     "--out", str(tmp_path / f"{name}.trec")]) == 0
        runs[name] = read_run(tmp_path / f"{name}.trec")
    assert runs["sharded"] == runs["one"] and runs["one"]
    assert not {d for hits in runs["one"].values() for d in hits} & set(index.docnos[::3])
    capsys.readouterr()
    assert main(["search", "--index", str(tmp_path / "sharded"), "--queries", str(tmp_path / "q"), "--device", "cpu",
                 "--deny-docnos", str(tmp_path / "deny.txt"), "--explain"]) == 2
    assert "--explain with a filter plans one unsharded index" in capsys.readouterr().err
