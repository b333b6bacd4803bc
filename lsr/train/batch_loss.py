"""The loss of one batch of examples: the ranking loss (InfoNCE with in-batch and hard negatives, MarginMSE
or KL against teacher scores) plus the FLOPS / L1 regularisers, as a function of the batch's vectors."""

from __future__ import annotations

from collections.abc import Callable

import torch

from lsr.train import losses
from lsr.train.config import LossConfig
from lsr.train.data import Example, TrainData

__all__ = ["batch_loss_fn"]


def batch_loss_fn(loss_cfg: LossConfig, data: TrainData, batch: list[Example], step: int, device: torch.device
                  ) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict]]:
    """``loss_fn(q [B, V], d [N, V]) -> (loss, logs)`` of ``batch`` in ``lsr.train.losses``' layout: other
    copies of a query's positives are excluded from its negatives, teacher scores are looked up, the
    FLOPS weights follow their warm-up at ``step``."""
    doc_ids = [e.positive for e in batch] + [n for e in batch for n in e.negatives]
    columns: dict[str, list[int]] = {}
    for j, doc in enumerate(doc_ids):
        columns.setdefault(doc, []).append(j)
    exclude = torch.zeros(len(batch), len(doc_ids), dtype=torch.bool)
    for i, e in enumerate(batch):  # other copies of a query's positives are not negatives for it
        for j in (j for p in data.positives.get(e.qid, ()) for j in columns.get(p, ()) if j != i):
            exclude[i, j] = True
    exclude = exclude.to(device)
    teacher = None
    if data.teacher is not None:
        teacher = torch.tensor([[data.teacher[e.qid].get(d, float("nan")) for d in (e.positive, *e.negatives)]
                                for e in batch], device=device)
    w_q = losses.flops_weight(loss_cfg.flops_query, step, loss_cfg.flops_warmup_steps)
    w_d = losses.flops_weight(loss_cfg.flops_doc, step, loss_cfg.flops_warmup_steps)

    def loss_fn(q: torch.Tensor, d: torch.Tensor) -> tuple[torch.Tensor, dict]:
        if loss_cfg.kind == "infonce":
            rank = losses.info_nce(q, d, loss_cfg.temperature, loss_cfg.in_batch_negatives, exclude)
        elif loss_cfg.kind == "margin_mse":
            rank = losses.margin_mse(q, d, teacher)
        else:
            rank = losses.kl_distillation(q, d, teacher, loss_cfg.temperature)
        f_q, f_d = losses.flops(q), losses.flops(d)
        total = rank + w_q * f_q + w_d * f_d
        if loss_cfg.l1_query or loss_cfg.l1_doc:
            total = total + loss_cfg.l1_query * losses.l1(q) + loss_cfg.l1_doc * losses.l1(d)
        return total, {"rank_loss": rank.item(), "flops_q": f_q.item(), "flops_d": f_d.item(),
                       "flops_weight_q": w_q, "flops_weight_d": w_d}
    return loss_fn
