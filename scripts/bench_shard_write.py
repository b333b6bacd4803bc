"""Shard writing cost on the CPU: µs per passage and bytes per passage of Parquet layouts for real SPLADE vectors.

Encodes --encode passages (synthetic MS MARCO-length text, scripts/bench_encode.synth_texts) with a model on
the CPU, repeats them (rows shuffled, fresh ids) up to --rows, and times on one thread:

* ``dictionary_zstd``: ``pq.write_table(..., compression="zstd")`` (lsr's earlier layout, the baseline);
* ``delta_bss_zstd``: ``lsr.storage.shard_writer.PARQUET_OPTIONS`` (delta term ids, byte-stream-split weights, zstd);
* ``shard_writer_tN``: ``ShardWriter`` end to end (sha256, fsync, manifest) with N threads, fed in windows
  of --window rows with a row group per window, as ``encode_corpus`` does, one window every
  window / --rate seconds (the model's pace); ``tail_s`` is the time ``close()`` takes after the last ``add``
  (what ``encode_corpus`` reports as ``close_s``), ``us_per_passage`` the time without the pauses.

    PYTHONPATH=. python scripts/bench_shard_write.py --rows 100000
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
from bench_encode import synth_texts  # noqa: E402

from lsr.encode.splade.encoder import SpladeEncoder  # noqa: E402
from lsr.sparse import SparseVectors  # noqa: E402
from lsr.storage.shard_writer import PARQUET_OPTIONS, ShardWriter  # noqa: E402
from lsr.storage.shards import vectors_to_table  # noqa: E402


def real_vectors(model: str, encode: int, rows: int) -> SparseVectors:
    enc = SpladeEncoder.from_pretrained(model, device="cpu", dtype=torch.bfloat16)
    texts, _ = synth_texts(encode, enc._towers["doc"].tokenizer, np.random.default_rng(0))
    base = enc.encode_document(texts)
    rng, parts = np.random.default_rng(1), []
    for k in range(-(-rows // encode)):
        part = base[torch.from_numpy(rng.permutation(encode))]
        part.ids = [f"{k}-{i}" for i in range(encode)]
        parts.append(part)
    return SparseVectors.concat(parts)[:rows]


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "data" / "models" / "splade-tiny"))
    ap.add_argument("--encode", type=int, default=4000, help="passages encoded for real (then repeated)")
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--window", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate", type=float, default=150_000, help="passages/s at which windows arrive")
    args = ap.parse_args()
    torch.set_num_threads(1)
    v = real_vectors(args.model, args.encode, args.rows)
    table = vectors_to_table(v)
    out: dict = {"rows": len(v), "nnz_per_row": round(v.nnz / len(v), 1)}
    for name, options in (("dictionary_zstd", {"compression": "zstd"}), ("delta_bss_zstd", PARQUET_OPTIONS)):
        seconds = best(lambda: pq.write_table(table, io.BytesIO(), **options), args.repeats)  # noqa: B023
        buf = io.BytesIO()
        pq.write_table(table, buf, **options)
        back = pq.read_table(io.BytesIO(buf.getvalue()))
        assert back.column("indices").to_pylist()[:50] == table.column("indices").to_pylist()[:50]
        out[name] = {"us_per_passage": round(seconds / len(v) * 1e6, 2), "bytes_per_passage": round(buf.tell() / len(v))}
    for threads in (1, 4):
        tails, pauses = [], []

        def write() -> None:
            with tempfile.TemporaryDirectory() as tmp:
                w = ShardWriter(Path(tmp) / "vec", v.vocab_size, {}, write_threads=threads, row_group_rows=args.window)
                pauses.append(0.0)
                for start in range(0, len(v), args.window):
                    time.sleep(args.window / args.rate)
                    pauses[-1] += args.window / args.rate
                    w.add(v[start:start + args.window])
                t = time.perf_counter()
                w.close()
                tails.append(time.perf_counter() - t)

        seconds = best(write, args.repeats) - pauses[0]
        out[f"shard_writer_t{threads}"] = {"us_per_passage": round(seconds / len(v) * 1e6, 2),
                                           "tail_s": round(min(tails), 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
