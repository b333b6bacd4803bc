"""Write and execute the notebooks in notebooks/ (outputs and plots saved in the .ipynb files and as PNG).

    python scripts/build_notebooks.py [benchmarks] [quickstart]   # needs matplotlib, nbformat, nbconvert, ipykernel

The benchmark notebook only reads the committed results in docs/bench/ (no GPU needed); the
quickstart notebook runs the offline SciFact BM25 pipeline through the Python API (~10 s on a CPU).
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbconvert.preprocessors import ExecutePreprocessor
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

REPO = Path(__file__).resolve().parents[1]
NB = REPO / "notebooks"

QUICKSTART = [
    new_markdown_cell("# lsr quickstart: BM25 on SciFact, offline\n\nEncode the shipped SciFact corpus with the "
                      "BM25 lexical encoder, build the inverted index, search the 300 test queries and evaluate "
                      "with ir-measures. The same job is `lsr run configs/scifact-bm25.yaml`; for SPLADE swap the "
                      "encoder for `lsr.SpladeEncoder.from_pretrained('data/models/splade-tiny')` (the shipped "
                      "model that `lsr run configs/quickstart.yaml` uses)."),
    new_code_cell("import os, time\nos.chdir('..')  # repository root: data/ lives there\n"
                  "import lsr\nfrom lsr.data.sources import load_dataset\nfrom lsr.encode.bm25.lexical import LexicalEncoder\n"
                  "ds = load_dataset('data/scifact', 'test')\n"
                  "ids, texts = zip(*ds.docs_iter())\nlen(ids), len(ds.queries), sum(map(len, ds.qrels.values()))"),
    new_code_cell("t0 = time.time()\nenc = LexicalEncoder(k1=0.9, b=0.4)\n"
                  "docs = enc.fit_encode_document(texts, ids=list(ids))\n"
                  "index = lsr.InvertedIndex.build(docs, device='cpu')\n"
                  "qids = list(ds.queries)\nqueries = enc.encode_query([ds.queries[q] for q in qids], ids=qids)\n"
                  "scores, doc_idx = lsr.Searcher(index).search(queries, k=1000)\n"
                  "print(f'{len(docs)} docs, {docs.nnz} postings, searched in {time.time() - t0:.1f}s')"),
    new_code_cell("from lsr import runs\nrun = runs.from_topk(queries.ids, index.docnos, scores, doc_idx)\n"
                  "lsr.evaluate(run, ds.qrels, metrics=('RR@10', 'nDCG@10', 'R@1000'))"),
    new_code_cell("# what a query looks like to the index, and its best hit\n"
                  "q = 0\nprint(ds.queries[qids[q]])\nprint(enc.decode(queries[q])[0][:10])\n"
                  "best = int(doc_idx[q, 0])\nprint(index.docnos[best], float(scores[q, 0]), texts[best][:200])"),
]

BENCH_SETUP = """import json, glob
from pathlib import Path
import numpy as np
import pandas as pd
import matplotlib.pyplot as plt
BENCH = Path('../docs/bench'); FIG = Path('figures'); FIG.mkdir(exist_ok=True)
def csvs(pattern):
    frames = [pd.read_csv(p) for p in sorted(BENCH.glob(pattern))]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
def lsr_rows(pattern, tree):  # lsr-auto rows of bench_search JSONs in extra/, labelled by tree(file stem) and case
    runs = pd.concat([pd.DataFrame(json.loads(p.read_text())['rows']).assign(tree=tree(p.stem))
                      for p in sorted((BENCH / 'extra').glob(pattern))])
    runs = runs[runs.method == 'lsr-auto'].copy()
    runs['case'] = runs['queries'] + ' B=' + runs['B'].astype(str) + ' k=' + runs['k'].astype(str)
    return runs
def ab_panels(runs, run_trees, run_title, base, base_trees, base_title, png):  # a session's A/B beside the issue's start
    fig, axes = plt.subplots(1, 2, figsize=(15, 4.2), gridspec_kw={'width_ratios': [3, 1]})
    runs[runs.B > 1].pivot_table(index='case', columns='tree', values='qps', aggfunc='median', sort=False)[run_trees].plot.bar(ax=axes[0], rot=25)
    axes[0].set_title(run_title); axes[0].set_ylabel('queries / s')
    base.pivot_table(index='case', columns='tree', values='qps', aggfunc='median')[base_trees].plot.bar(ax=axes[1], rot=0)
    axes[1].axhline(45000, color='k', ls='--', lw=1)
    axes[1].set_title(base_title)
    plt.tight_layout(); plt.savefig(FIG / png, dpi=110); plt.show()
    return base.pivot_table(index='case', columns='tree', values='qps', aggfunc=['min', 'median', 'max']).round(0)"""

HEAD = """head = csvs('bench_head*.csv')
MAIN = ['sparton', 'sparton_head', 'gemm_floor', 'torch_compile', 'torch_eager', 'torch_vocab_tiled',
        'hf_mlm_head', 'backbone_only']  # the diagnostic split rows stay in the table below
