"""A whole query set searched by the ranks of a torchrun job, embarrassingly parallel (``lsr search`` and
``lsr run`` under torchrun).

Each rank loads its partitions (a plain index is one partition: every rank holds all of it), takes its
contiguous slice of the *whole* query set (``lsr.parallel.plan.BatchPlan``) and searches it on its own
device with no collective per batch. Once every rank is done, one agreement (a failure anywhere fails every
rank) and one gather bring the ranks' [m, k] lists to rank 0, which merges each slice's lists exactly
(score descending, doc index ascending) and holds the result; the run it writes equals one process's byte
for byte (same scores per document: see ``lsr.parallel.search``). The gather goes in row chunks of at most
``GATHER_BYTES`` per call on rank 0, so its memory stays bounded for any query set.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from lsr.index.sharded import ShardedIndex, is_sharded, read_sharded_manifest
from lsr.parallel.agreement import index_parts, settings_part
from lsr.parallel.exchange import broadcast_queries, pack_hits, unpack_hits
from lsr.parallel.jobs import RankJob, rank_job
from lsr.parallel.plan import BatchPlan, plan_batch, rank_role, slice_bounds
from lsr.parallel.topology import agree, comm_device, is_distributed
from lsr.search.config import SearchConfig
from lsr.search.searcher import check_request
from lsr.search.sharded import ShardedSearcher, merge_hit_lists
from lsr.sparse import SparseVectors
from lsr.utils.host_copy import copy_to_host

__all__ = ["BatchHits", "ShardedHits", "index_doc_count", "index_partition_count", "load_rank_index",
           "rank_index_job", "search_batch", "search_sharded"]

GATHER_BYTES = 1 << 30  # rank 0's receive buffers per gather call


class BatchHits(NamedTuple):
    """``search_batch``'s result on rank 0: the merged top-k (CPU tensors) and the plan that produced it."""

    scores: torch.Tensor
    doc_idx: torch.Tensor
    plan: BatchPlan


class ShardedHits(NamedTuple):
    """``search_sharded``'s result: the top-k (scores, global doc indices) and the index's doc ids."""

    scores: torch.Tensor
    doc_idx: torch.Tensor
    docnos: list[str]


def index_partition_count(path: str | os.PathLike) -> int:
    """Partitions of an index folder: its manifest's for a sharded one, 1 for a plain one."""
    return len(read_sharded_manifest(path)["partitions"]) if is_sharded(path) else 1


def index_doc_count(path: str | os.PathLike) -> int:
    """Documents of an index folder (sharded or plain), read from its manifest or meta.json."""
    if is_sharded(path):
        return int(read_sharded_manifest(path)["n_docs"])
    from lsr.index.inverted import InvertedIndex

    return int(InvertedIndex.read_meta(path)["n_docs"])


def load_rank_index(path: str | os.PathLike, rank: int, world_size: int, verify: bool = True) -> ShardedIndex:
    """This rank's partitions of an index folder, in host memory; a plain index is one partition (every rank
    loads all of it)."""
    if is_sharded(path):
        role = rank_role(index_partition_count(path), rank, world_size)
        return ShardedIndex.load(path, device="cpu", partitions=role.partitions, verify=verify)
    from lsr.index.inverted import InvertedIndex

    index = InvertedIndex.load(path, device="cpu", verify=verify)
    return ShardedIndex([index], [0], index.vocab_size, index.n_docs, index.metadata, Path(path))


def search_batch(index: ShardedIndex, queries: SparseVectors | None, k: int, device: str | torch.device, *,
                 backend: str = "auto", stream: bool | None = None, query_batch: int | None = None,
                 query_metadata: Mapping[str, Any] | None = None,
                 config: SearchConfig | None = None) -> BatchHits | None:
    """Exact top-k of rank 0's ``queries`` (the others pass None) over the whole collection; collective, in
    a joined process group. ``index`` holds this rank's partitions (``load_rank_index``); ``config``: every
    partition's ``SearchConfig`` (``backend`` overrides its backend). Returns the merged hits on rank 0 (CPU
    tensors [B, k]), None on the other ranks."""
    rank, world = dist.get_rank(), dist.get_world_size()
    comm = comm_device()
    refusal = None
    if rank == 0:
        try:
            if queries is None:
                raise ValueError("rank 0 must pass the queries")
            k = check_request(queries, k, query_metadata, index)
        except Exception as e:  # noqa: BLE001 - raised on rank 0 by broadcast_queries, once all ranks know
            refusal = e
    queries, k = broadcast_queries(queries, k, refusal, comm)  # the whole set, once
    plan = plan_batch(index.n_partitions, world, len(queries))
    mine = plan.query_range(rank)
    with agree("search its queries"):  # one agreement for the whole job, none per batch
        searcher = ShardedSearcher(index, device, backend, stream=stream, config=config)
        local = searcher.search(queries[mine.start:mine.stop], k, query_batch, show_progress_bar=False)
    merged = _gather_merge_to_rank0(local, plan, k, comm, index.n_docs)
    return BatchHits(*merged, plan) if merged is not None else None


