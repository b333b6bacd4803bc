"""The search plan (lsr.search.plan) as ``Searcher.explain`` and ``lsr search --explain`` print it: every choice with
its reason, choices forced through ``SearchConfig``, one-line errors for invalid values, and the plan being what the
search runs (under TRITON_INTERPRET=1 on the CPU, tests/conftest.py)."""

from __future__ import annotations

import functools

import pytest
import torch

from lsr.cli import main
from lsr.index.inverted import InvertedIndex
from lsr.search import SearchConfig, Searcher, open_searcher
from lsr.search.gpu_search import gpu_search
from lsr.search.index_cache import index_cache
from lsr.sparse import SparseVectors
from lsr.testing import assert_exact_topk, float64_scores, random_dense_rows, seeded_generator
from tests.conftest import DEV

rand_vectors = functools.partial(random_dense_rows, device=DEV)


@pytest.fixture
def case() -> tuple[SparseVectors, SparseVectors, InvertedIndex]:
    gen = seeded_generator()
    docs = rand_vectors(120, 30, 0.2, gen, quantized=True)
    queries = rand_vectors(70, 30, 0.3, gen, quantized=True, empty_rows=1)
    return docs, queries, InvertedIndex.build(docs, device=DEV, block_size=64, postings="float32")


def lines(plan) -> dict[str, str]:
    """{step: "choice  (why)"} of a printed plan."""
    rows = str(plan).splitlines()[1:]
    return {row[:16].strip(): row[16:].strip() for row in rows}


def test_explain_prints_every_step_with_its_reason(case):
    docs, queries, index = case
    plan = Searcher(index, backend="gpu").explain(queries[:5], k=10)
    assert str(plan) == plan.describe() and str(plan).startswith("search plan: 5 queries, k=10")
    got = lines(plan)
    assert list(got) == ["backend", "query batches", "route", "span scorer", "pass 1", "pass 2", "selection",
                         "fallbacks", "cuda graph", "query chunks"]
    assert got["backend"] == "gpu  (forced by config)"
    assert got["route"] == "block  (auto)"
    if not torch.cuda.is_available():
        assert got["span scorer"].startswith("triton, span 128 (1 spans)  (auto: the cuda scorer cannot run (fewer")
        assert got["pass 2"].endswith("(the triton span scorer has no coarse mode)")
        assert got["cuda graph"] == "no  (cpu device)"
    assert plan.backend == "gpu" and plan.route == "block" and plan.block is not None
    cpu = Searcher(index.to("cpu"))
    assert lines(cpu.explain(queries, k=10))["backend"] == "torch  (auto: cpu device (the gpu backend runs on CUDA))"
    assert lines(cpu.explain(queries, k=10))["route"].startswith("torch-reference")


def test_auto_route_and_kernel_reasons(case):
    docs, queries, index = case
    searcher = Searcher(index, backend="gpu")
    big = lines(searcher.explain(queries, k=10))   # 70 queries on 120 docs, the Triton span scorer
    assert big["route"].startswith("dense-scatter  (auto: 120 docs <= dense.max_docs and 70 queries >=")
    small = SearchConfig(backend="gpu", cuda={"span": 64})
    if not torch.cuda.is_available():
        reason = lines(Searcher(index, config=small).explain(queries[:3], k=5))["span scorer"]
        assert reason.endswith("(auto: the cuda scorer cannot run (cpu device))")
    grouped = lines(Searcher(index, config=small.replace(triton={"group": 2})).explain(queries[:3], k=5))
    grouped = grouped["span scorer"]
    assert "group 2" in grouped
    compact = InvertedIndex.build(docs, device=DEV, block_size=64, postings="compact")
    got = lines(Searcher(compact, backend="gpu").explain(queries, k=10))["route"]
    assert got == "block  (auto: compact postings (the scatter kernel reads float32 ones))"


@pytest.mark.slow
def test_forced_choices_are_honoured_and_run(case):
    docs, queries, index = case
    q = queries[:7]
    forced = {"dense-scatter": SearchConfig(backend="gpu", route="dense-scatter"),
              "block": SearchConfig(backend="gpu", route="block", triton={"span": 64}),
              "twin": SearchConfig(backend="gpu", route="block", scorer="torch", triton={"span": 64},
                                   coarse={"span": 128, "min_batch": 1}, graphs={"enabled": False})}
    plans = {name: Searcher(index, config=cfg).explain(q, k=8) for name, cfg in forced.items()}
    assert lines(plans["dense-scatter"])["route"] == "dense-scatter  (forced by config)"
    assert plans["dense-scatter"].block is None
    assert lines(plans["block"])["route"] == "block  (forced by config)"
    twin = lines(plans["twin"])
    assert twin["span scorer"] == "torch, span 64 (2 spans)  (forced by config)"
    assert twin["pass 2"].startswith("coarse 16-bit sums, span 128") and "coarse floor" in twin
    assert lines(Searcher(index, config=forced["twin"].replace(coarse={"min_batch": 8})).explain(q, k=8))["pass 2"] \
        .endswith("(7 queries < coarse.min_batch: the coarse selection would cost more than it saves)")
    assert lines(Searcher(index, config=forced["block"].replace(graphs={"enabled": False})).explain(q, k=8))["cuda graph"] \
        == "no  (graphs.enabled=False)"
    results = [Searcher(index, config=cfg).search(q, k=8) for cfg in forced.values()]
    assert all(torch.equal(r[0], results[0][0]) and torch.equal(r[1], results[0][1]) for r in results[1:]), \
        "every route gives the same bits"
    assert lines(Searcher(index, config=SearchConfig(batches={"size": 3})).explain(q, k=8))["query batches"] \
        == "3 of <= 3  (batches.size; each batch is planned alike)"