head = head[(head.status == 'ok') & head.impl.isin(MAIN)].drop_duplicates(['mode', 'B', 'S', 'V', 'impl'], keep='last')
head['case'] = head['mode'] + ' ' + head.B.astype(str) + 'x' + head.S.astype(str) + 'x' + head.V.astype(str)
fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
for ax, col, label in [(axes[0], 'ms', 'time (ms, log)'), (axes[1], 'peak_extra_mb', 'peak extra memory (MB, log)')]:
    pivot = head.pivot_table(index='case', columns='impl', values=col)
    pivot[[c for c in MAIN if c in pivot]].plot.bar(ax=ax, logy=True, rot=30, legend=ax is axes[1])
    ax.set_ylabel(label); ax.set_xlabel('')
axes[1].legend(loc='upper left', bbox_to_anchor=(1.0, 1.0), fontsize=8)
axes[0].set_title('Sparton head vs baselines (H200, bf16, D=768)')
plt.tight_layout(); plt.savefig(FIG / 'head.png', dpi=110); plt.show()
head.pivot_table(index='case', columns='impl', values='ms').round(2)"""

SEARCH = """search = csvs('bench_search*.csv')
if len(search):
    s = search[(search.k == 1000) & search.qps.notna() & ~search.method.str.startswith('blk')]  # no sweep rows
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
    for ax, qset in zip(axes, ['synth', 'real']):
        part = s[(s.queries == qset) & (s.n_docs == s.n_docs.max())]
        part.pivot_table(index='B', columns='method', values='qps', aggfunc='max').plot(ax=ax, marker='o', logy=True, logx=True)
        ax.set_title(f'QPS at {s.n_docs.max():,} docs, k=1000, {qset} queries'); ax.set_ylabel('queries / s')
    plt.tight_layout(); plt.savefig(FIG / 'search_batch.png', dpi=110); plt.show()
    if s.n_docs.nunique() > 1:
        part = s[(s.B == s.B.max()) & (s.queries == 'synth')]
        ax = part.pivot_table(index='n_docs', columns='method', values='qps', aggfunc='max').plot(marker='o', logx=True, logy=True, figsize=(7, 4.5))
        ax.set_title(f'QPS vs collection size (B={s.B.max()}, k=1000, synthetic queries)'); plt.savefig(FIG / 'search_size.png', dpi=110); plt.show()
search.pivot_table(index=['n_docs', 'queries', 'B', 'k'], columns='method', values='qps', aggfunc='max').round(0) if len(search) else 'no search results'"""

ENCODE = """enc = csvs('bench_encode*.csv')
enc = enc[enc.status == 'ok']
best = enc.groupby(['data', 'method']).pps.max().unstack()
ax = best.plot.bar(figsize=(9, 4.5), rot=0, logy=True)
ax.axhline(22000, color='k', ls='--', lw=1, label='target 22k p/s'); ax.legend()
ax.set_ylabel('passages / s (best batch size)'); ax.set_title('Encoding throughput, BERT-base SPLADE, H200 bf16')
plt.tight_layout(); plt.savefig(FIG / 'encode.png', dpi=110); plt.show()
best.round(0)"""

PACKED = """prof = json.loads((BENCH / 'extra' / 'profile_encode_packed_e24ae88.json').read_text())
fixed = pd.DataFrame(prof['runs']['fixed_packed_tma']['fixed']).set_index('S')
cols = {'head_ms': 'padded, full texts', 'head_packed_ms': 'packed, full texts',
        'head_var_ms': 'padded, lengths 8..S', 'head_packed_var_ms': 'packed, lengths 8..S'}
ax = fixed[list(cols)].rename(columns=cols).plot(marker='o', figsize=(7, 4.5))
ax.set_xlabel('batch width S (tokens)'); ax.set_ylabel('ms per 1024 texts'); ax.set_ylim(0)
ax.set_title('Sparton head for inference: padded vs packed (H200, bf16, V=30522)')
plt.tight_layout(); plt.savefig(FIG / 'head_packed.png', dpi=110); plt.show()
fixed[list(cols)].rename(columns=cols)"""

WORKERS = """rows = []
for name, label in [('profile_encode_workers_compile_1m_dev.json', 'run 3'), ('profile_encode_workers_1m_abd6e3f.json', 'run 6')]:
    prof = json.loads((BENCH / 'extra' / name).read_text())
    compiled = prof.get('compile', {})
    compiled = compiled.get('full', compiled)  # keyed by compile mode in later files
    runs = [('eager', r) for r in prof['e2e']] + [('compiled', r) for r in compiled.get('e2e', [])]
    for mode, r in runs:
        rows.append({'case': f"{label}, {mode}", 'tokenizer': 'processes (8)' if r['tokenize_workers'] else 'thread (in-process)',
                     'pps': r['pps']})
