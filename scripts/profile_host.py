"""Host side of encoding, per core: µs per passage of each CPU stage, with the model's GPU part nulled.

Same synthetic MS MARCO-length passages as scripts/bench_encode.py (``synth_texts``: mean ~75 word pieces)
and the real tokenizer of --model (default data/models/splade-tiny; bert-base-uncased's vocabulary).
Every stage runs on one thread of this process (the Rust tokenizer limited to one thread), so the
numbers are CPU cost per passage per core; passages/s on N cores are projections, not measurements.

Stages (µs per passage; best of --repeats over all passages, cut in windows of 32,768 as encode_document does):
  tokenize_rust_encode_batch       Rust ``encode_batch`` (offsets, token strings, masks), nothing read out
  tokenize_rust_encode_batch_fast  Rust ``encode_batch_fast`` (no offsets), nothing read out
  tokenize_rust_ids                ``token_arrays`` on the Rust tokenizer: the ids read into NumPy (the path before lsr's bulk WordPiece)
  tokenize_lsr                     what lsr tokenizes with now (``TextTokenizer``: bulk ASCII WordPiece, Rust for the rest)
  pool_main_cpu / pool_wall        a TokenizerPool of one worker process: this process's CPU time (sending the
                                   texts, receiving the arrays) and the wall time per passage (worker included)
  prepare                          ``SpladeEncoder.prepare`` on ready token arrays: sort, bucket, pad (pinning needs CUDA: absent here)
  extract                          ``encode_prepared`` with the model nulled (each batch returns ready CSR parts,
                                   127 terms per passage): the per-batch loop, concatenation, reordering to input order, ids
  extract_reorder                  its last step alone (``rows_to_input_order``): on a GPU its gathers run on the device,
                                   here on this core, so extract - extract_reorder is the host-only part
  scifact_*                        SciFact's 5,183 real documents (longer: ~300 word pieces): lsr's tokenizer on its
                                   first call (cold: every word new) and warm, and the Rust ids
  write                            ``ShardWriter.add`` + close: Parquet (zstd) shards of 100,000 rows, sha256, manifest
  corpus_null_model / api_null_model  ``encode_corpus`` / ``encode_document`` end to end with the model nulled,
                                   wall µs per passage with --workers tokenizer processes (0: in-process)

    PYTHONPATH=. python scripts/profile_host.py --out results/host --passages 100000        # ~1 min on one core
    PYTHONPATH=. python scripts/profile_host.py --out /tmp/host --passages 2000 --repeats 1  # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # one core per stage: before tokenizers starts its pool
import numpy as np
import torch

torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
from bench_encode import MAX_LEN, synth_texts

import lsr.encode.splade.encoder as splade
from lsr.benchmarks.harness import environment
from lsr.encode.corpus import encode_corpus
from lsr.encode.stream import WINDOW
from lsr.encode.tokenize.pool import TokenizerPool, token_arrays
from lsr.sparse import SparseVectors
from lsr.storage.shard_writer import ShardWriter

NNZ = 127  # terms per passage of a trained SPLADE model on MS MARCO


def best_us(fn: Callable[[], object], n: int, repeats: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Best of ``repeats`` timings of ``fn()``, in µs per passage of ``n``."""
    times = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return round(min(times) / n * 1e6, 2)


def windows(texts: list[str]) -> list[list[str]]:
    return [texts[i:i + WINDOW] for i in range(0, len(texts), WINDOW)]


