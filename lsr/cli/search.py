"""``lsr search``: search a query set against an index (sharded or not) and write a run, or print the plan.

The command parses and prints; the work is ``lsr.search.open_searcher`` / ``Searcher`` (one index) and
``lsr.parallel.batch.search_sharded`` (a sharded index in one process; under torchrun any index, every rank
searching its slice of the queries, ``lsr.parallel.plan.BatchPlan``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from lsr.cli.args import add_encoder_args, check_bm25_model, encoder_from_args, integer, positive_float
from lsr.errors import UsageError
from lsr.search.config import BACKENDS

__all__ = ["cmd_search", "register"]


def _queries_from_args(args: argparse.Namespace, device: str):
    """(query vectors, encoder description or None) of ``lsr search --queries``: a vector folder, a TSV file
    (Anserini token queries with ``--vocab``; text topics ``qid<TAB>text`` to encode with ``--model``), or a
    dataset whose queries to encode."""
    from lsr.interop.vectors import is_vector_folder, read_query_vectors, recorded_encoder

    qpath = Path(args.queries)
    if qpath.is_file() and args.model and not args.vocab:   # text topics for the given encoder
        from lsr.data.sources import read_topics_tsv

        topics = read_topics_tsv(qpath)
        return _encode_queries(args, device, topics)
    if qpath.is_file() or is_vector_folder(qpath):
        if args.model:
            held = "Anserini token queries (--vocab)" if qpath.is_file() else "a query vector folder"
            raise UsageError(f"--queries {qpath} holds {held}, already encoded; --model encodes text queries: "
                             "drop one of them")
        # the encoder lsr encode --what queries recorded is checked against the index's, as for encoded queries
        return read_query_vectors(qpath, args.vocab, args.query_scale), recorded_encoder(qpath)
    from lsr.data.sources import load_dataset

    return _encode_queries(args, device, load_dataset(args.queries, args.split).queries)


def _encode_queries(args: argparse.Namespace, device: str, queries: dict[str, str]):
    check_bm25_model(args, f"--queries {args.queries} (text queries to encode)")
    enc = encoder_from_args(args, device)
    qids = list(queries)
    return enc.encode_query([queries[q] for q in qids], ids=qids), enc.describe()


def _search_config(args: argparse.Namespace):
    """The command's ``SearchConfig``: ``--set search.<key>=<value>`` over the defaults, then ``--k`` and
    ``--backend`` where given (``args.k`` and ``args.backend`` are set from it)."""
    from lsr.config import search_config_from_overrides

    try:
        cfg = search_config_from_overrides(args.set or ())
    except ValueError as e:
        raise UsageError(str(e)) from e
    cfg = cfg.replace(**{key: value for key, value in (("k", args.k), ("backend", args.backend)) if value is not None})
    args.k, args.backend = cfg.k, cfg.backend
    return cfg


def cmd_search(args: argparse.Namespace) -> int:
    from lsr.index.inverted import InvertedIndex
    from lsr.index.sharded import is_sharded
    from lsr.search.searcher import Searcher, run_depth
    from lsr.storage.provenance import check_not_inside
    from lsr.utils.devices import resolve_device

    config = _search_config(args)
    from lsr.live import is_live
    from lsr.parallel.topology import is_distributed

    if is_live(args.index):
        _check_live_search(args, is_distributed())
    args.doc_filter = filter_from_args(args)   # (the docno files are read once, here)
    filtered = args.doc_filter is not None
    if filtered and is_distributed():
        raise UsageError("--filter / --allow-docnos / --deny-docnos search in one process for now (not under torchrun)")
    if filtered and args.explain and is_sharded(args.index):
        raise UsageError("--explain with a filter plans one unsharded index; a sharded index's partitions are each "
                         "filtered by their slice of the filter: drop --explain, or explain without the filter")
    if args.explain:
        return _explain_search(args, config)
    if args.out is None:
        raise UsageError("--out is required: the run file to write (or pass --explain to print the search plan only)")
    check_not_inside(args.out, [args.index, args.queries, args.vocab], "--out")
    if Path(args.out).is_dir():
        raise UsageError(f"--out {args.out} is a directory; give the path of the run file to write")
    if Path(args.out).exists() and not args.overwrite:
        raise FileExistsError(f"--out {args.out} already exists; pass --overwrite to replace it")
    device = resolve_device(args.device)
    if is_live(args.index):
        return _search_live(args, device, config)
    if is_distributed():  # any index on every rank of a torchrun job
        return _search_on_ranks(args, device, config)
    if is_sharded(args.index) and filtered:
        return _search_sharded_filtered(args, device, config)
    if is_sharded(args.index):
        from lsr.parallel.batch import index_doc_count, search_sharded

        args.k = run_depth(args.k, index_doc_count(args.index))
        queries, meta = _queries_from_args(args, device)
        hits = search_sharded(args.index, queries, args.k, device, backend=args.backend,
                              stream={"auto": None, "yes": True, "no": False}[args.stream], query_metadata=meta,
                              config=config)
        return _write_run(args, queries, hits.docnos, hits.scores, hits.doc_idx)
    index = InvertedIndex.load(args.index, device=device)
    args.k = run_depth(args.k, index.n_docs)
    doc_filter = args.doc_filter
    queries, query_meta = _queries_from_args(args, device)
    searcher = Searcher(index, device=device, config=config, metadata=_metadata_for(args, doc_filter, index))
    scores, doc_idx = searcher.search(queries.to(device), k=args.k, query_metadata=query_meta, filter=doc_filter)
    return _write_run(args, queries, index.docnos, scores, doc_idx)


def _search_sharded_filtered(args: argparse.Namespace, device: str, config: Any) -> int:
    """A filtered search of a sharded index in one process: ``ShardedSearcher`` with the filter over the global
    document indices (each partition searches its slice), the folder's metadata columns loaded."""
    from lsr.search.factory import open_searcher
    from lsr.search.searcher import run_depth

    stream = {"auto": None, "yes": True, "no": False}[args.stream]
    searcher = open_searcher(args.index, device=device, config=config, backend=args.backend, stream=stream)
    args.k = run_depth(args.k, searcher.index.n_docs)
    queries, meta = _queries_from_args(args, device)
    scores, doc_idx = searcher.search(queries.to(device), args.k, query_metadata=meta, filter=args.doc_filter)
    return _write_run(args, queries, searcher.index.docnos, scores, doc_idx)


