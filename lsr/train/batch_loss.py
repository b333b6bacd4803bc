"""The loss of one batch of examples: the ranking loss (InfoNCE with in-batch and hard negatives, MarginMSE
or KL against teacher scores) plus the FLOPS / L1 regularisers, as a function of the batch's vectors.

Two halves, so that the CUDA-graph step (``lsr.train.graph_step``) can capture the second: ``loss_inputs``
(what changes per batch: the exclusion mask, the teacher scores, the FLOPS weights of the step; host work)
and ``loss_terms`` (the loss and its parts as tensors, no host sync). ``batch_loss_fn`` joins them for
the eager step and reads the parts as numbers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lsr.train import losses
from lsr.train.config import LossConfig
from lsr.train.data import Example, TrainData

__all__ = ["LOSS_PARTS", "LossInputs", "batch_loss_fn", "loss_inputs", "loss_terms"]

LOSS_PARTS = ("rank_loss", "flops_q", "flops_d")  # the tensor parts ``loss_terms`` returns, in log order


@dataclass
class LossInputs:
    """What a batch's loss needs besides its vectors: ``exclude`` bool [B, N] (other copies of a query's
    positives, which are no negatives for it), ``teacher`` float [B, 1 + n] (distillation; None without
    teacher scores), the FLOPS weights ``w_q`` / ``w_d`` of the step (numbers, or 0-d tensors a CUDA
    graph reads)."""

    exclude: torch.Tensor
    teacher: torch.Tensor | None
    w_q: float | torch.Tensor
    w_d: float | torch.Tensor


def loss_inputs(loss_cfg: LossConfig, data: TrainData, batch: list[Example], step: int,
                device: torch.device | str) -> LossInputs:
    """``batch``'s ``LossInputs`` in ``lsr.train.losses``' layout (positives, then each query's negatives) on
    ``device``; the FLOPS weights follow their warm-up at ``step``."""
    doc_ids = [e.positive for e in batch] + [n for e in batch for n in e.negatives]
    columns: dict[str, list[int]] = {}
    for j, doc in enumerate(doc_ids):
        columns.setdefault(doc, []).append(j)
    exclude = torch.zeros(len(batch), len(doc_ids), dtype=torch.bool)
    for i, e in enumerate(batch):  # other copies of a query's positives are not negatives for it
        for j in (j for p in data.positives.get(e.qid, ()) for j in columns.get(p, ()) if j != i):
            exclude[i, j] = True
    teacher = None
    if data.teacher is not None:
        teacher = torch.tensor([[data.teacher[e.qid].get(d, float("nan")) for d in (e.positive, *e.negatives)]
                                for e in batch], device=device)
    return LossInputs(exclude.to(device), teacher,
                      losses.flops_weight(loss_cfg.flops_query, step, loss_cfg.flops_warmup_steps),
                      losses.flops_weight(loss_cfg.flops_doc, step, loss_cfg.flops_warmup_steps))


def loss_terms(loss_cfg: LossConfig, q: torch.Tensor, d: torch.Tensor, inputs: LossInputs
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(total loss, {part: 0-d tensor} for ``LOSS_PARTS``) of vectors ``q`` [B, V] and ``d`` [N, V]; no host
    sync (a CUDA graph captures it)."""
    if loss_cfg.kind == "infonce":
        rank = losses.info_nce(q, d, loss_cfg.temperature, loss_cfg.in_batch_negatives, inputs.exclude)
    elif loss_cfg.kind == "margin_mse":
        rank = losses.margin_mse(q, d, inputs.teacher)
    else:
        rank = losses.kl_distillation(q, d, inputs.teacher, loss_cfg.temperature)
    f_q, f_d = losses.flops(q), losses.flops(d)
    total = rank + inputs.w_q * f_q + inputs.w_d * f_d
    if loss_cfg.l1_query or loss_cfg.l1_doc:
        total = total + loss_cfg.l1_query * losses.l1(q) + loss_cfg.l1_doc * losses.l1(d)
    return total, dict(zip(LOSS_PARTS, (rank, f_q, f_d), strict=True))


def batch_loss_fn(loss_cfg: LossConfig, data: TrainData, batch: list[Example], step: int, device: torch.device
                  ) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict]]:
    """``loss_fn(q [B, V], d [N, V]) -> (loss, logs)`` of ``batch`` (``loss_inputs`` + ``loss_terms``), its
    parts and FLOPS weights read as numbers for the log."""
    inputs = loss_inputs(loss_cfg, data, batch, step, device)

    def loss_fn(q: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, dict]:
        total, parts = loss_terms(loss_cfg, q, d, inputs)
        return total, {**{k: v.item() for k, v in parts.items()}, "flops_weight_q": inputs.w_q,
                       "flops_weight_d": inputs.w_d}
    return loss_fn