workers = pd.DataFrame(rows).pivot_table(index='case', columns='tokenizer', values='pps')
ax = workers.plot.barh(figsize=(8, 3.5))
ax.axvline(22000, color='k', ls='--', lw=1, label='target 22k p/s'); ax.legend(loc='lower right', fontsize=8)
ax.set_xlabel('passages / s, encode_corpus end to end (1M MS MARCO-length passages)')
ax.set_title('Tokenizing in worker processes vs a thread (H200, BERT-base, bf16)')
plt.tight_layout(); plt.savefig(FIG / 'encode_workers.png', dpi=110); plt.show()
workers"""

VARLEN = """prof = json.loads((BENCH / 'extra' / 'profile_encode_varlen_200k_09c00a9.json').read_text())
e2e1m = json.loads((BENCH / 'extra' / 'profile_encode_varlen_e2e_1m_09c00a9.json').read_text())
cols = {'body_pps': 'backbone', 'body_head_pps': 'backbone + head', 'encode_prepared_pps': 'encode_prepared',
        'contended_pool_pps': 'encode_prepared + tokenizer processes'}
table = pd.DataFrame({body: {label: r[key] for key, label in cols.items()} for body, r in prof['varlen'].items()})
for r in e2e1m['e2e']:
    table.loc['encode_corpus, 1M passages', 'varlen' if r['varlen'] else 'hf'] = r['pps']
table = table.rename(columns={'varlen': 'padding-free (varlen_body)', 'hf': 'HF padded forward'})
ax = table.plot.barh(figsize=(10, 4))
ax.axvline(22000, color='k', ls='--', lw=1, label='target 22k p/s')
ax.legend(loc='upper left', bbox_to_anchor=(1.0, 1.0), fontsize=8)
ax.set_xlabel('passages / s (MS MARCO lengths; 200K pre-tokenized, or 1M end to end)')
ax.set_title('Padding-free backbone vs HF forward (H200, bf16)')
plt.tight_layout(); plt.savefig(FIG / 'encode_varlen.png', dpi=110); plt.show()
table"""

E2E = """e2e = json.loads((BENCH / 'bench_e2e.json').read_text())
if 'schema' in e2e:  # the lsr.benchmarks.harness layout: the step times are in the summary, the sizes in the config
    e2e = {**e2e['summary'], 'meta': e2e['config']}
steps = dict(e2e['timed_s'])
ax = pd.Series(steps).plot.barh(figsize=(7, 3))
ax.set_xlabel('seconds'); ax.set_title(f"dev-small end to end: {e2e['meta']['n_queries']} queries x {e2e['meta']['n_docs']:,} docs (total {e2e['total_s']:.2f}s)")
plt.tight_layout(); plt.savefig(FIG / 'e2e.png', dpi=110); plt.show()
{'total_s': round(e2e['total_s'], 2), 'baseline_runs_eval_s': round(sum(e2e['baseline_s'].values()), 2), **e2e['meta']}"""

TRAIN = """train = pd.DataFrame([r | {'run': p.stem.replace('bench_train_', '')} for p in sorted(BENCH.glob('bench_train*.json'))
                      for r in json.loads(p.read_text())['rows']])
logs = {p.parent.name: pd.read_json(p, lines=True) for p in sorted(BENCH.glob('train/*/log.jsonl'))}
fig, axes = plt.subplots(1, 3, figsize=(18, 4.5))
if len(train):
    timed = train[(train.status == 'ok') & train.ms.notna() & ~train.checkpointing]
    timed.assign(case=timed.model + ' B=' + timed.B.astype(int).astype(str) + np.where(timed.run == 'session11', '', ' *')).pivot_table(
        index='case', columns='impl', values='ms').plot.bar(ax=axes[0], rot=0)
    axes[0].set_title('training step at equal batch, interleaved timing (ms, H100; * = a later run)')
    best = train[train.max_batch.notna()]
    best.assign(case=best.model + np.where(best.checkpointing, ' +ckpt', '')).pivot_table(
        index='case', columns='impl', values='max_batch').plot.bar(ax=axes[1], rot=0, logy=True)
    axes[1].set_title('largest batch that fits, doc length 256 (log)')
for label, log in logs.items():  # e.g. the SciFact fine-tuning with the Sparton head and with the torch head
    axes[2].plot(log.step, log.rank_loss.rolling(5, min_periods=1).mean(), label=label)
axes[2].set_title('SciFact fine-tuning: ranking loss (5-step mean)'); axes[2].set_xlabel('step')
if logs:
    axes[2].legend()
plt.tight_layout(); plt.savefig(FIG / 'train.png', dpi=110); plt.show()
train[['run', 'model', 'checkpointing', 'impl', 'B', 'ms', 'ms_p10', 'ms_p90', 'peak_extra_mb', 'max_batch']] if len(train) else 'no bench_train results yet'"""

MAXSIM = """rows = pd.concat([pd.DataFrame(json.loads(p.read_text())['rows']).assign(source=p.name)
                  for p in sorted(BENCH.glob('bench_maxsim*.json'))])
