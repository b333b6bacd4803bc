"""Input side of encoding, CPU time of the encoding process per passage (no GPU needed).

What the process that runs the model spends, on any of its threads, to turn texts into batches: the
tokenizer pool's round trip (sending texts to the worker processes, receiving their token arrays; the
workers' own time is not counted), cutting the arrays into padded length-sorted batches (pinned when CUDA
is present), and in ``encode_corpus`` reading the (id, text) stream into windows. These threads hold the
GIL that the thread launching the model needs, so every µs here is a µs the launcher may wait.

Each stage reports, per passage and best of --repeats: ``cpu_us`` (this process, all threads:
``time.process_time``; the worker processes excluded) and its ``user_us`` / ``sys_us`` parts, ``thread_us`` (the calling thread alone:
``time.thread_time``) and ``wall_us``. Passages: ``bench_encode.synth_texts`` (MS MARCO length, ~75 word
pieces), tokenizer and settings of --model, windows as ``encode_document`` cuts them (``window_spans``).

Stages:
  generator        the (str(i), text) generator alone, as scripts/ab_encode.py feeds encode_corpus
  read_windows     ``encode_corpus``'s window reader (``_windows``) over that generator
  pool             ``TokenizerPool(window)`` with --workers processes
  pool_beside_python  the same while another thread of this process runs Python nonstop (the worst case of a
                   launching thread): its wall_us shows how long the workers wait for this process's GIL
  batches          ``prepare`` on ready token arrays (what it does after tokenizing) for the padding-free
                   backbone (what splade-tiny runs on CUDA in bf16): packed token slices
  batches_padded   ``length_sorted_batches`` building padded [B, L] ids and masks (what older trees did)
  prepare          ``SpladeEncoder.prepare(window, pool=...)``: pool + batches
  api_input        the windows of ``encode_document`` prepared as ``encode_windows`` does (``stream.Pipeline``; older
                   trees: one ``Prefetch`` thread), drained by a thread that does nothing else
  corpus_input     ``encode_corpus``'s input side: ``_windows`` + the same
With --launcher, the api_input / corpus_input rows also say how many tiny torch ops per second a thread
(standing in for the one launching the model) completes beside them, against alone (GIL pressure).

    PYTHONPATH=. python scripts/bench_host_input.py --passages 100000 --workers 2 --out /tmp/host_input
    PYTHONPATH=. python scripts/bench_host_input.py --passages 400000 --workers 8 --launcher --out results/host_input
"""

from __future__ import annotations

import argparse
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from bench_encode import MAX_LEN, synth_texts  # noqa: E402
from profile_host import ReadyTokens  # noqa: E402

from lsr.benchmarks.harness import Results, environment, format_table  # noqa: E402
from lsr.encode.corpus import _windows, check_windows  # noqa: E402
from lsr.encode.splade.encoder import SpladeEncoder  # noqa: E402
from lsr.encode.stream import FIRST_WINDOW, WINDOW, Prefetch, window_spans  # noqa: E402
from lsr.encode.tokenize.batching import length_sorted_batches  # noqa: E402

try:
    from lsr.encode.stream import Pipeline  # (older trees have none)
except ImportError:
    Pipeline = None


def measure(fn: Callable[[], object], n: int, repeats: int) -> dict:
    """µs per passage of ``fn()`` (which handles ``n`` passages), the repeat with the least process CPU:
    ``cpu_us`` split into ``user_us`` and ``sys_us`` (system calls, page faults: pipe copies run there,
    without the GIL), ``thread_us`` of the calling thread, ``wall_us``."""
    best = None
    for _ in range(repeats):
        r, w, p, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter(), time.process_time(), time.thread_time()
        fn()
        r2 = resource.getrusage(resource.RUSAGE_SELF)
        got = (time.process_time() - p, time.thread_time() - t, time.perf_counter() - w, r2.ru_utime - r.ru_utime,
               r2.ru_stime - r.ru_stime)
        best = got if best is None or got[0] < best[0] else best
    return {k: v / n * 1e6 for k, v in zip(("cpu_us", "thread_us", "wall_us", "user_us", "sys_us"), best)}


class Launcher:
    """A thread calling a tiny torch op (which releases the GIL and must win it back) as often as it can:
    ops/s beside other work, against alone, shows how long it waited for the GIL (and for a core)."""

    def __init__(self) -> None:
        self.x, self.y = torch.zeros(1), torch.zeros(1)
        self.alone = self._rate(lambda: time.sleep(1.0))

    def _loop(self, stop: threading.Event, count: list[int]) -> None:
        while not stop.is_set():
            for _ in range(100):
                torch.add(self.x, 1.0, out=self.y)
            count[0] += 100

    def _rate(self, work: Callable[[], object]) -> float:
        stop, count = threading.Event(), [0]
        thread = threading.Thread(target=self._loop, args=(stop, count))
        t = time.perf_counter()
        thread.start()
        work()
        stop.set()
        thread.join()
        return count[0] / (time.perf_counter() - t)

    def beside(self, work: Callable[[], object]) -> dict:
        rate = self._rate(work)
        return {"launcher_ops_per_s": round(rate), "launcher_alone_ops_per_s": round(self.alone),
                "launcher_share": round(rate / self.alone, 3)}


