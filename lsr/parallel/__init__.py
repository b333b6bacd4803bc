"""Everything torch.distributed: the same jobs on several GPUs and hosts, launched with ``torchrun``.

* ``jobs``: ``rank_job``, the one frame of every distributed job (encode, index, search, run, train): the
  process group joined and left, the heartbeat, the agreement before any work, steps that fail on every rank
  when they fail on one, one-line timeouts; the same code runs in one process.
* ``topology``: process-group setup (gloo on CPUs, NCCL on GPUs), rank / world / device of this process,
  ``agree`` (a step that fails on one rank fails on all), the collective timeout (``LSR_DIST_TIMEOUT``).
* ``agreement``: the one agreement at the start of every job: each rank's fingerprint of its index,
  documents, inputs, settings and output folder, compared in one collective (``RanksDisagree``).
* ``watchdog``: every rank's heartbeat: a stopped rank found within ``LSR_DIST_HEARTBEAT`` seconds, and no rank
  left running or stopped when a job ends; ``joblock``: one encoding at a time in a vector folder.
* ``sharded_build``: the sharded index (``lsr.index.sharded.ShardedIndex``) built by every rank, each its share of
  the partitions (``build_on_ranks``); ``build_sharded_index``, ``lsr index --partitions`` in one process or on
  every rank.
* ``plan``: how the ranks share the partitions and the queries (``rank_role``, ``BatchPlan``), decided in one place.
* ``batch``: ``search_batch``, a whole query set over the ranks with no per-batch collective, gathered once;
  ``search_sharded``, an index folder searched in one process or on every rank (``lsr search`` under torchrun).
* ``search``: ``DistributedSearcher``, interactive batches over partitions or replicas spread over the ranks.
* ``exchange``: the packed messages distributed search sends (queries, hits with failure flags).
* ``encode``: corpus encoding over the ranks, identical to one process's and resumable with any world size
  (``encode_corpus_distributed``, ``encode_on_ranks`` for ``lsr encode``); ``encode_units``: its working
  folder (one-window units taken through claim files, shards assembled from them).
* ``training``: what data-parallel training needs of torch.distributed (DDP / FSDP2 wrapping, the
  differentiable all-gather of embeddings, reductions of logs and gradients, full state dicts); ``lsr.train``
  calls it.

``lsr run`` on every rank is ``lsr.pipeline.distributed``: the pipeline's job, which takes its rank coordination
from here (``lsr.pipeline`` imports this package, not the other way round). The sharded searcher is ``lsr.search.sharded``.

Library functions take explicit arguments and return values; the CLI parses and prints. The names
below are imported on first use (``from lsr.parallel import rank_job``): torch loads only then.
"""

from __future__ import annotations

from lsr.utils.lazy import lazy_exports

_EXPORTS = {
    "lsr.parallel.encode": ("encode_corpus_distributed", "encode_on_ranks"),
    "lsr.parallel.batch": ("search_batch", "search_sharded"),
    "lsr.parallel.jobs": ("RankJob", "rank_job"),
    "lsr.parallel.plan": ("BatchPlan", "plan_batch"),
    "lsr.parallel.search": ("DistributedSearcher",),
    "lsr.parallel.sharded_build": ("build_on_ranks", "build_sharded_index"),
    "lsr.parallel.topology": ("agree", "init_distributed", "is_distributed"),
}
__all__ = ["BatchPlan", "DistributedSearcher", "RankJob", "agree", "build_on_ranks", "build_sharded_index",
           "encode_corpus_distributed", "encode_on_ranks", "init_distributed", "is_distributed", "plan_batch",
           "rank_job", "search_batch", "search_sharded"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