ok = rows[(rows.status == 'ok') & (rows.method != 'einsum-fp32')]
cases = [c for c in ('colbert', 'colbert-pairs', 'colpali') if c in set(ok.case)]
fig, axes = plt.subplots(1, len(cases), figsize=(6 * len(cases), 3.8), squeeze=False)
for ax, case in zip(axes[0], cases):
    ok[ok.case == case].pivot_table(index='method', columns='mode', values='ms').plot.barh(ax=ax, logx=True)
    ax.set_xlabel('ms (log)'); ax.set_title(f'MaxSim {case} (H100, bf16)')
plt.tight_layout(); plt.savefig(FIG / 'maxsim.png', dpi=110); plt.show()
ok.pivot_table(index=['case', 'method'], columns='mode', values='ms')"""

COMPACT = """rows = pd.DataFrame(json.loads((BENCH / 'bench_search_compact_session11.json').read_text())['rows'])
rows = rows[rows.qps.notna()]
fig, axes = plt.subplots(1, 2, figsize=(14, 4.5))
for ax, q in zip(axes, ['synth+ranked', 'real+ranked']):
    rows[rows.queries == q].pivot_table(index='B', columns='postings', values='qps').plot(ax=ax, marker='o', logx=True)
    ax.set_title(f'8.8M docs, k=1000, {q} queries (H100)')
    ax.set_ylabel('queries / s'); ax.set_ylim(0)
plt.tight_layout(); plt.savefig(FIG / 'search_compact.png', dpi=110); plt.show()
rows.pivot_table(index=['queries', 'B'], columns='postings', values='qps').round(0)"""

SERVE = """loaded = [(p, json.loads(p.read_text())) for p in [BENCH / 'bench_serve.json', *sorted((BENCH / 'extra').glob('bench_serve*.json'))]]
serve = pd.concat([pd.DataFrame(d['rows']).assign(run=p.stem) for p, d in loaded if 'rows' in d])   # (A/B summaries have no rows)
serve = serve[serve.qps.notna()]
serve['pipeline'] = serve['pipeline'].fillna(0).astype(int) if 'pipeline' in serve else 0
fig, ax = plt.subplots(figsize=(9, 5))
serve['freeze_gc'] = serve['freeze_gc'].fillna(-1).astype(int) if 'freeze_gc' in serve else -1
for (run, q, mb, pl, fz), part in serve.groupby(['run', 'queries', 'max_batch', 'pipeline', 'freeze_gc']):
    label = f'{run.replace("bench_serve_", "")}: {q}, max_batch={mb}' + (', pipelined' if pl else '') + \
        ('' if fz else ', GC not frozen')
    ax.plot(part.qps, part.p99_ms, marker='o', label=label)
ax.axhline(20, color='k', ls='--', lw=1, label='p99 = 20 ms'); ax.set_yscale('log'); ax.set_xscale('log')
ax.set_xlabel('queries / s'); ax.set_ylabel('p99 latency (ms)'); ax.legend(fontsize=6)
ax.set_title('lsr serve, 8.8M docs, k=10, 1-128 clients (H100)')
plt.tight_layout(); plt.savefig(FIG / 'serve.png', dpi=110); plt.show()
serve[['run', 'queries', 'max_batch', 'pipeline', 'concurrency', 'qps', 'p50_ms', 'p99_ms', 'mean_batch']]"""

OLD_NEW = """runs = pd.concat([pd.DataFrame(json.loads(p.read_text())['rows']).assign(tree=p.stem.split('_')[{tree}])
                  for p in sorted((BENCH / 'extra').glob('{pattern}'))])
runs = runs[runs.qps.notna()]
fig, axes = plt.subplots(1, 2, figsize=(13, 4.2))
for ax, (q, k) in zip(axes, [('real', 10), ('synth', 1000)]):
    part = runs[(runs.queries == q) & (runs.k == k)]
    part.pivot_table(index='B', columns='tree', values='ms').plot(ax=ax, marker='o', logx=True)
    ax.set_title(f'8.8M docs, {{q}} queries, top-{{k}}: ms per batch ({title})'); ax.set_ylabel('ms'); ax.set_ylim(0)
