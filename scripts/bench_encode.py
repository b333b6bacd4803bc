"""Encoding throughput: Hugging Face masked LM + torch SPLADE head vs lsr's SpladeEncoder, same run.

Model: BERT-base (BertForMaskedLM from BertConfig(), random weights, sdpa, bf16 on CUDA), its decoder
bias shifted so a passage activates ~127 terms like a trained SPLADE model (lsr/testing.py
``calibrate_sparsity``), saved once and loaded by both sides: identical weights.

Data: ``synth`` = passages of whole-word vocabulary tokens whose token counts follow a lognormal
like MS MARCO passages (mean ~75 wordpieces with [CLS]/[SEP], max 256); ``scifact`` = the real
5,183 SciFact documents (title + abstract, truncated to 256). Every end-to-end case includes
tokenization with the real bert-base-uncased tokenizer.

Cases (passages/s):
  hf      tokenizer(batch, padding=True) -> BertForMaskedLM logits -> max_s log1p(relu(logits))·mask,
          batches in stream order, swept over batch sizes (the best one is the baseline). The
          output stays a dense [B, V] tensor on the GPU (no sparse conversion: favours the baseline).
  hf_sorted  the same on texts sorted by token length beforehand (sort not timed), B=1024: separates what length bucketing buys from what the Sparton head buys.
  lsr     encode_corpus(SpladeEncoder, defaults: padding-free backbone, packed Sparton head, tokenizer
          worker processes): background tokenization, length bucketing, sparse extraction, Parquet
          shards on disk; two batch / token budgets; on --lsr-passages texts (1M: the steady state; its
          first window, tokenized before the GPU starts, is reported as first_window_s).
  lsr_tokenize_only  SpladeEncoder.prepare on the main thread (tokenize, sort, pad, pin): the CPU side's
          ceiling, for diagnosis.
  fixed80 pre-tokenized [B, 80] random ids, no tokenization: HF MLM + torch head, the backbone alone
          and lsr's encode_prepared (reference points: 14,700 and 29,100 p/s at B=1024 on an H200).
On several GPUs (``torchrun -m lsr encode``, W ranks against 1, start-up included): scripts/bench_encode_dist.py.
Timing: wall clock with CUDA synchronisation after a warm-up pass (Triton autotuning, cuBLAS; all texts
for lsr, 4 batches for hf);
median of --repeats. Peak memory: torch.cuda.max_memory_allocated per case. Out-of-memory and other
failures are recorded per case and the run goes on. Writes bench_encode.json + bench_encode.csv (lsr.benchmarks.harness schema) to
--out after every case; prints a table last.

    PYTHONPATH=. python scripts/bench_encode.py --out results/encode            # H200, ~6 min
    PYTHONPATH=. python scripts/bench_encode.py --out results/encode --quick    # < 3 min (lsr on 100K: start-up bound)
    PYTHONPATH=. python scripts/bench_encode.py --out /tmp/enc --device cpu --tiny   # CPU smoke test
    PYTHONPATH=. python scripts/bench_encode.py --out results/encode-tiny --quick --model data/models/splade-tiny
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from lsr.benchmarks.harness import PeakMemory, Results, environment, quantiles, time_calls
from lsr.encode.corpus import encode_corpus
from lsr.encode.splade.encoder import PreparedTexts, SpladeEncoder, TokenBatch
from lsr.testing import calibrate_sparsity, tiny_config

TARGET_PPS, TARGET_RATIO = 22_000, 1.5
MAX_LEN = 256


# ---------------------------------------------------------------------------------------------- setup
def build_model(out: Path, tiny: bool, device: torch.device, dtype: torch.dtype, tokenizer) -> dict:
    """Random BERT-base (or tiny) masked LM, sparsity-calibrated, saved with the tokenizer to ``out``."""
    from transformers import AutoModelForMaskedLM, BertConfig

    torch.manual_seed(0)
    cfg = tiny_config("bert") if tiny else BertConfig()
    model = AutoModelForMaskedLM.from_config(cfg, attn_implementation="sdpa").to(device=device, dtype=dtype).eval()
    sample = [f"{t} {t}" for t in synth_texts(16, tokenizer, np.random.default_rng(1))[0]]
    shift = calibrate_sparsity(model, tokenizer, sample, target_nnz=127)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {"hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers, "vocab": cfg.vocab_size, "bias_shift": shift}


def synth_texts(n: int, tokenizer, rng: np.random.Generator) -> tuple[list[str], np.ndarray]:
    """n passages of whole-word vocabulary entries (each one wordpiece), token counts (with [CLS]/[SEP])
    lognormal: median 68, sigma 0.45 -> mean ~75, clipped to [8, 256] like MS MARCO after truncation."""
    words = np.array(sorted(t for t in tokenizer.get_vocab() if t.isascii() and t.isalpha() and len(t) > 1))
    lengths = np.clip(np.rint(rng.lognormal(np.log(68), 0.45, n)), 8, MAX_LEN).astype(np.int64)
    picks = rng.integers(0, len(words), int((lengths - 2).sum()))
    ends = np.cumsum(lengths - 2)
    return [" ".join(words[picks[e - k:e]]) for e, k in zip(ends, lengths - 2)], lengths


def scifact_texts(path: Path, limit: int | None) -> list[str]:
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [f"{r['title']} {r['text']}" for r in rows[:limit]]


# ---------------------------------------------------------------------------------------------- cases
def measure(fn: Callable[[], object], repeats: int, warmup: Callable[[], object], n: int) -> dict:
    """Row fields of ``repeats`` timed calls of ``fn`` (after ``warmup()``) that encode ``n`` passages each:
    time quantiles and passages/s at the median."""
    warmup()
    q = quantiles(time_calls(lambda i: fn(), repeats, warmup=0))
    return q | {"pps": n / q["ms"] * 1000}


def hf_head(model, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The usual SPLADE pooling over full MLM logits: [B, V]."""
    logits = model(input_ids=input_ids, attention_mask=mask).logits
    return torch.max(torch.log1p(torch.relu(logits)) * mask.unsqueeze(-1), dim=1).values


