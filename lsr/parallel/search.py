"""Exact distributed search over a ShardedIndex with torch.distributed (NCCL on GPUs, gloo on CPUs).

Launch with ``torchrun --nproc-per-node W ...``. How the W ranks share a P-partition index (partitioned,
replica groups or replicas) is decided in ``lsr.parallel.plan`` (``rank_role``), applied to each batch.

For every ``search`` call (interactive use: a batch at a time; a whole query set is faster through
``lsr.parallel.batch``, which has no per-batch collective):

1. rank 0 broadcasts the queries (``lsr.parallel.exchange``: the sizes with rank 0's verdict on the request,
   then one buffer: a few hundred KB at B = 500);
2. every rank computes the exact top-k of its partitions for its query slice (``ShardedSearcher``), doc
   indices global;
3. the [B / R, k] scores and doc indices, with a failure flag, are all-gathered in one collective (padded
   to equal slices) and, per slice, the lists of its P ranks are merged with ``exact_topk``'s order (score
   descending, doc index ascending). The flags are read once per call, after the last batch.

Every rank scores every doc as the single-process index does (collection-wide ``max_scores``, see
``lsr.index.sharded``), and the global top-k is inside the union of the ranks' top-k lists, so the
merged result equals single-process search bit for bit. Every rank gets the merged result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from lsr.index.sharded import ShardedIndex, read_sharded_manifest
from lsr.parallel.agreement import agreement, index_parts, settings_part
from lsr.parallel.exchange import broadcast_queries, pack_hits, unpack_hits
from lsr.parallel.plan import rank_role, slice_bounds
from lsr.parallel.topology import agree, comm_device
from lsr.search.searcher import check_request
from lsr.search.sharded import ShardedSearcher, merge_hit_lists
from lsr.sparse import SparseVectors
from lsr.utils.devices import torch_device

__all__ = ["DistributedSearcher"]

DEFAULT_QUERY_BATCH = 1024


class DistributedSearcher:
    """One rank's part of an exact distributed search (every rank constructs one and calls ``search``).

    Args:
        index: the sharded index folder (each rank loads only its partitions), or a ShardedIndex holding
            this rank's partitions.
        device: this rank's device (``init_distributed`` returns it), as ``Searcher``.
        backend, max_memory_bytes, stream: as ``ShardedSearcher``.
        verify: check file checksums when loading.
    """

    def __init__(self, index: str | os.PathLike | ShardedIndex, device: str | torch.device, backend: str = "auto",
                 max_memory_bytes: int | None = None, stream: bool | None = None, verify: bool = True) -> None:
        device = torch_device(device)  # a bad name fails before the collective load
        if not dist.is_initialized():
            raise RuntimeError("DistributedSearcher needs torch.distributed: launch with torchrun and call "
                               "init_distributed first")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = device
        self._comm = comm_device()
        with agreement("read the index") as parts:  # the same index (by content) and options on every rank
            held = {"backend": backend, "max_memory_bytes": max_memory_bytes, "stream": stream}
            if isinstance(index, ShardedIndex):
                held |= {"partitions": index.n_partitions, "documents": index.n_docs, "vocabulary": index.vocab_size}
            else:
                parts += index_parts(index)
            parts.append(settings_part("search settings", held))
        with agree("load its partitions"):
            if isinstance(index, ShardedIndex):  # built in memory by this rank (its partitions loaded)
                self.role = rank_role(index.n_partitions, self.rank, self.world_size)
                self.index = index
            else:
                n_p = len(read_sharded_manifest(index)["partitions"])
                self.role = rank_role(n_p, self.rank, self.world_size)
                self.index = ShardedIndex.load(index, device="cpu", partitions=self.role.partitions, verify=verify)
            self.local = ShardedSearcher(self.index, self.device, backend, max_memory_bytes, stream)

    def _gather_merge(self, local: tuple[torch.Tensor, torch.Tensor], n: int, k: int,
                      failed: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """All ranks' lists of their slices of an n-query batch -> (the merged [n, k] result, on every rank;
        whether any rank failed, a device scalar: read once per call, not per batch). One all-gather carries
        the hits and every rank's failure flag."""
        bounds, rows = slice_bounds(n, self.role.n_slices), -(-n // self.role.n_slices)
        packed = pack_hits(local[0].to(self._comm), local[1].to(self._comm), rows, failed)  # equal shapes
        gathered = [torch.empty_like(packed) for _ in range(self.world_size)]
        dist.all_gather(gathered, packed)
        any_failed = torch.stack([g[:, -1].amax() for g in gathered]).amax()  # n >= 1: rows >= 1
        lists = [unpack_hits(g, k) for g in gathered]
        n_p = self.world_size // self.role.n_slices  # ranks per slice: the partitions P (W when partitioned)
        out = []
        for j in range(self.role.n_slices):  # slice j: ranks j*P .. j*P+P-1 (all ranks when partitioned)
            m = bounds[j + 1] - bounds[j]
            ranks = range(j * n_p, (j + 1) * n_p)
            out.append(merge_hit_lists([(lists[r][0][:m].to(self.device), lists[r][1][:m].to(self.device))
                                        for r in ranks], k, self.index.n_docs))
        return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out]), any_failed

    def search(self, queries: SparseVectors | None, k: int = 1000, query_batch: int | None = None,
               query_metadata: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k of rank 0's queries over the whole collection; collective (every rank calls it,
        the others with ``queries=None``). Returns (scores float32 [B, k], global doc_idx int64 [B, k])
        on every rank.

        Per call: one broadcast of the sizes (carrying rank 0's verdict on the request) and one of the
        queries; per batch of ``query_batch`` queries, one all-gather that carries every rank's hits and
        failure flag. The flags are read once, at the end: a rank whose search failed sends empty lists
        from then on, and every rank raises (the failing one its own error)."""
        refusal = None
        if self.rank == 0:
            try:
                if queries is None:
                    raise ValueError("rank 0 must pass the queries")
                k = check_request(queries, k, query_metadata, self.index)
            except Exception as e:  # noqa: BLE001 - raised on rank 0 by broadcast_queries, once all ranks know
                refusal = e
        queries, k = broadcast_queries(queries, k, refusal, self._comm)
        qb = query_batch or DEFAULT_QUERY_BATCH
        out_s, out_i, flags = [], [], []
        error: BaseException | None = None
        for a in range(0, len(queries), qb):
            chunk = queries[a:a + qb]
            bounds = slice_bounds(len(chunk), self.role.n_slices)
            mine = chunk[bounds[self.role.query_slice]:bounds[self.role.query_slice + 1]]
            local = None
            if error is None:
                try:  # e.g. out of memory on one rank: it keeps answering the gathers, then all ranks raise
                    local = self.local.search(mine, k, show_progress_bar=False)
                except Exception as e:  # noqa: BLE001 - re-raised below, once the other ranks know
                    error = e
            if local is None:
                local = (torch.zeros(0, k, dtype=torch.float32, device=self._comm),
                         torch.full((0, k), -1, dtype=torch.int64, device=self._comm))
            s, i, failed = self._gather_merge(local, len(chunk), k, error is not None)
            out_s.append(s)
            out_i.append(i)
            flags.append(failed)
        if error is not None:
            raise error
        if flags and bool(torch.stack(flags).amax()):  # the one host sync the agreement needs, per call
            raise RuntimeError("another rank failed to search its partitions (its error says why)")
        if not out_s:
            return (torch.zeros(0, k, dtype=torch.float32, device=self.device),
                    torch.full((0, k), -1, dtype=torch.int64, device=self.device))
        return torch.cat(out_s), torch.cat(out_i)
