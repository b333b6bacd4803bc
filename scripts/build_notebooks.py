"""Write the notebooks in notebooks/ and execute them where the tools are installed.

    python scripts/build_notebooks.py [benchmarks] [quickstart]

``benchmarks.ipynb`` plots the current result files in docs/bench/ (one section per subsystem, no GPU
needed) and saves each plot as notebooks/figures/<subsystem>.png; ``quickstart.ipynb`` runs the offline
SciFact BM25 pipeline through the Python API (~10 s on a CPU). Writing needs nbformat; executing needs
nbclient, ipykernel and matplotlib (``pip install -e ".[dev]"``). Without them the notebooks are written
without outputs and the figures are left as they are.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NB = REPO / "notebooks"

QUICKSTART = [
    ("md", "# lsr quickstart: BM25 on SciFact, offline\n\nEncode the shipped SciFact corpus with the BM25 lexical "
           "encoder, build the inverted index, search the 300 test queries and evaluate with ir-measures. The same "
           "job is `lsr run configs/scifact-bm25.yaml`; for SPLADE swap the encoder for "
           "`lsr.SpladeEncoder.from_pretrained('data/models/splade-tiny')` (the shipped model that "
           "`lsr run configs/quickstart.yaml` uses)."),
    ("code", "import os, time\nos.chdir('..')  # repository root: data/ lives there\n"
             "import lsr\nfrom lsr import LexicalEncoder, load_dataset\n"
             "ds = load_dataset('data/scifact', 'test')\n"
             "ids, texts = zip(*ds.docs_iter())\nlen(ids), len(ds.queries), sum(map(len, ds.qrels.values()))"),
    ("code", "t0 = time.time()\nenc = LexicalEncoder(k1=0.9, b=0.4)\n"
             "docs = enc.fit_encode_document(texts, ids=list(ids))\n"
             "index = lsr.InvertedIndex.build(docs, device='cpu')\n"
             "qids = list(ds.queries)\nqueries = enc.encode_query([ds.queries[q] for q in qids], ids=qids)\n"
             "scores, doc_idx = lsr.Searcher(index).search(queries, k=1000)\n"
             "print(f'{len(docs)} docs, {docs.nnz} postings, searched in {time.time() - t0:.1f}s')"),
    ("code", "from lsr.data import runs\nrun = runs.from_topk(queries.ids, index.docnos, scores, doc_idx)\n"
             "lsr.evaluate(run, ds.qrels, metrics=('RR@10', 'nDCG@10', 'R@1000'))"),
    ("code", "# what a query looks like to the index, and its best hit\n"
             "q = 0\nprint(ds.queries[qids[q]])\nprint(enc.decode(queries[q])[0][:10])\n"
             "best = int(doc_idx[q, 0])\nprint(index.docnos[best], float(scores[q, 0]), texts[best][:200])"),
]

# Shared by every section: read a result file of either schema (lsr-bench/1 `rows` + `environment`, or the
# older `results` / `meta` / `env` keys) and draw grouped bars.
SETUP = """import json
from pathlib import Path
import matplotlib.pyplot as plt
BENCH = Path('../docs/bench'); FIG = Path('figures'); FIG.mkdir(exist_ok=True)

def load(name, key=None):
    doc = json.loads((BENCH / name).read_text())
    doc = doc[key] if key else doc
    env = doc.get('environment') or doc.get('meta') or doc.get('env') or {}
    rows = doc.get('rows') or doc.get('results') or doc.get('e2e') or []
    return env, [r for r in rows if r.get('status', 'ok') == 'ok']

def gpu(env):
    return env.get('device') or env.get('gpu') or '?'

def bars(ax, groups, series, values, ylabel, title, log=False):
    \"\"\"values[(group, series)] -> number; one cluster of bars per group.\"\"\"
    width = 0.8 / max(len(series), 1)
    for i, s in enumerate(series):
        ys = [values.get((g, s), 0) for g in groups]
        ax.bar([x + i * width for x in range(len(groups))], ys, width, label=s)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))], groups, rotation=20, ha='right')
    ax.set_ylabel(ylabel); ax.set_title(title, fontsize=10); ax.legend(fontsize=8)
    if log:
        ax.set_yscale('log')

def save(fig, name):
    fig.tight_layout(); fig.savefig(FIG / f'{name}.png', dpi=110); plt.show()"""

HEAD = """env, rows = load('head-h200.json')
impls = ['sparton', 'gemm_floor', 'torch_compile', 'torch_eager', 'torch_vocab_tiled']
cases = [r for r in rows if r['impl'] in impls and r['mode'] in ('fwd', 'train')]
groups = list(dict.fromkeys(f"{r['mode']} {r['B']}x{r['S']}x{r['V']}" for r in cases))
ms = {(f"{r['mode']} {r['B']}x{r['S']}x{r['V']}", r['impl']): r['ms'] for r in cases}
mb = {(f"{r['mode']} {r['B']}x{r['S']}x{r['V']}", r['impl']): r['peak_extra_mb'] for r in cases}
fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
bars(axes[0], groups, impls, ms, 'ms (log)', f'Sparton head vs baselines ({gpu(env)}, bf16, D=768)', log=True)
bars(axes[1], groups, impls, mb, 'peak extra MB (log)', 'memory beyond the inputs', log=True)
xl = {}
for name in ['head-250k-h100.json', 'head-250k-h200.json', 'head-250k-sparse-h100.json', 'head-250k-sparse-h200.json']:
    env, rows = load(name)
    label = ('sparse ' if 'sparse' in name else 'random ') + gpu(env).split()[1]
    for r in rows:
        if r['impl'] in ('sparton', 'sparton_tl_forward'):
            xl[(label, 'resident forward' if r['impl'] == 'sparton' else 'tl forward')] = r['ms']
