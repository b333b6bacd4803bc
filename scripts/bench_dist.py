"""Sharded and distributed exact search against one index on one device (synthetic MS MARCO-like data).

One process (``python scripts/bench_dist.py --out OUT --docs 8.8m --partitions 2,4,8``), rows:

* ``single``: ``Searcher`` over one InvertedIndex, B-query batches (the reference results);
* ``sharded-resident``: ``ShardedSearcher`` with all P partitions on the device, same batches;
* ``sharded-streamed``: partitions in pinned host memory, copied to the device one after the other
  (the next copy overlapping the current search); one call searches ``--stream-queries`` queries, so
  the index crosses the bus once per call (``stream_gbps`` = index bytes / call time);
* ``merge``: ``merge_hit_lists`` of P [B, k] lists alone (the merge a distributed search adds per batch).

``--memory-cap-gib G`` caps this process's device memory (``torch.cuda.set_per_process_memory_fraction``)
after the single index has been measured and freed: with G below the index size, the streamed rows show
an index larger than the (capped) device memory searched exactly.

Under ``torchrun --nproc-per-node W`` (ranks may share one GPU: ``cuda:LOCAL_RANK % device_count``; rank 0
writes the rows), every rank builds one index of the same N synthetic docs, and rank 0 measures the one-GPU
baseline of every row on its own index in the same job (``qps_1gpu``, ``vs_1gpu``) while the others wait:

* ``batch`` (``--batch-queries``, default 6,980 and 28,000): a whole query set through the batch route of
  ``lsr search`` (``lsr.parallel.batch.search_batch``, replicated: every rank the whole index and its slice of
  the queries, one gather to rank 0 at the end), wall clock including the gather and the copy to the host,
  against one GPU searching the whole set;
* ``interactive`` (``--batches``, one ``DistributedSearcher.search`` call per B-query batch) per layout of
  ``--layouts``: ``replicated``; ``weak`` (rank r's index is partition r of W*N docs: W copies of the N docs);
  ``split`` (strong scaling: partition r of the N docs);
* ``memory``: every rank's index size and peak device memory.

Bit-identity: every row compares its results (first batch; the whole set for ``batch``) with the one index's
(weak: the merge of the W shifted copies of the one index's top-k, which is the exact top-k of W copies).
Smoke runs: ``--docs 200k --batch-queries 700,2800`` on one GPU with ``--nproc-per-node 2``; on the CPU
``torchrun --nproc-per-node 2 scripts/bench_dist.py --device cpu --docs 20k --batches 8 --ks 10
--batch-queries 40,90 --repeats 2 --batch-repeats 1``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from lsr.benchmarks.harness import PeakMemory, Results, environment, format_table, quantiles, synchronize, time_calls
from lsr.benchmarks.synth import SynthSpec, synth_docs, synth_queries
from lsr.index.inverted import InvertedIndex
from lsr.index.sharded import ShardedIndex, partition_bounds
from lsr.parallel.search import DistributedSearcher
from lsr.search.searcher import Searcher
from lsr.search.sharded import ShardedSearcher, merge_hit_lists, shift_ids
from lsr.utils.host_copy import copy_to_host

GIB = 1 << 30


def parse_size(s: str) -> int:
    s = s.strip().lower()
    mult = {"k": 1_000, "m": 1_000_000}.get(s[-1], 1)
    return int(float(s[:-1] if s[-1] in "km" else s) * mult)


def window(queries, B: int, i: int):
    start = (i * B) % max(1, len(queries) - B + 1)
    return queries[start:start + B]


def same(a, b) -> bool:
    return bool(torch.equal(a[0].cpu(), b[0].cpu()) and torch.equal(a[1].cpu(), b[1].cpu()))


def time_batches(results: Results | None, row: dict, search, queries, B: int, k: int, repeats: int, ref=None,
                 add: bool = True) -> dict:
    """Time search(window of B queries, k) and add a row (qps, peak memory, bit_identical vs ref); with
    ``add=False`` return the row only."""
    try:
        with PeakMemory() as peak:
            ms = time_calls(lambda i: search(window(queries, B, i), k), repeats)
        row = row | quantiles(ms) | {"peak_extra_mb": peak.extra_mb, "qps": B / quantiles(ms)["ms"] * 1000}
        if ref is not None:
            row["bit_identical"] = same(search(window(queries, B, 0), k), ref)
    except torch.cuda.OutOfMemoryError as e:
        row["error"] = f"OOM: {str(e)[:120]}"
        torch.cuda.empty_cache()
    return results.add(row) if add else row


def single_process(args, results: Results, dev: torch.device, docs, queries) -> None:
    batches = [int(b) for b in args.batches.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    N = len(docs)
    index = InvertedIndex.build(docs, device=dev, block_size=args.block_size)
    results.config["index_gib"] = index.memory_bytes() / GIB
    single = Searcher(index, backend=args.backend)
    refs = {(B, k): single.search(window(queries, B, 0), k) for B in batches for k in ks}
    big = queries[:args.stream_queries]
    refs |= {("big", k): single.search(big, k) for k in ks}
    for B in batches:
        for k in ks:
            time_batches(results, {"method": "single", "n_docs": N, "P": 1, "B": B, "k": k}, single.search,
                         queries, B, k, args.repeats)
    max_scores = index.max_scores  # the collection's term maxima, which every partition gets
    del single, index
    docs = docs.to("cpu")
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        if args.memory_cap_gib:
            total = torch.cuda.get_device_properties(dev).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, args.memory_cap_gib * GIB / total), dev)
            results.config["memory_cap_gib"] = args.memory_cap_gib
    for P in (int(p) for p in args.partitions.split(",")):
        sharded = build_on_host(docs, P, dev, args.block_size, max_scores)
        base = {"n_docs": N, "P": P, "index_gib": sharded.memory_bytes() / GIB}
        if not args.memory_cap_gib or base["index_gib"] < args.memory_cap_gib:
            resident_rows(args, results, dev, sharded, queries, refs, base)
        if dev.type == "cuda":
            streamed_rows(args, results, dev, sharded, big, refs, base)
        for B in batches:
            for k in ks:
                lists = [_fake_list(B, k, p, dev) for p in range(P)]
                ms = time_calls(lambda i, k=k, lists=lists: merge_hit_lists(lists, k), args.repeats)
                results.add({"method": "merge", "P": P, "B": B, "k": k} | quantiles(ms))


def resident_rows(args, results: Results, dev: torch.device, sharded: ShardedIndex, queries, refs, base) -> None:
    """All partitions on the device, searched one after another per batch."""
    try:
        resident = ShardedSearcher(sharded, dev, args.backend, stream=False)
    except torch.cuda.OutOfMemoryError as e:
        results.add(base | {"method": "sharded-resident", "error": f"OOM: {str(e)[:120]}"})
    else:
        for B, k in (key for key in refs if key[0] != "big"):
            time_batches(results, base | {"method": "sharded-resident", "B": B, "k": k}, resident.search,
                         queries, B, k, args.repeats, refs[(B, k)])
        del resident
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def streamed_rows(args, results: Results, dev: torch.device, sharded: ShardedIndex, big, refs, base) -> None:
    """Partitions in pinned host memory; one call searches all of ``big`` (the index crosses once)."""
    streamed = ShardedSearcher(sharded, dev, args.backend, stream=True)
    for k in (key[1] for key in refs if key[0] == "big"):
        with PeakMemory() as peak:
            ms = time_calls(lambda i, k=k: streamed.search(big, k, query_batch=args.stream_batch), 2)
        q = quantiles(ms)
        results.add(base | {"method": "sharded-streamed", "B": len(big), "k": k} | q |
                    {"peak_extra_mb": peak.extra_mb, "qps": len(big) / q["ms"] * 1000,
                     "stream_gbps": base["index_gib"] * GIB / 1e9 / (q["ms"] / 1000),
                     "bit_identical": same(streamed.search(big, k), refs[("big", k)])})


def build_on_host(docs_cpu, P: int, dev: torch.device, block_size: int, max_scores: torch.Tensor) -> ShardedIndex:
    """P partitions built one at a time on ``dev`` (peak: one partition's build) and kept in host memory."""
    bounds = partition_bounds(len(docs_cpu), P)
    parts = []
    for p in range(P):
        index = InvertedIndex.build(docs_cpu[bounds[p]:bounds[p + 1]], device=dev, block_size=block_size)
        index.max_scores = max_scores.to(dev)
        parts.append(index.to("cpu"))
        del index
    return ShardedIndex(parts, bounds[:-1], docs_cpu.vocab_size, len(docs_cpu))


def _fake_list(B: int, k: int, seed: int, dev: torch.device):
    g = torch.Generator().manual_seed(seed)
    s = torch.sort((torch.randint(1, 4000, (B, k), generator=g).float() / 64), dim=1, descending=True).values
    i = torch.randint(0, 1 << 30, (B, k), generator=g).sort(dim=1).values
    return s.to(dev), i.to(dev)


def distributed(args, results: Results | None, dev: torch.device, spec: SynthSpec) -> None:
    """Every rank builds the same N synthetic docs into one index; the layouts wrap it (replicated: each rank the
    whole index; weak: rank r's copy is partition r of W*N docs; split: partition r of the N docs, strong scaling).
    Rank 0 alone measures the one-GPU baseline of every row on its index while the other ranks wait."""
    import torch.distributed as dist

    rank, W, N = dist.get_rank(), dist.get_world_size(), parse_size(args.docs)
    t0 = time.time()
    docs = synth_docs(N, spec, device=dev)
    index = InvertedIndex.build(docs, device=dev, block_size=args.block_size)
    layouts = {"replicated": ShardedIndex([index], [0], docs.vocab_size, N),
               "weak": ShardedIndex([index if p == rank else None for p in range(W)], [p * N for p in range(W)],
                                    docs.vocab_size, N * W)}
    if "split" in args.layouts:
        layouts["split"] = ShardedIndex.from_vectors(docs, W, device=dev, block_size=args.block_size, partitions=[rank])
    del docs
    build_s = time.time() - t0
    batch_sizes = [int(q) for q in args.batch_queries.split(",") if q]
    queries = synth_queries(max([7000, *batch_sizes]), spec, device=dev)
    single = Searcher(index, backend=args.backend)
    ks = [int(x) for x in args.ks.split(",")]
    for layout in (name for name in args.layouts.split(",") if name):
        searcher = DistributedSearcher(layouts[layout], dev, args.backend, stream=False)
        interactive_rows(args, results, searcher, single, queries, layout, N, build_s)
        del searcher
    for n in batch_sizes:
        for k in ks:
            batch_rows(args, results, dev, layouts["replicated"], single, queries[:n], k)
    memory_rows(results, dev, index)
    dist.barrier()


def interactive_rows(args, results: Results | None, searcher, single, queries, layout: str, N: int,
                     build_s: float) -> None:
    """B-query batches through ``DistributedSearcher`` (one call per batch) vs one GPU's ``Searcher``."""
    import torch.distributed as dist

    rank, W = dist.get_rank(), dist.get_world_size()
    for B, k in ((int(b), int(k)) for b in args.batches.split(",") for k in args.ks.split(",")):
        one = on_rank0(rank, lambda B=B, k=k: time_batches(None, {}, single.search, queries, B, k, args.repeats,
                                                           add=False))
        with PeakMemory() as peak:
            ms = time_calls(lambda i, B=B, k=k: searcher.search(window(queries, B, i) if rank == 0 else None, k),
                            args.repeats)
        got = searcher.search(window(queries, B, 0) if rank == 0 else None, k)
        if rank == 0:
            want = expected(single.search(window(queries, B, 0), k), layout, N, W, k)
            row = {"method": "interactive", "layout": layout, "world_size": W, "n_docs": N * W if layout == "weak" else N,
                   "B": B, "k": k, "build_s": build_s, "peak_extra_mb": peak.extra_mb} | quantiles(ms)
            row |= {"qps": B / row["ms"] * 1000, "qps_1gpu": one["qps"], "bit_identical": same(got, want)}
            row["vs_1gpu"] = row["qps"] / one["qps"]
        if args.profile:
            profile_calls(args, searcher, queries, B, k, f"{layout}-B{B}")
        slice_ms = local_slice_ms(args, searcher, queries, B, k)
        if rank == 0:
            results.add(row | slice_ms)


def profile_calls(args, searcher, queries, B: int, k: int, name: str) -> None:
    """torch.profiler over ``args.profile`` interactive calls: rank 0's operators by host time and by device
    time, written to OUT/profile-NAME.txt (where a call's time goes beyond its own search)."""
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    rank = dist.get_rank()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    dist.barrier()
    with profile(activities=activities) as prof:
        for i in range(args.profile):
            searcher.search(window(queries, B, i) if rank == 0 else None, k)
        synchronize()
    if rank == 0:
        table = prof.key_averages()
        text = [table.table(sort_by=key, row_limit=25) for key in ("cpu_time_total", "self_cpu_time_total",
                                                                    "device_time_total")]
        (Path(args.out) / f"profile-{name}.txt").write_text("\n\n".join(text))


def local_slice_ms(args, searcher, queries, B: int, k: int) -> dict:
    """The compute floor of an interactive call: every rank's own share of a B-query batch searched locally
    at once, no collective (slowest rank), against which the call's collectives are the rest."""
    import torch.distributed as dist

    from lsr.parallel.plan import slice_bounds

    role = searcher.role
    bounds = slice_bounds(B, role.n_slices)
    share = window(queries, B, 0)[bounds[role.query_slice]:bounds[role.query_slice + 1]].to(searcher.device)
    dist.barrier()
    ms = quantiles(time_calls(lambda i: searcher.local.search(share, k, show_progress_bar=False), args.repeats))["ms"]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, ms)
    return {"local_ms_max": max(every), "local_ms_min": min(every)}


