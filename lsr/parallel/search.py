"""Exact distributed search over a ShardedIndex with torch.distributed (NCCL on GPUs, gloo on CPUs).

Launch with ``torchrun --nproc-per-node W ...``. How the W ranks share a P-partition index (``rank_role``):

* P >= W (partitioned): rank r holds partitions r, r + W, r + 2W, ... and searches every query;
* P < W with W a multiple of P (replica groups): R = W / P copies of the index; rank r holds partition
  r mod P and searches query slice r // P of R. P = 1 is pure replication: every rank holds the whole
  index and searches 1/W of each batch, so throughput scales with W while the index fits one device
  (splitting the documents instead leaves each rank the per-batch costs that do not shrink with N; the
  measurements are in the scaling performance docs).

For every query batch:

1. rank 0 broadcasts the batch (sizes, then the CSR tensors: a few hundred KB at B = 500);
2. every rank computes the exact top-k of its partitions for its query slice (``ShardedSearcher``), doc
   indices global;
3. the [B / R, k] scores and doc indices are all-gathered (padded to equal slices) and, per slice, the
   lists of its P ranks are merged with ``exact_topk``'s order (score descending, doc index ascending).

Every rank scores every doc as the single-process index does (collection-wide ``max_scores``, see
``lsr.parallel.sharded_index``), and the global top-k is inside the union of the ranks' top-k lists, so the
merged result equals single-process search bit for bit. Every rank gets the merged result.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from lsr.parallel.sharded_index import ShardedIndex, read_sharded_manifest
from lsr.parallel.sharded_search import ShardedSearcher, merge_hit_lists
from lsr.parallel.topology import agree, comm_device, is_distributed, process_group
from lsr.search.searcher import check_request
from lsr.sparse import SparseVectors
from lsr.utils.devices import torch_device

__all__ = ["DistributedSearcher", "RankRole", "ShardedHits", "rank_partitions", "rank_role", "search_sharded"]

DEFAULT_QUERY_BATCH = 1024


def rank_partitions(n_partitions: int, rank: int, world_size: int) -> list[int]:
    """Partitions of ``rank``: r, r + W, r + 2W, ... (P >= W); r mod P in replica groups (P < W)."""
    return rank_role(n_partitions, rank, world_size).partitions


class RankRole(NamedTuple):
    """What one rank does: its partitions, and which of ``n_slices`` equal slices of a batch it searches."""

    partitions: list[int]
    query_slice: int
    n_slices: int


def rank_role(n_partitions: int, rank: int, world_size: int) -> RankRole:
    """Partitioned (P >= W: every rank searches all queries) or replica groups (W = R * P: rank r searches
    slice r // P of the batch on partition r mod P). Any other P < W is refused with the counts that work."""
    if n_partitions >= world_size:
        return RankRole(list(range(rank, n_partitions, world_size)), 0, 1)
    if world_size % n_partitions:
        raise ValueError(f"an index of {n_partitions} partitions cannot be shared by {world_size} ranks: rebuild it "
                         f"with --partitions {world_size} (or a multiple, or a divisor of {world_size}), or start "
                         f"{n_partitions} ranks")
    return RankRole([rank % n_partitions], rank // n_partitions, world_size // n_partitions)


def slice_bounds(n: int, n_slices: int) -> list[int]:
    """Start of each of ``n_slices`` near-equal slices of n rows, and n."""
    return [n * j // n_slices for j in range(n_slices + 1)]


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
        with agree("load its partitions"):
            if isinstance(index, ShardedIndex):  # built in memory by this rank (its partitions loaded)
                self.role = rank_role(index.n_partitions, self.rank, self.world_size)
                self.index = index
            else:
                n_p = len(read_sharded_manifest(index)["partitions"])
                self.role = rank_role(n_p, self.rank, self.world_size)
                self.index = ShardedIndex.load(index, device="cpu", partitions=self.role.partitions, verify=verify)
            self.local = ShardedSearcher(self.index, self.device, backend, max_memory_bytes, stream)

    def _broadcast(self, queries: SparseVectors | None) -> SparseVectors:
        """Rank 0's queries on every rank (ids stay on rank 0)."""
        sizes = torch.zeros(3, dtype=torch.int64, device=self._comm)
        if self.rank == 0:
            sizes[:] = torch.tensor([len(queries), queries.nnz, queries.vocab_size])
        dist.broadcast(sizes, 0)
        n, nnz, vocab = sizes.tolist()
        if self.rank == 0:
            parts = [queries.indptr.to(self._comm, torch.int64), queries.indices.to(self._comm, torch.int32),
                     queries.values.to(self._comm, torch.float32)]
        else:
            parts = [torch.empty(n + 1, dtype=torch.int64, device=self._comm),
                     torch.empty(nnz, dtype=torch.int32, device=self._comm),
                     torch.empty(nnz, dtype=torch.float32, device=self._comm)]
        for t in parts:
            dist.broadcast(t, 0)
        ids = queries.ids if self.rank == 0 else [str(i) for i in range(n)]
        return SparseVectors(*parts, ids, vocab, validate=False)

    def _gather_merge(self, local: tuple[torch.Tensor, torch.Tensor], n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All ranks' lists of their slices of an n-query batch -> the merged [n, k] result (on every rank)."""
        bounds, rows = slice_bounds(n, self.role.n_slices), -(-n // self.role.n_slices)
        s, i = (t.to(self._comm) for t in local)
        pad = rows - s.shape[0]  # slices differ by one row at most: pad to equal all-gather sizes
        s = torch.cat([s, s.new_zeros(pad, k)]).contiguous()
        i = torch.cat([i, i.new_full((pad, k), -1)]).contiguous()
        all_s = [torch.empty_like(s) for _ in range(self.world_size)]
        all_i = [torch.empty_like(i) for _ in range(self.world_size)]
        dist.all_gather(all_s, s)
        dist.all_gather(all_i, i)
        n_p = self.world_size // self.role.n_slices  # ranks per slice: the partitions P (W when partitioned)
        out = []
        for j in range(self.role.n_slices):  # slice j: ranks j*P .. j*P+P-1 (all ranks when partitioned)
            m = bounds[j + 1] - bounds[j]
            ranks = range(j * n_p, (j + 1) * n_p)
            out.append(merge_hit_lists([(all_s[r][:m].to(self.device), all_i[r][:m].to(self.device)) for r in ranks], k))
        return torch.cat([o[0] for o in out]), torch.cat([o[1] for o in out])

    def search(self, queries: SparseVectors | None, k: int = 1000, query_batch: int | None = None,
               query_metadata: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k of rank 0's queries over the whole collection; collective (every rank calls it,
        the others with ``queries=None``). Returns (scores float32 [B, k], global doc_idx int64 [B, k])
        on every rank."""
        with agree("check the queries"):
            if self.rank == 0:
                if queries is None:
                    raise ValueError("rank 0 must pass the queries")
                k = check_request(queries, k, query_metadata, self.index)
        queries = self._broadcast(queries)
        qb = query_batch or DEFAULT_QUERY_BATCH
        out_s, out_i = [], []
        for a in range(0, len(queries), qb):
            chunk = queries[a:a + qb]
            bounds = slice_bounds(len(chunk), self.role.n_slices)
            mine = chunk[bounds[self.role.query_slice]:bounds[self.role.query_slice + 1]]
            with agree("search its partitions"):  # e.g. out of memory on one rank: all fail, none waits
                local = self.local.search(mine, k, show_progress_bar=False)
            s, i = self._gather_merge(local, len(chunk), k)
            out_s.append(s)
            out_i.append(i)
        if not out_s:
            return (torch.zeros(0, k, dtype=torch.float32, device=self.device),
                    torch.full((0, k), -1, dtype=torch.int64, device=self.device))
        return torch.cat(out_s), torch.cat(out_i)


class ShardedHits(NamedTuple):
    """``search_sharded``'s result: the top-k (scores, global doc indices) and the index's doc ids."""

    scores: torch.Tensor
    doc_idx: torch.Tensor
    docnos: list[str]


def search_sharded(index: str | os.PathLike, queries: SparseVectors | None, k: int, device: str, *,
                   backend: str = "auto", stream: bool | None = None,
                   query_metadata: Mapping[str, Any] | None = None) -> ShardedHits | None:
    """Exact top-k of ``queries`` over a sharded index folder: in one process (``ShardedSearcher``), or on
    every rank of a torchrun job (``DistributedSearcher``; collective: it joins the process group and leaves
    it when done unless the caller had joined; each rank loads its partitions, rank 0 passes the queries,
    encoded on ``rank_device(device)``, and the others None). Returns the hits where the queries were given,
    None on the other ranks. ``stream``: as ``ShardedSearcher``."""
    if not is_distributed():
        if queries is None:
            raise ValueError("search_sharded needs the queries outside a torchrun job")
        sharded = ShardedIndex.load(index)
        searcher = ShardedSearcher(sharded, device, backend, stream=stream)
        scores, doc_idx = searcher.search(queries, k=k, query_metadata=query_metadata)
        return ShardedHits(scores, doc_idx, sharded.docnos)
    with process_group(device) as dev:
        dist_searcher = DistributedSearcher(index, dev, backend, stream=stream)
        scores, doc_idx = dist_searcher.search(queries, k=k, query_metadata=query_metadata)
        return ShardedHits(scores, doc_idx, dist_searcher.index.docnos) if dist_searcher.rank == 0 else None
