"""``lsr run`` on every rank of a torchrun job: the steps of ``lsr.pipeline.steps`` spread over the ranks, in one
``lsr.parallel.jobs.rank_job`` (the process group, the heartbeat, the agreement before any work, one-line failures).

* the ranks agree on what they use (``lsr.parallel.agreement``: the config, the documents, the encoder's and
  other input files by content, the output folder by path) in one collective before any work;
* rank 0 alone checks and claims the output folder (``lsr.storage.provenance``) and fits BM25 statistics; the
  other ranks follow once it has (they load the fit it saved);
* every rank encodes its slice of the documents into the run's ``doc_vectors`` folder
  (``encode_corpus_distributed``: the folder one process writes, file for file);
* every rank builds its partitions of the sharded index (``index.partitions``; default one per rank;
  ``lsr.parallel.sharded_build.build_on_ranks``);
* rank 0 encodes the queries, every rank searches its share of them on its partitions with no collective per
  batch (``lsr.parallel.batch.search_batch``: the queries broadcast once, the per-rank top-k gathered once on
  rank 0 and merged exactly);
* rank 0 alone writes run.trec, run.msmarco.tsv and metrics.json (and runs a configured rerank stage
  while the others wait), and every rank returns its result.

Each step is a step of the job (``RankJob.step``): a failure on one rank fails every rank (with the failing
rank's error there and "another rank failed" elsewhere) instead of leaving the others waiting.
The run files and metrics equal a single-process ``lsr run`` with the same ``index.partitions`` (and one
plain index), byte for byte.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from lsr.config import RunConfig
from lsr.encode.factory import corpus_settings
from lsr.interop.vectors import is_vector_folder, read_doc_vectors
from lsr.parallel.agreement import config_parts, corpus_part
from lsr.parallel.encode import encode_dataset_distributed
from lsr.parallel.jobs import RankJob, rank_job
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
    if any(getattr(cfg.filter, f) for f in ("where", "allow_docnos", "deny_docnos")):
        raise ValueError("a run with a filter: section runs in one process for now (not under torchrun)")
    with rank_job(resolve_device(cfg.device)) as job:
        with job.agreement("read the config and the dataset") as parts:  # the ranks agree before any work
            cfg = dataclasses.replace(cfg, index=dataclasses.replace(cfg.index, partitions=job_partitions(cfg, job.world)))
            from lsr.data.sources import load_dataset

            dataset = load_dataset(cfg.data.dataset, cfg.data.split)
            check_job_partitions(cfg, dataset, cfg.index.partitions)
            parts += [corpus_part(dataset), *config_parts(cfg.to_dict(), covered=("data.dataset",))]
        job.on_lead("claim the output folder", lambda: claim_output(cfg, dataset, Path(cfg.output), overwrite))
        timings: dict[str, float] = {}
        vectors, encoder, doc_meta = _encode_corpus(job, cfg, dataset, timings)
        result = _index_search_write(job, cfg, dataset, vectors, encoder, doc_meta, timings)
        return json.loads(job.from_lead(json.dumps(result) if job.lead else None, RESULT_LIMIT))


def _encode_corpus(job: RankJob, cfg: RunConfig, dataset: Any, timings: dict[str, float]) -> tuple[Any, Any, Any]:
    """(the document vectors: a folder or SparseVectors, the encoder or None, the vectors' metadata)."""
    out, origin, dev = Path(cfg.output), job_origin(cfg, dataset), str(job.device)
    with timed_step("encode documents", timings):
        if cfg.inputs.doc_vectors:
            with job.step("read the document vectors"):
                given = Path(cfg.inputs.doc_vectors)
                vectors = given if is_vector_folder(given) else read_doc_vectors(given, cfg.inputs.vocab)
            return vectors, None, None
        encoder = job.built_on_lead(lambda: doc_encoder(cfg, dataset, out, origin, dev),
                                    lambda: doc_encoder(cfg, dataset, out, origin, dev, fit=False), "the encoder",
                                    lead_only=cfg.encoder.kind == "bm25")  # the others load the statistics it saves
        manifest = encode_dataset_distributed(encoder, dataset, out / "doc_vectors",
                                              **corpus_settings(cfg.encoder, origin))
    return out / "doc_vectors", encoder, manifest.get("metadata")


def _index_search_write(job: RankJob, cfg: RunConfig, dataset: Any, vectors: Any, encoder: Any, doc_meta: Any,
                        timings: dict[str, float]) -> dict[str, Any] | None:
    """Build the sharded index, search it with rank 0's queries, write the results on rank 0 (its result;
    None on the other ranks)."""
    from lsr.parallel.batch import load_rank_index, search_batch
    from lsr.parallel.sharded_build import build_on_ranks
    from lsr.search.searcher import run_depth

    out, dev = Path(cfg.output), str(job.device)
    with timed_step("build index", timings):
        # metadata {} for pre-encoded vectors, as the single-process job builds them
        build_on_ranks(vectors, cfg.index.partitions, out / "index", device=dev, block_size=cfg.index.block_size,
                       metadata=doc_meta or {}, overwrite=True, postings=cfg.index.postings)
        with job.step("load its partitions"):
            index = load_rank_index(out / "index", job.rank, job.world, verify=False)
    with timed_step("encode queries", timings):
        queries, query_meta = job.on_lead("encode the queries", lambda: encode_queries(cfg, dataset, encoder)) \
            or (None, None)
    with timed_step("search", timings):  # every rank its slice of the queries, gathered once on rank 0
        hits = search_batch(index, queries, run_depth(cfg.search.k, index.n_docs), dev, backend=cfg.search.backend,
                            query_metadata=query_meta, config=cfg.search)
    return job.on_lead("write the run and metrics", lambda: write_results(
        cfg, dataset, queries, index.docnos, (hits.scores, hits.doc_idx), timings, dev))