def filter_from_args(args: argparse.Namespace) -> Any:
    """The ``DocFilter`` of ``--filter`` / ``--allow-docnos`` / ``--deny-docnos`` (all that are given must hold),
    or None."""
    from lsr.search.filters import filter_of

    for flag in ("allow_docnos", "deny_docnos"):
        path = getattr(args, flag, None)
        if path and not Path(path).is_file():
            raise UsageError(f"--{flag.replace('_', '-')} {path}: no such file (one docno per line)")
    lists = filter_of(None, args.allow_docnos, args.deny_docnos, args.filter_missing)
    if not args.filter:
        return lists
    return _where(args) if lists is None else _where(args) & lists


def _where(args: argparse.Namespace) -> Any:
    from lsr.search.filters import DocFilter

    try:
        return DocFilter.where(args.filter)
    except ValueError as e:
        raise UsageError(f"--filter: {e}") from e


def _metadata_for(args: argparse.Namespace, doc_filter: Any, index: Any) -> Any:
    """The index folder's metadata columns when the filter reads them (else None: nothing is loaded)."""
    if doc_filter is None or not doc_filter.reads_metadata():
        return None
    from lsr.index.metadata import load_metadata

    table = load_metadata(args.index, index.docnos)
    if table is None:
        raise UsageError(f"--filter reads metadata columns and {args.index} has none: attach them with "
                         f"`lsr index --metadata CORPUS --out {args.index}`, or filter with --allow-docnos / --deny-docnos")
    return table


def _check_live_search(args: argparse.Namespace, distributed: bool) -> None:
    """What ``lsr search`` does not offer on a live index (yet), refused in one line before any work."""
    if args.filter:
        raise UsageError(f"--filter reads metadata columns and the live index {args.index} has none (its added "
                         "documents carry no metadata): filter it with --allow-docnos / --deny-docnos")
    if distributed:
        raise UsageError(f"{args.index} is a live index, searched in one process: run lsr search without torchrun")


