"""Command line: ``lsr encode | index | search | evaluate | run`` (the stages add ``train``, ``serve``, ``rerank``,
``export-ciff``, ``import-ciff``); flags mean one thing across commands (``lsr.cli_types``).

Every command prints its result. Errors are one line on stderr (``lsr <command>: error: ...``), never a
traceback (``-v`` prints it too), with exit code 2 for usage errors (bad options or config values) and
1 for runtime errors (missing or bad files, a full disk, a failed step); an interrupt exits 130.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from lsr import __version__
from lsr.cli_types import DEVICE_HELP, HelpFormatter, device, integer, ranged
from lsr.utils.ranges import BLOCK_SIZES, PARTITIONS, WORKERS

if TYPE_CHECKING:  # pragma: no cover
    from lsr.config import EncoderConfig
    from lsr.encode.base import Encoder

__all__ = ["UsageError", "add_command", "add_device_arg", "add_encoder_args", "check_bm25_model", "encoder_from_args",
           "main"]


class UsageError(ValueError):
    """A bad option or config value: exit code 2."""


def _check_json_out(path: str | None, inputs: list[str | None]) -> None:
    """``--json``: never inside an input, and an existing file only if it is a metrics JSON (lsr's own)."""
    if path is None:
        return
    from lsr.storage.provenance import check_not_inside

    check_not_inside(path, inputs, "--json")
    p = Path(path)
    if p.exists():
        try:
            old = json.loads(p.read_text(encoding="utf-8"))
            ours = isinstance(old, dict) and all(isinstance(v, (int, float)) for v in old.values())
        except (OSError, ValueError):
            ours = False
        if not ours:
            raise FileExistsError(f"--json {path} exists and is not a metrics file lsr wrote; choose another path")


def _print_metrics(metrics: dict[str, float], json_out: str | None) -> None:
    from lsr.storage.files import atomic_write_text

    for name, value in metrics.items():
        print(f"{name}\t{value:.4f}")
    if json_out:
        atomic_write_text(json_out, json.dumps(metrics, indent=1))


def _encoder_config(args: argparse.Namespace) -> EncoderConfig:
    """The encoder options as a config. BM25: ``--model`` is a fitted encoder folder; SPLADE: a Hugging Face
    id or local path."""
    from lsr.config import EncoderConfig

    if args.encoder == "bm25" and getattr(args, "attention", None) is not None:  # it would be silently ignored
        raise UsageError(f"--attention {args.attention} sets a SPLADE decoder LLM's attention; BM25 has none: drop "
                         "it, or pass --encoder splade --model MODEL")
    corpus = {k: getattr(args, k) for k in ("doc_top_k", "shard_rows", "tokenize_workers") if hasattr(args, k)}
    return EncoderConfig(kind=args.encoder, model=args.model, batch_size=args.batch_size,
                         max_length_query=args.max_length_query, max_length_doc=args.max_length_doc,
                         compile=args.compile, attention=getattr(args, "attention", None), **corpus)


def check_bm25_model(args: argparse.Namespace, what: str) -> None:
    """``--encoder bm25`` (the default) encodes ``what`` only with ``--model``, the statistics a corpus was fitted with."""
    if args.encoder == "bm25" and not args.model:
        raise UsageError(f"{what} with --encoder bm25 (the default) needs --model FOLDER, the fitted BM25 encoder: "
                         "lsr encode --dataset DATA --out VECTORS writes it as VECTORS/encoder (or pass --encoder "
                         "splade --model MODEL)")


def encoder_from_args(args: argparse.Namespace, device: str) -> Encoder:
    from lsr.pipeline import open_encoder

    return open_encoder(_encoder_config(args), device)


def cmd_encode(args: argparse.Namespace) -> int:
    from lsr.data.sources import load_dataset
    from lsr.pipeline import resolve_device
    from lsr.storage.shards import write_vectors

    device = resolve_device(args.device)
    ds = load_dataset(args.dataset, args.split)
    out = Path(args.out)
    _check_encode_out(out, args)
    if args.what == "queries":
        check_bm25_model(args, "--what queries")
        enc = encoder_from_args(args, device)
        qids = list(ds.queries)
        vecs = enc.encode_query([ds.queries[q] for q in qids], ids=qids)
        write_vectors(out, vecs, enc.describe())
        print(f"wrote {len(vecs)} query vectors to {out}")
        return 0
    from lsr.parallel.topology import is_distributed

    if is_distributed():  # every rank of a torchrun job encodes its slice
        from lsr.parallel.encode import encode_on_ranks
        from lsr.parallel.topology import launch_rank

        manifest = encode_on_ranks(ds, out, _encoder_config(args), device)
        if launch_rank() == 0:
            print(f"document vectors in {out} ({manifest['n_rows']} documents in {len(manifest['shards'])} shards)")
        return 0
    from lsr.parallel.joblock import FolderLock

    enc = encoder_from_args(args, device)
    lock = FolderLock(out)
    taken = lock.acquire()   # a job writing this folder refuses us here, before a BM25 fit replaces its encoder
    try:
        _encode_documents_here(enc, ds, out, args)
    finally:
        if taken:
            lock.release()
    print(f"document vectors in {out}")
    return 0


def _encode_documents_here(enc: Encoder, ds: Any, out: Path, args: argparse.Namespace) -> None:
    """``lsr encode`` of documents in this one process (the folder's lock held)."""
    from lsr.parallel.encode import encode_dataset_distributed

    if (out / "manifest.json").exists():  # before a new BM25 fit replaces the one these vectors were made with
        from lsr.storage.provenance import check_same_origin
        from lsr.storage.shards import read_manifest

        check_same_origin(read_manifest(out).get("origin"), ds.docs_origin, out)
    if args.encoder == "bm25" and not args.model:
        enc.fit(text for _, text in ds.docs_iter())
        enc.save(out / "encoder")
        print(f"fitted BM25 statistics saved to {out / 'encoder'} (pass it as --model to encode queries)")
    # (encode_corpus, or the rest of an interrupted torchrun encoding of this folder)
    encode_dataset_distributed(enc, ds, out, batch_size=args.batch_size, shard_rows=args.shard_rows, resume=True,
                               doc_top_k=args.doc_top_k, tokenize_workers=args.tokenize_workers,
                               origin=ds.docs_origin)


def _check_encode_out(out: Path, args: argparse.Namespace) -> None:
    """``lsr encode --out``: not inside an input; a new or empty folder, or a vector folder to resume."""
    from lsr.storage.provenance import check_not_inside

    check_not_inside(out, [args.dataset, args.dataset.rsplit(":", 1)[0], args.model], "--out")
    if not out.exists():
        return
    if not out.is_dir():
        raise FileExistsError(f"--out {out} is a file; give a folder for the vectors")
    lsr_names = ("manifest.json", "encoder")
    foreign = [p.name for p in out.iterdir() if p.name not in lsr_names and not p.name.startswith(("part-", "."))]
    if foreign and not (out / "manifest.json").exists():
        raise FileExistsError(f"--out {out} holds files lsr did not write ({foreign[0]}, ...); choose a new or "
                              "empty folder")


def cmd_index(args: argparse.Namespace) -> int:
    from lsr.index.inverted import InvertedIndex
    from lsr.pipeline import resolve_device

    device = resolve_device(args.device)
    if args.partitions is not None:  # under torchrun every rank builds its partitions on its own device
        from lsr.parallel.sharded_index import build_sharded_index, check_partition_count
        from lsr.storage.shards import read_manifest

        n_docs = int(read_manifest(args.vectors)["n_rows"])
        try:  # a count above the documents is a bad flag value: refused before any rank starts work
            check_partition_count(n_docs, args.partitions, args.vectors)
        except ValueError as e:
            raise UsageError(str(e)) from None

        n_p = build_sharded_index(args.vectors, args.partitions, args.out, device=device, block_size=args.block_size,
                                  overwrite=args.overwrite, workers=args.workers, postings=args.postings)
        print(f"indexed {args.vectors} into {n_p} partitions -> {args.out}")
        return 0
    # metadata from the manifest
    index = InvertedIndex.build(args.vectors, device=device, block_size=args.block_size, postings=args.postings)
    index.save(args.out, overwrite=args.overwrite)
    print(f"indexed {index.n_docs} documents, {index.n_postings} postings ({index.postings} layout) -> {args.out}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from lsr.evaluation.measures import evaluate, parse_metrics

    try:
        parse_metrics(tuple(args.metrics))
    except ValueError as e:
        raise UsageError(str(e)) from None
    _check_json_out(args.json, [args.run, args.qrels])
    _print_metrics(evaluate(args.run, args.qrels, metrics=tuple(args.metrics), require_overlap=True), args.json)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from lsr.config import load_config
    from lsr.pipeline import run_pipeline

    try:
        cfg = load_config(args.config, args.set or ())
    except (ValueError, TypeError, FileNotFoundError) as e:
        raise UsageError(str(e)) from e
    _check_json_out(args.json, [args.config, cfg.data.dataset, cfg.data.dataset.rsplit(":", 1)[0]])
    if args.check and cfg.evaluation.expected and not cfg.expected_holds():
        on = cfg.evaluation.expected_on
        raise UsageError(f"--check: the config's expected values were measured on {on.dataset} (split {on.split}), "
                         f"not on {cfg.data.dataset} (split {cfg.data.split}); drop --check, or set evaluation.expected "
                         "and evaluation.expected_on for this data")
    from lsr.parallel.topology import launch_rank

    result = run_pipeline(cfg, overwrite=args.overwrite)  # under torchrun: every rank, rank 0's result
    if launch_rank() == 0:  # one rank of a torchrun job reports
        print(f"# {cfg.name}: {result['n_docs']} docs, {result['n_queries']} queries on {result['device']}; "
              f"run written to {result['files']['run_trec']}")
        _print_metrics(result["metrics"], args.json)
    missed = cfg.evaluation.missed(result["metrics"]) if args.check else {}
    if missed:
        print(f"metrics differ from the config's expected values by more than {cfg.evaluation.tolerance}: {missed}",
              file=sys.stderr)
    return 1 if missed else 0


def add_encoder_args(p: argparse.ArgumentParser) -> None:
    add_device_arg(p)
    p.add_argument("--encoder", choices=("bm25", "splade"), default="bm25", help="encoder kind")
    p.add_argument("--model", help="SPLADE: Hugging Face id or local path; bm25: folder of a fitted encoder")
    p.add_argument("--batch-size", type=integer(1), default=None, help="texts per batch (default: the encoder's own)")
    p.add_argument("--max-length-query", type=integer(1), default=None,
                   help="SPLADE: query tokens kept (default: the checkpoint's, 64 for a plain masked LM)")
    p.add_argument("--max-length-doc", type=integer(1), default=None,
                   help="SPLADE: document tokens kept (default: the checkpoint's, 256 for a plain masked LM)")
    p.add_argument("--split", default=None, help="dataset split (e.g. test, dev) for local BEIR folders")
    p.add_argument("--compile", action="store_true", help="SPLADE: torch.compile the backbone (long corpora)")
    p.add_argument("--attention", choices=("causal", "bidirectional"), default=None,
                   help="SPLADE decoder LLMs (Qwen3, Llama, ...): attention (default: the model's own, causal)")


def add_command(sub: argparse._SubParsersAction, name: str, text: str, func: Callable[[argparse.Namespace], int] | None = None,
             ) -> argparse.ArgumentParser:
    """A sub-command parser whose options show their defaults; ``func`` handles the parsed arguments."""
    p = sub.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)
    if func is not None:
        p.set_defaults(func=func)
    return p


# Commands defined in their stage's package: each module has ``register(sub, command)`` that adds its
# parser(s) with ``command(sub, name, help)`` and sets ``func``; imports stay lazy (``lsr --help`` is fast).
_STAGE_COMMANDS: tuple[str, ...] = ("lsr.interop.cli", "lsr.serve.cli", "lsr.train.cli", "lsr.rerank.cli")


def add_device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=device, default="auto", help=DEVICE_HELP)


