"""The end-to-end job behind ``lsr run``: encode -> index -> search -> evaluate, from one ``RunConfig``.

* ``run``: ``run_pipeline(cfg)``, the job in one process; under torchrun it hands the job to
  ``distributed`` (every rank runs it, every rank returns rank 0's result).
* ``distributed``: ``run_pipeline_distributed``, the job spread over the ranks of a torchrun job (its rank
  coordination from ``lsr.parallel``: ``jobs.rank_job``, distributed encoding, the sharded build, batch search).
* ``steps``: the steps both jobs share: devices and encoders, the output folder's claim, pre-encoded
  vectors, the queries, the run files and metrics.

``distributed`` imports ``steps`` and ``run`` imports ``distributed`` (only under torchrun), so neither job
module imports the other.
"""

from __future__ import annotations

from lsr.pipeline.run import run_pipeline
from lsr.pipeline.steps import (
    build_encoder,
    claim_output,
    corpus_settings,
    doc_encoder,
    encode_queries,
    job_origin,
    load_query_vectors,
    open_encoder,
    read_doc_vectors,
    resolve_device,
    timed_step,
    write_results,
)

__all__ = ["build_encoder", "claim_output", "corpus_settings", "doc_encoder", "encode_queries", "job_origin",
           "load_query_vectors", "open_encoder", "read_doc_vectors", "resolve_device", "run_pipeline", "timed_step",
           "write_results"]
