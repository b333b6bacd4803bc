"""Passages/s of one lsr tree's encoding paths, for before/after comparisons on one machine.

Run it from two checkouts (e.g. the current tree and `git archive OLD lsr scripts` unpacked elsewhere)
one after the other on the same GPU: each prints one JSON line. Cases, on the same seeded synthetic
MS MARCO-length passages (scripts/bench_encode.synth_texts, bert-base-uncased word pieces):

* ``api``: ``SpladeEncoder.encode_document(texts)`` (vectors returned in memory);
* ``corpus``: ``encode_corpus`` into a temporary Parquet directory (with its stats: first window, waits).

A warm-up call on --warmup passages precedes the timed ones (tokenizer processes start, Triton tunes).

    PYTHONPATH=. python scripts/ab_encode.py --model data/models/splade-tiny --passages 200000
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from bench_encode import synth_texts  # noqa: E402

from lsr.encode.corpus import encode_corpus  # noqa: E402
from lsr.encode.splade.encoder import SpladeEncoder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="SPLADE checkpoint folder")
    ap.add_argument("--tokenizer", default=str(ROOT / "data" / "bert-base-uncased"))
    ap.add_argument("--passages", type=int, default=200_000)
    ap.add_argument("--warmup", type=int, default=20_000)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--label", default=str(ROOT))
    ap.add_argument("--profile", type=int, default=0,
                    help="also profile encode_document on this many passages (cProfile of the calling thread + "
                         "torch.profiler GPU kernel time); printed as a second JSON line")
    ap.add_argument("--skip-corpus", action="store_true", help="time encode_document only")
    ap.add_argument("--old-windows", action="store_true",
                    help="no small first windows (windows cut as before they grew from a small first one): the "
                         "vectors of an older tree exactly, for a comparison of non-zeros")
    args = ap.parse_args()
    if args.old_windows:  # encode_document's windows (read at each call); encode_corpus gets first_window below
        import lsr.encode.stream as stream_module

        stream_module.FIRST_WINDOW = stream_module.WINDOW
    from transformers import AutoTokenizer

    texts, _ = synth_texts(args.passages, AutoTokenizer.from_pretrained(args.tokenizer), np.random.default_rng(0))
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    enc = SpladeEncoder.from_pretrained(args.model, device=args.device, dtype=dtype)
    enc.encode_document(texts[:args.warmup])
    row: dict = {"label": args.label, "passages": args.passages, "device": args.device,
                 "old_windows": args.old_windows}
    t = time.perf_counter()
    out = enc.encode_document(texts)
    row["api_pps"] = args.passages / (time.perf_counter() - t)
    row["api_nnz"] = int(out.indptr[-1]) if hasattr(out, "indptr") else None
    if args.skip_corpus:
        print(json.dumps(row), flush=True)
    else:
        time_corpus(enc, texts, args, row)
    if args.profile:
        print(json.dumps(profile_document(enc, texts[:args.profile])), flush=True)


def time_corpus(enc: SpladeEncoder, texts: list[str], args: argparse.Namespace, row: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        docs = ((str(i), s) for i, s in enumerate(texts[:args.warmup]))
        encode_corpus(enc, docs, Path(tmp) / "warm", show_progress_bar=False)
        stats: dict = {}
        t = time.perf_counter()
        old = {"first_window": 2**62} if args.old_windows else {}
        encode_corpus(enc, ((str(i), s) for i, s in enumerate(texts)), Path(tmp) / "run", show_progress_bar=False,
                      n_docs=args.passages, stats=stats, **old)
        row["corpus_pps"] = args.passages / (time.perf_counter() - t)
        row["corpus_stats"] = {k: v for k, v in stats.items() if isinstance(v, (int, float))}
    print(json.dumps(row), flush=True)


def profile_document(enc: SpladeEncoder, texts: list[str]) -> dict:
    """Where ``encode_document`` spends the calling thread's time, and how busy the GPU is meanwhile."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.runcall(enc.encode_document, texts)
    wall_cprofile = time.perf_counter() - t
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as tp:
        t = time.perf_counter()
        enc.encode_document(texts)
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        wall = time.perf_counter() - t
    events = tp.key_averages()
    gpu_s = sum(getattr(e, "self_device_time_total", 0) for e in events) / 1e6
    top = sorted(events, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)[:12]
    return {"passages": len(texts), "wall_s_cprofile": wall_cprofile, "wall_s_torch_profiler": wall,
            "gpu_kernel_s": gpu_s,
            "top_gpu": [(e.key[:80], e.count, getattr(e, "self_device_time_total", 0) / 1e3) for e in top],
            "cprofile_tottime": buf.getvalue()[-6000:]}


if __name__ == "__main__":
    main()
