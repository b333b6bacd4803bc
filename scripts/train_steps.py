"""The batches, loss and step pieces that ``bench_train.py``, its torchrun worker ``bench_train_scaling.py`` and
``profile_train_step.py`` share: random token batches, the SPLADE loss every implementation minimises, one
sentence-transformers step, and telling an out-of-memory error / freeing memory between trials.

They live apart so that the benchmark and its worker import them one way (``bench_train.py`` launches
``bench_train_scaling.py``, which must not import it back).
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from lsr.train import losses


def batch_ids(B: int, length: int, vocab: int, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """B random token rows of ``length`` with full masks, the same for the same arguments (seeded)."""
    g = torch.Generator().manual_seed(B * 7919 + length + seed * 104729)
    ids = torch.randint(1000, min(vocab, 30000), (B, length), generator=g)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones(B, length, dtype=torch.long, device=device)}


def spladeish_loss(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """InfoNCE with in-batch negatives + FLOPS (the weights of ``bench_train.py``'s every implementation)."""
    return losses.info_nce(q, d) + 5e-4 * losses.flops(q) + 1e-3 * losses.flops(d)


def st_loss_step(model: Any, loss_fn: Any, device: str | torch.device) -> Callable[[dict, dict], None]:
    """One sentence-transformers training step over ``loss_fn`` (bf16 autocast on CUDA, AdamW as lsr's)."""
    from lsr.train.model import adamw_kernel

    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **adamw_kernel(device))
    amp = torch.autocast("cuda", dtype=torch.bfloat16, enabled=str(device).startswith("cuda"))

    def step(q: dict, d: dict) -> None:
        opt.zero_grad(set_to_none=True)
        with amp:
            out = loss_fn([dict(q), dict(d)], None)
        loss = sum(out.values()) if isinstance(out, dict) else out
        loss.backward()
        opt.step()
    return step


def cleanup() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()