def on_rank0(rank: int, fn):
    """``fn()`` on rank 0 while the other ranks wait (a one-GPU baseline measured in the same job)."""
    import torch.distributed as dist

    out = fn() if rank == 0 else None
    dist.barrier()
    return out


def expected(single_hits, layout: str, N: int, W: int, k: int):
    """The exact top-k of a layout, derived from the one index's: weak = W copies of the same N docs (doc d of
    copy c is d + c*N), so its top-k is the merge of the W shifted copies of the one-index top-k."""
    if layout != "weak":
        return single_hits
    s, i = single_hits
    return merge_hit_lists([(s, shift_ids(i, c * N)) for c in range(W)], k)


def batch_rows(args, results: Results | None, dev: torch.device, replicated: ShardedIndex, single, queries, k: int):
    """A whole query set: one process on rank 0's GPU (``Searcher``, results copied to the host) vs every rank
    its slice with no per-batch collective and one gather to rank 0 (``search_batch``), wall clock."""
    import torch.distributed as dist

    from lsr.parallel.batch import search_batch

    rank, n = dist.get_rank(), len(queries)

    def one_gpu(i: int):  # the one-process path's result on the host, as lsr search's run writer takes it
        s, d = single.search(queries, k, query_batch=args.query_batch)
        return copy_to_host(s), copy_to_host(d)

    base_ms = on_rank0(rank, lambda: time_calls(one_gpu, args.batch_repeats))
    ms = time_calls(lambda i: search_batch(replicated, queries if rank == 0 else None, k, dev, backend=args.backend,
                                           query_batch=args.query_batch), args.batch_repeats)
    hits = search_batch(replicated, queries if rank == 0 else None, k, dev, backend=args.backend,
                        query_batch=args.query_batch)
    if rank == 0:
        q, q1 = quantiles(ms), quantiles(base_ms)
        row = {"method": "batch", "layout": "replicated", "world_size": dist.get_world_size(), "n_docs": replicated.n_docs,
               "B": n, "k": k} | q | {"qps": n / q["ms"] * 1000, "qps_1gpu": n / q1["ms"] * 1000, "ms_1gpu": q1["ms"]}
        row |= {"vs_1gpu": row["qps"] / row["qps_1gpu"], "bit_identical": same((hits.scores, hits.doc_idx), one_gpu(0))}
    phases = batch_phases(args, replicated, queries if rank == 0 else None, k, dev)
    if rank == 0:
        results.add(row | phases)


