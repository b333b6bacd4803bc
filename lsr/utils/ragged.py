"""Index arithmetic on ragged (CSR-like) layouts, shared by every stage.

A ragged layout is a list of runs given by their start positions and lengths (the rows of a CSR matrix,
the postings of query terms, the tokens of packed texts). Expanding it to one entry per element is the
same three lines everywhere; here they are written once. Every function is vectorised and, when the
caller passes ``total`` (the sum of the lengths, often known without reading the device), free of host
syncs, so CUDA graphs can capture it.
"""

from __future__ import annotations

import torch

__all__ = ["ragged_positions", "segment_ids"]


def segment_ids(lengths: torch.Tensor, total: int | None = None, *, dtype: torch.dtype = torch.int64,
                start: int = 0) -> torch.Tensor:
    """[sum(lengths)] the run number (``start + i`` for run i) of every element, runs laid out back to back.

    ``total`` = sum(lengths) when known (no host sync); ``dtype`` of the result.
    """
    runs = torch.arange(start, start + lengths.numel(), device=lengths.device, dtype=dtype)
    return torch.repeat_interleave(runs, lengths, output_size=total)


def ragged_positions(starts: torch.Tensor, lengths: torch.Tensor,
                     total: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand runs ``[starts[i], starts[i] + lengths[i])`` into (run int64 [T], source position int64 [T]).

    Element j of the concatenation belongs to run ``run[j]`` and reads position ``pos[j]`` of the source
    array. ``starts`` of zeros gives each element's position inside its run. ``total`` = T when known.
    """
    lengths = lengths.to(torch.int64)
    run = segment_ids(lengths, total)
    first = torch.cumsum(lengths, 0) - lengths
    pos = starts.to(torch.int64)[run] + torch.arange(run.numel(), device=run.device) - first[run]
    return run, pos