plt.tight_layout(); plt.savefig(FIG / '{figure}', dpi=110); plt.show()
runs.pivot_table(index=['queries', 'k', 'B'], columns='tree', values=['ms', 'qps', 'p50_latency_ms']).round(2)"""
RESCUE = OLD_NEW.format(pattern="bench_search_ingraph_rescue_*_session13.json", tree=-2, title="H100, one call",
                        figure="search_rescue.png")
SELECT = OLD_NEW.format(pattern="bench_search_select_*_session15_h100.json", tree=-3, title="H100, one call",
                        figure="search_select.png")
COARSE3 = OLD_NEW.format(pattern="bench_search_*_session16_h200.json", tree=2, title="H200, one call",
                         figure="search_coarse3cta.png")
COARSE16 = OLD_NEW.format(pattern="bench_search_*_session18_h200.json", tree=2, title="H200; final: another call",
                          figure="search_coarse16.png")

ENCODE19 = """e2e = pd.DataFrame(json.loads((BENCH / 'extra' / 'ab_gelu_epilogue_head_groups_e2e_session19_h200.json').read_text()))
head = pd.DataFrame(json.loads((BENCH / 'extra' / 'ab_packed_head_configs_session19_h200.json').read_text())['rows'])
fig, axes = plt.subplots(1, 2, figsize=(14, 4.2))
e2e.pivot_table(index='mode', columns='round', values='pps', sort=False).plot.bar(ax=axes[0], rot=0)
axes[0].axhline(28000, color='k', ls='--', lw=1, label='issue target 28K'); axes[0].legend(title='round')
axes[0].set_title('encode_corpus, BERT-base, 1M passages (H200, one process)'); axes[0].set_ylabel('passages / s')
head.set_index('name').ms.sort_values().plot.barh(ax=axes[1])
axes[1].set_title('packed Sparton head, one batch of 131K tokens (ms, H200)')
plt.tight_layout(); plt.savefig(FIG / 'encode_session19.png', dpi=110); plt.show()
e2e[['round', 'mode', 'pps', 'encode_only_pps']]"""

ATTN20 = """stream = json.loads((BENCH / 'extra' / 'packed_attention_stream_session20_h200.json').read_text())
ab = json.loads((BENCH / 'extra' / 'ab_packed_attention_e2e_session20_h200.json').read_text())
rows = pd.DataFrame(stream['rows'])
# packed_attention's choice: grouped 64-row tiles (2 stages) for texts <= 64 or > 96 tokens, row tiles between
rows['packed'] = [r['(True, 64, 64, 4, 2)'] if r['L'] <= 64 or 2 * r['L'] > 192 else r['(False, 64, 64, 4, 1)']
                  for _, r in rows.iterrows()]
fig, axes = plt.subplots(1, 2, figsize=(14, 4.2))
rows.plot(x='L', y=['flash', 'packed'], marker='o', ax=axes[0])
axes[0].set_title('attention per layer, one 50K window cut into batches (H200)')
axes[0].set_xlabel("batch's longest text (tokens)"); axes[0].set_ylabel('ms per call')
e2e = pd.DataFrame(ab['e2e'])
e2e['run'] = e2e['call'].str[:2] + ' r' + e2e['round'].astype(str)
e2e.pivot_table(index='run', columns='attention', values='pps', sort=False).plot.bar(ax=axes[1], rot=0)
axes[1].axhline(28000, color='k', ls='--', lw=1); axes[1].set_ylim(25000, 29000)
axes[1].set_title('encode_corpus, BERT-base, flash vs packed in one process'); axes[1].set_ylabel('passages / s')
plt.tight_layout(); plt.savefig(FIG / 'encode_session20.png', dpi=110); plt.show()
print('window totals, ms per layer: flash %.2f, packed %.2f' % (rows.flash.sum(), rows.packed.sum()))
pd.DataFrame(ab['gpu_only'])"""

GRAPH21 = """ab = json.loads((BENCH / 'extra' / 'ab_graph_large_session21_h200.json').read_text())
rows = pd.DataFrame(ab['batches'])
rows['case'] = rows['queries'] + ' B=' + rows['B'].astype(str) + ' k=' + rows['k'].astype(str)
fig, ax = plt.subplots(figsize=(14, 4.2))
rows.pivot_table(index='case', columns='mode', values='qps', aggfunc='median', sort=False)[['before', 'after']].plot.bar(ax=ax, rot=20)
ax.axhline(45000, color='k', ls='--', lw=1, label='issue target, B=500 k=1000'); ax.legend()
ax.set_title('block path: CUDA graphs up to B=64 (before) and up to B=512 (after), one process, H200, 8.8M docs, compact')
ax.set_ylabel('queries / s (median of two rounds)')
plt.tight_layout(); plt.savefig(FIG / 'search_graphs_session21.png', dpi=110); plt.show()
pd.DataFrame(ab['searcher'])"""

AB21 = """runs = lsr_rows('bench_search_session_last_*_session21_h200.json', lambda stem: stem.split('_')[4][:3])
fig, ax = plt.subplots(figsize=(14, 4.2))
runs[runs.B > 1].pivot_table(index='case', columns='tree', values='qps', aggfunc='median', sort=False)[['old', 'new']].plot.bar(ax=ax, rot=25)
ax.set_title("bench_search: session 21's start (f4a70c3) vs its end (4e0bd30), alternating twice on one H200 (median of the rounds)")
ax.set_ylabel('queries / s'); plt.tight_layout(); plt.savefig(FIG / 'search_session21.png', dpi=110); plt.show()
runs.pivot_table(index='case', columns='tree', values='qps', aggfunc=['min', 'max'], sort=False).round(0)"""

AB22 = """runs = lsr_rows('bench_search_session_ab_*_session22_h200.json', lambda stem: stem.split('_')[4][:3])
base = lsr_rows('bench_search_issue_baseline_*_session22_h200.json', lambda stem: stem.split('_')[4])
ab_panels(runs, ['old', 'new'], "bench_search: session 22's start (ed17eeb) vs its end, alternating twice on one H200 (median)",
          base, ['today', 'new'], "issue 18's start (65fee74) vs now", 'search_session22.png')"""

AB23 = """def merged(name, trees):  # lsr-auto rows of a merged A/B file ({tag: bench_search JSON}, tag = tree + round)
    d = json.loads((BENCH / 'extra' / name).read_text())
    rows = pd.concat([pd.DataFrame(v['rows']).assign(tree=trees[t[:3]], round=t[3:]) for t, v in d.items()])
    rows = rows[rows.method == 'lsr-auto'].copy()
    rows['case'] = rows['queries'] + ' B=' + rows['B'].astype(str) + ' k=' + rows['k'].astype(str)
    return rows