def batch_phases(args, replicated: ShardedIndex, queries, k: int, dev: torch.device) -> dict:
    """Where the batch route's time goes: ``search_batch``'s three steps timed apart (wall clock, each rank
    synchronised before and after): the query broadcast, each rank's own slice (slowest and fastest rank), and
    the gather + merge into rank 0's host result."""
    import torch.distributed as dist

    from lsr.parallel.batch import _gather_merge_to_rank0
    from lsr.parallel.exchange import broadcast_queries
    from lsr.parallel.plan import plan_batch
    from lsr.parallel.topology import comm_device

    def step(fn):
        synchronize()
        dist.barrier()
        t = time.perf_counter()
        out = fn()
        synchronize()
        return out, (time.perf_counter() - t) * 1000

    rank, comm = dist.get_rank(), comm_device()
    times = []
    for _ in range(args.batch_repeats):
        (qs, kk), t_b = step(lambda: broadcast_queries(queries, k, None, comm))
        plan = plan_batch(replicated.n_partitions, dist.get_world_size(), len(qs))
        mine = plan.query_range(rank)
        searcher = ShardedSearcher(replicated, dev, args.backend, stream=False)
        local, t_s = step(lambda: searcher.search(qs[mine.start:mine.stop], kk, args.query_batch,
                                                  show_progress_bar=False))
        _, t_g = step(lambda: _gather_merge_to_rank0(local, plan, kk, comm, replicated.n_docs))
        times.append((t_b, t_s, t_g))
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, sorted(times, key=lambda t: sum(t))[len(times) // 2])
    return {"broadcast_ms": max(t[0] for t in every), "slice_ms_max": max(t[1] for t in every),
            "slice_ms_min": min(t[1] for t in every), "gather_merge_ms": max(t[2] for t in every)}


def memory_rows(results: Results | None, dev: torch.device, index: InvertedIndex) -> None:
    """Index bytes and peak device memory of every rank (one row each, from rank 0)."""
    import torch.distributed as dist

    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else 0
    mine = {"index_gib": index.memory_bytes() / GIB, "peak_gib": peak / GIB}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if results is not None:
        for r, m in enumerate(every):
            results.add({"method": "memory", "rank": r} | m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs", default="8.8m", help="documents (per rank with --weak)")
    ap.add_argument("--partitions", default="2,4,8", help="single process: partition counts")
    ap.add_argument("--batches", default="64,500", help="query batch sizes B of the interactive rows")
    ap.add_argument("--ks", default="1000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=65536)
    ap.add_argument("--backend", default="auto", choices=("auto", "torch", "gpu"))
    ap.add_argument("--stream-queries", type=int, default=7000, help="queries of one streamed call")
    ap.add_argument("--stream-batch", type=int, default=None, help="query batch inside a streamed call")
    ap.add_argument("--memory-cap-gib", type=float, default=None, help="cap device memory after the single index")
    ap.add_argument("--layouts", default="replicated,weak",
                    help="torchrun: interactive layouts to time (replicated, weak, split), comma-separated")
    ap.add_argument("--batch-queries", default="6980,28000",
                    help="torchrun: sizes of whole query sets searched by the batch route (empty: none)")
    ap.add_argument("--batch-repeats", type=int, default=3, help="timed repeats of each batch-route row")
    ap.add_argument("--profile", type=int, default=0, metavar="CALLS",
                    help="torchrun: profile this many interactive calls per row (OUT/profile-LAYOUT-BN.txt)")
    ap.add_argument("--query-batch", type=int, default=None, help="queries per search batch inside a rank")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    spec = SynthSpec() if args.device.startswith("cuda") else SynthSpec(block_rows=4096)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from lsr.parallel.topology import init_distributed

        dev = init_distributed(args.device)
        import torch.distributed as dist

        rank = dist.get_rank()
        results = Results(Path(args.out), "bench_dist", environment(dev, world_size=dist.get_world_size()),
                          {"args": vars(args)}) if rank == 0 else None
        distributed(args, results, dev, spec)
        dist.destroy_process_group()
        if results is None:
            return
    else:
        dev = torch.device(args.device)
        results = Results(Path(args.out), "bench_dist", environment(dev), {"args": vars(args)})
        docs = synth_docs(parse_size(args.docs), spec, device=dev)
        queries = synth_queries(max(7000, args.stream_queries), spec, device=dev)
        synchronize()
        results.config["partition_bounds"] = {P: partition_bounds(len(docs), int(P))[:3]
                                              for P in args.partitions.split(",")}
        single_process(args, results, dev, docs, queries)
    results.save()
    print(format_table(results.rows, ["method", "layout", "P", "world_size", "rank", "n_docs", "B", "k", ("ms", ".2f"),
                                      ("qps", ".0f"), ("qps_1gpu", ".0f"), ("vs_1gpu", ".2f"), ("stream_gbps", ".1f"),
                                      ("index_gib", ".2f"), ("peak_gib", ".2f"), ("local_ms_max", ".2f"),
                                      ("slice_ms_max", ".1f"), ("gather_merge_ms", ".1f"), "bit_identical"]))


if __name__ == "__main__":
    main()
