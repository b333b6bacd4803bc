"""Sparton, the fused SPLADE head  Y[b, v] = log1p(relu(max_s (H Eᵀ + b)[b, s, v]))  without [B, S, V] logits.

Public API: ``sparton_head(hidden, weight, bias, mask, backend="auto"|"triton"|"torch")`` (differentiable),
``explain_sparton_head`` (which forward would run, and why), ``torch_sparton_head`` (the reference), ``SpartonHead``
(nn.Module), ``packed_tokens_sparton_head`` (inference on already packed tokens).

Module map (one file per role; the variants never import the dispatch, the dispatch imports them):

* ``reference``: the torch twins and the argument checks every variant shares (shapes documented there).
* ``epilogue``: the padded forwards' shared tl epilogue (bias, relu, log1p, stores).
* ``fwd_padded``: the tl kernel on padded [B, S, D] states and its launcher (autotuned, two row launches).
* ``fwd_resident``: the sm_90 forward with the vocabulary tile on chip (Gluon; **experimental**).
* ``fwd_packed``: the forward over packed (padding-free) tokens, for inference.
* ``bwd``: the backward kernels, from the saved (y32, argmax) only.
* ``cpu``: the tiled CPU head, for inference.
* ``autograd``: ``SpartonHeadFunction`` (padded forward + ``bwd``).
* ``dispatch``: ``SpartonPlan`` / ``plan_head`` / ``SpartonDispatch``: the one place that picks a variant and says why.
* ``layer``: ``SpartonHead``.
"""

from lsr.encode.sparton.dispatch import (
    DEFAULT_DISPATCH,
    VARIANTS,
    HeadFacts,
    SpartonDispatch,
    SpartonPlan,
    explain_sparton_head,
    packed_tokens_sparton_head,
    plan_head,
    sparton_head,
)
from lsr.encode.sparton.layer import SpartonHead
from lsr.encode.sparton.reference import torch_packed_tokens_head, torch_sparton_head

__all__ = ["DEFAULT_DISPATCH", "VARIANTS", "HeadFacts", "SpartonDispatch", "SpartonHead", "SpartonPlan",
           "explain_sparton_head", "packed_tokens_sparton_head", "plan_head", "sparton_head",
           "torch_packed_tokens_head", "torch_sparton_head"]
