"""Tokenized texts cut into length-sorted padded batches: what ``SpladeEncoder.prepare`` returns."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["PreparedTexts", "TokenBatch", "length_sorted_batches"]


@dataclass
class TokenBatch:
    """One padded batch: ``input_ids`` / ``attention_mask`` int64 [B, L] (pinned memory when bound for
    CUDA), ``rows`` int64 [B], the positions of these texts in the prepared input, and for the
    padding-free path ``lengths`` int32 [B] (real tokens per text, pinned likewise) with their sum
    ``n_tokens``."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    rows: torch.Tensor
    lengths: torch.Tensor | None = None
    n_tokens: int = 0


@dataclass
class PreparedTexts:
    """Tokenized texts cut into length-sorted batches (see ``SpladeEncoder.prepare``)."""

    kind: str  # "query" | "doc"
    batches: list[TokenBatch]
    n: int
    n_tokens: int  # real tokens, special tokens included
    n_slots: int  # padded positions actually computed (sum of B·L): n_slots / n_tokens - 1 = padding waste


def length_sorted_batches(kind: str, flat: np.ndarray, lengths: np.ndarray, batch_size: int, max_tokens: int | None,
                          mult: int, pad_id: int, *, pin: bool) -> PreparedTexts:
    """Token ids of n texts back to back (``flat``, ``lengths`` [n]) -> batches of similar length, longest
    first (the peak memory shows up at once): at most ``batch_size`` texts and ``max_tokens`` padded
    positions each, widths rounded up to ``mult``, padded with ``pad_id``; pinned when ``pin``."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    order = np.argsort(-lengths, kind="stable")
    batches, i, slots = [], 0, 0
    while i < len(order):
        width = -(-max(int(lengths[order[i]]), 1) // mult) * mult  # the longest remaining text
        size = batch_size if max_tokens is None else max(1, min(batch_size, max_tokens // width))
        sel = order[i:i + size]
        lens = lengths[sel]
        col = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        ids = np.full((len(sel), width), pad_id, dtype=np.int64)
        ids[np.repeat(np.arange(len(sel)), lens), col] = flat[np.repeat(starts[sel], lens) + col]
        mask = (np.arange(width)[None, :] < lens[:, None]).astype(np.int64)
        tensors = [torch.from_numpy(a) for a in (ids, mask, lens.astype(np.int32))]
        if pin:
            tensors = [t.pin_memory() for t in tensors]
        batches.append(TokenBatch(tensors[0], tensors[1], torch.from_numpy(sel.astype(np.int64)), tensors[2],
                                  int(lens.sum())))
        slots += ids.size
        i += len(sel)
    return PreparedTexts(kind, batches, len(lengths), int(lengths.sum()), slots)
