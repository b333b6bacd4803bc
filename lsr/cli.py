"""Command line: ``lsr encode | index | search | evaluate | run``.

Every command prints its result and exits non-zero with a one-line message on bad input.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _print_metrics(metrics: dict[str, float], json_out: str | None) -> None:
    for name, value in metrics.items():
        print(f"{name}\t{value:.4f}")
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(json.dumps(metrics, indent=1))


def _encoder_from_args(args: argparse.Namespace, device: str) -> Any:
    """BM25: ``--model`` is a fitted encoder folder; SPLADE: a Hugging Face id or local path."""
    from lsr.config import EncoderConfig
    from lsr.pipeline import build_encoder

    if args.encoder == "bm25" and args.model:
        from lsr.encode.lexical import LexicalEncoder

        return LexicalEncoder.load(args.model)
    cfg = EncoderConfig(kind=args.encoder, model=args.model, batch_size=args.batch_size,
                        max_length_query=args.max_length_query, max_length_doc=args.max_length_doc,
                        doc_top_k=getattr(args, "doc_top_k", None), compile=args.compile)
    return build_encoder(cfg, device)


def cmd_encode(args: argparse.Namespace) -> int:
    from lsr.data import load_dataset
    from lsr.encode.corpus import encode_corpus
    from lsr.pipeline import resolve_device
    from lsr.shards import write_vectors

    device = resolve_device(args.device)
    ds = load_dataset(args.dataset, args.split)
    out = Path(args.out)
    if args.queries:
        if args.encoder == "bm25" and not args.model:
            raise SystemExit("lsr encode --queries with bm25 needs --model FOLDER of the fitted encoder "
                             "(written by lsr encode as OUT/encoder)")
        enc = _encoder_from_args(args, device)
        qids = list(ds.queries)
        vecs = enc.encode_queries([ds.queries[q] for q in qids], ids=qids)
        write_vectors(out, vecs, enc.describe())
        print(f"wrote {len(vecs)} query vectors to {out}")
        return 0
    enc = _encoder_from_args(args, device)
    if args.encoder == "bm25" and not args.model:
        enc.fit(text for _, text in ds.docs_iter())
        enc.save(out / "encoder")
        print(f"fitted BM25 statistics saved to {out / 'encoder'} (pass it as --model to encode queries)")
    encode_corpus(enc, ds.docs_iter(), out, batch_size=args.batch_size, shard_rows=args.shard_rows,
                  resume=True, n_docs=ds.n_docs, doc_top_k=args.doc_top_k, tokenize_workers=args.tokenize_workers)
    print(f"document vectors in {out}")
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    from lsr.index.inverted import InvertedIndex
    from lsr.pipeline import resolve_device

    device = resolve_device(args.device)
    index = InvertedIndex.build(args.vectors, device=device, block_size=args.block_size)  # metadata from the manifest
    index.save(args.out, overwrite=args.overwrite)
    print(f"indexed {index.n_docs} documents, {index.n_postings} postings -> {args.out}")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    from lsr import runs
    from lsr.index.inverted import InvertedIndex
    from lsr.pipeline import load_query_vectors, resolve_device
    from lsr.search.searcher import Searcher

    device = resolve_device(args.device)
    index = InvertedIndex.load(args.index, device=device)
    qpath = Path(args.queries)
    query_meta = None
    if qpath.exists() and (qpath.is_file() or (qpath / "manifest.json").exists()):
        queries = load_query_vectors(args.queries, args.vocab, args.query_scale)
    else:
        from lsr.data import load_dataset

        enc = _encoder_from_args(args, device)
        ds = load_dataset(args.queries, args.split)
        qids = list(ds.queries)
        queries = enc.encode_queries([ds.queries[q] for q in qids], ids=qids)
        query_meta = enc.describe()
    scores, doc_idx = Searcher(index, device=device, backend=args.backend).search(
        queries.to(device), k=args.k, query_metadata=query_meta)
    runs.write_topk(args.out, queries.ids, index.docnos, scores, doc_idx, fmt=args.format, tag=args.tag)
    print(f"searched {len(queries)} queries (k={args.k}) -> {args.out}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from lsr.evaluation.measures import evaluate

    _print_metrics(evaluate(args.run, args.qrels, metrics=tuple(args.metrics)), args.json)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from lsr.config import load_config
    from lsr.pipeline import run_pipeline

    cfg = load_config(args.config, args.set or ())
    result = run_pipeline(cfg)
    print(f"# {cfg.name}: {result['n_docs']} docs, {result['n_queries']} queries on {result['device']}; "
          f"run written to {result['files']['run_trec']}")
    _print_metrics(result["metrics"], args.json)
    if args.check and cfg.expected:
        bad = {m: (result["metrics"].get(m), v) for m, v in cfg.expected.items()
               if result["metrics"].get(m) is None or abs(result["metrics"][m] - v) > cfg.tolerance}
        if bad:
            print(f"metrics differ from the config's expected values by more than {cfg.tolerance}: {bad}",
                  file=sys.stderr)
            return 1
    return 0


def _add_encoder_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--encoder", choices=("bm25", "splade"), default="bm25")
    p.add_argument("--model", help="SPLADE: HF id or local path; bm25: folder of a fitted encoder")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--max-length-query", type=int, default=64)
    p.add_argument("--max-length-doc", type=int, default=256)
    p.add_argument("--split", default=None)
    p.add_argument("--compile", action="store_true", help="SPLADE: torch.compile the backbone (long corpora)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lsr", description="GPU learned sparse retrieval")
    ap.add_argument("-v", "--verbose", action="store_true", help="log each step")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("encode", help="encode a corpus (or its queries) to Parquet vector shards")
    p.add_argument("--dataset", required=True, help="ir_datasets id or local folder")
    p.add_argument("--out", required=True)
    p.add_argument("--queries", action="store_true", help="encode the queries instead of the documents")
    p.add_argument("--shard-rows", type=int, default=100_000)
    p.add_argument("--doc-top-k", type=int, default=None)
    p.add_argument("--tokenize-workers", type=int, default=None,
                   help="SPLADE: tokenizer processes (default on CUDA: min(8, cores - 4), none below 6 cores; 0 = in-process)")
    p.add_argument("--device", default="auto")
    _add_encoder_args(p)
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser("index", help="build a GPU inverted index from document vectors")
    p.add_argument("--vectors", required=True, help="vector directory written by lsr encode")
    p.add_argument("--out", required=True)
    p.add_argument("--block-size", type=int, default=65536)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--device", default="auto")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("search", help="batch-search queries and write a run")
    p.add_argument("--index", required=True)
    p.add_argument("--queries", required=True,
                   help="query vectors (lsr vector dir or Anserini TSV), or a dataset whose queries to encode")
    p.add_argument("--out", required=True, help="run file to write")
    p.add_argument("--k", type=int, default=1000)
    p.add_argument("--format", choices=("trec", "msmarco"), default="trec")
    p.add_argument("--tag", default="lsr")
    p.add_argument("--vocab", help="vocab.txt or tokenizer folder for Anserini token queries")
    p.add_argument("--query-scale", type=float, default=None)
    p.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    p.add_argument("--device", default="auto")
    _add_encoder_args(p)
    p.set_defaults(func=cmd_search)

    p = sub.add_parser("evaluate", help="evaluate a run with ir-measures")
    p.add_argument("--run", required=True, help="TREC or MS MARCO run file")
    p.add_argument("--qrels", required=True, help="qrels file, BEIR folder or ir_datasets id")
    p.add_argument("--metrics", nargs="+", default=["RR@10", "nDCG@10", "R@1000"])
    p.add_argument("--json", help="also write {metric: value} here")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("run", help="encode -> index -> search -> evaluate from a YAML config")
    p.add_argument("config")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config value (repeatable)")
    p.add_argument("--json", help="also write {metric: value} here")
    p.add_argument("--check", action="store_true", help="exit 1 if metrics miss the config's expected values")
    p.set_defaults(func=cmd_run)
    return ap


def main(argv: list[str] | None = None) -> int:
    # idle OpenMP threads sleep instead of spinning: on a CPU shared with other processes a spinning
    # thread takes the core a working one needs (read when torch loads, i.e. later than this)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError, RuntimeError) as e:
        print(f"lsr {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
