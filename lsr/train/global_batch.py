"""Data-parallel training over the ranks of a torchrun job: each rank's part of a global batch, and the loss of
one global batch (the collectives it takes are ``lsr.parallel.training``'s).

**Batches.** ``optim.batch_size`` is the per-rank batch, as Hugging Face Trainer's
``per_device_train_batch_size`` and sentence-transformers mean it: W ranks train on global batches of
W x batch_size examples, cut by ``epoch_batches`` from (seed, epoch) alone, so the data order is the global
batch's whatever the rank count. Rank r encodes the r-th of W contiguous parts of each global batch
(``split_sizes``: equal parts, or parts one example apart for a short last batch); every rank encodes
the same number of rows, a short part padded with copies of the batch's first example that no loss sees.

**The loss.** With ``loss.gather_across_ranks`` every rank gathers all ranks' query and document
vectors (``lsr.parallel.training.gather_rows``: an all-gather whose backward sums every rank's gradient of each part back to
its owner) into the global batch and computes the one-process loss of it (in-batch negatives, FLOPS and
distillation over the global batch). Without it each rank's part is a group with its own in-batch
negatives and FLOPS, and the loss is sum_r (k_r / g) loss_r over the parts (k_r of the g examples): the
mean of per-rank losses when the parts are equal. ``loss.in_batch_groups: W`` computes that loss in one
process (``grouped_loss``), so a run can move between rank counts and continue the same loss curve.
DDP averages the ranks' gradients, so each rank's loss is scaled to make that average the gradient of
the loss above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from lsr.parallel.training import gather_rows, sum_over_ranks

__all__ = ["SCALED_LOGS", "RankPart", "group_rows", "grouped_loss", "rank_loss", "reduce_logs", "split_sizes"]

T = TypeVar("T")
LossFn = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict]]
SCALED_LOGS = ("rank_loss", "flops_q", "flops_d")  # log fields that are parts of the loss (averaged like it)


def split_sizes(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous near-equal parts of ``n`` items, the larger ones first."""
    base, extra = divmod(n, parts)
    return [base + (i < extra) for i in range(parts)]


@dataclass(frozen=True)
class RankPart:
    """This rank's part of a global batch: ``examples`` (``rows`` of them, the first ``real`` ones its own,
    the others padding), where its part starts in the global batch, and every rank's real count."""

    examples: list
    real: int
    start: int
    sizes: list[int]

    @property
    def rows(self) -> int:
        return len(self.examples)

    @classmethod
    def of(cls, batch: Sequence[T], rank: int, world: int) -> RankPart:
        sizes = split_sizes(len(batch), world)
        start, real = sum(sizes[:rank]), sizes[rank]
        rows = max(sizes[0], 1)
        mine = list(batch[start:start + real])
        return cls(mine + [batch[0]] * (rows - real), real, start, sizes)


def group_rows(start: int, k: int, total: int, n_neg: int) -> tuple[list[int], list[int]]:
    """Rows of queries [start, start + k) in ``q`` and of their documents in ``d`` (layout of
    ``lsr.train.losses``: ``total`` positives, then ``n_neg`` negatives per query)."""
    q_rows = list(range(start, start + k))
    return q_rows, q_rows + list(range(total + start * n_neg, total + (start + k) * n_neg))


def _scaled(loss: torch.Tensor, logs: dict, scale: float) -> tuple[torch.Tensor, dict]:
    return loss * scale, {k: v * scale if k in SCALED_LOGS else v for k, v in logs.items()}


def grouped_loss(make_loss: Callable[[list], LossFn], batch: list, groups: int, n_neg: int) -> LossFn:
    """One process: the batch cut into ``groups`` parts as ``groups`` ranks cut it, each part's loss on
    its own rows (its in-batch negatives, its FLOPS), summed with weights k_j / g."""
    sizes = split_sizes(len(batch), groups)

    def loss_fn(q: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, dict]:
        total: torch.Tensor | None = None
        logs: dict[str, Any] = {}
        start = 0
        for k in (k for k in sizes if k):
            qi, di = group_rows(start, k, len(batch), n_neg)
            loss, part_logs = _scaled(*make_loss(batch[start:start + k])(q[qi], d[di]), k / len(batch))
            total = loss if total is None else total + loss
            logs = {key: logs.get(key, 0.0) + v if key in SCALED_LOGS else v for key, v in part_logs.items()}
            start += k
        assert total is not None  # a batch has at least one example
        return total, logs
    return loss_fn


def rank_loss(make_loss: Callable[[list], LossFn], batch: list, part: RankPart, n_neg: int, gather: bool) -> LossFn:
    """This rank's loss on its encoded part (``part.rows`` queries and their documents): the global
    batch's loss after gathering every rank's vectors (``gather``), else its own part's, scaled so that
    the ranks' average gradient (DDP's) is the gradient of the loss the module docstring defines."""
    world = len(part.sizes)
    if gather:
        m = part.rows
        q_rows = [r * m + o for r, k in enumerate(part.sizes) for o in range(k)]
        per_rank = m * (1 + n_neg)
        d_rows = [r * per_rank + o for r, k in enumerate(part.sizes) for o in range(k)]
        d_rows += [r * per_rank + m + o * n_neg + t for r, k in enumerate(part.sizes) for o in range(k)
                   for t in range(n_neg)]
        full = make_loss(batch)
        return lambda q, d: full(gather_rows(q)[q_rows], gather_rows(d)[d_rows])
    if not part.real:  # nothing of its own: a zero loss that still reaches every parameter (DDP waits for all)
        return lambda q, d: ((q.sum() + d.sum()) * 0.0, {k: 0.0 for k in SCALED_LOGS})
    qi, di = group_rows(0, part.real, part.rows, n_neg)
    own = make_loss(batch[part.start:part.start + part.real])
    return lambda q, d: _scaled(*own(q[qi], d[di]), world * part.real / len(batch))


def reduce_logs(loss: torch.Tensor, logs: dict, extra: dict[str, float], world: int
                ) -> tuple[float, dict, dict[str, float]]:
    """One all-reduce of a step's numbers over the ``world`` ranks: the loss and its parts averaged (each rank's
    value carries its weight), ``extra`` counts summed."""
    keys = [k for k in SCALED_LOGS if k in logs]
    out = sum_over_ranks([float(loss)] + [float(logs[k]) for k in keys] + list(extra.values()))
    averaged = {k: v / world for k, v in zip(keys, out[1:1 + len(keys)], strict=True)}
    return out[0] / world, {**logs, **averaged}, dict(zip(extra, out[1 + len(keys):], strict=True))
