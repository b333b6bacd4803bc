"""Benchmark filtered search and live updates (issue targets: docs/guide/filters.md), baselines in the same run.

    PYTHONPATH=. python scripts/bench_updates.py --out OUT [--n-docs 8.8m] [--batch 500] [--k 1000]
        [--shares 0.5,0.1,0.001] [--upserts 200000] [--upsert-batch 1000] [--compact-changes 1000000]

Rows (OUT/bench_updates.json, .csv; a short table last):

* ``filtered``: ``Searcher.search(filter=mask)`` at each allowed share of a seeded random mask, B queries, against
  the unfiltered search of the same batch (``qps_ratio``); B=1 latency per query; ``exact``: the filtered hits equal
  those of an index built from the allowed documents, on a query subset.
* ``upserts``: vector upserts per second into a ``LiveIndex`` of the collection (batches of ``--upsert-batch``,
  each fsynced in the log), alone and while a thread searches (that thread's QPS against the QPS with no writer).
* ``visibility``: seconds from an upsert's return until a search returns the new document.
* ``compaction``: seconds to fold ``--compact-changes`` upserts into a new base.

Documents and queries: ``lsr.benchmarks.synth`` on the device. ``--device cpu`` is a dry run (small sizes).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from lsr.benchmarks.harness import Results, environment, format_table, quantiles, synchronize, time_calls
from lsr.benchmarks.synth import SynthSpec, synth_docs, synth_queries
from lsr.index.inverted import InvertedIndex
from lsr.live import LiveIndex, LiveSearcher
from lsr.search import Searcher
from lsr.search.filters import DocFilter
from lsr.sparse import SparseVectors


def count(text: str) -> int:
    text = text.lower()
    scale = {"k": 1e3, "m": 1e6}.get(text[-1], 1)
    return int(float(text.rstrip("km")) * scale)


def filtered_rows(res: Results, index: InvertedIndex, queries: SparseVectors, args: argparse.Namespace) -> None:
    searcher = Searcher(index)
    rng = np.random.default_rng(0)
    base = quantiles(time_calls(lambda i: searcher.search(queries, args.k), args.repeats))
    res.add({"case": "filtered", "method": "unfiltered", "share": 1.0, "B": len(queries), "k": args.k, **base,
             "qps": len(queries) / base["ms"] * 1e3})
    for share in args.shares:
        mask = rng.random(index.n_docs) < share
        flt = DocFilter.mask(mask)
        t = quantiles(time_calls(lambda i: searcher.search(queries, args.k, filter=flt), args.repeats))
        one = quantiles(time_calls(lambda i: searcher.search(queries[i % len(queries):i % len(queries) + 1], args.k,
                                                             filter=flt), args.repeats * 4))
        sub = queries[:args.exact_queries]
        rows = torch.from_numpy(np.flatnonzero(mask)).to(index.device)
        ref = Searcher(InvertedIndex.build(index.docs[rows], block_size=index.block_size, postings=index.postings))
        want = ref.search(sub, args.k)[1]
        got = searcher.search(sub, args.k, filter=flt)[1]
        exact = bool(torch.equal(torch.where(want >= 0, rows[want.clamp_min(0)], -1), got))
        res.add({"case": "filtered", "method": searcher.explain(queries, args.k, filter=flt).steps[0].choice,
                 "share": share, "B": len(queries), "k": args.k, **t, "qps": len(queries) / t["ms"] * 1e3,
                 "qps_ratio": base["ms"] / t["ms"], "b1_ms": one["ms"], "exact": exact})


def update_rows(res: Results, docs: SparseVectors, queries: SparseVectors, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        t0 = time.perf_counter()
        live = LiveIndex.create(Path(tmp) / "live", docs, block_size=args.block_size)
        res.add({"case": "create", "method": "LiveIndex.create", "s": time.perf_counter() - t0, "n_docs": len(docs)})
        spec = SynthSpec(vocab_size=docs.vocab_size)
        fresh = synth_docs(args.upsert_batch, spec, docs.device)
        searcher = LiveSearcher(live)

        def batch(j: int) -> SparseVectors:   # upserts of existing docnos (a replaced document moves to the end)
            ids = [docs.ids[(j * args.upsert_batch + i) % len(docs)] for i in range(args.upsert_batch)]
            return SparseVectors(fresh.indptr, fresh.indices, fresh.values, ids, fresh.vocab_size, validate=False)

        n_batches = max(1, args.upserts // args.upsert_batch)
        t0 = time.perf_counter()
        for j in range(n_batches):
            live.upsert(batch(j))
        alone = n_batches * args.upsert_batch / (time.perf_counter() - t0)
        res.add({"case": "upserts", "method": "alone", "upserts_per_s": alone, "batch": args.upsert_batch})
        q = queries[:args.batch]
        idle = quantiles(time_calls(lambda i: searcher.search(q, args.k), args.repeats))
        stop, done = threading.Event(), [0]

        def writer() -> None:
            j = n_batches
            while not stop.is_set():
                live.upsert(batch(j))
                j, done[0] = j + 1, done[0] + args.upsert_batch

        thread = threading.Thread(target=writer)
        t0 = time.perf_counter()
        thread.start()
        busy = quantiles(time_calls(lambda i: searcher.search(q, args.k), args.repeats))
        stop.set()
        thread.join()
        res.add({"case": "upserts", "method": "while searching", "upserts_per_s": done[0] / (time.perf_counter() - t0),
                 "read_qps": len(q) / busy["ms"] * 1e3, "read_qps_idle": len(q) / idle["ms"] * 1e3,
                 "read_share": idle["ms"] / busy["ms"]})
        new = SparseVectors(queries.indptr[:2] - queries.indptr[0], queries.indices[:int(queries.indptr[1])],
                            queries.values[:int(queries.indptr[1])] * 100, ["fresh-doc"], queries.vocab_size,
                            validate=False)   # a document that is query 0's top hit
        live.upsert(new)
        t0 = time.perf_counter()
        hit = searcher.search_run(queries[:1], 10)
        synchronize()
        res.add({"case": "visibility", "method": "upsert -> search", "s": time.perf_counter() - t0,
                 "seen": "fresh-doc" in next(iter(hit.values()), {})})
        left = args.compact_changes - done[0] - n_batches * args.upsert_batch
        for j in range(max(0, left // args.upsert_batch)):
            live.upsert(batch(n_batches + j))
        t0 = time.perf_counter()
        live.compact()
        res.add({"case": "compaction", "method": "compact", "s": time.perf_counter() - t0,
                 "changes": max(args.compact_changes, done[0]), "n_docs": live.n_docs})
        live.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--n-docs", default="8.8m")
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--shares", default="0.5,0.1,0.001")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--exact-queries", type=int, default=8)
    ap.add_argument("--upserts", type=int, default=200_000)
    ap.add_argument("--upsert-batch", type=int, default=1000)
    ap.add_argument("--compact-changes", type=int, default=1_000_000)
    ap.add_argument("--block-size", type=int, default=65536)
    ap.add_argument("--tmp", default=None, help="where the live index folder is made (default: the system's)")
    ap.add_argument("--skip", default="", help="comma list of: filtered, updates")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run at small sizes")
    args = ap.parse_args()
    args.shares = [float(s) for s in args.shares.split(",") if s]
    dev = torch.device(args.device)
    docs = synth_docs(count(args.n_docs), SynthSpec(), dev)
    queries = synth_queries(max(args.batch, 64), SynthSpec(), dev)[:args.batch]
    res = Results(args.out, "bench_updates", environment(dev), vars(args))
    if "filtered" not in args.skip:
        filtered_rows(res, InvertedIndex.build(docs, block_size=args.block_size), queries, args)
    if "updates" not in args.skip:
        update_rows(res, docs, queries, args)
    print(format_table(res.rows, ["case", "method", "share", ("ms", ".2f"), ("qps", ".0f"), ("qps_ratio", ".2f"),
                                  ("b1_ms", ".2f"), "exact", ("upserts_per_s", ".0f"), ("read_share", ".2f"),
                                  ("s", ".3f"), "seen"]))


if __name__ == "__main__":
    main()
