"""``lsr rerank``: rescore the top-k of a run with a late-interaction (ColBERT-style) model."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from lsr.cli.args import DEVICE_HELP, device, integer
from lsr.config import MAXSIM_IMPLS

__all__ = ["cmd_rerank", "default_cache_dir", "register"]


def default_cache_dir() -> Path:
    """``$LSR_CACHE/doc-embeddings``, else ``~/.cache/lsr/doc-embeddings``."""
    root = os.environ.get("LSR_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lsr"
    return Path(root) / "doc-embeddings"


def register(sub: argparse._SubParsersAction, command) -> None:
    p = command(sub, "rerank", "rerank the top-k of a run with a ColBERT-style late-interaction model (MaxSim)")
    p.add_argument("--run", required=True, help="TREC or MS MARCO run to rerank")
    p.add_argument("--model", required=True, help="local PyLate or colbert-ir checkpoint folder")
    p.add_argument("--dataset", required=True, help="ir_datasets id or local folder the run was made from")
    p.add_argument("--out", required=True, help="TREC run to write (the top-k of each query, reranked)")
    p.add_argument("--k", type=integer(1), default=100, help="documents per query to rerank (the rest is dropped)")
    p.add_argument("--split", default=None, help="dataset split (e.g. test, dev) for local BEIR folders")
    p.add_argument("--cache", default=None, help=f"document embedding cache folder (default: {default_cache_dir()})")
    p.add_argument("--no-cache", action="store_true", help="keep document embeddings in memory only")
    p.add_argument("--batch-size", type=integer(1), default=32, help="documents per encoder batch")
    p.add_argument("--query-batch", type=integer(1), default=64, help="queries scored per MaxSim call")
    p.add_argument("--dtype", default=None, help="encoder dtype (default: bf16 on CUDA, fp32 on CPU)")
    p.add_argument("--maxsim", choices=MAXSIM_IMPLS, default="auto",
                   help="the MaxSim kernel's implementation (auto: Triton on CUDA)")
    p.add_argument("--tag", default="lsr-rerank", help="run tag (TREC column 6)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--device", type=device, default="auto", help=DEVICE_HELP)
    p.set_defaults(func=cmd_rerank)


def cmd_rerank(args: argparse.Namespace) -> int:
    from lsr.errors import UsageError
    from lsr.storage.provenance import check_not_inside

    if Path(args.out).exists() and not args.overwrite:
        raise UsageError(f"{args.out} exists; pass --overwrite to replace it or choose another --out")
    if not Path(args.run).is_file():
        raise FileNotFoundError(f"--run {args.run}: no such run file (a TREC or MS MARCO run, e.g. from lsr search)")
    check_not_inside(args.out, [args.run, args.model, args.dataset], "--out")
    if args.no_cache and args.cache:
        raise UsageError("--cache and --no-cache contradict each other; pass one")
    n_queries = rerank_to_file(args.run, args.model, args.dataset, args.out, k=args.k, split=args.split,
                               cache_dir=None if args.no_cache else (args.cache or default_cache_dir()),
                               device=args.device, dtype=args.dtype, batch_size=args.batch_size,
                               query_batch=args.query_batch, maxsim=args.maxsim, tag=args.tag)
    print(f"reranked the top-{args.k} of {n_queries} queries -> {args.out}")
    return 0


def rerank_to_file(run_path: str, model: str, dataset: str, out: str, *, k: int = 100, split: str | None = None,
                   cache_dir: str | Path | None = None, device: str = "auto", dtype: str | None = None,
                   batch_size: int = 32, query_batch: int = 64, maxsim: str = "auto", tag: str = "lsr-rerank") -> int:
    """Read a run, rerank it (see ``lsr.rerank.rerank.rerank_run``), write a TREC run; returns the query count."""
    from lsr.data import runs
    from lsr.data.sources import load_dataset
    from lsr.rerank.cache import DocEmbeddingCache
    from lsr.rerank.encoder import ColbertEncoder
    from lsr.rerank.rerank import rerank_run
    from lsr.utils.devices import resolve_device

    first = runs.read_run(run_path)
    ds = load_dataset(dataset, split)
    encoder = ColbertEncoder(model, device=resolve_device(device), dtype=dtype)
    cache = DocEmbeddingCache(cache_dir, encoder.fingerprint)
    reranked = rerank_run(first, ds.queries, ds.docs_iter, encoder, cache, k=k, query_batch=query_batch,
                          doc_batch=batch_size, maxsim=maxsim)
    runs.write_trec(reranked, out, tag=tag)
    return len(reranked)