def _gather_merge_to_rank0(local: tuple[torch.Tensor, torch.Tensor], plan: BatchPlan, k: int, comm: torch.device,
                           n_docs: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Every rank's [m, k] lists -> rank 0, merged per query slice over the slice's ranks (in row chunks)."""
    rank, world = dist.get_rank(), plan.world_size
    n_slices = plan.role(0).n_slices
    per_slice = world // n_slices  # ranks of one slice: its partitions (all ranks when partitioned)
    bounds = slice_bounds(plan.n_queries, n_slices)
    rows = -(-plan.n_queries // n_slices)
    step = max(1, GATHER_BYTES // (16 * k * world))
    # every row is written below (the slices tile the queries): empty, since first touches of host memory are
    # what a large result costs most on rank 0
    out = (torch.empty(plan.n_queries, k, dtype=torch.float32),
           torch.empty(plan.n_queries, k, dtype=torch.int64)) if rank == 0 else None
    for c in range(0, rows, step):
        m = min(step, rows - c)
        packed = pack_hits(local[0][c:c + m].to(comm), local[1][c:c + m].to(comm), m)
        received = [torch.empty_like(packed) for _ in range(world)] if rank == 0 else None
        dist.gather(packed, received, dst=0)
        if out is None:
            continue
        lists = [unpack_hits(t, k) for t in received]
        for j in range(n_slices):
            a, b = bounds[j] + c, min(bounds[j + 1], bounds[j] + c + m)
            if b > a:
                ranks = range(j * per_slice, (j + 1) * per_slice)
                s, i = merge_hit_lists([(lists[r][0][:b - a], lists[r][1][:b - a]) for r in ranks], k, n_docs)
                copy_to_host(s, out[0][a:b])  # straight into the result, through pinned buffers
                copy_to_host(i, out[1][a:b])
    return out


@contextmanager
def rank_index_job(index: str | os.PathLike, device: str, settings: Mapping[str, Any],
                   config: SearchConfig | None = None) -> Iterator[tuple[ShardedIndex, RankJob]]:
    """The start of a search job on every rank of a torchrun job (``rank_job``: the process group joined, and
    left on exit unless the caller had joined): agree on the index, ``settings`` (the search options) and the
    ``config`` the ranks search with (one collective, ``lsr.parallel.agreement``), load this rank's partitions.
    Yields (them, the job)."""
    with rank_job(device) as job:
        with job.agreement("read the index") as parts:
            parts += [*index_parts(index), settings_part("search settings", settings)]
            if config is not None:   # a route or a knob that differs between ranks would change their bits
                parts.append(settings_part("the search config", dataclasses.asdict(config)))
        with job.step("load its partitions"):
            mine = load_rank_index(index, job.rank, job.world)
        yield mine, job


def search_sharded(index: str | os.PathLike, queries: SparseVectors | None, k: int, device: str, *,
                   backend: str = "auto", stream: bool | None = None, query_batch: int | None = None,
                   query_metadata: Mapping[str, Any] | None = None,
                   config: SearchConfig | None = None) -> ShardedHits | None:
    """Exact top-k of ``queries`` over an index folder: a sharded one in one process (``ShardedSearcher``),
    or a sharded or plain one on every rank of a torchrun job (``rank_index_job``, then ``search_batch``; rank
    0 passes the queries, encoded on ``rank_device(device)``, and the others None). Returns the hits where the
    queries were given, None on the other ranks. ``stream``: as ``ShardedSearcher``; ``config``: as
    ``search_batch``."""
    if not is_distributed():
        if queries is None:
            raise ValueError("search_sharded needs the queries outside a torchrun job")
        sharded = ShardedIndex.load(index)
        searcher = ShardedSearcher(sharded, device, backend, stream=stream, config=config)
        scores, doc_idx = searcher.search(queries, k=k, query_batch=query_batch, query_metadata=query_metadata)
        return ShardedHits(scores, doc_idx, sharded.docnos)
    settings = {"k": k, "backend": backend, "stream": stream, "query_batch": query_batch}
    with rank_index_job(index, device, settings, config) as (mine, job):
        hits = search_batch(mine, queries, k, job.device, backend=backend, stream=stream, query_batch=query_batch,
                            query_metadata=query_metadata, config=config)
        return ShardedHits(hits.scores, hits.doc_idx, mine.docnos) if hits is not None else None
