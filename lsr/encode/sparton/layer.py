"""``SpartonHead``: the Sparton head as an ``nn.Module`` (an MLM decoder's weight [V, D] and bias [V]).

It holds parameters and options only; every call goes through ``dispatch.sparton_head``.
"""

from __future__ import annotations

import torch
from torch import nn

from lsr.encode.sparton.dispatch import sparton_head

__all__ = ["SpartonHead"]


class SpartonHead(nn.Module):
    """The MLM decoder (weight [V, D], bias [V]) applied as a Sparton head: forward(hidden, mask) -> [B, V]."""

    def __init__(self, vocab_size: int, hidden_size: int, bias: bool = True, *, backend: str = "auto",
                 deterministic: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, **kw))
        self.bias = nn.Parameter(torch.zeros(vocab_size, **kw)) if bias else None
        self.backend, self.deterministic = backend, deterministic
        nn.init.normal_(self.weight, std=0.02)

    @classmethod
    def from_linear(cls, decoder: nn.Linear, bias: torch.Tensor | None = None, **kw) -> SpartonHead:
        """Share the parameters of an HF decoder Linear (``bias`` overrides, e.g. BERT's cls.predictions.bias)."""
        head = cls.__new__(cls)
        nn.Module.__init__(head)
        head.weight = decoder.weight
        head.bias = bias if bias is not None else decoder.bias
        head.backend, head.deterministic = kw.get("backend", "auto"), kw.get("deterministic", False)
        return head

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return sparton_head(hidden, self.weight, self.bias, mask, self.backend, self.deterministic)

    def extra_repr(self) -> str:
        V, D = self.weight.shape
        return f"vocab_size={V}, hidden_size={D}, bias={self.bias is not None}, backend={self.backend!r}"
