"""The training step issued op by op (any device, torchrun, GradCache): what the trainer runs wherever the CUDA-graph
step (``lsr.train.graph_step``) does not.

    step = EagerStep(model, optimizer, cfg, rank, world)
    loss, logs, grad_norm, counts = step.run(data, batch, step_index, lr)

Under torchrun each rank encodes its part of the global batch (``lsr.train.global_batch.RankPart``) and its loss is
the rank's share of the global batch's (``rank_loss``); the loss, its parts and the non-zero counts are then
reduced over the ranks (``reduce_logs``), so every rank logs and checks the same numbers. In one process
``loss.in_batch_groups`` cuts the batch as that many ranks would (``grouped_loss``).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lsr.train.batch_loss import batch_loss_fn
from lsr.train.config import TrainConfig
from lsr.train.data import Example, TrainData
from lsr.train.global_batch import RankPart, group_rows, grouped_loss, rank_loss, reduce_logs
from lsr.train.model import TrainableEncoder

__all__ = ["EagerStep", "check_finite"]


def check_finite(loss: float, step: int) -> None:
    """The one-line error of a non-finite loss at ``step`` (the update is not applied)."""
    if not math.isfinite(loss):
        raise FloatingPointError(f"step {step}: the loss is {loss}; lower optim.lr or set encoder.dtype: float32")


class EagerStep:
    """Forward, backward, clipping and the optimizer step of one (global) batch, op by op, on rank ``rank`` of
    ``world``."""

    def __init__(self, model: TrainableEncoder, optimizer: torch.optim.Optimizer, cfg: TrainConfig, rank: int = 0,
                 world: int = 1) -> None:
        self.model, self.optimizer, self.cfg = model, optimizer, cfg
        self.rank, self.world = rank, world

    def _step_loss(self, data: TrainData, batch: list[Example], part: RankPart | None, step: int):
        """The loss function of this process's encoded rows: its rank's share (under torchrun), the
        grouped loss (``loss.in_batch_groups``) or the batch's own."""
        n_neg, loss_cfg = self.cfg.negatives.count, self.cfg.loss

        def loss_fn(examples: list[Example]):
            return batch_loss_fn(loss_cfg, data, examples, step, self.model.device)

        if part is not None:
            return rank_loss(loss_fn, batch, part, n_neg, loss_cfg.gather_across_ranks)
        if loss_cfg.in_batch_groups > 1:
            return grouped_loss(loss_fn, batch, loss_cfg.in_batch_groups, n_neg)
        return loss_fn(batch)

    def run(self, data: TrainData, batch: list[Example], step: int, lr: float
            ) -> tuple[float, dict[str, Any], float | None, dict]:
        """One step at learning rate ``lr``: (loss, logs, grad norm or None, counts)."""
        optim, tokens0 = self.cfg.optim, self.model.tokens
        part = RankPart.of(batch, self.rank, self.world) if self.world > 1 else None
        examples = part.examples if part is not None else batch
        queries = [data.queries[e.qid] for e in examples]
        docs = [data.docs[d] for d in [e.positive for e in examples] + [n for e in examples for n in e.negatives]]
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        loss, logs, q, d = self.model.backward(self._step_loss(data, batch, part, step), queries, docs,
                                               optim.grad_cache_chunk)
        q_rows, d_rows = group_rows(0, part.real if part else len(batch), len(examples), self.cfg.negatives.count)
        counts = {"nnz_q": float((q[q_rows] > 0).sum()), "n_q": len(q_rows), "nnz_d": float((d[d_rows] > 0).sum()),
                  "n_d": len(d_rows), "tokens": self.model.tokens - tokens0}
        if self.world > 1:  # the global batch's loss and counts (also: every rank sees the same loss below)
            loss, logs, counts = reduce_logs(loss, logs, counts, self.world)
        check_finite(float(loss), step)
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        grad_norm = None
        if optim.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(params, optim.max_grad_norm, foreach=not optim.deterministic)
            grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)  # (a DTensor under FSDP)
        self.optimizer.step()
        return float(loss), logs, grad_norm, counts