def _open_live(args: argparse.Namespace, device: str, config: Any) -> tuple[Any, Any]:
    """(the live index at ``--index``, read-only: readers never take the writer lock; its ``LiveSearcher``)."""
    from lsr.live import LiveIndex, LiveSearcher

    live = LiveIndex.open(args.index, device=device, write=False)
    return live, LiveSearcher(live, device, config=config)


def _search_live(args: argparse.Namespace, device: str, config: Any) -> int:
    """``lsr search --index L`` on a live index: its base (deletes masked out) and its added documents, merged
    exactly; the run is what searching an index rebuilt from its documents writes."""
    from lsr.search.searcher import run_depth

    live, searcher = _open_live(args, device, config)
    args.k = run_depth(args.k, max(live.n_docs, 1))
    doc_filter = args.doc_filter
    queries, query_meta = _queries_from_args(args, device)
    scores, slots = searcher.search(queries, args.k, filter=doc_filter, query_metadata=query_meta)
    return _write_run(args, queries, live.slot_docnos(), scores, slots)   # (read-only: no update in between)


def _live_base_for_explain(args: argparse.Namespace, device: str, config: Any, doc_filter: Any) -> tuple[Any, Any]:
    """(the live index's base, the filter its search applies: its deleted documents and the docno lists' part
    of it), after the line saying what the live index holds."""
    import numpy as np

    from lsr.live.search import live_slot_mask
    from lsr.search.filters import DocFilter, as_filter

    live, _ = _open_live(args, device, config)
    n_base = int(live.base_alive.sum())
    print(f"live index {args.index}: {n_base:,} base + {live.n_docs - n_base:,} added documents (generation "
          f"{live.generation}, update {live.seq}); the plan below is the base index's")
    allowed = live.base_alive
    if doc_filter is not None:   # over the live slots, as LiveSearcher resolves it (a listed docno may be an added one)
        alive = np.concatenate([live.base_alive, live.delta_alive])
        allowed = allowed & live_slot_mask(as_filter(doc_filter), live.slot_docnos(), alive)[:live.base.n_docs]
    return live.base, None if allowed.all() else DocFilter.mask(allowed)


def _search_on_ranks(args: argparse.Namespace, device: str, config: Any) -> int:
    """``lsr search`` under torchrun: the ranks agree on the index and the options before any work
    (``rank_index_job``), rank 0 reads (or encodes) the queries, every rank searches its share, rank 0 writes."""
    from lsr.parallel.batch import rank_index_job, search_batch
    from lsr.search.searcher import run_depth

    stream = {"auto": None, "yes": True, "no": False}[args.stream]
    settings = {"k": args.k, "backend": args.backend, "stream": stream}
    with rank_index_job(args.index, device, settings, config) as (mine, job):
        args.k = run_depth(args.k, mine.n_docs)
        # rank 0 reads the queries and writes the run
        queries, meta = job.on_lead("read the queries", lambda: _queries_from_args(args, str(job.device))) or (None, None)
        hits = search_batch(mine, queries, args.k, job.device, backend=args.backend, stream=stream,
                            query_metadata=meta, config=config)
    if hits is None:
        return 0
    return _write_run(args, queries, mine.docnos, hits.scores, hits.doc_idx)


def _write_run(args: argparse.Namespace, queries, docnos, scores, doc_idx) -> int:
    """``lsr search``'s run file and its one line of output."""
    from lsr.data import runs

    runs.write_topk(args.out, queries.ids, docnos, scores, doc_idx, fmt=args.format, tag=args.tag,
                    replace=args.overwrite)
    print(f"searched {len(queries)} queries (k={args.k}) -> {args.out}")
    return 0