@torch.inference_mode()
def hf_encode(model, tokenizer, texts: list[str], batch: int, device: torch.device) -> None:
    for i in range(0, len(texts), batch):
        enc = tokenizer(texts[i:i + batch], padding=True, truncation=True, max_length=MAX_LEN, return_tensors="pt")
        hf_head(model, enc["input_ids"].to(device, non_blocking=True), enc["attention_mask"].to(device, non_blocking=True))


def lsr_encode(enc: SpladeEncoder, texts: list[str], batch: int, max_tokens: int | None, stats: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        encode_corpus(enc, ((str(i), t) for i, t in enumerate(texts)), Path(tmp) / "vec", batch_size=batch,
                      max_tokens=max_tokens, shard_rows=100_000, show_progress_bar=False, resume=False, stats=stats)


def run_case(results: Results, fields: dict, fn: Callable[[], dict]) -> None:
    """Run one measurement; an OOM or any error is recorded and the benchmark goes on."""
    row = dict(fields)
    try:
        with PeakMemory() as peak:
            row.update(fn())
        row["peak_extra_mb"] = peak.extra_mb
    except torch.cuda.OutOfMemoryError:
        row["status"] = "oom"
    except Exception as e:  # noqa: BLE001 - a failed case must not end the run
        row["error"] = f"{type(e).__name__}: {e}"[:300]
        traceback.print_exc()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    results.add(row)
    results.summary = summary(results.rows)
    results.save()


def end_to_end_cases(args, results: Results, data: str, texts: list[str], hf_model, tokenizer, enc: SpladeEncoder,
                     hf_batches: list[int], hf_sorted_batch: int | None, lsr_configs: list[dict],
                     method: str = "lsr", lsr_texts: list[str] | None = None) -> None:
    """HF on ``texts``; lsr on ``lsr_texts`` (default the same): a longer stream, so that lsr's rate is its
    steady state and not the start-up of its pipeline (the first window is tokenized before the GPU starts)."""
    dev, n = args.device, len(texts)
    warm = texts[: min(n, 4096, 4 * max(hf_batches + [c["batch"] for c in lsr_configs]))]
    cases = [("hf", b, texts) for b in hf_batches]
    if hf_sorted_batch:  # HF on globally length-sorted texts (sorting not timed): what bucketing alone buys
        lengths = [len(x) for x in tokenizer(texts, truncation=True, max_length=MAX_LEN)["input_ids"]]
        cases.append(("hf_sorted", hf_sorted_batch, [texts[i] for i in np.argsort(lengths, kind="stable")[::-1]]))
    for name, b, stream in cases:
        run_case(results, {"data": data, "method": name, "batch": b, "passages": n},
                 lambda b=b, stream=stream: measure(lambda: hf_encode(hf_model, tokenizer, stream, b, dev), args.repeats,
                                                    lambda: hf_encode(hf_model, tokenizer, warm, b, dev), n))
    if lsr_configs and method == "lsr":  # the CPU side alone: can tokenization + batching keep up with the GPU?
        run_case(results, {"data": data, "method": "lsr_tokenize_only", "batch": lsr_configs[0]["batch"], "passages": n},
                 lambda: measure(lambda: enc.prepare(texts, "doc", lsr_configs[0]["batch"]), args.repeats,
                                 lambda: enc.prepare(warm, "doc"), n))
    lsr_texts = texts if lsr_texts is None else lsr_texts
    m = len(lsr_texts)
    for cfg in lsr_configs:
        def case(b=cfg["batch"], tokens=cfg["max_tokens"]) -> dict:
            stats: dict = {}
            # warm-up on up to 200K texts (4 windows): Triton autotunes once per sequence-length bucket,
            # and the shortest buckets only show up at the end of each length-sorted window
            timing = measure(lambda: lsr_encode(enc, lsr_texts, b, tokens, stats), args.repeats,
                             lambda: lsr_encode(enc, lsr_texts[:200_000], b, tokens, {}), m)
            return timing | {"nnz_per_doc": round(stats["nnz"] / m, 1),
                    "tokens_per_doc": round(stats["tokens"] / m, 1),
                    "padding": round(stats["padded_tokens"] / stats["tokens"] - 1, 4),
                    "first_window_s": round(stats["first_window_s"], 2), "encode_s": round(stats["encode_s"], 2),
                    "wait_input_s": round(stats["wait_input_s"], 2), "wait_writer_s": round(stats["wait_writer_s"], 2)}
        enc.pad_multiple = cfg.get("pad_multiple", 1)
        run_case(results, {"data": data, "method": method, "batch": cfg["batch"], "max_tokens": cfg["max_tokens"],
                           "pad_multiple": enc.pad_multiple, "passages": m}, case)
        enc.pad_multiple = 1
    if lsr_configs and method == "lsr":  # the in-memory API users call, same texts and batching as encode_corpus
        cfg = lsr_configs[0]
        enc.max_tokens, saved = cfg["max_tokens"], enc.max_tokens
        run_case(results, {"data": data, "method": "lsr_api", "batch": cfg["batch"], "max_tokens": cfg["max_tokens"],
                           "passages": m},
                 lambda: measure(lambda: enc.encode_document(lsr_texts, batch_size=cfg["batch"]), args.repeats,
                                 lambda: enc.encode_document(lsr_texts[:200_000], batch_size=cfg["batch"]), m))
        enc.max_tokens = saved


def fixed_length_cases(args, results: Results, hf_model, enc: SpladeEncoder, batch: int, length: int = 80) -> None:
    dev = args.device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 30000, (batch, length), generator=gen)
    ids[:, 0], ids[:, -1] = 101, 102
    ids_d, mask_d = ids.to(dev), torch.ones_like(ids).to(dev)
    lengths = torch.full((batch,), length, dtype=torch.int32, device=dev)
    prepared = PreparedTexts("doc", [TokenBatch(ids_d, mask_d, torch.arange(batch), lengths, batch * length)], batch,
                             batch * length, batch * length)
    impls = {"hf": lambda: hf_head(hf_model, ids_d, mask_d),
             "hf_backbone": lambda: hf_model.base_model(input_ids=ids_d, attention_mask=mask_d).last_hidden_state,
             "lsr": lambda: enc.encode_prepared(prepared)}
    for name, fn in impls.items():
        def case(fn=fn) -> dict:
            with torch.inference_mode():
                return measure(fn, max(3, args.repeats * 5), fn, batch)
        run_case(results, {"data": f"fixed{length}", "method": name, "batch": batch, "passages": batch}, case)