runs = merged('bench_search_session_ab_session23_h200.json', {'old': '8423771 (start)', 'new': 'end'})
base = merged('bench_search_issue_baseline_call16_session23_h200.json', {'old': '65fee74 (issue 18)', 'new': 'end'})
ab_panels(runs, ['8423771 (start)', 'end'], "bench_search: session 23's start vs its end, alternating twice on one H200 (median)",
          base, ['65fee74 (issue 18)', 'end'], "issue 18's start vs now (3 rounds)", 'search_session23.png')"""

HEAD24 = """def head_ab(name, gpu, trees={'base': '9fb413b (start)', 'new': 'b121e6e'}):  # {tag: bench_head JSON}, tag = tree_case
    frames = [pd.DataFrame(doc['rows']).assign(tree=trees[tag.split('_')[0]])
              for tag, doc in json.loads((BENCH / 'extra' / name).read_text()).items()]
    df = pd.concat(frames)
    sparsity = np.where(df.active < 1, ' active ' + df.active.astype(str), ' random')
    df['case'] = df.B.astype(str) + 'x' + df.S.astype(str) + 'x' + df.V.astype(str) + sparsity + ' (' + gpu + ')'
    return df
ab = pd.concat([head_ab('bench_head_250k_ab_session24_h100.json', 'H100'), head_ab('bench_head_30k_ab_session24_h200.json', 'H200')])
t = ab.pivot_table(index=['case', 'impl'], columns='tree', values='ms', aggfunc='median')
fig, axes = plt.subplots(1, 2, figsize=(15, 4.2))
for ax, impl, title in [(axes[0], 'sparton', 'fwd + bwd (ms)'), (axes[1], 'sparton_bwd_only', 'backward alone (ms)')]:
    t.xs(impl, level='impl').plot.bar(ax=ax, rot=12); ax.set_title(title)
axes[0].axhline(26, color='k', ls='--', lw=1)  # issue 18's target for 64x512x250002
plt.tight_layout(); plt.savefig(FIG / 'head_session24.png', dpi=110); plt.show()
t.loc[(slice(None), ['sparton', 'sparton_bwd_only', 'sparton_bwd_dh_part', 'sparton_bwd_de_part']), :].round(2)"""

HEAD25 = """bwd = pd.concat([head_ab(f'bench_head_bwd_ab_session25_{g.lower()}.json', g, {'base': 'beff6cf', 'new': '75c8dca'})
                 for g in ('H100', 'H200')])
fwd = head_ab('bench_head_fwd_ab_session25_h100.json', 'H100', {'base': '75c8dca', 'new': '6b5fdba'})
fig, axes = plt.subplots(1, 2, figsize=(15, 4.2))
tb = bwd[bwd.impl == 'sparton_bwd_dh_part'].pivot_table(index='case', columns='tree', values='ms', aggfunc='median')
tb[['beff6cf', '75c8dca']].plot.bar(ax=axes[0], rot=12); axes[0].set_title('dH part of the backward (ms): 96 MB slices -> row groups, one launch')
fwd_rows = fwd.impl.isin(['sparton_fwd_only', 'gemm_floor']) | ((fwd['mode'] == 'fwd') & (fwd.impl == 'sparton'))
tf = fwd[fwd_rows].pivot_table(index=['case', 'impl'], columns='tree', values='ms', aggfunc='median')
tf[['75c8dca', '6b5fdba']].plot.bar(ax=axes[1], rot=12); axes[1].set_title('forward (ms): rows without holes skip the mask reads (H100)')
plt.tight_layout(); plt.savefig(FIG / 'head_session25.png', dpi=110); plt.show()
fwd.pivot_table(index=['case', 'impl'], columns='tree', values='ms', aggfunc='median').round(2)"""

HEAD26 = """runs26 = {'bench_head_resident_session26_h100_call7_round1.json': 'H100 call 7', 'bench_head_session26_h100.json': 'H100 call 9',
         'bench_head_active001_session26_h100.json': 'H100 call 9', 'bench_head_250k_session26_h200_round1.json': 'H200 call 10a',
         'bench_head_250k_session26_h200_round2.json': 'H200 call 10b', 'bench_head_250k_active001_session26_h200.json': 'H200 call 10',
         'bench_head_250k_final_session26_h200.json': 'H200 call 11'}