bars(axes[2], list(dict.fromkeys(g for g, _ in xl)), ['resident forward', 'tl forward'], xl, 'ms',
     'fwd+bwd 64x512x250002 (random weights / 1% active)')
axes[2].axhline(26, color='k', ls='--', lw=1)
save(fig, 'head')"""

ENCODE = """env, rows = load('encode-h200.json')
msm = {}
for r in rows:  # several batch sizes per method: its best
    msm[(r['data'], r['method'])] = max(msm.get((r['data'], r['method']), 0), r['pps'])
methods = list(dict.fromkeys(m for _, m in msm))
fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
bars(axes[0], list(dict.fromkeys(d for d, _ in msm)), methods, msm, 'passages / s',
     f"bench_encode.py ({gpu(env)}, {env.get('commit', '')})")
env, rows = load('profile-encode-attention-h200.json')
att = {(f'round {i // 2}', r['body']): r['pps'] for i, r in enumerate(rows)}
bars(axes[1], ['round 0', 'round 1'], ['varlen', 'varlen-flash'], att, 'passages / s',
     f'encode_corpus, 1M passages: packed attention vs flash ({gpu(env)})')
tiny = [json.loads(line) for line in (BENCH / 'ab-encode-splade-tiny-h100.jsonl').read_text().splitlines()]
st = {(api, t['label']): t[key] for t in tiny for api, key in (('encode_document', 'api_pps'), ('encode_corpus', 'corpus_pps'))}
bars(axes[2], ['encode_document', 'encode_corpus'], ['old', 'new'], st, 'passages / s',
     'splade-tiny, 400K passages (H100): before / after the host-input work')
save(fig, 'encode')"""

SEARCH = """env, rows = load('search-h200.json')
cases = [r for r in rows if r['B'] > 1]
qps = {(f"B={r['B']} k={r['k']}", r['queries']): r['qps'] for r in cases}
fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
bars(axes[0], list(dict.fromkeys(g for g, _ in qps)), ['synth', 'real'], qps, 'queries / s',
     f'exact top-k, 8.8M docs, compact postings ({gpu(env)})')
base = {}
for key in ['old0', 'old1', 'old2', 'new0', 'new1', 'new2']:
    env, rows = load('search-baseline-h200.json', key)
    for r in rows:
        if r['method'] == 'lsr-auto':
            base[(f"B={r['B']} {key[-1]}", '65fee74' if key.startswith('old') else 'current')] = r['qps']
bars(axes[1], sorted({g for g, _ in base}), ['65fee74', 'current'], base, 'queries / s',
     'synthetic top-1000: the tree the throughput work started from vs today (3 rounds)')
axes[1].axhline(45000, color='k', ls='--', lw=1)
env, rows = load('search-methods-h200.json')
m = {(r['method'], r['queries']): r['qps'] for r in rows if r['n_docs'] == 8800000 and r['B'] == 500 and r['k'] == 1000}
bars(axes[2], list(dict.fromkeys(g for g, _ in m)), ['synth', 'real'], m, 'queries / s (log)',
     f"every method, B=500 k=1000 ({gpu(env)}, {env.get('commit')})", log=True)
save(fig, 'search')"""

TRAIN = """fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
env, rows = load('train-h100.json')
step = {(f"{r['model']} B={r['B']}", r['impl']): r['ms'] for r in rows if r['method'] != 'max_batch'}
bars(axes[0], list(dict.fromkeys(g for g, _ in step)), ['lsr', 'torch_head', 'st'], step, 'ms per step',
     f'training step ({gpu(env)}; st = sentence-transformers)')
big = {(r['model'], r['impl']): r['max_batch'] for r in rows if r['method'] == 'max_batch'}
env, rows = load('train-checkpointing-h100.json')
big.update({(r['model'] + ' + ckpt', r['impl']): r['max_batch'] for r in rows if r['method'] == 'max_batch'})
bars(axes[1], list(dict.fromkeys(g for g, _ in big)), ['lsr', 'torch_head', 'st'], big, 'largest batch (log)',
     'largest training batch', log=True)
save(fig, 'train')"""

SERVE = """env, rows = load('serve-h100.json')
fig, ax = plt.subplots(figsize=(8, 4.5))
for frozen in (0, 1):
    pts = [(r['p99_ms'], r['qps'], r['concurrency']) for r in sorted(rows, key=lambda r: r['concurrency'])
           if r['freeze_gc'] == frozen]
    ax.plot([p[0] for p in pts], [p[1] for p in pts], 'o-', label=f'gc frozen = {frozen}')
    for p99, q, c in pts:
        ax.annotate(str(c), (p99, q), fontsize=7)
