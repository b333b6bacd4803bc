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

Under ``torchrun --nproc-per-node W`` (ranks may share one GPU: ``cuda:LOCAL_RANK % device_count``), rows
``distributed`` (rank 0 writes them): every rank builds its partition of the same synthetic collection
(strong scaling: N docs split W ways; ``--weak``: N docs per rank, every rank's partition holding the
same N synthetic docs, W*N in all; ``--replicate``: every rank holds all N docs and searches 1/W of each batch,
rows ``replicated``) and times ``DistributedSearcher.search`` on B-query batches
(broadcast + local exact top-k + all-gather + merge). ``--check`` (strong scaling): rank 0 compares
with a single index afterwards (bit_identical).

Bit-identity: every sharded / distributed row compares its results of the first batch with the single
index's (exact equality of scores and doc ids). CPU dry run: ``--device cpu --docs 20k --batches 8 --ks 10``.
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
from lsr.parallel.sharded_index import ShardedIndex, partition_bounds
from lsr.parallel.sharded_search import ShardedSearcher, merge_hit_lists
from lsr.search.searcher import Searcher

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


def time_batches(results: Results, row: dict, search, queries, B: int, k: int, repeats: int, ref=None) -> dict:
    """Time search(window of B queries, k) and add a row (qps, peak memory, bit_identical vs ref)."""
    try:
        with PeakMemory() as peak:
            ms = time_calls(lambda i: search(window(queries, B, i), k), repeats)
        row = row | quantiles(ms) | {"peak_extra_mb": peak.extra_mb, "qps": B / quantiles(ms)["ms"] * 1000}
        if ref is not None:
            row["bit_identical"] = same(search(window(queries, B, 0), k), ref)
    except torch.cuda.OutOfMemoryError as e:
        row["error"] = f"OOM: {str(e)[:120]}"
        torch.cuda.empty_cache()
    return results.add(row)


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
    import torch.distributed as dist

    from lsr.parallel.search import DistributedSearcher

    rank, W = dist.get_rank(), dist.get_world_size()
    N = parse_size(args.docs)
    t0 = time.time()
    docs = synth_docs(N, spec, device=dev)
    if args.replicate:  # every rank the whole index, 1/W of every batch
        sharded = ShardedIndex([InvertedIndex.build(docs, device=dev, block_size=args.block_size)], [0],
                               docs.vocab_size, N)
    elif args.weak:
        index = InvertedIndex.build(docs, device=dev, block_size=args.block_size)
        sharded = ShardedIndex([index if p == rank else None for p in range(W)], [p * N for p in range(W)],
                               docs.vocab_size, N * W)
    else:
        sharded = ShardedIndex.from_vectors(docs, W, device=dev, block_size=args.block_size, partitions=[rank])
    del docs
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    searcher = DistributedSearcher(sharded, dev, args.backend, stream=False)
    build_s = time.time() - t0
    queries = synth_queries(7000, spec, device=dev)
    for B in (int(b) for b in args.batches.split(",")):
        for k in (int(x) for x in args.ks.split(",")):
            def call(i: int, B=B, k=k):
                return searcher.search(window(queries, B, i) if rank == 0 else None, k)

            with PeakMemory() as peak:
                ms = time_calls(call, args.repeats)
            got = call(0)
            row = {"method": "replicated" if args.replicate else "distributed", "world_size": W, "weak": args.weak, "n_docs": N * W if args.weak else N,
                   "P": 1 if args.replicate else W, "B": B, "k": k, "build_s": build_s, "peak_extra_mb": peak.extra_mb} | quantiles(ms)
            row["qps"] = B / row["ms"] * 1000
            if args.check and not args.weak and rank == 0:
                full = synth_docs(N, spec, device=dev)
                ref = Searcher(InvertedIndex.build(full, device=dev, block_size=args.block_size),
                               backend=args.backend).search(window(queries, B, 0), k)
                row["bit_identical"] = same(got, ref)
                del full, ref
            if results is not None:
                results.add(row)
    dist.barrier()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--docs", default="8.8m", help="documents (per rank with --weak)")
    ap.add_argument("--partitions", default="2,4,8", help="single process: partition counts")
    ap.add_argument("--batches", default="500")
    ap.add_argument("--ks", default="1000")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--block-size", type=int, default=65536)
    ap.add_argument("--backend", default="auto", choices=("auto", "torch", "gpu"))
    ap.add_argument("--stream-queries", type=int, default=7000, help="queries of one streamed call")
    ap.add_argument("--stream-batch", type=int, default=None, help="query batch inside a streamed call")
    ap.add_argument("--memory-cap-gib", type=float, default=None, help="cap device memory after the single index")
    ap.add_argument("--weak", action="store_true", help="torchrun: N docs per rank (weak scaling)")
    ap.add_argument("--check", action="store_true", help="torchrun, strong scaling: compare with one index")
    ap.add_argument("--replicate", action="store_true", help="torchrun: every rank holds the whole index and "
                    "searches 1/W of each batch (replica groups of one partition)")
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
    print(format_table(results.rows, ["method", "P", "n_docs", "B", "k", ("ms", ".2f"), ("qps", ".0f"),
                                      ("stream_gbps", ".1f"), ("peak_extra_mb", ".0f"), "bit_identical"]))


if __name__ == "__main__":
    main()