def beside_python(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run while another thread runs Python nonstop (holding the GIL but for the interpreter's switches)."""

    def run() -> object:
        stop = threading.Event()

        def spin() -> None:
            while not stop.is_set():
                sum(range(1000))

        thread = threading.Thread(target=spin)
        thread.start()
        try:
            return fn()
        finally:
            stop.set()
            thread.join()

    return run


def drain(items: Iterator) -> None:
    try:
        for _ in items:
            pass
    finally:
        items.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "data" / "models" / "splade-tiny"))
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2, help="tokenizer worker processes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--launcher", action="store_true", help="also measure a launching thread's ops/s beside the input")
    ap.add_argument("--shard-rows", type=int, default=100_000, help="encode_corpus's shard_rows (window cuts)")
    ap.add_argument("--out", type=Path, default=None, help="folder for bench_host_input.json / .csv")
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # on CUDA, batches go to pinned memory
    enc = SpladeEncoder.from_pretrained(args.model, device=device, max_length_doc=MAX_LEN)
    # what a CUDA bf16 encoder does, also on the CPU: batches of 1,024 texts / 131,072 tokens, bound for
    # the padding-free backbone (on the CPU its torch twin; only the input side runs here)
    enc.batch_size, enc.max_tokens, enc.varlen = 1024, 131072, True
    pin = device == "cuda"
    texts, _ = synth_texts(args.passages, enc.tower("doc").tokenizer, np.random.default_rng(0))
    n = len(texts)
    spans = window_spans(n, WINDOW, FIRST_WINDOW)
    windows = [texts[s:s + z] for s, z in spans]
    sort_window = check_windows(args.shard_rows, None)  # encode_corpus's default
    pool = enc.tokenizer_pool("doc", args.workers)
    pool(texts[:4 * 1024])  # started, tokenizer loaded
    arrays = [pool(w) for w in windows]
    tower = enc.tower("doc")

    def padded_batches(flat: np.ndarray, lengths: np.ndarray) -> object:
        return length_sorted_batches("doc", flat, lengths, enc.batch_size, enc.max_tokens, 1, tower.pad_id, pin=pin)

    ready = ReadyTokens({id(w): a for w, a in zip(windows, arrays)})

    def prepare(w: list[str]) -> object:
        return enc.prepare(w, "doc", pool=pool)

    def stream() -> object:
        return ((str(i), t) for i, t in enumerate(texts))

    def prepared(items: Iterator[list[str]]) -> Prefetch:
        """What encode_windows / encode_corpus run: a thread submitting windows to the pool and another cutting
        them into batches (older trees: one thread doing both)."""
        if Pipeline is None:
            return Prefetch(items, prepare, 2)
        return Pipeline(items, lambda w: enc.tokenize_async(w, "doc", pool=pool),
                        lambda tokenized: enc.prepare_tokens(tokenized(False), "doc"), 2)

    def corpus_input() -> None:
        drain(prepared(texts for _, texts in _windows(stream(), 0, args.shard_rows, sort_window, FIRST_WINDOW)))

    def api_input() -> None:
        drain(prepared(iter(windows)))

    stages = {
        "generator": lambda: sum(1 for _ in stream()),
        "read_windows": lambda: sum(len(w[0]) for w in _windows(stream(), 0, args.shard_rows, sort_window, FIRST_WINDOW)),
        "pool": lambda: [pool(w) for w in windows],
        "pool_beside_python": beside_python(lambda: [pool(w) for w in windows]),
        "batches": lambda: [enc.prepare(w, "doc", pool=ready) for w in windows],
        "batches_padded": lambda: [padded_batches(f, le) for f, le in arrays],
        "prepare": lambda: [prepare(w) for w in windows],
        "api_input": api_input,
        "corpus_input": corpus_input,
    }
    launcher = Launcher() if args.launcher else None
    env = environment(device, passages=n, workers=args.workers, pinned=pin, model=args.model,
                      chars_per_passage=round(sum(map(len, texts)) / n, 1),
                      tokens_per_passage=round(float(sum(a[1].sum() for a in arrays)) / n, 1))
    results = Results(args.out, "bench_host_input", env, vars(args)) if args.out else None
    rows = []
    try:
        for name, fn in stages.items():
            row = {"method": name} | measure(fn, n, args.repeats)
            if launcher is not None and name.endswith("_input"):
                row |= launcher.beside(fn)
            rows.append(results.add(row, echo=False) if results else row)
    finally:
        pool.close()
    print({k: env[k] for k in ("device", "cpu_count", "commit", "passages", "workers", "pinned", "tokens_per_passage")})
    cols = [("method", ""), ("cpu_us", ".3f"), ("user_us", ".3f"), ("sys_us", ".3f"), ("thread_us", ".3f"), ("wall_us", ".3f")]
    if launcher is not None:
        cols += [("launcher_share", ".3f")]
    print(format_table(rows, cols))
    print(f"µs per passage; at 150K passages/s a passage has {1e6 / 150_000:.2f} µs of the launching thread")


if __name__ == "__main__":
    main()