# ---------------------------------------------------------------------------------------------- output
def best_rows(rows: list) -> dict[str, dict[str, dict]]:
    """data -> method -> the fastest successful row."""
    best: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r.get("pps") and r["pps"] > best.setdefault(r["data"], {}).get(r["method"], {}).get("pps", 0):
            best[r["data"]][r["method"]] = r
    return best


def summary(rows: list) -> dict:
    out = {}
    for data, best in best_rows(rows).items():
        s: dict = {m: {"pps": round(r["pps"]), "batch": r["batch"], "max_tokens": r.get("max_tokens")}
                   for m, r in best.items()}
        if "lsr" in best and "hf" in best:
            s["lsr_over_hf"] = round(best["lsr"]["pps"] / best["hf"]["pps"], 2)
            s["meets_targets"] = bool(best["lsr"]["pps"] >= TARGET_PPS and s["lsr_over_hf"] >= TARGET_RATIO)
        if "lsr" in best and "lsr_api" in best:  # issue target: the in-memory API at >= 90% of encode_corpus
            s["api_over_corpus"] = round(best["lsr_api"]["pps"] / best["lsr"]["pps"], 3)
        out[data] = s
    return out


def table(rows: list) -> str:
    lines = ["| data | method | best config | passages/s | vs hf | padding | nnz/doc |", "|---|---|---|---|---|---|---|"]
    for data, best in best_rows(rows).items():
        for method, r in best.items():
            ratio = f"{r['pps'] / best['hf']['pps']:.2f}×" if "hf" in best and "tokenize" not in method else ""
            cfg = f"B={r['batch']}" + (f", {r['max_tokens']} tok" if r.get("max_tokens") else "")
            lines.append(f"| {data} | {method} | {cfg} | {r['pps']:,.0f} | {ratio} | {r.get('padding', '')} | "
                         f"{r.get('nnz_per_doc', '')} |")
    lines.append(f"targets (synth, lsr): ≥ {TARGET_PPS:,} passages/s and ≥ {TARGET_RATIO}× hf")
    return "\n".join(lines)


