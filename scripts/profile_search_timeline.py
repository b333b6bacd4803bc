"""Where a graph-replayed block-path search spends its time: host marks at the steps before the graph's launch
(median of 30 calls) and the kernels of the calls under torch.profiler (name, duration, GPU gap before each).

    PYTHONPATH=. python scripts/profile_search_timeline.py --out OUT [--n-docs 8841823]

8.8M synthetic docs (lsr.benchmarks.synth, bf16-rounded weights, compact postings), synthetic queries, B = 1 / 64 / 500,
top-1000. Writes OUT/prof_timeline.json; prints the marks (ms from the call's start) and kernel counts.
docs/performance/search.md reads these.
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import torch
from torch.profiler import ProfilerActivity, profile

from lsr.benchmarks.synth import SynthSpec, synth_docs, synth_queries
from lsr.index.inverted import InvertedIndex
from lsr.search import block_path as bp
from lsr.search import gpu_search as gs
from lsr.search import graphs as gr
from lsr.search.config import SearchConfig
from lsr.testing import rounded_weights

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--out", required=True)
ap.add_argument("--n-docs", type=int, default=8_841_823)
args = ap.parse_args()
OUT = Path(args.out)
OUT.mkdir(parents=True, exist_ok=True)
dev = torch.device("cuda")
spec = SynthSpec()
docs = rounded_weights(synth_docs(args.n_docs, spec, device=dev))
queries = synth_queries(7000, spec, device=dev)
index = InvertedIndex.build(docs, device=dev, block_size=65536, postings="compact")
del docs
torch.cuda.synchronize()

marks = {}
def wrap(mod, name):
    f = getattr(mod, name)
    def g(*a, **kw):
        marks.setdefault(name, time.perf_counter())
        return f(*a, **kw)
    setattr(mod, name, g)
for mod, name in ((gs, "plan_search"), (gs, "query_csr"), (gs, "block_search"), (bp, "_search_chunk"),
                  (gr.GraphCache, "lookup"), (bp, "settle")):
    wrap(mod, name)
orig = gr.ChunkGraph.__call__
def call(self, *a):
    marks.setdefault("copies", time.perf_counter())   # the graph's input copies and its replay follow
    out = orig(self, *a)
    marks.setdefault("replayed", time.perf_counter())
    return out
gr.ChunkGraph.__call__ = call

def one_call(ev: list, n: int) -> list:
    """The GPU ops of the n-th profiled call: from its query-scales kernel (every block-path search starts with
    it) up to the next call's (the tail holds the flag read, the output copies and the next call's input copies;
    the gaps before them are host time)."""
    starts = [i for i, e in enumerate(ev) if e.name.startswith("_query_scales")]
    a = starts[min(n, len(starts) - 1)]
    return ev[a:starts[n + 1] if n + 1 < len(starts) else len(ev)]


def window(B, i):
    start = (i * B) % max(1, len(queries) - B + 1)
    return queries[start:start + B]

def one(B, k, i):
    marks.clear()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    q = window(B, i)
    marks["window"] = time.perf_counter()
    gs.gpu_search(index, q, k, AUTO)
    marks["return"] = time.perf_counter()
    torch.cuda.synchronize()
    marks["synced"] = time.perf_counter()
    return {a: (b - t0) * 1e3 for a, b in marks.items()}

AUTO = SearchConfig()
res = {}
for B, k in ((1, 1000), (64, 1000), (500, 1000)):
    for i in range(4):
        one(B, k, 50 + i)
    rows = [one(B, k, i) for i in range(30)]
    med = {key: sorted(r[key] for r in rows)[len(rows) // 2] for key in rows[0]}
    print(B, k, {a: round(b, 3) for a, b in sorted(med.items(), key=lambda x: x[1])}, flush=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(6):
            one(B, k, i)
    ev = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                key=lambda e: e.time_range.start)
    c = one_call(ev, 3)
    lst, prev = [], None
    for e in c:
        gap = 0 if prev is None else e.time_range.start - prev
        lst.append((e.name[:70], round(e.time_range.end - e.time_range.start, 1), round(gap, 1)))
        prev = max(prev or 0, e.time_range.end)
    span = c[-1].time_range.end - c[0].time_range.start
    busy = sum(x[1] for x in lst)
    gaps = sum(x[2] for x in lst[1:])
    print(f"B={B} k={k}: {len(c)} GPU ops in one call over {span:.0f} us, busy {busy:.0f}, gaps {gaps:.0f}")
    res[f"B{B}_k{k}"] = {"host_marks_ms": med, "kernels": lst, "span_us": span, "busy_us": busy, "gaps_us": gaps}
(OUT / "prof_timeline.json").write_text(json.dumps(res, indent=1))
