"""Where does corpus-encoding time go? A diagnosis of encode_corpus vs the GPU path alone.

Same model and data as scripts/bench_encode.py (random BERT-base MLM, sparsity-calibrated, bf16 on CUDA;
synthetic MS MARCO-like passages, real bert-base-uncased tokenizer). Parts:

  fixed     B=1024 random-id batches at S in 64/80/96/128 (warm-up first, median of repeats, CUDA synced):
            ms of the backbone + MLM transform (tower.body), the padded Sparton head (sparton_head) and the
            packed one (sparton_head(variant="packed"), what encode_prepared uses), both also on a mask of random
            lengths 8..S (head_var, head_packed_var), the sparse extraction (_to_csr), the whole
            encode_prepared on one pinned batch, and the bare bf16 GEMM hidden @ Eᵀ (cuBLAS reference
            for the head's FLOPs); TFLOP/s = 2·B·S·D·V / time.
  varlen    --passages texts cut into windows of 50,000, prepared beforehand (not timed); passages/s of
            encode_prepared over all windows, of body + head + _to_csr per batch (no reordering / copy to
            the host), of body + head, of the body alone, and of encode_prepared while another thread runs
            enc.prepare nonstop (GIL contention as in encode_corpus before tokenizer processes, without the
            writer), and the same with that thread tokenizing in worker processes; padded / real tokens;
            batch widths (buckets of 16). Once per --bodies entry: the padding-free backbone with lsr's packed
            attention (varlen) or flash attention (varlen-flash), and HF's padded forward (hf), on the same
            prepared batches.
  e2e       encode_corpus (windows of 50,000, shards of 100,000, B=1024, 131,072 tokens) after a 20K warm-up
            pass, once per --workers value (tokenizer processes; 0 = the reading thread tokenizes), repeated
            --e2e-repeats times in turn, for each --bodies entry: passages/s and the main thread's time split
            (stats: first_window_s, wait_input_s, encode_s, wait_writer_s). --unique N repeats N generated
            passages up to --passages (an 8.8M-passage run without generating 8.8M texts).
  tokenize  per window: enc.prepare (tokenize + sort + pad + pin), the tokenizer call alone (Rust + ids to
            numpy), the Rust encode_batch alone, and tokenize / prepare through worker processes.

Writes profile_encode.json to --out (after every part) and prints a table last.

    PYTHONPATH=. python scripts/profile_encode.py --out results/profile_encode          # H200, ~3-4 min
    PYTHONPATH=. python scripts/profile_encode.py --out results/p8m --parts e2e --bodies varlen --workers 8 \
        --passages 8800000 --unique 1000000                                             # H200, ~7 min
    PYTHONPATH=. python scripts/profile_encode.py --tiny --device cpu --passages 300 --out /tmp/prof   # smoke
    PYTHONPATH=. python scripts/profile_encode.py --out results/attn --parts e2e --bodies varlen,varlen-flash \
        --workers 8 --passages 1000000 --unique 250000 --e2e-repeats 2              # attention A/B, H200, ~4 min
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
from bench_encode import MAX_LEN, build_model, common_args, measure, synth_texts

from lsr.benchmarks.harness import environment, synchronize
from lsr.encode.corpus import encode_corpus
from lsr.encode.sparton import sparton_head
from lsr.encode.splade.encoder import PreparedTexts, SpladeEncoder, TokenBatch
from lsr.encode.splade.extract import to_csr as _to_csr
from lsr.encode.splade.forward import head_weights
from lsr.encode.tokenize.pool import default_workers


def timed(fn, dev: torch.device) -> float:
    synchronize()
    t0 = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - t0


def uses_varlen(enc: SpladeEncoder, prepared: PreparedTexts) -> bool:
    """Does encode_prepared run these batches through the padding-free backbone?"""
    with torch.inference_mode():
        return enc.runs_packed(prepared.kind) and prepared.batches[0].lengths is not None


# ---------------------------------------------------------------------------------------------- parts
def fixed_part(enc: SpladeEncoder, dev: torch.device, batch: int, lengths: tuple[int, ...], repeats: int) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    rows = []
    for S in lengths:
        rows.append(fixed_row(enc, dev, batch, S, repeats, gen))
        print(f"fixed S={S}: {rows[-1]}", flush=True)
    return rows


@torch.inference_mode()
def fixed_row(enc: SpladeEncoder, dev: torch.device, batch: int, S: int, repeats: int, gen: torch.Generator) -> dict:
    tower = enc.tower("doc")
    V, D = tower.weight.shape
    ids = torch.randint(1000, 30000, (batch, S), generator=gen)
    ids[:, 0], ids[:, -1] = 101, 102
    mask = torch.ones_like(ids)
    if dev.type == "cuda":
        ids, mask = ids.pin_memory(), mask.pin_memory()
    ids_d, mask_d = ids.to(dev), mask.to(dev)
    prepared = PreparedTexts("doc", [TokenBatch(ids, mask, torch.arange(batch))], batch, batch * S, batch * S)
    hidden = tower.body(input_ids=ids_d, attention_mask=mask_d).logits
    y = head_weights(tower, hidden, mask_d, backend=enc.backend, packed=enc.packed)
    w, b = tower.weight, tower.bias
    var = (torch.arange(S)[None, :] < torch.randint(min(8, S), S + 1, (batch, 1), generator=gen)).to(dev)  # unsorted lengths
    cases = {"body": lambda: tower.body(input_ids=ids_d, attention_mask=mask_d).logits,
             "head": lambda: sparton_head(hidden, w, b, mask_d),
             "head_packed": lambda: sparton_head(hidden, w, b, mask_d, variant="packed"),
             "head_var": lambda: sparton_head(hidden, w, b, var),
             "head_packed_var": lambda: sparton_head(hidden, w, b, var, variant="packed"),
             "to_csr": lambda: _to_csr(y, None),
             "encode_prepared": lambda: enc.encode_prepared(prepared)}
    if batch * S * V * hidden.element_size() <= 40e9:  # the GEMM's [B·S, V] output
        flat, weight_t = hidden.reshape(-1, D), tower.weight.t()
        cases["gemm"] = lambda: flat @ weight_t
    flops = 2 * batch * S * D * V
    row = {"S": S, "batch": batch, "nnz_per_doc": round(int((y > 0).sum()) / batch, 1),
           "var_fill": round(float(var.float().mean()), 3)}  # real / padded tokens of the head_var mask
    for name, fn in cases.items():
        row[f"{name}_ms"] = round(measure(fn, repeats, fn, 1)["ms"], 3)
    row["head_tflops"] = round(flops / row["head_ms"] / 1e9, 2)
    if "gemm_ms" in row:
        row["gemm_tflops"] = round(flops / row["gemm_ms"] / 1e9, 2)
    row["encode_pps"] = round(batch / row["encode_prepared_ms"] * 1e3)
    return row


@torch.inference_mode()
def warm_head(enc: SpladeEncoder, dev: torch.device, batch: int, max_tokens: int | None) -> None:
    """Run the head once per sequence-length bucket (the Triton head autotunes per power of two of S)."""
    tower = enc.tower("doc")
    for S in (8, 16, 32, 64, 128, 256):
        B = batch if max_tokens is None else max(1, min(batch, max_tokens // S))
        hidden = torch.randn(B, S, tower.weight.shape[1], device=dev, dtype=enc.dtype)
        head_weights(tower, hidden, torch.ones(B, S, dtype=torch.int64, device=dev), backend=enc.backend,
                     packed=enc.packed)
    synchronize()


def varlen_part(enc: SpladeEncoder, dev: torch.device, windows: list[list[str]], prepared: list[PreparedTexts],
                ids: list[list[str]], batch: int, max_tokens: int | None, workers: int) -> dict:
    tower = enc.tower("doc")
    n = sum(p.n for p in prepared)

    def full() -> None:
        for p, i in zip(prepared, ids):
            enc.encode_prepared(p, i)

    @torch.inference_mode()
    def partial(stages: int) -> None:  # 1: body, 2: + head, 3: + _to_csr (no reordering, stays on the GPU)
        for p in prepared:
            for b in p.batches:
                y = enc._encode_batch(tower, b, head=stages > 1)
                if stages > 2:
                    _to_csr(y, None)

    def contended(pool: Any = None) -> tuple[float, int]:
        stop, done = threading.Event(), [0]

        def tokenize() -> None:
            while not stop.is_set():
                enc.prepare(windows[done[0] % len(windows)], "doc", batch, max_tokens, pool=pool)
                done[0] += 1

        thread = threading.Thread(target=tokenize, daemon=True)
        thread.start()
        try:
            return timed(full, dev), done[0]
        finally:
            stop.set()
            thread.join()

    warm_head(enc, dev, batch, max_tokens)
    enc.encode_prepared(prepared[0], ids[0])  # cuBLAS / sdpa / allocator warm-up on real shapes
    out = {"passages": n, "windows": len(prepared), "varlen": uses_varlen(enc, prepared[0])}
    out["encode_prepared_pps"] = round(n / timed(full, dev))
    out["body_head_csr_pps"] = round(n / timed(lambda: partial(3), dev))
    out["body_head_pps"] = round(n / timed(lambda: partial(2), dev))
    out["body_pps"] = round(n / timed(lambda: partial(1), dev))
    seconds, windows_prepared = contended()
    out["contended_pps"] = round(n / seconds)
    out["contended_windows_prepared"] = windows_prepared
    if workers:
        pool = enc.tokenizer_pool("doc", workers)
        try:
            enc.prepare(windows[0], "doc", batch, max_tokens, pool=pool)  # workers started
            seconds, windows_prepared = contended(pool)
        finally:
            pool.close()
        out["contended_pool_pps"] = round(n / seconds)
        out["contended_pool_workers"] = workers
        out["contended_pool_windows_prepared"] = windows_prepared
    widths = [b.input_ids.shape[1] for p in prepared for b in p.batches]
    out["padded_over_real_tokens"] = round(sum(p.n_slots for p in prepared) / sum(p.n_tokens for p in prepared), 4)
    out["batches"] = len(widths)
    out["rows_per_batch"] = round(n / max(len(widths), 1), 1)
    buckets = Counter((w - 1) // 16 for w in widths)
    out["width_hist"] = {f"{16 * k + 1}-{16 * k + 16}": buckets[k] for k in sorted(buckets)}
    print(f"varlen: {out}", flush=True)
    return out


def compile_part(enc: SpladeEncoder, dev: torch.device, prepared: list[PreparedTexts], ids: list[list[str]]) -> dict:
    """encode_prepared over the prepared windows with the torch.compile'd backbone: the first pass
    compiles (timed apart), the second is measured."""
    n = sum(p.n for p in prepared)

    def full() -> None:
        for p, i in zip(prepared, ids):
            enc.encode_prepared(p, i)

    t0 = time.perf_counter()
    full()
    synchronize()
    first = time.perf_counter() - t0
    out = {"passages": n, "first_pass_s": round(first, 1), "encode_prepared_pps": round(n / timed(full, dev))}
    out["compile_s"] = round(first - n / out["encode_prepared_pps"], 1)  # the first pass's extra time
    print(f"compile: {out}", flush=True)
    return out


def e2e_part(enc: SpladeEncoder, dev: torch.device, texts: list[str], window: int, batch: int,
             max_tokens: int | None, warm: int, workers: int | None) -> dict:
    def run(docs: list[str], stats: dict) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            encode_corpus(enc, ((str(i), t) for i, t in enumerate(docs)), Path(tmp) / "vec", batch_size=batch,
                          max_tokens=max_tokens, shard_rows=100_000, sort_window=window, show_progress_bar=False,
                          resume=False, tokenize_workers=workers, stats=stats)

    run(texts[:warm], {})
    stats: dict = {}
    seconds = timed(lambda: run(texts, stats), dev)
    out = {"passages": len(texts), "varlen": uses_varlen(enc, enc.prepare(texts[:2], "doc")),
           "tokenize_workers": stats["tokenize_workers"], "pps": round(len(texts) / seconds),
           "wall_s": round(seconds, 3), "stats_pps": round(stats["docs_per_s"])}  # pps: wall clock incl. setup + cleanup
    split = ("first_window_s", "wait_input_s", "encode_s", "wait_writer_s")
    out.update({k: round(stats[k], 3) for k in split + ("seconds",)})
    out["other_s"] = round(stats["seconds"] - sum(stats[k] for k in split[1:]), 3)
    out["encode_only_pps"] = round(len(texts) / stats["encode_s"]) if stats["encode_s"] > 0 else None
    out["padding"] = round(stats["padded_tokens"] / stats["tokens"] - 1, 4)
    out["nnz_per_doc"] = round(stats["nnz"] / len(texts), 1)
    print(f"e2e: {out}", flush=True)
    return out


def tokenize_part(enc: SpladeEncoder, windows: list[list[str]], prepare_s: list[float], workers: int, batch: int,
                  max_tokens: int | None) -> dict:
    cpu = torch.device("cpu")
    tok = enc._tokenizer("doc")
    fast = tok._fast  # the Rust batch call alone (fast tokenizers only)
    rust = None if fast is None else getattr(fast, "encode_batch_fast", fast.encode_batch)
    tok_s, rust_s = [], []
    for w in windows:
        tok_s.append(timed(lambda w=w: tok(w), cpu))
        if rust is not None:
            rust_s.append(timed(lambda w=w: rust(w), cpu))
    n = sum(map(len, windows))
    out = {"passages": n, "window": len(windows[0]),
           "prepare_s_per_window": [round(s, 3) for s in prepare_s], "prepare_pps": round(n / sum(prepare_s)),
           "tokenizer_s_per_window": [round(s, 3) for s in tok_s], "tokenizer_pps": round(n / sum(tok_s)),
           "rust_encode_pps": round(n / sum(rust_s)) if rust_s else None}
    if workers and fast is not None:
        with enc.tokenizer_pool("doc", workers) as pool:
            pool(windows[0][:1000])  # workers started
            out["pool_workers"] = workers
            out["pool_pps"] = round(n / sum(timed(lambda w=w: pool(w), cpu) for w in windows))
            out["pool_prepare_pps"] = round(n / sum(timed(lambda w=w: enc.prepare(w, "doc", batch, max_tokens, pool=pool),
                                                          cpu) for w in windows))
    print(f"tokenize: {out}", flush=True)
    return out


# ---------------------------------------------------------------------------------------------- output
def table(res: dict) -> str:
    lines = [("| S | body ms | head ms | head TFLOP/s | packed head ms | head / packed ms, lengths 8..S | gemm ms | "
              "gemm TFLOP/s | to_csr ms | encode_prepared ms | p/s |"),
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in res.get("fixed", []):
        lines.append(f"| {r['S']} | {r['body_ms']} | {r['head_ms']} | {r['head_tflops']} | {r['head_packed_ms']} | "
                     f"{r['head_var_ms']} / {r['head_packed_var_ms']} | {r.get('gemm_ms', '-')} | "
                     f"{r.get('gemm_tflops', '-')} | {r['to_csr_ms']} | {r['encode_prepared_ms']} | {r['encode_pps']:,} |")
    e, t = res.get("e2e"), res.get("tokenize")
    for body, v in (res.get("varlen") or {}).items():
        lines.append(f"{body} varlen p/s: encode_prepared {v['encode_prepared_pps']:,} | body+head+to_csr "
                     f"{v['body_head_csr_pps']:,} | body+head {v['body_head_pps']:,} | "
                     f"body {v['body_pps']:,} | encode_prepared + tokenizing thread {v['contended_pps']:,} | "
                     f"+ thread using {v.get('contended_pool_workers', 0)} processes {v.get('contended_pool_pps', 0):,} | "
                     f"padded/real {v['padded_over_real_tokens']} | {v['batches']} batches")
    named = [("e2e", e or [])] + [(f"e2e compile={m}", c.get("e2e", [])) for m, c in (res.get("compile") or {}).items()]
    for name, runs in named:
        for r in runs:
            lines.append(f"{name}, {r.get('body', 'varlen' if r.get('varlen') else 'hf')}, {r['tokenize_workers']} "
                         "tokenizer processes: "
                         f"{r['pps']:,} p/s in {r['seconds']} s = "
                         f"first window {r['first_window_s']} (in wait_input) | wait_input {r['wait_input_s']} | "
                         f"encode {r['encode_s']} ({r['encode_only_pps']:,} p/s) | wait_writer {r['wait_writer_s']} | "
                         f"other {r['other_s']}")
    for m, c in (res.get("compile") or {}).items():
        lines.append(f"compile={m}: encode_prepared {c['encode_prepared_pps']:,} p/s (first pass {c['first_pass_s']} s, "
                     f"{c.get('compile_s', '-')} s more than the second)")
    if t:
        lines.append(f"tokenize p/s: prepare {t['prepare_pps']:,} | tokenizer call {t['tokenizer_pps']:,} | "
                     f"rust encode_batch {t['rust_encode_pps'] or 0:,} | {t.get('pool_workers', 0)} processes: "
                     f"tokenize {t.get('pool_pps', 0):,}, prepare {t.get('pool_prepare_pps', 0):,}")
    return "\n".join(lines)


BODIES = {"varlen": (True, "packed"), "varlen-flash": (True, "flash"), "hf": (False, None)}  # varlen=, attention


def load_body(folder: str, body: str, dev: torch.device, dtype: torch.dtype, compile: bool = False) -> SpladeEncoder:
    """The encoder of one --bodies entry."""
    varlen, attention = BODIES[body]
    enc = SpladeEncoder.from_pretrained(folder, device=dev, dtype=dtype, max_length_doc=MAX_LEN, varlen=varlen,
                                        compile=compile)
    if attention is not None and enc.tower("doc").varlen is not None:
        enc.tower("doc").varlen.attention = attention
    return enc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap, "bench_results/profile_encode", "synthetic passages (default 300,000; 300 when small)",
                "timed repeats per fixed-length measurement (median)")
    ap.add_argument("--parts", default="fixed,varlen,e2e,tokenize",
                    help="comma-separated subset of fixed,varlen,e2e,tokenize,compile (compile: varlen "
                         "encode_prepared with a torch.compile'd backbone, compile time reported apart)")
    ap.add_argument("--workers", default="0,auto",
                    help="tokenizer processes for e2e, one run each (comma-separated; auto = default_workers()); "
                         "the first value > 0 is also used by the varlen and tokenize parts")
    ap.add_argument("--e2e-repeats", type=int, default=1, help="alternating rounds over --workers")
    ap.add_argument("--unique", type=int, help="distinct synthetic passages, repeated to --passages (for 8.8M-passage "
                    "runs without generating 8.8M texts; tokenization and encoding cost the same per passage)")
    ap.add_argument("--bodies", default="varlen,hf",
                    help="backbones for the varlen and e2e parts (comma-separated): varlen = the padding-free "
                         "forward (SpladeEncoder varlen=True) with lsr's packed attention kernel, varlen-flash = "
                         "the same with flash attention's variable-length kernel, hf = HF's padded forward "
                         "(varlen=False); fixed, tokenize and compile use the first; e2e alternates them")
    args = ap.parse_args()
    if set(args.bodies.split(",")) - BODIES.keys():
        ap.error(f"--bodies takes {', '.join(BODIES)}; got {args.bodies}")
    parts = set(args.parts.split(","))
    workers = [default_workers() if w == "auto" else int(w) for w in args.workers.split(",")]
    pool_workers = next((w for w in workers if w > 0), 0)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    small = args.tiny or not cuda  # the CPU runs the torch twin of the head ([B, S, V] logits)
    dtype = torch.bfloat16 if cuda else torch.float32
    n = args.passages or (300 if small else 300_000)
    batch, max_tokens = (8, 2048) if small else (1024, 131072)
    window, lengths, warm = (100, (16, 32), 100) if small else (50_000, (64, 80, 96, 128), 20_000)
    repeats = args.repeats or (2 if small else 10)
    torch.backends.cuda.matmul.allow_tf32 = True
    from transformers import AutoTokenizer

    env = environment(dev)
    env.update(tiny=args.tiny, dtype=str(dtype), passages=n, batch=batch, max_tokens=max_tokens, window=window)
    print(json.dumps(env), flush=True)
    res: dict = {"env": env}

    def save() -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_encode.json").write_text(json.dumps(res, indent=1))

    tokenizer = AutoTokenizer.from_pretrained(args.data / "bert-base-uncased")
    with tempfile.TemporaryDirectory() as tmp:
        env["model"] = build_model(Path(tmp), args.tiny, dev, dtype, tokenizer)
        bodies = {b: load_body(tmp, b, dev, dtype) for b in args.bodies.split(",")}
        first = next(iter(bodies))
        enc = bodies[first]
        compiled = {first: load_body(tmp, first, dev, dtype, compile=True)} if "compile" in parts else {}
    if "fixed" in parts:
        res["fixed"] = fixed_part(enc, dev, batch, lengths, repeats)
        save()
    texts, _ = synth_texts(min(n, args.unique or n), tokenizer, np.random.default_rng(0))
    texts = (texts * -(-n // len(texts)))[:n]
    windows = [texts[i:i + window] for i in range(0, n, window)]
    ids = [[str(j) for j in range(i, i + len(w))] for i, w in zip(range(0, n, window), windows)]
    enc.prepare(windows[0][:1000], "doc", batch, max_tokens)  # builds the tokenizer copy
    prepare_s, prepared = [], []
    for w in windows:
        t0 = time.perf_counter()
        prepared.append(enc.prepare(w, "doc", batch, max_tokens))
        prepare_s.append(time.perf_counter() - t0)
    if "varlen" in parts:
        res["varlen"] = {}
        for body, model in bodies.items():
            res["varlen"][body] = varlen_part(model, dev, windows, prepared, ids, batch, max_tokens, pool_workers)
            save()
    if compiled:
        res["compile"] = {m: compile_part(model, dev, prepared, ids) for m, model in compiled.items()}
        save()
    del prepared
    e2e_models = [(m, model, res["compile"][m].setdefault("e2e", [])) for m, model in compiled.items()]
    e2e_models += [(b, model, res.setdefault("e2e", [])) for b, model in bodies.items()]
    for _ in range(args.e2e_repeats if "e2e" in parts else 0):
        for body, model, runs in e2e_models:
            for w in workers:
                runs.append({"body": body, **e2e_part(model, dev, texts, window, batch, max_tokens, min(warm, n), w)})
                save()
    if "tokenize" in parts:
        res["tokenize"] = tokenize_part(enc, windows, prepare_s, pool_workers, batch, max_tokens)
        res["tokenize"]["prepare_median_s"] = round(statistics.median(prepare_s), 3)
        save()
    print(table(res))


if __name__ == "__main__":
    main()
