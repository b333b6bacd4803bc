"""One-off: time the block path's stages and CUDA kernel variants at 8.8M docs (not part of the repo)."""
import sys, time, json, os
import torch
sys.path.insert(0, ".")
import types
for _n in ("pyarrow", "pyarrow.parquet"):
    sys.modules.setdefault(_n, types.ModuleType(_n))
from lsr.index.inverted import InvertedIndex
from lsr.synth import synth_docs, synth_queries
from lsr.search_triton import span_offsets, _n_sample, _cap, _query_arrays
from lsr.kernels import block_cuda
from lsr.kernels.block import span_items
from lsr.kernels.fixed import query_scales
from lsr.kernels.topk import ROW, kth_threshold, topk_keys, unpack_keys

N = int(float(os.environ.get("N", "8.8e6"))); B = int(os.environ.get("B", "500")); k = 1000
docs = synth_docs(N, device="cuda"); qs = synth_queries(B, device="cuda")
index = InvertedIndex.build(docs, device="cuda", block_size=65536)
del docs
ip, terms, w = _query_arrays(index, qs)
def ev():
    e = torch.cuda.Event(enable_timing=True); e.record(); return e
res = {}
def stage_times(span, warps, step, reps=3):
    off = span_offsets(index, span)
    n_spans = off.shape[1] - 1
    n_samp = _n_sample(n_spans, span, k, 16); cap = _cap(k, n_samp)
    out = {}
    for r in range(reps):
        t = [ev()]
        max_terms = int(ip.diff().max())
        scale, inv = query_scales(ip, terms, w, index.max_scores, max_terms); t.append(ev())
        args = (index.doc_ids, index.scores, off, ip, terms, w, scale, inv, span)
        sample = (torch.arange(n_samp, device="cuda") * n_spans) // n_samp
        items = span_items(B, sample, 1, span // ROW)
        maxima, _ = block_cuda.cuda_block_candidates(*args, items, B * n_samp * (span // ROW), warps=warps, step=step); t.append(ev())
        theta = kth_threshold(maxima.view(B, -1), k); t.append(ev())
        items = span_items(B, torch.arange(n_spans, device="cuda"), 1, cap); t.append(ev())
        cand, counts = block_cuda.cuda_block_candidates(*args, items, B * n_spans * cap, theta=theta, cap=cap, warps=warps, step=step); t.append(ev())
        over = torch.nonzero(counts.view(B, n_spans) > cap); n_over = over.shape[0]; t.append(ev())
        best = topk_keys(cand.view(B, -1), k); t.append(ev())
        torch.cuda.synchronize()
        ms = [a.elapsed_time(b) for a, b in zip(t[:-1], t[1:])]
        out = dict(zip(["scales", "pass1", "theta", "items", "pass2", "overflow", "topk"], ms))
        out["total"] = sum(ms); out["cap"] = cap; out["n_over"] = n_over; out["n_samp"] = n_samp
        out["emitted_per_q"] = float(counts.sum()) / B
    return out
CFGS = [(8192, 16, 2), (8192, 8, 2), (16384, 16, 2), (16384, 32, 1), (4096, 8, 2), (8192, 16, 1)]
if os.environ.get("CFG"):
    CFGS = [tuple(int(x) for x in os.environ["CFG"].split(","))]
REPS = int(os.environ.get("REPS", "3"))
for span, warps, step in CFGS:
    try:
        r = stage_times(span, warps, step, REPS)
    except Exception as e:
        r = {"error": str(e)[:200]}
    res[f"s{span} w{warps} u{step}"] = r
    print(f"s{span} w{warps} u{step}", json.dumps({a: round(b, 2) if isinstance(b, float) else b for a, b in r.items()}), flush=True)
json.dump(res, open(os.environ.get("OUT", ".") + "/prof.json", "w"), indent=1)