r26 = pd.concat([pd.DataFrame(json.loads((BENCH / 'extra' / f).read_text())['rows']).assign(run=run) for f, run in runs26.items()])
r26 = r26[r26.status == 'ok'].copy()
r26['case'] = (r26['mode'] + ' ' + r26.B.astype(str) + 'x' + r26.S.astype(str) + 'x' + r26.V.astype(str)
               + np.where(r26.active < 1, ' active ' + r26.active.astype(str), '') + ' | ' + r26.run)
pairs = {'sparton': 'resident forward', 'sparton_tl_forward': 'tl forward',
         'sparton_fwd_only': 'resident forward', 'sparton_fwd_only_tl': 'tl forward'}
fig, axes = plt.subplots(1, 2, figsize=(15, 7.5), gridspec_kw={'wspace': 0.75})
for ax, impls, title in [(axes[0], ['sparton', 'sparton_tl_forward'], 'head call (train: fwd+bwd, fwd: forward), ms'),
                         (axes[1], ['sparton_fwd_only', 'sparton_fwd_only_tl'], 'training forward alone, ms')]:
    t = r26[r26.impl.isin(impls)].assign(kernel=lambda d: d.impl.map(pairs))
    t.pivot_table(index='case', columns='kernel', values='ms', aggfunc='median').plot.barh(ax=ax)
    ax.set_title(title); ax.set_ylabel(''); ax.legend(loc='lower right')
axes[0].axvline(26, color='k', ls='--', lw=1)
plt.savefig(FIG / 'head_session26.png', dpi=110, bbox_inches='tight'); plt.show()
r26[r26.impl.isin(pairs)].pivot_table(index='case', columns='impl', values='ms', aggfunc='median').round(2)"""

HEAD27 = """runs27 = {'bench_head_250k_session27_h100_call2.json': 'H100 call 2', 'bench_head_250k_session27_h100_call6.json': 'H100 call 6 (exp. bwd)',
          'bench_head_250k_session27_h100_call8.json': 'H100 call 8', 'bench_head_250k_session27_h200_round2.json': 'H200 call 10',
          'bench_head_250k_session27_h200_call12_round1.json': 'H200 call 12a', 'bench_head_250k_session27_h200_call12_round2.json': 'H200 call 12b',
          'bench_head_250k_active001_session27_h100_call8.json': 'H100 call 8', 'bench_head_250k_active001_session27_h200.json': 'H200 call 10'}
r27 = pd.concat([pd.DataFrame(json.loads((BENCH / 'extra' / f).read_text())['rows']).assign(run=run) for f, run in runs27.items()])
r27 = r27[(r27.status == 'ok') & r27.impl.isin(['sparton', 'sparton_tl_forward'])].copy()
r27['case'] = np.where(r27.active < 1, 'active ' + r27.active.astype(str), 'random') + ' | ' + r27.run
ab = []
for f, run in {'sparton_ws_vs_lockstep_session27_h100_call2.json': 'H100 call 2', 'sparton_ws_vs_lockstep_session27_h100_call8.json': 'H100 call 8',
               'sparton_ws_vs_lockstep_session27_h200.json': 'H200 call 10'}.items():
    for case, t in json.loads((BENCH / 'extra' / f).read_text())['timing'].items():
        for kernel, key in (('lockstep (session 26)', 'res'), ('warp-specialized', '{}')):
            ab += [{'case': f'{case} | {run}', 'kernel': kernel, 'ms': ms} for ms in t[key]]