def test_explain_plans_what_the_search_reuses(case):
    docs, queries, index = case
    searcher = Searcher(index, config=SearchConfig(backend="gpu", route="block", triton={"span": 64}))
    searcher.explain(queries[:4], k=6)
    keys = index_cache(index).plan_keys()
    searcher.search(queries[:4], k=6)
    assert index_cache(index).plan_keys() == keys, "the search found the plan explain had made"


def test_invalid_config_values_are_one_line_errors(case):
    docs, queries, index = case
    for bad, text in [({"route": "csr"}, "SearchConfig.route must be one of auto, block, dense-scatter, got 'csr'"),
                      ({"backend": "triton"}, "SearchConfig.backend must be one of auto, torch, gpu, got 'triton'"),
                      ({"scorer": "ptx"}, "SearchConfig.scorer must be one of auto, cuda, triton, torch, got 'ptx'"),
                      ({"triton": {"span": 0}}, "SearchConfig.triton.span must be a power of two in \\[32, "),
                      ({"graphs": {"enabled": "yes"}}, "SearchConfig.graphs.enabled must be bool, got 'yes'"),
                      ({"coarse": {"rescue_cells": -1}}, "SearchConfig.coarse.rescue_cells must be >= 0, got -1"),
                      ({"coarse": {"spam": 1}}, "unknown key\\(s\\) in SearchConfig.coarse: \\['spam'\\]")]:
        with pytest.raises(ValueError, match=text) as err:
            SearchConfig(**bad)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="backend") as err:
        Searcher(index, backend="triton")
    assert "\n" not in str(err.value)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="SearchConfig\\(scorer='cuda'\\) cannot run here: ") as err:
            gpu_search(index, queries[:2], 5, SearchConfig(scorer="cuda", route="block"))
        assert "\n" not in str(err.value)
    compact = InvertedIndex.build(docs, device=DEV, block_size=64, postings="compact")
    with pytest.raises(ValueError, match="route='dense-scatter'\\) reads float32 postings"):
        gpu_search(compact, queries[:2], 5, SearchConfig(route="dense-scatter"))


def test_open_searcher_picks_the_searcher_of_an_index_or_folder(case, tmp_path):
    from lsr.index.sharded import ShardedIndex
    from lsr.search.sharded import ShardedSearcher
    docs, queries, index = case
    cpu_docs = docs.to("cpu")
    index.save(tmp_path / "single")
    ShardedIndex.build(cpu_docs, 2, tmp_path / "sharded", block_size=64)
    want = Searcher(index.to("cpu"), backend="torch").search(queries.to("cpu"), k=9)
    for source in (index, tmp_path / "single", str(tmp_path / "sharded"), ShardedIndex.load(tmp_path / "sharded")):
        searcher = open_searcher(source, device="cpu", config=SearchConfig(backend="torch"))
        sharded = "sharded" in str(source) or isinstance(source, ShardedIndex)
        assert isinstance(searcher, ShardedSearcher if sharded else Searcher)
        got = searcher.search(queries.to("cpu"), k=9)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    with pytest.raises(TypeError, match="open_searcher takes"):
        open_searcher(42)


def test_cli_search_explain_prints_the_plan_and_writes_nothing(case, tmp_path, capsys):
    from lsr.storage.shards import write_vectors
    docs, queries, index = case
    index.to("cpu").save(tmp_path / "idx")
    write_vectors(tmp_path / "q", queries.to("cpu"))
    run = tmp_path / "run.trec"
    argv = ["search", "--index", str(tmp_path / "idx"), "--queries", str(tmp_path / "q"), "--device", "cpu",
            "--k", "10"]
    assert main(argv + ["--explain", "--backend", "gpu"]) == 0
    out = capsys.readouterr().out
    assert "search plan: 70 queries, k=10" in out and "route          dense-scatter" in out
    assert main(argv + ["--explain", "--out", str(run)]) == 0
    assert "backend        torch" in capsys.readouterr().out and not run.exists(), "--explain writes no run"
    assert main(argv) == 2
    assert "--out is required" in capsys.readouterr().err
    assert main(argv + ["--out", str(run)]) == 0 and run.exists()


