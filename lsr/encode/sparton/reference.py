"""The Sparton head's references (torch twins) and the argument checks every variant shares.

    Y[b, v] = log1p(relu(max_s (H Eᵀ + bias)[b, s, v]))   over the unmasked positions s of row b

Shapes, for every variant: hidden H [B, S, D] (or packed tokens [T, D] with the text of each token),
weight E [V, D], bias [V] | None, mask [B, S] (bool or int, nonzero = keep; None = every position) ->
Y [B, V] in hidden's dtype; a fully masked row gives 0.

* ``torch_sparton_head``: the reference of every forward (padded, resident, packed, CPU tiled); it builds the
  [B, S, V] logits, which the kernels never do. Tests and benchmarks import it; there is one reference.
* ``torch_packed_tokens_head``: the same on tokens that are already packed (the padding-free body's output).
* ``check_head_args``: shapes and devices (every variant, the twin included); returns the mask as bool.
* ``check_kernel_inputs``: what the Triton launchers need on top (one bf16/fp16/fp32 dtype, 32-bit offsets).
* ``refuse_grad``: the inference-only variants (packed, CPU tiled) say so when a gradient would be needed.
"""

from __future__ import annotations

import torch

__all__ = ["check_head_args", "check_kernel_inputs", "needs_grad", "refuse_grad", "torch_packed_tokens_head",
           "torch_sparton_head"]

KERNEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_head_args(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    mask: torch.Tensor | None) -> torch.Tensor:
    """Validate shapes/devices; return the mask as bool [B, S] (all-true when None)."""
    if hidden.dim() != 3 or weight.dim() != 2:
        raise ValueError(f"hidden must be [B,S,D] and weight [V,D], got {tuple(hidden.shape)}, {tuple(weight.shape)}")
    B, S, D = hidden.shape
    if weight.shape[1] != D:
        raise ValueError(f"hidden dim {D} != weight dim {weight.shape[1]}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must be [V]={weight.shape[0]}, got {tuple(bias.shape)}")
    if mask is None:
        mask = torch.ones(B, S, dtype=torch.bool, device=hidden.device)
    if tuple(mask.shape) != (B, S):
        raise ValueError(f"mask must be [B,S]=({B},{S}), got {tuple(mask.shape)}")
    for name, t in (("weight", weight), ("bias", bias), ("mask", mask)):
        if t is not None and t.device != hidden.device:
            raise ValueError(f"{name} is on {t.device}, hidden on {hidden.device}")
    return mask if mask.dtype == torch.bool else mask != 0


def check_kernel_inputs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        mask: torch.Tensor) -> None:
    """The padded launchers' contract on top of ``check_head_args``: hidden [B,S,D] and weight [V,D] of one
    bf16/fp16/fp32 dtype, a float bias [V] | None, a bool mask [B,S], one device, B·S and V·D below 2**31
    (the kernels' offsets are 32-bit)."""
    B, S, D = hidden.shape
    V = weight.shape[0]
    if hidden.dtype not in KERNEL_DTYPES or weight.dtype != hidden.dtype:
        raise TypeError(f"hidden/weight must share a bf16/fp16/fp32 dtype, got {hidden.dtype}/{weight.dtype}")
    if weight.shape[1] != D or mask.shape != (B, S) or mask.dtype != torch.bool:
        raise ValueError("expected hidden [B,S,D], weight [V,D], bool mask [B,S]")
    if bias is not None and (bias.shape != (V,) or not bias.is_floating_point()):
        raise ValueError("bias must be a float [V]")
    if any(t.device != hidden.device for t in (weight, mask) + ((bias,) if bias is not None else ())):
        raise ValueError("all inputs must be on one device")
    if B * S >= 2**31 or V * D >= 2**31:
        raise ValueError("B·S and V·D must be < 2**31")


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd would record a call on these tensors (grad mode on and one of them requires grad)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def refuse_grad(*tensors: torch.Tensor | None) -> None:
    """Raise for an inference-only variant when a gradient would be needed."""
    if needs_grad(*tensors):
        raise RuntimeError("the packed Sparton head is inference-only (no backward): call it under "
                           "torch.no_grad() / torch.inference_mode(), or use sparton.sparton_head for training")


def torch_sparton_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       mask: torch.Tensor | None = None, *, upcast: bool = True) -> torch.Tensor:
    """Plain-torch twin: builds the [B, S, V] logits.

    hidden [B,S,D], weight [V,D], bias [V] | None, mask [B,S] (bool/int, nonzero = keep) -> [B,V] in
    hidden's dtype. ``upcast=True`` computes in float32 (float64 stays float64) — the reference;
    ``upcast=False`` keeps the logits in the input precision (what an eager HF head does).
    Masked positions are −inf; a fully masked row gives 0.
    """
    mask = check_head_args(hidden, weight, bias, mask)
    cdt = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    h, w = (hidden.to(cdt), weight.to(cdt)) if upcast else (hidden, weight.to(hidden.dtype))
    logits = h @ w.t()
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    logits = logits.masked_fill(~mask[:, :, None], float("-inf"))
    return torch.log1p(torch.relu(logits.amax(dim=1))).to(hidden.dtype)


def torch_packed_tokens_head(tokens: torch.Tensor, segments: torch.Tensor, n_texts: int, weight: torch.Tensor,
                             bias: torch.Tensor | None = None) -> torch.Tensor:
    """Torch twin of ``fwd_packed.triton_packed_tokens_fwd``: tokens [T,D], segments int [T] (the text of each
    token, non-decreasing, in [0, n_texts)) -> [n_texts, V] in tokens' dtype, a segmented max of the fp32 logits
    (rows of at most 256 MiB at a time); texts without tokens are 0."""
    T = tokens.shape[0]
    V = weight.shape[0]
    cdt = torch.float64 if tokens.dtype == torch.float64 else torch.float32
    w = weight.to(cdt)
    best = torch.zeros(n_texts, V, dtype=cdt, device=tokens.device)  # relu'd values are >= 0
    step = max(1, (1 << 26) // max(V, 1))
    for i in range(0, T, step):
        logits = tokens[i:i + step].to(cdt) @ w.t()
        if bias is not None:
            logits = logits + bias.to(cdt)
        seg = segments[i:i + step].to(torch.int64)[:, None].expand(-1, V)
        best.scatter_reduce_(0, seg, torch.relu(logits), "amax")
    return torch.log1p(best).to(tokens.dtype)
