"""The end-to-end job behind ``lsr run``: encode -> index -> search -> evaluate, from one ``RunConfig``.

* ``run``: ``run_pipeline(cfg)``, the job in one process; under torchrun it hands the job to
  ``distributed`` (every rank runs it, every rank returns rank 0's result).
* ``distributed``: ``run_pipeline_distributed``, the job spread over the ranks of a torchrun job (its rank
  coordination from ``lsr.parallel``: ``jobs.rank_job``, distributed encoding, the sharded build, batch search).
* ``steps``: the steps both jobs share: the documents' encoder, the output folder's claim, the queries, the
  run files and metrics (encoders come from ``lsr.encode.factory``, pre-encoded vectors from
  ``lsr.interop.vectors``).

``distributed`` imports ``steps`` and ``run`` imports ``distributed`` (only under torchrun), so neither job
module imports the other.
"""

from __future__ import annotations

from lsr.pipeline.run import run_pipeline
from lsr.pipeline.steps import claim_output, doc_encoder, encode_queries, job_origin, timed_step, write_results

__all__ = ["claim_output", "doc_encoder", "encode_queries", "job_origin", "run_pipeline", "timed_step", "write_results"]
