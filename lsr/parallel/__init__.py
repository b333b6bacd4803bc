"""Everything torch.distributed: the same jobs on several GPUs and hosts, launched with ``torchrun``.

* ``topology``: process-group setup (gloo on CPUs, NCCL on GPUs), rank / world / device of this process.
* ``sharded_index``: ``ShardedIndex``, a collection split into contiguous partitions in one folder.
* ``sharded_search``: ``ShardedSearcher``, the partitions searched in turn on one device with an exact merge.
* ``search``: ``DistributedSearcher``, partitions or replicas spread over the ranks.
* ``encode``: corpus encoding over the ranks, identical to one process's output.
* ``pipeline``: ``lsr run`` on every rank of a torchrun job.
"""