def ran_as_planned(searcher: Searcher, queries: SparseVectors, k: int) -> tuple[dict[str, str], dict]:
    """(the printed plan's steps, what the search then ran: ``IndexCache.ran`` per step) of one search, on a cleared
    cache (the plan is made afresh)."""
    cache = index_cache(searcher.index)
    cache.clear()
    plan = searcher.explain(queries, k)
    got = searcher.search(queries, k)
    ran = {step: cache.ran.choices(step) for step in ("route", "span scorer", "pass 2", "rescoring", "cuda graph")}
    return lines(plan), {"plan": plan, "ran": ran, "result": got}


# every route a CPU runs under the interpreter, forced through the config: (config, the plan's route and scorer,
# pass 2 coarse or not)
ROUTES = [(SearchConfig(backend="torch"), "torch-reference", None, None),
          (SearchConfig(backend="gpu", route="dense-scatter"), "dense-scatter", None, None),
          (SearchConfig(backend="gpu", route="block", scorer="triton", triton={"span": 64}), "block", "triton", False),
          (SearchConfig(backend="gpu", route="block", scorer="torch", triton={"span": 64}, coarse={"enabled": False}),
           "block", "torch", False),
          (SearchConfig(backend="gpu", route="block", scorer="torch", triton={"span": 64},
                        coarse={"span": 128, "min_batch": 1}), "block", "torch", True)]


@pytest.mark.parametrize("cfg, route, scorer, coarse", ROUTES)
def test_every_route_forced_by_config_runs_as_explained(case, cfg, route, scorer, coarse):
    """What ``explain`` names is what the search runs (the executors' own counts, ``IndexCache.ran``), and its
    result is the float64 reference's top k."""
    docs, queries, index = case
    q, k = queries[:7], 8
    steps, got = ran_as_planned(Searcher(index, config=cfg), q, k)
    ran = got["ran"]
    assert steps["route"].startswith(route) and ran["route"] == {route: 1}
    assert_exact_topk(*got["result"], float64_scores(q, docs), k)
    if scorer is None:
        assert ran["span scorer"] == {} and ran["pass 2"] == {} and "span scorer" not in steps
        return
    assert got["plan"].scorer == scorer and steps["span scorer"].startswith(f"{scorer}, span 64")
    assert set(ran["span scorer"]) == {scorer} and ran["span scorer"][scorer] >= 2, "pass 1 and pass 2 launched"
    assert steps["pass 2"].startswith("coarse" if coarse else "exact") and ("coarse" in ran["pass 2"]) == coarse
    assert ran["rescoring"] == ({"triton csr": 1} if coarse else {}), steps.get("rescoring")
    assert steps["cuda graph"].startswith("no") and set(ran["cuda graph"]) == {"eager"}


@pytest.mark.gpu
def test_gpu_scorers_and_graphs_run_as_explained():
    """On a GPU: the CUDA scorer (coarse and exact pass 2), the Triton one, and CUDA graphs replayed or not, each
    forced through the config, run as ``explain`` names them, with the float64 reference's top k."""
    from lsr.benchmarks.synth import synth_docs, synth_queries
    docs = synth_docs(40_000, device="cuda")
    index = InvertedIndex.build(docs, device="cuda", block_size=8192, postings="float32")
    q, k = synth_queries(24, device="cuda"), 100
    ref = float64_scores(q, docs)
    for cfg, scorer, coarse, replay in [
            (SearchConfig(route="block", coarse={"min_batch": 1}), "cuda", True, True),
            (SearchConfig(route="block", coarse={"enabled": False}, graphs={"enabled": False}), "cuda", False, False),
            (SearchConfig(route="block", scorer="triton"), "triton", False, True),
            (SearchConfig(route="block", scorer="torch", graphs={"enabled": True}), "torch", True, False)]:
        searcher = Searcher(index, config=cfg)
        steps, got = ran_as_planned(searcher, q, k)
        ran = got["ran"]
        assert got["plan"].scorer == scorer and set(ran["span scorer"]) == {scorer}
        assert steps["pass 2"].startswith("coarse" if coarse else "exact") and ("coarse" in ran["pass 2"]) == coarse
        assert steps["cuda graph"].startswith("replayed" if replay else "no")
        searcher.search(q, k)   # a small batch is captured at its first search: the second replays it
        assert ("replayed" in index_cache(index).ran.choices("cuda graph")) == replay, steps["cuda graph"]
        assert_exact_topk(*got["result"], ref, k)


def test_a_cached_plan_holds_the_query_length_bucket_not_its_first_batch_s_length(case):
    """Plans are cached per query-length bucket; the plan holds the bucket, so a later batch of the bucket with
    longer queries fits what the plan sized (a CUDA graph's term buffer holds B x the plan's max_terms: a plan that
    kept its first batch's length ran later, longer batches eagerly)."""
    docs, _, index = case
    gen = seeded_generator()
    short = rand_vectors(4, 30, 0.1, gen, quantized=True)
    long = rand_vectors(4, 30, 0.9, gen, quantized=True)
    searcher = Searcher(index, backend="gpu")
    first, later = searcher.explain(short, k=10).block, searcher.explain(long, k=10).block
    assert later is first, "one bucket, one cached plan"
    assert first.max_terms >= int(long.indptr.diff().max()) and first.max_terms == 64
    assert_exact_topk(*searcher.search(long, k=10), float64_scores(long, docs), 10)
