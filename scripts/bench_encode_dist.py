"""``lsr encode`` on W GPUs against 1 GPU of the same host: wall clock including start-up, same run, same files.

The distributed row of the encode benchmark (bench_encode.py measures one process's throughput). Model: the
random, sparsity-calibrated BERT-base of bench_encode.py (``build_model``; ``--tiny``: 2 layers), saved once.
Data: ``--passages`` synthetic MS MARCO-length passages (bench_encode.py's ``synth_texts``) written as an
MS MARCO-layout TSV folder. For every W in ``--ranks`` the script runs, as a user would,

    python -m torch.distributed.run --standalone --nproc-per-node W -m lsr encode --dataset DATA \\
        --out OUT_W --encoder splade --model MODEL --device cuda --shard-rows S

and times the whole command (interpreter, model load, tokenizer workers, Triton autotuning, reading and
encoding, the last shard and the manifest). ``startup`` rows run the same command on ``--startup-passages``
passages (one small window): what a job pays before its steady state. Every W's output folder is compared
byte for byte with W = 1's (``identical``). Writes bench_encode_dist.json / .csv to --out and prints a table last.

    PYTHONPATH=. python scripts/bench_encode_dist.py --out results/encode-dist --passages 2m --ranks 1,4
    PYTHONPATH=. python scripts/bench_encode_dist.py --out /tmp/ed --device cpu --tiny --passages 3000 --ranks 1,2
"""

from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
from bench_encode import build_model, synth_texts  # noqa: E402

from lsr.benchmarks.harness import Results, environment, format_table  # noqa: E402

TARGET_SPEEDUP = 3.5  # issue 42: 4 GPUs, wall clock including start-up


def parse_count(text: str) -> int:
    text = text.strip().lower()
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def write_corpus(folder: Path, texts: list[str]) -> None:
    """An MS MARCO-layout folder (collection.tsv, queries.tsv) holding ``texts``."""
    folder.mkdir(parents=True)
    with open(folder / "collection.tsv", "w", encoding="utf-8") as f:
        f.writelines(f"{i}\t{t}\n" for i, t in enumerate(texts))
    (folder / "queries.tsv").write_text("0\tunused query\n", encoding="utf-8")


def run_encode(ranks: int, data: Path, out: Path, args: argparse.Namespace, profile: Path | None = None) -> float:
    """Seconds the whole ``torchrun ... lsr encode`` command takes; raises with its stderr on failure. With
    ``profile``, one process without torchrun under cProfile instead, its statistics written there."""
    launch = (["-m", "cProfile", "-o", str(profile)] if profile else
              ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)])
    cmd = [sys.executable, *launch, "-m", "lsr", "encode", "--dataset", str(data), "--out", str(out), "--encoder", "splade", "--model", str(args.model_dir),
           "--device", args.device, "--shard-rows", str(args.shard_rows)]
    if args.batch_size:
        cmd += ["--batch-size", str(args.batch_size)]
    env = dict(os.environ, PYTHONPATH=str(REPO), TQDM_DISABLE="1")
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        said = [line for line in done.stderr.splitlines() if line.startswith("lsr ")] or [done.stderr[-2000:]]
        raise RuntimeError(f"torchrun --nproc-per-node {ranks} lsr encode failed ({done.returncode}): {said[0]}")
    return seconds


def same_files(a: Path, b: Path) -> bool:
    """Both folders hold the same file names with the same bytes."""
    names = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    if names != sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()):
        return False
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def measure(results: Results, case: str, data: Path, n: int, ranks: list[int], work: Path,
            args: argparse.Namespace) -> None:
    """A row per W: wall clock, passages/s, speed-up over W = 1, identity with W = 1's folder."""
    base: dict = {}
    for w in ranks:
        out = work / f"{case}-w{w}"
        row = {"case": case, "ranks": w, "passages": n}
        try:
            row["wall_s"] = round(run_encode(w, data, out, args), 2)
            row["pps"] = round(n / row["wall_s"])
            if not base:
                base = {"wall_s": row["wall_s"], "out": out}
            row["speedup"] = round(base["wall_s"] / row["wall_s"], 2)
            row["identical"] = same_files(out, base["out"])
        except Exception as e:  # noqa: BLE001 - a failed case is recorded, the run goes on
            row["error"] = f"{type(e).__name__}: {e}"[:600]
        results.add(row)
        if out != base.get("out"):
            shutil.rmtree(out, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("bench_results/encode-dist"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--passages", type=parse_count, default=2_000_000,
                    help="synthetic passages (2m: about 4 minutes with --ranks 1,4 on H200s; the issue's row is 4.4m)")
    ap.add_argument("--startup-passages", type=parse_count, default=4096, help="passages of the start-up rows")
    ap.add_argument("--ranks", default="1,4", help="world sizes to run, the first is the baseline")
    ap.add_argument("--shard-rows", type=int, default=100_000)
    ap.add_argument("--batch-size", type=int, help="lsr encode --batch-size (default: the encoder's)")
    ap.add_argument("--tiny", action="store_true", help="2-layer 32-wide BERT (CPU smoke test)")
    ap.add_argument("--data", type=Path, default=REPO / "data", help="holds bert-base-uncased/")
    ap.add_argument("--profile-startup", action="store_true",
                    help="also run the start-up job once in one process under cProfile (OUT/startup.prof)")
    ap.add_argument("--workdir", type=Path, help="where the corpus, model and outputs go (default: a temp folder)")
    args = ap.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]
    from transformers import AutoTokenizer

    results = Results(args.out, "bench_encode_dist", environment(args.device), {
        "passages": args.passages, "startup_passages": args.startup_passages, "ranks": ranks, "tiny": args.tiny,
        "shard_rows": args.shard_rows, "batch_size": args.batch_size, "target_speedup": TARGET_SPEEDUP})
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        tokenizer = AutoTokenizer.from_pretrained(args.data / "bert-base-uncased")
        args.model_dir = work / "model"
        dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
        results.config["model"] = build_model(args.model_dir, args.tiny, torch.device("cpu"), dtype, tokenizer)
        texts, lengths = synth_texts(args.passages, tokenizer, np.random.default_rng(0))
        results.config["tokens_per_passage"] = round(float(lengths.mean()), 1)
        write_corpus(work / "startup", texts[:args.startup_passages])
        write_corpus(work / "corpus", texts)
        del texts
        measure(results, "startup", work / "startup", min(args.passages, args.startup_passages), ranks, work, args)
        if args.profile_startup:  # where the start-up goes: one process's cProfile of the start-up job
            run_encode(1, work / "startup", work / "profiled", args, profile=args.out / "startup.prof")
        measure(results, "encode", work / "corpus", args.passages, ranks, work, args)
    rows = {(r["case"], r["ranks"]): r for r in results.rows if r.get("wall_s")}
    top = rows.get(("encode", max(ranks)), {})
    results.summary = {"speedup": top.get("speedup"), "identical": all(r.get("identical") for r in rows.values()),
                       "meets_target": bool(top.get("speedup", 0) >= TARGET_SPEEDUP and max(ranks) >= 4)}
    results.save()
    print(format_table(results.rows, ["case", "ranks", "passages", ("wall_s", ".1f"), ("pps", ",d"),
                                      ("speedup", ".2f"), "identical"]))
    print(f"target: >= {TARGET_SPEEDUP}x with 4 GPUs (wall clock including start-up), output identical to 1 rank")


if __name__ == "__main__":
    main()
