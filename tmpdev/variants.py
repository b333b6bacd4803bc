"""One-off: time pass 2 of the CUDA block kernel with parts removed (differences locate the time)."""
import os, sys, json, types
import torch
sys.path.insert(0, ".")
for _n in ("pyarrow", "pyarrow.parquet"):
    sys.modules.setdefault(_n, types.ModuleType(_n))
from lsr.index.inverted import InvertedIndex
from lsr.synth import synth_docs, synth_queries
from lsr.search_triton import span_offsets, _n_sample, _cap, _query_arrays
from lsr.kernels import block_cuda
from lsr.kernels.block import span_items
from lsr.kernels.fixed import query_scales
from lsr.kernels.topk import ROW, kth_threshold

N = int(float(os.environ.get("N", "8.8e6"))); B = int(os.environ.get("B", "500")); k = 1000
docs = synth_docs(N, device="cuda"); qs = synth_queries(B, device="cuda")
index = InvertedIndex.build(docs, device="cuda", block_size=65536)
del docs
ip, terms, w = _query_arrays(index, qs)
if os.environ.get("REPEAT"):  # one query B times: every span's postings are shared by all queries
    n0 = int(ip[1] - ip[0])
    ip = torch.arange(B + 1, device="cuda", dtype=torch.int64) * n0
    terms, w = terms[:n0].repeat(B).contiguous(), w[:n0].repeat(B).contiguous()
ORIG = block_cuda._SOURCE
ADD = "tile[dd[e] - doc0] += (i64)((double)ww[e] * wq[u]);"
VARIANTS = {
    "base": [],
    "no_adds": [("const int cell = dd[e] - (int)doc0;", "sink += v; continue; const int cell = dd[e] - (int)doc0;")],
    "no_loads": [("if (p0[u] < hi[u]) {", "if (p0[u] < hi[u] && sink == 7777777) {")],
    "no_steps": [("for (; c < c_end; c += U) {", "for (; c < c_end * (sink == 7777777); c += U) {")],
}
def patch(src, reps):
    src = src.replace("const double sc = scale[q];", "const double sc = scale[q]; i64 sink = 0;")
    src = src.replace("        __syncthreads();                       // zeros and w_count", "        if (sink == 1234567) out[0] = sink;\n        __syncthreads();                       // zeros and w_count")
    src = src.replace("i64 sink = 0;", "u64 sink = 0;")
    for a, b in reps:
        assert a in src, a
        src = src.replace(a, b)
    return src
span, warps, step = (int(x) for x in os.environ.get("CFG", "8192,16,2").split(","))
off = span_offsets(index, span)
n_spans = off.shape[1] - 1
n_samp = _n_sample(n_spans, span, k, 16); cap = _cap(k, n_samp)
max_terms = int(ip.diff().max())
scale, inv = query_scales(ip, terms, w, index.max_scores, max_terms)
args = (index.doc_ids, index.scores, off, ip, terms, w, scale, inv, span)
block_cuda._SOURCE = patch(ORIG, [])
block_cuda._kernel.cache_clear()
sample = (torch.arange(n_samp, device="cuda") * n_spans) // n_samp
maxima, _ = block_cuda.cuda_block_candidates(*args, span_items(B, sample, 1, span // ROW), B * n_samp * (span // ROW), warps=warps, step=step)
theta = kth_threshold(maxima.view(B, -1), k)
items = span_items(B, torch.arange(n_spans, device="cuda"), 1, cap)
res = {}
for name, reps in VARIANTS.items():
    if os.environ.get("ONLY") and name not in os.environ["ONLY"].split(","):
        continue
    block_cuda._SOURCE = patch(ORIG, reps)
    block_cuda._kernel.cache_clear()
    f = lambda: block_cuda.cuda_block_candidates(*args, items, B * n_spans * cap, theta=theta, cap=cap, warps=warps, step=step)
    f(); torch.cuda.synchronize()
    ts = []
    for _ in range(3):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b))
    res[name] = sorted(ts)[1]
    print(f"{name:<12} {res[name]:8.2f} ms", flush=True)
json.dump(res, open(os.environ.get("OUT", ".") + "/variants.json", "w"))