def _add_encode_command(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "encode", "encode a corpus (or its queries) to Parquet vector shards", cmd_encode)
    p.add_argument("--dataset", required=True, help="ir_datasets id or local folder")
    p.add_argument("--out", required=True, help="vector directory to write (resumed when it exists)")
    add_encoder_args(p)
    p.add_argument("--what", choices=("documents", "queries"), default="documents",
                   help="encode the dataset's documents, or its queries (for lsr search --queries)")
    p.add_argument("--shard-rows", type=integer(1), default=100_000, help="documents per shard (the resume granularity)")
    p.add_argument("--doc-top-k", type=integer(1), default=None, help="keep each document's k largest weights")
    p.add_argument("--tokenize-workers", type=ranged(WORKERS), default=None,
                   help="SPLADE: tokenizer processes (default on CUDA: min(8, cores - 4), none below 6 cores; "
                        "0 = in-process)")


def _add_index_command(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "index", "build a GPU inverted index from document vectors", cmd_index)
    p.add_argument("--vectors", required=True, help="vector directory written by lsr encode")
    p.add_argument("--out", required=True, help="index directory to write")
    p.add_argument("--block-size", type=ranged(BLOCK_SIZES), default=65536, help="documents per posting block")
    p.add_argument("--postings", choices=("auto", "float32", "compact"), default="auto",
                   help="posting layout: compact (4 bytes a posting: 16-bit local doc ids and weights; needs weights "
                        "exact in bf16/fp16, e.g. vectors encoded in bf16), float32 (8 bytes), or auto (compact where "
                        "the weights allow it; the default); same results")
    p.add_argument("--overwrite", action="store_true", help="replace an existing index at --out")
    p.add_argument("--partitions", type=ranged(PARTITIONS), default=None,
                   help="write a sharded index of P contiguous doc ranges (one per rank of a distributed search)")
    p.add_argument("--workers", type=integer(1, int(WORKERS.high)), default=1, help="with --partitions: partitions built at once (threads)")
    add_device_arg(p)