ab = pd.DataFrame(ab)
fig, axes = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={'wspace': 0.6})
r27.pivot_table(index='case', columns='impl', values='ms', aggfunc='median').plot.barh(ax=axes[0])
axes[0].axvline(26, color='k', ls='--', lw=1); axes[0].legend(loc='upper center', bbox_to_anchor=(0.5, -0.05), ncol=2); axes[0].set_title('64x512x250002 fwd+bwd, ms'); axes[0].set_ylabel('')
ab.pivot_table(index='case', columns='kernel', values='ms', aggfunc='median').plot.barh(ax=axes[1])
axes[1].set_title('resident forward alone (median of 3 rounds), ms'); axes[1].set_ylabel('')
plt.savefig(FIG / 'head_session27.png', dpi=110, bbox_inches='tight'); plt.show()
ab.pivot_table(index='case', columns='kernel', values='ms', aggfunc=['min', 'median', 'max']).round(2)"""

BENCHMARKS = [
    new_markdown_cell("# lsr benchmarks\n\nPlots of the committed benchmark results in `docs/bench/` (H200, and H100 for training and MaxSim; see "
                      "docs/benchmarks.md for the commands, versions and commits). Nothing here needs a GPU."),
    new_code_cell(BENCH_SETUP),
    new_markdown_cell("## Sparton head: time and peak extra memory per case"),
    new_code_cell(HEAD),
    new_markdown_cell("## Exact search: QPS vs batch size and collection size"),
    new_code_cell(SEARCH),
    new_markdown_cell("## Corpus encoding throughput"),
    new_code_cell(ENCODE),
    new_markdown_cell("## Padding-free backbone: packed tokens, flash attention, fused add + LayerNorm"),
    new_code_cell(VARLEN),
    new_markdown_cell("## Packed Sparton head (inference): texts share 128-token tiles"),
    new_code_cell(PACKED),
    new_markdown_cell("## Corpus encoding: tokenizer processes vs a tokenizing thread (same run, 1M passages)"),
    new_code_cell(WORKERS),
    new_markdown_cell("## Dev-small end to end (search + runs + evaluation, vectors given)"),
    new_code_cell(E2E),
    new_markdown_cell("## Training: step time and largest batch (lsr.train vs sentence-transformers), loss curves"),
    new_code_cell(TRAIN),
    new_markdown_cell("## Late interaction: fused MaxSim vs flash-maxsim, einsum and torch.compile"),
    new_code_cell(MAXSIM),
    new_markdown_cell("## Compact postings (4 bytes) against float32 postings (8 bytes), same collection, exact"),
    new_code_cell(COMPACT),
    new_markdown_cell("## Serving: throughput against p99 latency, batching off and on"),
    new_code_cell(SERVE),
    new_markdown_cell("## Small batches: coarse lists with ties settled inside the chunk (session 13, old = 9e6cc32)"),
    new_code_cell(RESCUE),
    new_markdown_cell("## Small batches: bucket selection and one-kernel query scales (session 15, old = 007706d)"),
    new_code_cell(SELECT),
    new_markdown_cell("## Batches: the coarse pass 2 in float32, three CTAs per SM (session 16, base = 2864652)"),
    new_code_cell(COARSE3),
    new_markdown_cell("## Batches: coarse sums in 16 bits, 32,768-doc spans (session 18: base = 1bb7c98 twice, new = da25664 "
                      "twice, final = 9b72210)"),
    new_code_cell(COARSE16),
    new_markdown_cell("## Encoding: GELU in the FFN GEMM's epilogue, packed-head tile groups (session 19, base = 9bba66b)"),
    new_code_cell(ENCODE19),
    new_markdown_cell("## Encoding: lsr's packed attention kernel against flash attention's variable-length kernel (session 20)"),
    new_code_cell(ATTN20),
    new_markdown_cell("## Batches above 64 queries replay CUDA graphs too (session 21, before = graphs up to B = 64)"),
    new_code_cell(GRAPH21),
    new_markdown_cell("## Search at the start and the end of session 21, one machine"),
    new_code_cell(AB21),
    new_markdown_cell("## Search at the start and the end of session 22, and against the tree issue 18 started from (one H200)"),
    new_code_cell(AB22),
    new_markdown_cell("## Search at the start and the end of session 23 (row top-k and histogram kernels), and against issue "
                      "18's starting tree (one H200)"),
    new_code_cell(AB23),
    new_markdown_cell("## Sparton head backward: tile sizes from a sweep (session 24, start = 9fb413b, end = b121e6e)"),
    new_code_cell(HEAD24),
    new_markdown_cell("## Sparton head: dH over row groups in one launch, the forward without mask reads for right-padded rows "
                      "(session 25)"),
    new_code_cell(HEAD25),
    new_markdown_cell("## Sparton head: the forward with the vocabulary tile resident on chip (Gluon, session 26)\n\nEach "
                      "file is one `bench_head.py` run; `sparton_tl_forward` / `sparton_fwd_only_tl` are the same calls "
                      "with the tl forward kernel, measured in the same run. The dashed line is issue 18's 26 ms for "
                      "64x512x250002."),
    new_code_cell(HEAD26),
    new_markdown_cell("## Sparton head: the warp-specialized resident forward (session 27)\n\nLeft: `bench_head.py` runs of"
                      " 64x512x250002 training (fwd+bwd), the warp-specialized resident forward (`sparton`) against the "
                      "session-25 tl forward (`sparton_tl_forward`) in the same run; H100 calls 2 and 8 and H200 calls 10 "
                      "and 12 ran the committed tree, H100 call 6 an experimental backward that was not kept. Right: the "
                      "training forward alone, session 26's lockstep resident kernel against the warp-specialized one, "
                      "three alternating rounds per call (`ab_fwd.py`). The dashed line is issue 18's 26 ms."),
    new_code_cell(HEAD27),
]


def build(name: str, cells: list) -> None:
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}})
    ExecutePreprocessor(timeout=600, kernel_name="python3").preprocess(nb, {"metadata": {"path": str(NB)}})
    nbformat.write(nb, NB / name)
    print(f"wrote {NB / name}")


if __name__ == "__main__":
    import sys

    NB.mkdir(exist_ok=True)
    wanted = sys.argv[1:] or ["benchmarks", "quickstart"]  # e.g. `benchmarks` alone: no pipeline run
    for name, cells in (("benchmarks", BENCHMARKS), ("quickstart", QUICKSTART)):
        if name in wanted:
            build(f"{name}.ipynb", cells)
