"""A sharded index built by the ranks of a torchrun job: the rank coordination around ``lsr.index.sharded``.

The per-partition work is the library's (``lsr.index.sharded.PartitionBuild``: a partition read, built, saved and
dropped; the manifest over the built partitions); this module only decides who does what, each step agreed
(a failure on one rank fails every rank):

1. rank 0 checks the output path and opens the temporary folder the index is built in (one shared file
   system), and sends its path to the others;
2. rank r builds partitions r, r + W, r + 2W, ... on its own device into it;
3. rank 0 writes the manifest, and the folder is renamed into place; no rank returns before it is.

``build_sharded_index`` is the whole job of ``lsr index --partitions`` (``lsr.parallel.jobs.rank_job``: one
process, or every rank of a torchrun job after their agreement on the vectors and the settings).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from lsr.index.sharded import PartitionBuild, check_index_target, read_sharded_manifest
from lsr.parallel.agreement import content_part, output_part, settings_part
from lsr.parallel.jobs import rank_job
from lsr.parallel.topology import agree, broadcast_text, rank_and_size
from lsr.sparse import SparseVectors
from lsr.storage.files import atomic_directory

__all__ = ["build_on_ranks", "build_sharded_index"]


def build_on_ranks(vectors: SparseVectors | str | os.PathLike, n_partitions: int, out: str | os.PathLike, *,
                   device: str | torch.device = "cpu", overwrite: bool = False, **settings: Any) -> Path:
    """``ShardedIndex.build`` with every rank of the current process group building its share of the partitions
    on its own ``device`` (collective: every rank calls it with the same arguments; one process builds them
    all). ``settings``: ``PartitionBuild.of``'s (block_size, metadata, postings, workers). Returns the folder."""
    plan = PartitionBuild.of(vectors, n_partitions, device=device, **settings)  # the same refusal on every rank
    rank, world = rank_and_size()
    out = Path(out)
    # the outer agree waits for rank 0 to publish the folder: no rank returns before it is in place
    with agree("publish the index folder"), ExitStack() as stack:
        tmp = None
        with agree("prepare the output folder"):
            if rank == 0:
                check_index_target(out, overwrite)
                tmp = stack.enter_context(atomic_directory(out, overwrite=overwrite))
        tmp = Path(broadcast_text(str(tmp) if rank == 0 else None))
        with agree("build its partitions"):
            plan.build_partitions(tmp, range(rank, n_partitions, world))
        with agree("write the manifest"):
            if rank == 0:
                plan.write_manifest(tmp)
    return out


def build_sharded_index(vectors: SparseVectors | str | os.PathLike, n_partitions: int, out: str | os.PathLike, *,
                        device: str = "cpu", **build_kwargs: Any) -> int:
    """``lsr index --partitions``: the sharded index of ``vectors`` in this process or, under torchrun, on every
    rank (each builds its partitions on its own device, once the ranks agree on the vectors and the settings).
    ``build_kwargs``: ``build_on_ranks``'s (overwrite, block_size, postings, workers, metadata). Returns the
    number of partitions written."""
    with rank_job(device) as job:
        with job.agreement("read the vectors") as parts:  # the ranks agree before any work
            parts += [settings_part("index settings", {"partitions": n_partitions, **build_kwargs}),
                      output_part(out, "index folder")]
            if not isinstance(vectors, SparseVectors):
                parts.append(content_part("vectors", vectors))
        build_on_ranks(vectors, n_partitions, out, device=str(job.device), **build_kwargs)
    return len(read_sharded_manifest(out)["partitions"])  # at most one per document