class NullModel:
    """Monkeypatches ``SpladeEncoder._encode_batch`` and the CSR extraction (``splade.CountedRows``; in older
    trees ``splade.to_csr``) so that a batch costs no model work: every row gets ``NNZ`` fixed terms,
    as ready CSR parts built once per batch size."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size, self._parts = vocab_size, {}

    def _encode_batch(self, tower, batch, head: bool = True) -> torch.Tensor:  # noqa: ANN001 - SpladeEncoder's signature
        return torch.zeros(len(batch.rows), 1)

    def to_csr(self, y: torch.Tensor, top_k: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B = y.shape[0]
        if B not in self._parts:
            terms = torch.arange(NNZ, dtype=torch.int32).repeat(B) * (self.vocab_size // NNZ)
            self._parts[B] = (torch.full((B,), NNZ, dtype=torch.int64), terms, torch.rand(B * NNZ))
        return self._parts[B]

    def __enter__(self) -> NullModel:
        null = self

        class ReadyRows:  # CountedRows' interface
            def __init__(self, y: torch.Tensor, top_k: int | None) -> None:
                self._parts = null.to_csr(y, top_k)

            def csr(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
                return self._parts

        self._name = next(n for n in ("CountedRows", "to_csr", "_to_csr") if hasattr(splade, n))
        self._saved = splade.SpladeEncoder._encode_batch, getattr(splade, self._name)
        splade.SpladeEncoder._encode_batch = lambda enc, tower, batch, head=True: self._encode_batch(tower, batch, head)
        setattr(splade, self._name, ReadyRows if self._name == "CountedRows" else self.to_csr)
        return self

    def __exit__(self, *exc: object) -> None:
        splade.SpladeEncoder._encode_batch = self._saved[0]
        setattr(splade, self._name, self._saved[1])


class ReadyTokens:
    """A stand-in for a tokenizer pool that returns precomputed token arrays (prepare without tokenizing)."""

    tag = "doc"

    def __init__(self, arrays: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
        self.arrays = arrays

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        return self.arrays[id(texts)]


def tokenize_stages(enc: splade.SpladeEncoder, parts: list[list[str]], n: int, repeats: int) -> dict:
    tok = enc._tokenizer("doc")
    rust = tok._fast
    out = {"tokenize_rust_encode_batch": best_us(lambda: [rust.encode_batch(w) for w in parts], n, repeats),
           "tokenize_rust_encode_batch_fast": best_us(lambda: [rust.encode_batch_fast(w) for w in parts], n, repeats),
           "tokenize_rust_ids": best_us(lambda: [token_arrays(rust, w) for w in parts], n, repeats),
           "tokenize_lsr": best_us(lambda: [tok(w) for w in parts], n, repeats)}
    with TokenizerPool(rust.to_str(), enc.max_length_doc, 1) as pool:
        pool(parts[0][:100])  # started
        out["pool_main_cpu"] = best_us(lambda: [pool(w) for w in parts], n, repeats, time.process_time)
        out["pool_wall"] = best_us(lambda: [pool(w) for w in parts], n, repeats)
    return out


def real_text_stages(enc: splade.SpladeEncoder, repeats: int) -> dict:
    """SciFact documents (real text: word pieces, punctuation, some non-ASCII): the lsr tokenizer on its
    first call (every word new) and warm, against the Rust ids."""
    from lsr.encode.splade.checkpoint import TextTokenizer

    with open(REPO / "data" / "scifact" / "corpus.jsonl", encoding="utf-8") as f:
        docs = [f"{r['title']} {r['text']}" for r in map(json.loads, f)]
    fresh = TextTokenizer(enc._towers["doc"].tokenizer, enc.max_length_doc)
    n = len(docs)
    out = {"scifact_lsr_cold": best_us(lambda: fresh(docs), n, 1),
           "scifact_lsr_warm": best_us(lambda: fresh(docs), n, repeats),
           "scifact_rust_ids": best_us(lambda: token_arrays(fresh._fast, docs), n, repeats)}
    covers = getattr(getattr(fresh, "_tokenize", None), "covers", None)
    facts = {"scifact_docs": n, "scifact_tokens_per_doc": round(float(fresh(docs)[1].mean()), 1),
             "scifact_share_tokenized_by_rust": None if covers is None else round(1 - sum(map(covers, docs)) / n, 4)}
    return out, facts


def host_stages(enc: splade.SpladeEncoder, parts: list[list[str]], n: int, repeats: int) -> dict:
    tok = enc._tokenizer("doc")
    ready = ReadyTokens({id(w): tok(w) for w in parts})
    out = {"prepare": best_us(lambda: [enc.prepare(w, "doc", pool=ready) for w in parts], n, repeats)}
    prepared = [enc.prepare(w, "doc", pool=ready) for w in parts]
    ids = [[str(start + i) for i in range(len(w))] for start, w in zip(range(0, n, WINDOW), parts)]
    with NullModel(enc.vocab_size):
        out["extract"] = best_us(lambda: [enc.encode_prepared(p, i) for p, i in zip(prepared, ids)], n, repeats)
        vectors = SparseVectors.concat([enc.encode_prepared(p, i) for p, i in zip(prepared, ids)])
    if hasattr(splade, "rows_to_input_order"):  # trees that reorder rows in one step
        order = [torch.cat([b.rows for b in p.batches]) for p in prepared]
        rows = [(torch.full((p.n,), NNZ), torch.zeros(p.n * NNZ, dtype=torch.int32), torch.rand(p.n * NNZ)) for p in prepared]
        def reorder() -> list:
            out = [splade.rows_to_input_order(*r, o, i, enc.vocab_size) for r, o, i in zip(rows, order, ids)]
            return [getattr(v, "result", lambda v=v: v)() for v in out]  # (PendingVectors in newer trees)

        out["extract_reorder"] = best_us(reorder, n, repeats)

    def write() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            writer = ShardWriter(Path(tmp) / "vec", enc.vocab_size, {}, shard_rows=100_000)
            for start in range(0, n, WINDOW):
                writer.add(vectors[start:start + WINDOW])
            writer.close()

    out["write"] = best_us(write, n, repeats)
    return out


def end_to_end(enc: splade.SpladeEncoder, texts: list[str], workers: int, repeats: int) -> dict:
    def corpus() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            encode_corpus(enc, ((str(i), t) for i, t in enumerate(texts)), Path(tmp) / "vec", show_progress_bar=False,
                          resume=False, tokenize_workers=workers, sort_window=WINDOW)

    def api() -> None:
        splade.encode_windows(enc, texts, None, "doc", tokenize_workers=workers)

    with NullModel(enc.vocab_size):
        return {f"corpus_null_model_w{workers}": best_us(corpus, len(texts), repeats),
                f"api_null_model_w{workers}": best_us(api, len(texts), repeats)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default=str(REPO / "data" / "models" / "splade-tiny"))
    ap.add_argument("--passages", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", default="0,1", help="tokenizer processes for the end-to-end rows (comma-separated)")
    ap.add_argument("--target-pps", type=float, default=150_000, help="the rate the per-core costs are compared with")
    args = ap.parse_args()
    enc = splade.SpladeEncoder.from_pretrained(args.model, device="cpu", max_length_doc=MAX_LEN,
                                               batch_size=1024, max_tokens=131072)
    texts, _ = synth_texts(args.passages, enc._towers["doc"].tokenizer, np.random.default_rng(0))
    parts, n = windows(texts), len(texts)
    enc._tokenizer("doc")(parts[0][:100])  # warm: learned words are part of the steady state
    res = {"env": environment("cpu", passages=n, cores=os.cpu_count(), cpu=cpu_model(), model=args.model,
                              rayon_threads=os.environ["RAYON_NUM_THREADS"]),
           "us_per_passage": tokenize_stages(enc, parts, n, args.repeats) | host_stages(enc, parts, n, args.repeats)}
    real, res["scifact"] = real_text_stages(enc, args.repeats)
    res["us_per_passage"].update(real)
    for w in (int(x) for x in args.workers.split(",")):
        res["us_per_passage"].update(end_to_end(enc, texts, w, args.repeats))
    res["per_core_pps"] = {k: round(1e6 / v) for k, v in res["us_per_passage"].items()}
    res["budget_us_at_target"] = round(1e6 / args.target_pps, 2)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "profile_host.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res["env"]))
    for k, v in res["us_per_passage"].items():
        print(f"{k:34s} {v:9.2f} µs/passage   {res['per_core_pps'][k]:>10,} p/s")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
