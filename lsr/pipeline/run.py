"""``run_pipeline``: the whole ``lsr run`` job (encode -> index -> search -> evaluate) in one process, or handed
to ``lsr.pipeline.distributed`` under torchrun.

Every step writes its result under ``config.output`` (vectors, index, runs, metrics.json), and the
encoding step resumes from complete shards, so an interrupted job picks up where it stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lsr.config import RunConfig
from lsr.encode.factory import corpus_settings
from lsr.interop.vectors import read_doc_vectors
from lsr.pipeline.steps import check_job_partitions, claim_output, doc_encoder, encode_queries, timed_step, write_results
from lsr.utils.devices import resolve_device

__all__ = ["run_pipeline"]


def run_pipeline(cfg: RunConfig, overwrite: bool = False) -> dict[str, Any]:
    """Run the whole job; returns {"metrics", "timings", "files", "config"} and writes metrics.json.

    ``cfg.output`` must be a new or empty folder, or one an earlier ``lsr run`` wrote for the same
    documents (its artefacts are then reused or resumed); ``overwrite=True`` also takes a folder lsr did
    not write or one made for other documents (lsr's own artefacts in it are recomputed). Under torchrun
    every rank runs it (``lsr.pipeline.distributed``) and every rank returns rank 0's result.
    """
    from lsr.parallel.topology import is_distributed

    if is_distributed():
        from lsr.pipeline.distributed import run_pipeline_distributed

        return run_pipeline_distributed(cfg, overwrite)
    import torch

    from lsr.data.sources import load_dataset
    from lsr.encode.corpus import encode_corpus
    from lsr.search.factory import open_searcher
    from lsr.search.searcher import run_depth
    from lsr.storage.shards import read_vectors

    device = resolve_device(cfg.device)
    out = Path(cfg.output)
    timings: dict[str, float] = {}
    doc_filter = run_filter(cfg)   # (a bad expression or docno file fails before any work)
    dataset = load_dataset(cfg.data.dataset, cfg.data.split)
    check_job_partitions(cfg, dataset, cfg.index.partitions)
    origin = claim_output(cfg, dataset, out, overwrite)
    encoder = None
    with timed_step("encode documents", timings):
        doc_meta = None
        if cfg.inputs.doc_vectors:
            docs = read_doc_vectors(cfg.inputs.doc_vectors, cfg.inputs.vocab)
        else:
            encoder = doc_encoder(cfg, dataset, out, origin, device)
            # a complete folder is reused only when written with the same encoder settings (encode_corpus checks)
            doc_meta = encode_corpus(encoder, dataset.docs_iter(), out / "doc_vectors", n_docs=dataset.n_docs,
                                     **corpus_settings(cfg.encoder, origin)).get("metadata")
            docs = read_vectors(out / "doc_vectors", verify=False)  # encode_corpus has just verified the shards
    with timed_step("build index", timings):
        index = _build_index(cfg, docs, out / "index", device, doc_meta)
        del docs
    with timed_step("encode queries", timings):
        queries, query_meta = encode_queries(cfg, dataset, encoder)
    with timed_step("search", timings):
        searcher = open_searcher(index, device=device, config=cfg.search,
                                 metadata=run_metadata(cfg, doc_filter, index, out / "index"))
        k = run_depth(cfg.search.k, index.n_docs)
        queries = queries.to(device)
        explain = getattr(searcher, "explain", None)   # one index: the plan its first batch follows, for the record
        plan = explain(queries, k, filter=doc_filter) if explain is not None else None
        scores, doc_idx = searcher.search(queries, k=k, query_metadata=query_meta, filter=doc_filter)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return write_results(cfg, dataset, queries, index.docnos, (scores, doc_idx), timings, device,
                         search_plan=None if plan is None else plan.describe())


def run_filter(cfg: RunConfig) -> Any:
    """The ``DocFilter`` of the config's ``filter:`` section, or None."""
    from lsr.search.filters import filter_of

    f = cfg.filter
    return filter_of(f.where, f.allow_docnos, f.deny_docnos, f.missing)


def run_metadata(cfg: RunConfig, doc_filter: Any, index: Any, folder: Path) -> Any:
    """The metadata columns of the run's index when its filter reads them, else None."""
    if doc_filter is None or not doc_filter.reads_metadata():
        return None
    from lsr.index.metadata import load_metadata

    table = load_metadata(folder, index.docnos)
    if table is None:
        raise ValueError(f"filter.where reads metadata columns and {folder} has none: list the corpus columns to keep "
                         "in index.metadata (e.g. index.metadata=[year, lang])")
    return table


def _build_index(cfg: RunConfig, docs: Any, out: Path, device: str, doc_meta: dict[str, Any] | None) -> Any:
    """The job's index saved in ``out``: one InvertedIndex, or a sharded one for ``index.partitions`` > 1."""
    from lsr.index.inverted import InvertedIndex

    if cfg.index.partitions == 1:
        index = InvertedIndex.build(docs, device=device, block_size=cfg.index.block_size, metadata=doc_meta,
                                    postings=cfg.index.postings)
        index.save(out, overwrite=True)
        return index
    from lsr.index.sharded import ShardedIndex

    # built and saved partition by partition, then loaded: the partitions stay memory-mapped on the host
    # and the searcher moves them to the device, or streams them there when they do not fit
    ShardedIndex.build(docs, cfg.index.partitions, out, device=device, block_size=cfg.index.block_size,
                       metadata=doc_meta, overwrite=True, postings=cfg.index.postings)
    return ShardedIndex.load(out, verify=False)
