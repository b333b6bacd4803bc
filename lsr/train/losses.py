"""Training losses on SPLADE vectors: ranking (InfoNCE, MarginMSE, KL) and sparsity (FLOPS, L1).

Layout used throughout: ``q`` [B, V] query vectors; ``d`` [N, V] document vectors whose first B rows
are the queries' positives (row i belongs to query i) and whose remaining rows are hard negatives,
``n`` per query, query i's at rows B + i·n ... B + i·n + n - 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["flops", "flops_weight", "info_nce", "kl_distillation", "l1", "margin_mse", "own_documents"]


def own_documents(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """[B, 1 + n] scores of each query against its own positive and its n hard negatives."""
    B = q.shape[0]
    n = (d.shape[0] - B) // B
    pos = (q * d[:B]).sum(-1, keepdim=True)
    if n == 0:
        return pos
    neg = torch.einsum("bv,bnv->bn", q, d[B:].view(B, n, -1))
    return torch.cat([pos, neg], 1)


def info_nce(q: torch.Tensor, d: torch.Tensor, temperature: float = 1.0, in_batch: bool = True,
             exclude: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy of each query's positive among the documents it is compared with: every row of
    ``d`` (``in_batch``) or only its own positive and hard negatives. ``exclude`` [B, N] bool drops
    documents from a query's softmax (other copies of its positives, which are no negatives)."""
    B = q.shape[0]
    if not in_batch:
        scores = own_documents(q, d) / temperature
        return F.cross_entropy(scores, torch.zeros(B, dtype=torch.long, device=q.device))
    scores = (q @ d.t()) / temperature
    if exclude is not None:
        scores = scores.masked_fill(exclude, float("-inf"))
    return F.cross_entropy(scores, torch.arange(B, device=q.device))


def margin_mse(q: torch.Tensor, d: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """MarginMSE (Hofstätter et al.): (s(q, d+) - s(q, d-) - (t+ - t-))², one negative per query;
    ``teacher`` [B, 2] holds (t+, t-)."""
    s = own_documents(q, d)
    if s.shape[1] != 2:
        raise ValueError(f"margin_mse takes one hard negative per query, got {s.shape[1] - 1}")
    return F.mse_loss(s[:, 0] - s[:, 1], teacher[:, 0] - teacher[:, 1])


def kl_distillation(q: torch.Tensor, d: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """KL(teacher ‖ student) over each query's own documents (positive + negatives), ``teacher`` [B, 1 + n]."""
    s = F.log_softmax(own_documents(q, d) / temperature, dim=1)
    t = F.log_softmax(teacher / temperature, dim=1)
    return F.kl_div(s, t, log_target=True, reduction="batchmean")


def flops(x: torch.Tensor) -> torch.Tensor:
    """FLOPS regulariser (Paria et al., SPLADE): Σ_v (mean_b |x[b, v]|)², a smooth proxy of the number
    of multiplications a query-document match costs."""
    return x.abs().mean(0).pow(2).sum()


def l1(x: torch.Tensor) -> torch.Tensor:
    """Mean over rows of Σ_v |x[b, v]|."""
    return x.abs().sum(-1).mean()


def flops_weight(weight: float, step: int, warmup_steps: int) -> float:
    """SPLADE's schedule: the weight grows as (step / warmup)² until ``warmup_steps``, then stays."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return weight
    return weight * (step / warmup_steps) ** 2