ax.axvline(20, color='k', ls='--', lw=1); ax.set_xscale('log')
ax.set_xlabel('p99 ms (log; labels: clients)'); ax.set_ylabel('queries / s'); ax.legend()
ax.set_title(f'lsr serve, text queries by splade-tiny, 8.8M docs, k=10 ({gpu(env)})', fontsize=10)
save(fig, 'serve')"""

SCALING = """runs = {}
for name, label in [('dist-h100.json', None), ('dist-strong-2xh100.json', 'documents split, 2 GPUs'),
                    ('dist-weak-2xh100.json', '2 x 8.8M docs, 2 GPUs'), ('dist-replicated-2xh100.json', 'replicas, 2 GPUs')]:
    env, rows = load(name)
    for r in rows:
        if r['method'] != 'merge' and r['B'] in (64, 500):
            runs[(f"B={r['B']}", label or f"{r['method']}, P={r['P']}, 1 GPU")] = r['qps']
fig, ax = plt.subplots(figsize=(11, 4.5))
bars(ax, ['B=64', 'B=500'], list(dict.fromkeys(s for _, s in runs)), runs, 'queries / s',
     'exact top-1000 over 8.8M docs across partitions and GPUs (H100)')
save(fig, 'scaling')"""

RERANK = """fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
for ax, (name, title) in zip(axes, [('maxsim-h100.json', 'ColBERT rerank, 500 x 1,000 candidates'),
                                    ('maxsim-pairs-h100.json', 'kernel against kernel, shared documents')]):
    env, rows = load(name)
    ms = {(r['mode'], r['method']): r['ms'] for r in rows}
    bars(ax, list(dict.fromkeys(m for m, _ in ms)), list(dict.fromkeys(s for _, s in ms)), ms, 'ms (log)',
         f'MaxSim: {title} ({gpu(env)})', log=True)
save(fig, 'rerank')"""

SECTIONS = [
    ("Sparton head", "Forward and training cases against eager, torch.compile, a vocab-tiled head and the bare GEMM; "
                     "the XLM-R vocabulary's fwd+bwd with the resident and the `tl` forward (dashed: 26 ms). "
                     "Page: docs/performance/head.md.", HEAD),
    ("Encoding", "lsr against Hugging Face + torch head; lsr's packed attention against flash attention end to end; "
                 "splade-tiny before and after the host-input work. Page: docs/performance/encode.md.", ENCODE),
    ("Search", "Today's QPS; against the tree the throughput work started from (dashed: 45K); every method in one "
               "older run. Page: docs/performance/search.md.", SEARCH),
    ("Training", "Step time and largest batch against a torch head and sentence-transformers. "
                 "Page: docs/performance/train.md.", TRAIN),
    ("Serving", "QPS against p99 latency, the garbage collector left as it is or frozen after warm-up (dashed: 20 ms). "
                "Page: docs/performance/serve.md.", SERVE),
    ("Scaling", "One index, partitions on one GPU, and two GPUs split by documents or by queries. "
                "Page: docs/performance/scaling.md.", SCALING),
    ("Rerank (MaxSim)", "The fused MaxSim kernel against flash-maxsim and einsum. "
                        "Page: docs/performance/rerank.md.", RERANK),
]


def benchmark_cells() -> list[tuple[str, str]]:
    cells = [("md", "# lsr benchmarks\n\nPlots of the current result files in `docs/bench/` (one per benchmark and "
                    "GPU kind; older runs are in git history). Every number, its command and the design behind it "
                    "are on the performance pages of the documentation (`docs/performance/`). Regenerate with "
                    "`python scripts/build_notebooks.py benchmarks`."),
             ("code", SETUP)]
    for title, text, code in SECTIONS:
        cells += [("md", f"## {title}\n\n{text}"), ("code", code)]
    return cells


def write(name: str, cells: list[tuple[str, str]]) -> None:
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

    nb = new_notebook(cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    runnable = all(importlib.util.find_spec(m) for m in ("nbclient", "ipykernel", "matplotlib"))
    if runnable:
        from nbclient import NotebookClient

        NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NB)}}).execute()
    else:
        print(f"{name}: nbclient, ipykernel or matplotlib missing: written without outputs", file=sys.stderr)
    nbformat.write(nb, NB / name)
    print(f"wrote {NB / name}")


def main(argv: list[str]) -> None:
    NB.mkdir(exist_ok=True)
    wanted = argv or ["benchmarks", "quickstart"]
    unknown = sorted(set(wanted) - {"benchmarks", "quickstart"})
    if unknown:
        raise SystemExit(f"build_notebooks.py: unknown notebook {unknown[0]!r}; choose benchmarks and/or quickstart")
    if "benchmarks" in wanted:
        write("benchmarks.ipynb", benchmark_cells())
    if "quickstart" in wanted:
        write("quickstart.ipynb", QUICKSTART)


if __name__ == "__main__":
    main(sys.argv[1:])
