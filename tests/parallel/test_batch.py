"""The batch route of ``lsr search`` / ``lsr run`` under torchrun (lsr.parallel.batch, lsr.parallel.plan): every rank
its slice of the whole query set, one gather at the end; equal to one process byte for byte (gloo ranks on the
CPU). Also the packed messages of lsr.parallel.exchange."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from lsr.cli import main
from lsr.index import InvertedIndex
from lsr.index.sharded import ShardedIndex
from lsr.parallel.exchange import pack_hits, unpack_hits
from lsr.parallel.plan import plan_batch
from lsr.storage.shards import write_vectors
from lsr.testing import free_port, random_collection

N_DOCS, VOCAB = 70, 40
# (index, k): a plain index (every rank a replica), 2 partitions (two replica groups of 2), 5 (partitioned, P > W)
CASES = (("plain", 25), ("p2", 80), ("p5", 25))


@pytest.mark.parametrize("n_queries", [0, 1, 3, 13, 100])
def test_query_slices_cover_every_query_once_in_order(n_queries):
    for world in range(1, 9):
        for n_parts in sorted({1, 2, world, world + 1, 2 * world} | {d for d in range(1, world) if world % d == 0}):
            if n_parts < world and world % n_parts:
                continue
            plan = plan_batch(n_parts, world, n_queries)
            roles = [plan.role(r) for r in range(world)]
            n_slices = roles[0].n_slices
            slices = [plan.query_range(r) for r in range(world)]
            # the ranks of slice j (j*P .. j*P+P-1) all search the same range; the slices in order tile the set
            leaders = [slices[j * (world // n_slices)] for j in range(n_slices)]
            assert [q for s in leaders for q in s] == list(range(n_queries)), (n_parts, world)
            assert all(slices[r] == leaders[roles[r].query_slice] for r in range(world))
            held = sorted(p for r in range(world // n_slices) for p in roles[r].partitions)
            assert held == list(range(n_parts))  # each slice's ranks hold every partition once
            assert max(map(len, leaders)) - min(map(len, leaders)) <= 1
    assert plan_batch(1, 4, 13).layout == "replicas" and plan_batch(2, 4, 13).layout == "replica groups"
    assert plan_batch(5, 4, 13).layout == "partitioned" and plan_batch(3, 1, 13).layout == "one process"
    with pytest.raises(ValueError, match="3 partitions cannot be shared by 4 ranks"):
        plan_batch(3, 4, 13)


def test_the_batch_plan_prints_as_every_plan_does():
    from lsr.utils.plans import Plan, explain

    plan = plan_batch(2, 4, 13)
    assert isinstance(plan, Plan)
    lines = str(plan).splitlines()
    assert lines[0] == "batch plan: 13 queries, 2 partition(s), 4 rank(s)" and explain([None, plan]) == str(plan)
    steps = {s.name: s for s in plan.plan_steps()}
    assert list(steps) == ["layout", "rank 0", "rank 1", "rank 2", "rank 3", "merge"]
    assert steps["layout"].choice == "replica groups" and "2 copies of the index" in steps["layout"].why
    assert steps["rank 2"].choice == "partitions [0], queries 6..12 (7)"
    many = [s.name for s in plan_batch(1, 10, 100).plan_steps()]
    assert many[-2:] == ["...", "merge"] and "rank 7" in many and "rank 8" not in many
    assert [s.name for s in plan_batch(3, 1, 13).plan_steps()] == ["layout", "rank 0"]  # one process: no merge


@pytest.mark.parametrize("k", [1, 7, 40, 90])
def test_key_merge_equals_exact_topk_with_ties_padding_and_short_lists(k):
    from lsr.search.searcher import exact_topk
    from lsr.search.sharded import merge_hit_lists

    g = torch.Generator().manual_seed(k)
    parts = []
    for p in range(3):   # three partitions' lists: disjoint docs, few distinct scores (many ties), padding
        scores = torch.randint(0, 4, (6, 30), generator=g).float() * 0.25   # zeros are padding
        scores = scores.sort(dim=1, descending=True).values
        docs = torch.randperm(1000, generator=g)[:30].repeat(6, 1) + p * 1000
        parts.append((scores, torch.where(scores > 0, docs, -1)))
    parts[1][0][0] = torch.where(parts[1][1][0] >= 0, 1e-45, 0.0)   # subnormal scores keep their order too
    want = exact_topk(torch.cat([s for s, _ in parts], 1), k, torch.cat([i for _, i in parts], 1))
    got = merge_hit_lists(parts, k, n_docs=3000)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert torch.equal(merge_hit_lists(parts, k)[1], want[1])   # no bound given: exact_topk itself


def test_packed_hits_keep_every_bit():
    scores = torch.tensor([[3.5, -0.0, 1e-40], [float("inf"), 2.0, 0.0]], dtype=torch.float32)
    doc_idx = torch.tensor([[7, 1 << 40, -1], [0, 3, -1]])
    packed = pack_hits(scores, doc_idx, rows=4, failed=True)
    assert packed.dtype == torch.int64 and packed.shape == (4, 7) and bool((packed[:, -1] == 1).all())
    s, i = unpack_hits(packed, 3)
    assert torch.equal(s[:2].view(torch.int32), scores.view(torch.int32)) and torch.equal(i[:2], doc_idx)
    assert bool((s[2:] == 0).all()) and bool((i[2:] == -1).all())  # padding rows: no hit
    assert pack_hits(scores, doc_idx, rows=2).shape == (2, 6)  # no flag column unless asked


def _rank(rank: int, world: int, port: int, tmp: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    t = Path(tmp)
    logs = {}
    for name, k in CASES:  # lsr search leaves the process group when done: one per command
        argv = ["search", "--index", str(t / name), "--queries", str(t / "q"), "--k", str(k), "--out",
                str(t / f"dist-{name}.trec"), "--device", "cpu", "--backend", "torch"]
        logs[name] = _main(argv)
    logs["refused"] = _main(["search", "--index", str(t / "plain"), "--queries", str(t / "q-bad"), "--out",
                             str(t / "refused.trec"), "--device", "cpu", "--backend", "torch"])
    (t / f"log-{rank}.json").write_text(json.dumps(logs))


def _main(argv: list[str]) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(argv)
    return {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}


@pytest.mark.slow
def test_lsr_search_on_four_ranks_equals_one_process(tmp_path):
    """A plain index under torchrun (every rank a replica: a usage error before), replica groups and more
    partitions than ranks: the run file of one process, byte for byte; rank 0 alone writes and reports."""
    docs = random_collection(N_DOCS, VOCAB, 11, density=0.15, quantized=True)  # many exact ties
    write_vectors(tmp_path / "q", random_collection(13, VOCAB, 12, density=0.2, quantized=True))
    write_vectors(tmp_path / "q-bad", random_collection(3, VOCAB + 1, 12, density=0.2))
    InvertedIndex.build(docs, block_size=16).save(tmp_path / "plain")
    for n_p in (2, 5):
        ShardedIndex.build(docs, n_p, tmp_path / f"p{n_p}", block_size=16)
    mp.spawn(_rank, args=(4, free_port(), str(tmp_path)), nprocs=4)

    logs = [json.loads((tmp_path / f"log-{r}.json").read_text()) for r in range(4)]
    for name, k in CASES:
        assert [g[name]["rc"] for g in logs] == [0] * 4, [g[name] for g in logs]
        assert logs[0][name]["out"].startswith("searched 13 queries") and all(g[name]["out"] == "" for g in logs[1:])
        assert main(["search", "--index", str(tmp_path / "plain"), "--queries", str(tmp_path / "q"), "--k", str(k),
                     "--out", str(tmp_path / f"one-{name}.trec"), "--device", "cpu", "--backend", "torch"]) == 0
        got, want = (tmp_path / f"dist-{name}.trec").read_bytes(), (tmp_path / f"one-{name}.trec").read_bytes()
        assert got == want and len(want.splitlines()) > 13 * 10, name
    # rank 0 refuses the queries (another vocabulary): every rank ends with one line, none waits, nothing written
    assert [g["refused"]["rc"] for g in logs] == [1] * 4
    errors = [g["refused"]["err"] for g in logs]
    assert all(e.count("\n") == 1 and e.startswith("lsr search: error: ") for e in errors), errors
    assert "vocab_size 41" in errors[0] and all("another rank failed to check the queries" in e for e in errors[1:])
    assert not (tmp_path / "refused.trec").exists()
