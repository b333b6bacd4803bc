"""Sparton on the CPU: the SPLADE max-pooled head  Y[b, v] = log1p(relu(max_s (H Eᵀ + bias)[b, s, v]))
computed tile by tile, so the [B, S, V] logits never exist whole.

The torch twin (``reference.torch_sparton_head``) builds all logits, masks them, adds the bias, takes the
max and applies log1p∘relu element by element: on a CPU those passes over [tokens, V] floats, not the
matmul, take most of the time. Here:

* only real tokens are computed: the unmasked positions are packed into one [T, D] block, rows in
  order, so padding costs nothing;
* the vocabulary is cut into tiles of ``vocab_tile`` rows of E and the tokens into blocks of about
  ``token_tile`` (whole texts where they fit): each [tile, block] logit product stays in cache, and
  each text's max over its tokens is read from it at once;
* bias, relu and log1p run once per (text, term) after the max: bias is constant over positions and
  fp32 rounding is monotone, so max_s fl(x_s + b) == fl(max_s x_s + b) exactly, and log1p∘relu is
  monotone too (the GPU kernel does the same).

The product is H_block @ Eᵀ_tile, [block, tile]: a text's max is then a reduction over rows, which
torch vectorises across the tile's columns (the max along a row of the transposed product is several
times slower). Eᵀ is made contiguous once per weight and kept while that weight lives, so each tile is
a plain row-major GEMM operand (a transposed operand makes MKL repack it on every call).
Equal to the twin within fp32 rounding (the matmul may sum in another order); not differentiable
(inference only: ``dispatch.sparton_head`` sends autograd to the twin).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import torch

from lsr.encode.sparton.reference import check_head_args

__all__ = ["cpu_sparton_head"]

VOCAB_TILE = 2048  # columns of Eᵀ per product
TOKEN_TILE = 2048  # tokens per block (several texts of up to 512 tokens)

_TRANSPOSED: dict[int, tuple] = {}  # id(weight) -> (weakref to it, version, dtype, Eᵀ); dropped with the weight


def _transposed(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """weight [V, D] as a contiguous [D, V] in ``dtype``, reused while ``weight`` is alive and unchanged."""
    try:
        version = weight._version
    except RuntimeError:  # an inference tensor has no version counter: do not cache it
        return weight.to(dtype).t().contiguous()
    key = id(weight)
    hit = _TRANSPOSED.get(key)
    if hit is not None and hit[0]() is weight and hit[1:3] == (version, dtype):
        return hit[3]
    wt = weight.to(dtype).t().contiguous()
    ref = weakref.ref(weight, lambda _, key=key: _TRANSPOSED.pop(key, None))
    _TRANSPOSED[key] = (ref, version, dtype, wt)
    return wt


def token_blocks(counts: list[int], token_tile: int) -> Iterator[tuple[int, int, list[tuple[int, int, int]]]]:
    """Cut the packed token stream into blocks of at most ``token_tile`` tokens (a longer text is split,
    shorter texts are never cut). Yields (first token, end token, pieces) where each piece is
    (row, start, end) with start/end relative to the block."""
    start = 0
    pieces: list[tuple[int, int, int]] = []
    block_start = 0
    for row, n in enumerate(counts):
        offset = 0
        while offset < n:
            room = token_tile - (start - block_start)
            if pieces and room < min(n - offset, token_tile):  # the rest of this text does not fit: close
                yield block_start, start, pieces
                pieces, block_start = [], start
                continue
            take = min(n - offset, token_tile)
            pieces.append((row, start - block_start, start - block_start + take))
            start += take
            offset += take
    if pieces:
        yield block_start, start, pieces


@torch.no_grad()
def cpu_sparton_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     mask: torch.Tensor | None = None, *, vocab_tile: int = VOCAB_TILE,
                     token_tile: int = TOKEN_TILE) -> torch.Tensor:
    """SPLADE head by tiles (see the module docstring); same contract as ``torch_sparton_head``.

    hidden [B,S,D], weight [V,D], bias [V] | None, mask [B,S] (bool/int, nonzero = keep) -> [B,V] in
    hidden's dtype, computed in float32 (float64 stays float64). A fully masked row gives 0.
    """
    if vocab_tile <= 0 or token_tile <= 0:
        raise ValueError("vocab_tile and token_tile must be positive")
    mask = check_head_args(hidden, weight, bias, mask)
    B, V = hidden.shape[0], weight.shape[0]
    cdt = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    pooled = torch.full((B, V), float("-inf"), dtype=cdt, device=hidden.device)
    tokens = hidden[mask].to(cdt)  # [T, D] real tokens, row after row
    wt = _transposed(weight, cdt)  # [D, V]
    counts = mask.sum(1).tolist()
    for first, end, pieces in token_blocks(counts, token_tile):
        block = tokens[first:end]
        whole = [(row, a, b) for row, a, b in pieces if b - a == counts[row]]
        split = [(row, a, b) for row, a, b in pieces if b - a != counts[row]]
        for v0 in range(0, V, vocab_tile):
            v1 = min(V, v0 + vocab_tile)
            logits = torch.mm(block, wt[:, v0:v1])  # [block, tile]
            for row, a, b in whole:
                torch.amax(logits[a:b], dim=0, out=pooled[row, v0:v1])
            for row, a, b in split:  # a text longer than a block: running max over its blocks
                torch.maximum(pooled[row, v0:v1], logits[a:b].amax(dim=0), out=pooled[row, v0:v1])
    if bias is not None:
        pooled += bias.to(cdt)
    return pooled.relu_().log1p_().to(hidden.dtype)