def _add_evaluate_command(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "evaluate", "evaluate a run with ir-measures", cmd_evaluate)
    p.add_argument("--run", required=True, help="TREC or MS MARCO run file")
    p.add_argument("--qrels", required=True, help="qrels file, BEIR folder or ir_datasets id")
    p.add_argument("--metrics", nargs="+", default=["RR@10", "nDCG@10", "R@1000"], help="ir-measures metric strings")
    p.add_argument("--json", help="also write {metric: value} here")


def _add_run_command(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "run", "encode -> index -> search -> evaluate from a YAML config", cmd_run)
    p.add_argument("config", help="YAML config (see configs/; every key: lsr/config.py)")
    p.add_argument("--set", action="append", metavar="SECTION.KEY=VALUE",
                   help="override a config value, e.g. search.k=100 (repeatable)")
    p.add_argument("--json", help="also write {metric: value} here")
    p.add_argument("--check", action="store_true", help="exit 1 if metrics miss the config's expected values")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an output folder lsr did not write, or one made for other documents")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lsr", description="GPU learned sparse retrieval: encode, index, search, evaluate",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--version", action="version", version=f"lsr {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="log each step (and the traceback of an error)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_encode_command(sub)
    _add_index_command(sub)
    importlib.import_module("lsr.search.cli").register(sub, add_command)
    _add_evaluate_command(sub)
    _add_run_command(sub)
    for module in _STAGE_COMMANDS:
        importlib.import_module(module).register(sub, add_command)
    return ap


_OUTPUT_FLAGS = ("out", "json", "cache")   # the flags that name something a command writes


def _check_output_flags(args: argparse.Namespace) -> None:
    """Before any work: an output path below an existing file (``--out notes.txt/run``) is refused with one line."""
    from lsr.storage.provenance import file_in_the_way

    for name in _OUTPUT_FLAGS:
        value = getattr(args, name, None)
        blocker = file_in_the_way(value) if isinstance(value, str) else None
        if blocker is not None:
            raise NotADirectoryError(f"--{name} {value}: {blocker} is a file, not a folder; choose another --{name}")


def _output_flag(filename: str, args: argparse.Namespace | None) -> tuple[str, str] | None:
    """(``--out PATH`` or ``FILE (in --out PATH)``, ``--out``) when ``filename`` is an output flag's path or lies
    inside it (``--json``, ``--cache`` too)."""
    for name in _OUTPUT_FLAGS if args is not None else ():
        value = getattr(args, name, None)
        if isinstance(value, str) and Path(value) in (Path(filename), *Path(filename).parents):
            where = f"--{name} {value}" if Path(value) == Path(filename) else f"{filename} (in --{name} {value})"
            return where, f"--{name}"
    return None


def _one_line(e: BaseException, args: argparse.Namespace | None = None) -> str:
    """The error as one line; a full disk and a denied permission say so and what to do (naming the output flag
    the user gave when the file is, or is inside, its path)."""
    where = f" writing {e.filename}" if isinstance(e, OSError) and e.filename else ""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on device{where}: free space or choose another --out"
    if isinstance(e, OSError) and e.errno == errno.EFBIG:
        return f"the file size limit (ulimit -f) was reached{where}: raise it or choose another --out"
    if isinstance(e, (FileExistsError, NotADirectoryError)) and e.filename:
        from lsr.storage.provenance import file_in_the_way

        # mkdir(parents=True) names the file itself; open() and mkdir() below it name the path they wanted
        blocker = Path(e.filename) if Path(e.filename).is_file() else file_in_the_way(e.filename)
        if blocker is not None:
            return f"{e.filename}: {blocker} is a file, not a folder; choose another output path"
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        flag = _output_flag(str(e.filename), args) if e.filename else None
        denied = "read-only file system" if e.errno == errno.EROFS else "permission denied"
        if flag is not None:
            return f"{denied} writing {flag[0]}: check its folder's permissions or choose another {flag[1]}"
        return f"{denied}: {e.filename or e} (check its permissions or choose another path)"
    if isinstance(e, IsADirectoryError):
        return f"{e.filename} is a directory; a file was expected"
    text = " ".join(str(e).split()) or type(e).__name__
    known = (ValueError, OSError, RuntimeError, LookupError, ImportError, NotImplementedError)
    return text if isinstance(e, known) else f"{type(e).__name__}: {text}"


def main(argv: list[str] | None = None) -> int:
    # idle OpenMP threads sleep instead of spinning: on a CPU shared with other processes a spinning
    # thread takes the core a working one needs (read when torch loads, i.e. later than this)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:   # argparse has printed its one line (a bad option: 2) or the help / version (0)
        return 0 if e.code is None else e.code if isinstance(e.code, int) else 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    from lsr.parallel.watchdog import report_as

    report_as(f"lsr {args.command}")   # the line a distributed job's heartbeat prints, should a rank stop
    try:
        _check_output_flags(args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"lsr {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - every error leaves as one line, never a traceback
        if args.verbose:
            import traceback

            traceback.print_exc()
        print(f"lsr {args.command}: error: {_one_line(e, args)}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
