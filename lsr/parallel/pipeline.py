"""``lsr run`` on every rank of a torchrun job: the steps of ``lsr.pipeline`` spread over the ranks.

* the ranks agree on what they use (``lsr.parallel.agreement``: the config, the documents, the encoder's and
  other input files by content, the output folder by path) in one collective before any work;
* rank 0 alone checks and claims the output folder (``lsr.storage.provenance``) and fits BM25 statistics; the
  other ranks follow once it has (they load the fit it saved);
* every rank encodes its slice of the documents into the run's ``doc_vectors`` folder
  (``encode_corpus_distributed``: the folder one process writes, file for file);
* every rank builds its partitions of the sharded index (``index.partitions``; default one per rank);
* rank 0 encodes the queries, every rank searches its share of them on its partitions with no collective per
  batch (``lsr.parallel.batch.search_batch``: the queries broadcast once, the per-rank top-k gathered once on
  rank 0 and merged exactly);
* rank 0 alone writes run.trec, run.msmarco.tsv and metrics.json (and runs a configured rerank stage
  while the others wait), and every rank returns its result.

Each step is wrapped in ``lsr.parallel.topology.agree``: a failure on one rank fails every rank (with the
failing rank's error there and "another rank failed" elsewhere) instead of leaving the others waiting.
The run files and metrics equal a single-process ``lsr run`` with the same ``index.partitions`` (and one
plain index), byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

from lsr.config import RunConfig
from lsr.encode.factory import corpus_settings
from lsr.interop.vectors import is_vector_folder, read_doc_vectors
from lsr.parallel.agreement import agreement, config_parts, corpus_part
from lsr.parallel.encode import encode_dataset_distributed
from lsr.parallel.topology import agree, broadcast_text, built_on_rank0, process_group
from lsr.pipeline.steps import (
    check_job_partitions,
    claim_output,
    doc_encoder,
    encode_queries,
    job_origin,
    timed_step,
    write_results,
)
from lsr.utils.devices import resolve_device

__all__ = ["job_partitions", "run_pipeline_distributed"]

RESULT_LIMIT = 1 << 20  # bytes of rank 0's result JSON sent to the other ranks


def job_partitions(cfg: RunConfig, world_size: int) -> int:
    """The sharded index's partitions under ``world_size`` ranks: ``index.partitions``, or one per rank
    when the config leaves it at 1 (each rank builds one in parallel); fewer than the ranks only when they
    divide them (replica groups, ``lsr.parallel.plan``)."""
    n = cfg.index.partitions if cfg.index.partitions > 1 else world_size
    if n < world_size and world_size % n:
        raise ValueError(f"index.partitions={n} cannot be shared by {world_size} ranks: set index.partitions to "
                         f"{world_size} (or a multiple, or a divisor of {world_size}), or start fewer ranks")
    return n


def run_pipeline_distributed(cfg: RunConfig, overwrite: bool = False) -> dict[str, Any]:
    """``run_pipeline`` on every rank of the current torchrun job (collective); returns rank 0's result
    on every rank. Joins the process group torchrun describes (and leaves it when done) unless the
    caller already has."""
    with process_group(resolve_device(cfg.device)) as device:
        dev = str(device)
        rank, world = dist.get_rank(), dist.get_world_size()
        with agreement("read the config and the dataset") as parts:  # the ranks agree before any work
            cfg = dataclasses.replace(cfg, index=dataclasses.replace(cfg.index, partitions=job_partitions(cfg, world)))
            from lsr.data.sources import load_dataset

            dataset = load_dataset(cfg.data.dataset, cfg.data.split)
            check_job_partitions(cfg, dataset, cfg.index.partitions)
            parts += [corpus_part(dataset), *config_parts(cfg.to_dict(), covered=("data.dataset",))]
        with agree("claim the output folder"):
            if rank == 0:  # rank 0 decides, the others follow
                claim_output(cfg, dataset, Path(cfg.output), overwrite)
        timings: dict[str, float] = {}
        vectors, encoder, doc_meta = _encode_corpus(cfg, dataset, dev, timings)
        result = _index_search_write(cfg, dataset, vectors, encoder, doc_meta, dev, timings)
        return json.loads(broadcast_text(json.dumps(result) if rank == 0 else None, RESULT_LIMIT))


def _encode_corpus(cfg: RunConfig, dataset: Any, dev: str, timings: dict[str, float]) -> tuple[Any, Any, Any]:
    """(the document vectors: a folder or SparseVectors, the encoder or None, the vectors' metadata)."""
    out, origin = Path(cfg.output), job_origin(cfg, dataset)
    with timed_step("encode documents", timings):
        if cfg.inputs.doc_vectors:
            with agree("read the document vectors"):
                given = Path(cfg.inputs.doc_vectors)
                vectors = given if is_vector_folder(given) else read_doc_vectors(given, cfg.inputs.vocab)
            return vectors, None, None
        encoder = built_on_rank0(lambda: doc_encoder(cfg, dataset, out, origin, dev),
                                 lambda: doc_encoder(cfg, dataset, out, origin, dev, fit=False), "the encoder",
                                 rank0_only=cfg.encoder.kind == "bm25")  # the others load the statistics it saves
        manifest = encode_dataset_distributed(encoder, dataset, out / "doc_vectors",
                                              **corpus_settings(cfg.encoder, origin))
    return out / "doc_vectors", encoder, manifest.get("metadata")


def _index_search_write(cfg: RunConfig, dataset: Any, vectors: Any, encoder: Any, doc_meta: Any, dev: str,
                        timings: dict[str, float]) -> dict[str, Any] | None:
    """Build the sharded index, search it with rank 0's queries, write the results on rank 0 (its result;
    None on the other ranks)."""
    from lsr.parallel.batch import load_rank_index, search_batch
    from lsr.parallel.sharded_index import ShardedIndex
    from lsr.search.searcher import run_depth

    rank, world, out = dist.get_rank(), dist.get_world_size(), Path(cfg.output)
    with timed_step("build index", timings):
        # metadata {} for pre-encoded vectors, as the single-process job builds them
        ShardedIndex.build(vectors, cfg.index.partitions, out / "index", device=dev, block_size=cfg.index.block_size,
                           metadata=doc_meta or {}, overwrite=True, postings=cfg.index.postings)
        with agree("load its partitions"):
            index = load_rank_index(out / "index", rank, world, verify=False)
    queries, query_meta = None, None
    with timed_step("encode queries", timings), agree("encode the queries"):
        if rank == 0:
            queries, query_meta = encode_queries(cfg, dataset, encoder)
    with timed_step("search", timings):  # every rank its slice of the queries, gathered once on rank 0
        hits = search_batch(index, queries, run_depth(cfg.search.k, index.n_docs), dev, backend=cfg.search.backend,
                            query_metadata=query_meta, config=cfg.search)
    result = None
    with agree("write the run and metrics"):
        if rank == 0:
            result = write_results(cfg, dataset, queries, index.docnos, (hits.scores, hits.doc_idx), timings, dev)
    return result
