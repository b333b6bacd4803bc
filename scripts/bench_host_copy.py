"""A search result's trip from the GPU to the host: ``tensor.cpu()`` (pageable, the driver's staging) against a
pinned result (``pin_memory=True``, allocated per call) and ``lsr.utils.host_copy.copy_to_host`` (two reused pinned
buffers, threaded host copy). Sizes are [n, 1000] float32 scores and int64 doc indices, as a top-1000 of n queries;
every repeat writes into fresh host memory, as a new result does (torch caches freed pinned memory, so the
first call, ``first_ms``, is what a one-shot command pays). Prints GB/s per method and size.

    PYTHONPATH=. python scripts/bench_host_copy.py --out bench_results/host-copy --queries 7000,28000
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from lsr.benchmarks.harness import Results, environment, format_table
from lsr.utils.host_copy import copy_to_host


def pinned(src: torch.Tensor) -> torch.Tensor:
    out = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
    return out.copy_(src)


METHODS = {"cpu": lambda t: t.cpu(), "pinned_result": pinned, "copy_to_host": copy_to_host}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--queries", default="7000,28000")
    ap.add_argument("--k", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    dev = torch.device("cuda")
    results = Results(args.out, "bench_host_copy", environment(dev), {"args": vars(args) | {"out": str(args.out)}})
    for n in (int(q) for q in args.queries.split(",")):
        pair = (torch.rand(n, args.k, device=dev), torch.randint(0, 1 << 30, (n, args.k), device=dev))
        nbytes = sum(t.numel() * t.element_size() for t in pair)
        for name, fn in METHODS.items():
            times = []
            for _ in range(args.repeats + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                got = [fn(t) for t in pair]
                times.append(time.perf_counter() - t0)
                del got
            ms = sorted(times[1:])[len(times[1:]) // 2] * 1e3
            results.add({"method": name, "queries": n, "mb": nbytes / 2**20, "ms": ms, "gbps": nbytes / ms / 1e6,
                         "first_ms": times[0] * 1e3})  # the first call: pinned memory not yet cached
    print(format_table(results.rows, ["method", "queries", ("mb", ".0f"), ("ms", ".1f"), ("gbps", ".2f"), ("first_ms", ".1f")]))


if __name__ == "__main__":
    main()