def common_args(ap: argparse.ArgumentParser, out: str, passages: str, repeats: str) -> None:
    """The options bench_encode.py and profile_encode.py share (the help texts differ)."""
    ap.add_argument("--out", type=Path, default=Path(out))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="2-layer 32-wide BERT (CPU smoke test)")
    ap.add_argument("--passages", type=int, help=passages)
    ap.add_argument("--repeats", type=int, help=repeats)
    ap.add_argument("--data", type=Path, default=REPO / "data")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_args(ap, "bench_results/encode", "synthetic passages for the HF cases (default 100k, tiny 64)",
                "timed passes per end-to-end case (median)")
    ap.add_argument("--lsr-passages", type=int,
                    help="synthetic passages for lsr's end-to-end cases (default 1M; quick: --passages; tiny 64): "
                         "long enough that the pipeline's start-up (~1-2 s) does not set the rate")
    ap.add_argument("--quick", action="store_true", help="fewer passages and configurations (< 3 min)")
    ap.add_argument("--compile", action="store_true", help="add an lsr case with torch.compile'd backbone")
    ap.add_argument("--model", type=Path, help="a masked-LM / SPLADE checkpoint folder to encode with "
                    "(default: a random, sparsity-calibrated BERT-base)")
    args = ap.parse_args()
    args.device = torch.device(args.device)
    cuda = args.device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    small = args.tiny or not cuda
    args.passages = args.passages or (64 if small else 100_000)
    args.lsr_passages = args.lsr_passages or (args.passages if small or args.quick else 1_000_000)
    args.repeats = args.repeats or 1  # end-to-end passes are long (>= 100k passages) and stable
    def cfgs(*triples: tuple[int, int | None, int]) -> list[dict]:
        return [{"batch": b, "max_tokens": t, "pad_multiple": p} for b, t, p in triples]

    if small:  # the CPU runs the torch twin of the head ([B, S, 30522] logits): keep it tiny
        hf_batches, hf_sorted_batch, fixed_batch = [16], 16, 8
        lsr_configs = cfgs((16, None, 1), (32, 2048, 8))
    elif args.quick:
        hf_batches, hf_sorted_batch, fixed_batch = [256, 1024], 1024, 1024
        lsr_configs = cfgs((1024, 131072, 1), (2048, 262144, 1))
    else:
        hf_batches, hf_sorted_batch, fixed_batch = [256, 512, 1024, 2048], 1024, 1024
        lsr_configs = cfgs((1024, 131072, 1), (2048, 262144, 1))
    torch.backends.cuda.matmul.allow_tf32 = True
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    env = environment(args.device)
    results = Results(args.out, "bench_encode", env, {
        "quick": args.quick, "tiny": args.tiny, "dtype": str(dtype), "passages": args.passages,
        "lsr_passages": args.lsr_passages, "repeats": args.repeats,
        "targets": {"pps": TARGET_PPS, "ratio": TARGET_RATIO}})
    print(json.dumps(env), flush=True)
    tokenizer = AutoTokenizer.from_pretrained(args.data / "bert-base-uncased")
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:  # a real checkpoint (e.g. data/models/splade-tiny) instead of the random BERT-base
            tmp = str(args.model)
            results.config["model"] = {"path": tmp}
        else:
            results.config["model"] = build_model(Path(tmp), args.tiny, args.device, dtype, tokenizer)
        hf_model = AutoModelForMaskedLM.from_pretrained(tmp, dtype=dtype, attn_implementation="sdpa").to(args.device).eval()
        enc = SpladeEncoder.from_pretrained(tmp, device=args.device, dtype=dtype, max_length_doc=MAX_LEN)
        check = scifact_texts(args.data / "scifact" / "corpus.jsonl", 32)
        with torch.inference_mode():  # exactness on real text: lsr vs the HF computation, same dtype
            e = tokenizer(check, padding=True, truncation=True, max_length=MAX_LEN, return_tensors="pt").to(args.device)
            ref = hf_head(hf_model, e["input_ids"], e["attention_mask"]).float().cpu()
        got = enc.encode_document(check).to_dense()
        check = results.config["check"] = {"max_abs_diff": float((got - ref).abs().max()), "max_ref": float(ref.max())}
        fixed_length_cases(args, results, hf_model, enc, fixed_batch)
        long, _ = synth_texts(max(args.passages, args.lsr_passages), tokenizer, np.random.default_rng(0))
        synth = long[:args.passages]
        end_to_end_cases(args, results, "synth", synth, hf_model, tokenizer, enc, hf_batches, hf_sorted_batch,
                         lsr_configs, lsr_texts=long[:args.lsr_passages])
        scifact = scifact_texts(args.data / "scifact" / "corpus.jsonl", 32 if small else None)
        end_to_end_cases(args, results, "scifact", scifact, hf_model, tokenizer, enc, hf_batches, hf_sorted_batch,
                         lsr_configs)
        if args.compile:
            compiled = SpladeEncoder.from_pretrained(tmp, device=args.device, dtype=dtype, max_length_doc=MAX_LEN,
                                                     compile=True)
            end_to_end_cases(args, results, "synth", synth, hf_model, tokenizer, compiled, [], None, lsr_configs[:1],
                             method="lsr_compile", lsr_texts=long[:args.lsr_passages])
    results.save()
    print(json.dumps(results.summary))
    print(f"exactness on 32 SciFact docs: max |lsr - hf| = {check['max_abs_diff']:.3g} "
          f"(largest weight {check['max_ref']:.3g}, {dtype})")
    print(table(results.rows))


if __name__ == "__main__":
    main()
