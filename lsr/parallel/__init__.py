"""Everything torch.distributed: the same jobs on several GPUs and hosts, launched with ``torchrun``.

* ``topology``: process-group setup (gloo on CPUs, NCCL on GPUs; ``process_group`` joins and leaves it),
  rank / world / device of this process, ``agree`` (a step that fails on one rank fails on all), the
  collective timeout (``LSR_DIST_TIMEOUT``).
* ``agreement``: the one agreement at the start of every job: each rank's fingerprint of its index,
  documents, inputs, settings and output folder, compared in one collective (``RanksDisagree``).
* ``watchdog``: every rank's heartbeat: a stopped rank found within ``LSR_DIST_HEARTBEAT`` seconds, and no rank
  left running or stopped when a job ends; ``joblock``: one encoding at a time in a vector folder.
* ``sharded_index``: ``ShardedIndex``, a collection split into contiguous partitions in one folder;
  ``build_sharded_index`` builds it in one process or on every rank.
* ``sharded_search``: ``ShardedSearcher``, the partitions searched in turn on one device with an exact merge.
* ``plan``: how the ranks share the partitions and the queries (``rank_role``, ``BatchPlan``), decided in one place.
* ``batch``: ``search_batch``, a whole query set over the ranks with no per-batch collective, gathered once;
  ``search_sharded``, an index folder searched in one process or on every rank (``lsr search`` under torchrun).
* ``search``: ``DistributedSearcher``, interactive batches over partitions or replicas spread over the ranks.
* ``exchange``: the packed messages distributed search sends (queries, hits with failure flags).
* ``encode``: corpus encoding over the ranks, identical to one process's and resumable with any world size
  (``encode_corpus_distributed``, ``encode_on_ranks`` for ``lsr encode``); ``encode_units``: its working
  folder (one-window units taken through claim files, shards assembled from them).
* ``pipeline``: ``lsr run`` on every rank of a torchrun job (the steps come from ``lsr.pipeline.steps``).

Library functions take explicit arguments and return values; the CLI parses and prints. The names
below are imported on first use (``from lsr.parallel import ShardedIndex``): torch loads only then.
"""

from __future__ import annotations

from lsr.utils.lazy import lazy_exports

_EXPORTS = {
    "lsr.parallel.encode": ("encode_corpus_distributed", "encode_on_ranks"),
    "lsr.parallel.pipeline": ("run_pipeline_distributed",),
    "lsr.parallel.batch": ("search_batch", "search_sharded"),
    "lsr.parallel.plan": ("BatchPlan", "plan_batch"),
    "lsr.parallel.search": ("DistributedSearcher",),
    "lsr.parallel.sharded_index": ("ShardedIndex", "build_sharded_index"),
    "lsr.parallel.sharded_search": ("ShardedSearcher",),
    "lsr.parallel.topology": ("agree", "init_distributed", "is_distributed", "process_group"),
}
__all__ = ["BatchPlan", "DistributedSearcher", "ShardedIndex", "ShardedSearcher", "agree", "build_sharded_index",
           "encode_corpus_distributed", "encode_on_ranks", "init_distributed", "is_distributed", "process_group",
           "plan_batch", "run_pipeline_distributed", "search_batch", "search_sharded"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