def _explain_search(args: argparse.Namespace, config: Any) -> int:
    """``lsr search --explain``: print the plan of the first query batch; nothing is searched or written."""
    from lsr.index.inverted import InvertedIndex
    from lsr.index.sharded import ShardedIndex, is_sharded
    from lsr.live import is_live
    from lsr.parallel.batch import index_partition_count
    from lsr.parallel.plan import plan_batch
    from lsr.parallel.topology import launch_rank
    from lsr.search.searcher import Searcher, run_depth
    from lsr.utils.devices import resolve_device

    if launch_rank() != 0:  # under torchrun one rank prints the plan; nothing is searched
        return 0
    device = resolve_device(args.device)
    note, doc_filter = "", args.doc_filter
    if is_live(args.index):   # the base's plan; the delta segment is planned alike, per search
        index, doc_filter = _live_base_for_explain(args, device, config, doc_filter)
    elif is_sharded(args.index):   # every partition is planned alike: the first one's plan stands for them
        sharded = ShardedIndex.load(args.index, device=device, partitions=[0])
        index, note = sharded.partitions[0], f"(partition 1 of {sharded.n_partitions}) "
    else:
        index = InvertedIndex.load(args.index, device=device)
    queries, _ = _queries_from_args(args, device)
    world = int(os.environ.get("WORLD_SIZE", "1"))  # the ranks of this torchrun job (1 outside one)
    print(plan_batch(index_partition_count(args.index), world, len(queries)))
    searcher = Searcher(index, device=device, config=config, metadata=_metadata_for(args, doc_filter, index))
    print(note + str(searcher.explain(queries.to(device), k=run_depth(args.k, max(index.n_docs, 1)), filter=doc_filter)))
    from lsr.utils.runtime import failures_block

    if failures_block():   # the routes this process disabled (loading and encoding the queries ran kernels)
        print(failures_block())
    return 0


def register(sub: Any, command: Any) -> None:
    """Add ``lsr search`` to the ``lsr`` command's sub-parsers (``lsr.cli``)."""
    p = command(sub, "search", "batch-search queries and write a run", cmd_search)
    p.add_argument("--index", required=True, help="index directory written by lsr index (sharded, live or plain)")
    p.add_argument("--queries", required=True,
                   help="query vectors (lsr vector dir or Anserini TSV), or a dataset whose queries to encode")
    p.add_argument("--out", help="run file to write (required unless --explain)")
    p.add_argument("--k", type=integer(1), default=None,
                   help="results per query, at most the index's documents (default: search.k, 1000)")
    p.add_argument("--format", choices=("trec", "msmarco"), default="trec", help="run file format")
    p.add_argument("--tag", default="lsr", help="run tag (TREC format)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing file at --out")
    p.add_argument("--vocab", help="vocab.txt or tokenizer folder for Anserini token queries")
    p.add_argument("--query-scale", type=positive_float, default=None, help="Anserini query quantisation scale")
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="search backend: torch ops, or lsr's GPU kernels (default: search.backend, auto: gpu on "
                        "CUDA)")
    p.add_argument("--set", action="append", metavar="search.KEY=VALUE",
                   help="set a search key, e.g. search.route=block, search.scorer=triton, search.triton.span=1024 "
                        "(repeatable; every key: lsr.search.config)")
    p.add_argument("--filter", metavar="EXPR", help="search only the documents whose metadata columns satisfy EXPR, "
                   "e.g. \"year >= 2015 and lang == 'en'\" (columns attached by lsr index --metadata)")
    p.add_argument("--allow-docnos", metavar="FILE", help="search only these documents (one docno per line)")
    p.add_argument("--deny-docnos", metavar="FILE", help="never return these documents (one docno per line)")
    p.add_argument("--filter-missing", choices=("error", "ignore"), default="error",
                   help="docnos of --allow-docnos / --deny-docnos that the index lacks: an error, or skipped")
    p.add_argument("--explain", action="store_true",
                   help="print the plan: how the ranks of a torchrun job share the index and the queries, and the "
                        "search plan of the first query batch (backend, route, kernels, passes, fallbacks, each "
                        "with its reason); exit without searching or writing --out")
    p.add_argument("--stream", default="auto", choices=("auto", "yes", "no"),
                   help="sharded index: keep partitions in host memory and stream them to the GPU (auto: when "
                        "they exceed half the free GPU memory)")
    add_encoder_args(p)
