"""Tokenized texts cut into length-sorted batches: what ``SpladeEncoder.prepare`` returns.

A window's token ids are gathered once into length order (longest first) as one int32 array, pinned when bound
for CUDA, and each batch is a slice of it. The padding-free path (``lsr.encode.backbone.varlen_body``) takes those slices
as they are; the padded [B, L] int64 form that HF's forward needs is built only for batches that go there (at
``prepare`` time when the encoder will run them padded, else on first access). Building and pinning padded
batches on the host cost the process that launches the model several times more CPU per passage than the gather
(scripts/bench_host_input.py, docs/performance/encode.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["PreparedTexts", "TokenBatch", "length_sorted_batches"]


class TokenBatch:
    """One batch of texts of similar length: ``rows`` int64 [B], the positions of these texts in the prepared
    input; ``lengths`` int32 [B] (real tokens per text; None for a batch given only in padded form) and their
    sum ``n_tokens``; ``input_ids`` / ``attention_mask`` int64 [B, L], the padded form. A batch built from
    packed ``tokens`` (int32 [n_tokens], the texts' ids back to back) pads them on first access to
    ``input_ids`` / ``attention_mask`` (width ``width``, ``pad_id``). Tensors are pinned when bound for CUDA."""

    def __init__(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, rows: torch.Tensor,
                 lengths: torch.Tensor | None = None, n_tokens: int = 0, *, tokens: torch.Tensor | None = None,
                 width: int | None = None, pad_id: int = 0) -> None:
        if input_ids is None and (tokens is None or lengths is None or width is None):
            raise ValueError("a TokenBatch needs input_ids, or tokens with lengths and width")
        self._input_ids, self._attention_mask = input_ids, attention_mask
        self.rows, self.lengths, self.n_tokens, self.tokens, self.pad_id = rows, lengths, n_tokens, tokens, pad_id
        self.width = int(input_ids.shape[1]) if width is None else width

    @property
    def input_ids(self) -> torch.Tensor:
        if self._input_ids is None:
            self._pad()
        return self._input_ids

    @property
    def attention_mask(self) -> torch.Tensor:
        if self._attention_mask is None:
            if self.tokens is None:  # padded ids given without a mask: pad_id marks nothing, lengths do
                raise ValueError("this TokenBatch was given input_ids without an attention_mask")
            self._pad()
        return self._attention_mask

    def _pad(self) -> None:
        lengths = self.lengths.numpy()
        pin = self.tokens.is_pinned()
        real = np.arange(self.width) < lengths[:, None]  # row-major order = the packed tokens' order
        ids = torch.full(real.shape, self.pad_id, dtype=torch.int64, pin_memory=pin)
        ids.numpy()[real] = self.tokens.numpy()
        mask = torch.empty(real.shape, dtype=torch.int64, pin_memory=pin)
        np.copyto(mask.numpy(), real)
        self._input_ids, self._attention_mask = ids, mask

    def __repr__(self) -> str:
        return f"TokenBatch(texts={len(self.rows)}, width={self.width}, n_tokens={self.n_tokens})"


@dataclass
class PreparedTexts:
    """Tokenized texts cut into length-sorted batches (see ``SpladeEncoder.prepare``)."""

    kind: str  # "query" | "doc"
    batches: list[TokenBatch]
    n: int
    n_tokens: int  # real tokens, special tokens included
    n_slots: int  # padded positions actually computed (sum of B·L): n_slots / n_tokens - 1 = padding waste


def _sorted_tokens(flat: np.ndarray, lengths: np.ndarray, order: np.ndarray, ordered: np.ndarray,
                   ends: np.ndarray, pin: bool) -> torch.Tensor:
    """The texts' ids in ``order``, back to back: int32 [sum lengths] (pinned when ``pin``), written in place
    (``ordered`` = lengths[order], ``ends`` its cumulative sum)."""
    total = int(ends[-1]) if len(ends) else 0
    out = torch.empty(total, dtype=torch.int32, pin_memory=pin)
    if total:
        starts = np.cumsum(lengths) - lengths
        index = np.int32 if len(flat) < 2**31 else np.int64  # (half the bytes to write and read)
        # token j of the output comes from flat[j + (start of its text in flat - start of its text in out)]
        source = np.repeat((starts[order] - (ends - ordered)).astype(index), ordered)
        source += np.arange(total, dtype=index)
        # (torch's gather: faster than np.take with out=, which buffers; and it releases the GIL)
        torch.index_select(torch.from_numpy(np.ascontiguousarray(flat, np.int32)), 0, torch.from_numpy(source), out=out)
    return out


def length_sorted_batches(kind: str, flat: np.ndarray, lengths: np.ndarray, batch_size: int, max_tokens: int | None,
                          mult: int, pad_id: int, *, pin: bool, padded: bool = True) -> PreparedTexts:
    """Token ids of n texts back to back (``flat``, ``lengths`` [n]) -> batches of similar length, longest
    first (the peak memory shows up at once): at most ``batch_size`` texts and ``max_tokens`` padded
    positions each, widths rounded up to ``mult``, padded with ``pad_id``; pinned when ``pin``. ``padded``:
    build the padded form now (False: on first access; the padding-free path never asks)."""
    lengths = np.asarray(lengths, np.int64)
    order = np.argsort(-lengths, kind="stable")
    ordered = lengths[order]
    cum = np.cumsum(ordered)
    tokens = _sorted_tokens(flat, lengths, order, ordered, cum, pin)
    sorted_lengths = torch.empty(len(order), dtype=torch.int32, pin_memory=pin)
    np.copyto(sorted_lengths.numpy(), ordered, casting="unsafe")
    ends = cum.tolist()
    batches, i, slots = [], 0, 0
    while i < len(order):
        width = -(-max(int(ordered[i]), 1) // mult) * mult  # the longest remaining text
        size = batch_size if max_tokens is None else max(1, min(batch_size, max_tokens // width))
        j = min(len(order), i + size)
        start = ends[i - 1] if i else 0
        batch = TokenBatch(None, None, torch.from_numpy(order[i:j]), sorted_lengths[i:j], ends[j - 1] - start,
                           tokens=tokens[start:ends[j - 1]], width=width, pad_id=pad_id)
        if padded:
            batch._pad()
        batches.append(batch)
        slots += (j - i) * width
        i = j
    return PreparedTexts(kind, batches, len(lengths), int(lengths.sum()), slots)
