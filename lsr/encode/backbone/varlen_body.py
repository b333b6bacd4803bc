"""Padding-free inference forward of a BERT-family masked LM: backbone + MLM transform on packed tokens.

    body = VarlenBody.from_model(model)          # BertForMaskedLM / DistilBertForMaskedLM, else None
    states = body(ids, positions, cu_seqlens, max_len)   # [T, D] transformed states of the T real tokens

Why: HF's forward runs on padded [B, L] batches. With a real padding mask its sdpa call cannot use
the flash kernel (it takes an additive [B, 1, L, L] mask through the memory-efficient kernel), and every
padded position costs a full pass through the 12 layers. Here the texts of a batch are packed back to
back ([T] token ids, ``cu_seqlens`` [B+1] int32 start offsets) and attention stays inside each text; the
linear layers then see T rows instead of B·L, and the Q, K, V projections run as one GEMM. On CUDA in
fp16/bf16 the attention is lsr's own Triton kernel over packed row tiles (``packed_attention``: faster than
flash attention's variable-length kernel over MS MARCO-like batches; measurements in the performance docs);
``attention = "flash"`` takes ``aten._flash_attention_forward`` with cumulative lengths instead.

Same weights and modules as the HF model (its LayerNorms, activation functions and Linears are called
on [T, D] rows; on CUDA each residual add + LayerNorm runs as one kernel, ``add_layer_norm``);
only the Q/K/V weights are concatenated, a copy that is rebuilt when the model's
tensors change in place (their version counters are compared on every call). Results equal HF's
forward at the real positions up to floating-point summation order (tested against it), except for the
fused GELU below (CUDA, fp16 / bf16).

Where neither kernel runs (CPU, fp32, GPUs before sm80 for flash) the attention runs through its
torch twin ``torch_varlen_attention``: the texts are padded into [B, H, L, Dh] and go through sdpa
with a key mask, then packed again. Inference only: no gradients flow through the concatenated copy.

GELU feed-forward layers on CUDA in fp16 / bf16 (``gelu_epilogue``, on by default) run up-projection, bias
and GELU as one cuBLASLt GEMM (``torch._addmm_activation``): the epilogue applies GELU in its tanh form (as
torch defines this call) in fp32 to the accumulator and rounds once, where the separate call rounds the product
to 16 bits, then applies the model's erf GELU and rounds again. It saves a pass over the [T, 4D] activations;
against an fp32 erf-GELU reference it is closer in bf16 and within 1.25x the separate call's mean error in fp16
(tests/encode/test_varlen_body.py checks that bound). Without cuBLASLt (``DISABLE_ADDMM_CUDA_LT=1``) torch computes the same call
as a 16-bit GEMM and a separate tanh GELU: no faster; set ``gelu_epilogue=False`` there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lsr.encode.backbone.add_layer_norm import add_layer_norm
from lsr.encode.backbone.packed_attention import (
    packed_attention,
    packed_attention_runs,
    text_of_rows,
    torch_varlen_attention,
)
from lsr.utils.ragged import ragged_positions
from lsr.utils.runtime import failure_memory

__all__ = ["FLASH_FAILED", "VarlenBody", "flash_varlen_attention", "pack_batch", "pack_tokens", "torch_varlen_attention", "varlen_attention"]

FLASH_FAILED = failure_memory("encode.flash_attention", "varlen_body: flash attention",
                              "using the sdpa twin")  # e.g. a torch build without flash attention


def flash_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                           max_len: int) -> torch.Tensor:
    """Flash attention over packed sequences (CUDA, fp16/bf16, head dim a multiple of 8, sm80+).

    Same contract as ``torch_varlen_attention``; ``cu_seqlens`` int32 on q's device. No host sync.
    """
    cu = cu_seqlens.to(torch.int32)
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, False, False)[0]


def _flash_ok(q: torch.Tensor) -> bool:
    if FLASH_FAILED.failed or q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    return q.shape[-1] % 8 == 0 and q.shape[-1] <= 256 and torch.cuda.get_device_capability(q.device)[0] >= 8


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                     max_len: int, segments: torch.Tensor | None = None, kernel: str = "packed") -> torch.Tensor:
    """The packed Triton kernel (``kernels.packed_attention``) where it runs and ``kernel`` is "packed", else
    flash attention where it runs, else the torch twin. Same contract as ``torch_varlen_attention``;
    ``segments`` int32 [T] (the text of each row; derived from cu_seqlens when None)."""
    if kernel not in ("packed", "flash"):
        raise ValueError(f"attention kernel {kernel!r}: use 'packed' (lsr's Triton kernel) or 'flash'")
    if kernel == "packed" and packed_attention_runs(q):
        if segments is None:
            segments = text_of_rows(cu_seqlens, q.shape[0])
        return packed_attention(q, k, v, segments, cu_seqlens.to(torch.int32), max_len)
    if _flash_ok(q):
        try:
            return flash_varlen_attention(q, k, v, cu_seqlens, max_len)
        except RuntimeError as e:
            FLASH_FAILED.record(e)
    return torch_varlen_attention(q, k, v, cu_seqlens, max_len)


@dataclass
class _Layer:
    """One post-LN transformer layer: Q/K/V (separate HF Linears, run as one), output projection,
    LayerNorm, FFN (up, activation, down), LayerNorm."""

    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    out: nn.Linear
    norm1: nn.LayerNorm
    up: nn.Linear
    act: Callable[[torch.Tensor], torch.Tensor]
    down: nn.Linear
    norm2: nn.LayerNorm
    # whether the activation is a GELU (erf or tanh form) that the fused epilogue may replace: decided once, at
    # build time, outside any compiled forward
    gelu: bool = field(init=False)

    def __post_init__(self) -> None:
        self.gelu = _is_gelu(self.act)


class VarlenBody:
    """Backbone + MLM transform of a supported masked LM, run on packed tokens (see the module doc).

    Build it with ``from_model`` (None for architectures it does not cover); call it under
    ``torch.inference_mode()``.
    """

    def __init__(self, embed: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], layers: list[_Layer],
                 transform: Callable[[torch.Tensor], torch.Tensor], heads: int, architecture: str) -> None:
        self._embed, self.layers, self._transform = embed, layers, transform
        self.heads, self.architecture = heads, architecture
        self._fused: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._versions: list[int] = []
        self._run = self._forward
        self.gelu_epilogue = True   # see the module doc; False calls the model's own activation
        self.attention = "packed"   # "flash": flash attention's variable-length kernel instead (module doc)

    @classmethod
    def from_model(cls, model: nn.Module) -> VarlenBody | None:
        """The padding-free forward of ``model`` (BertForMaskedLM with absolute positions, or
        DistilBertForMaskedLM), or None when its architecture is not covered (HF's forward is used then)."""
        cfg = getattr(model, "config", None)
        kind = getattr(cfg, "model_type", None)
        if kind == "bert" and hasattr(model, "bert") and hasattr(model, "cls"):
            if (getattr(cfg, "is_decoder", False) or getattr(cfg, "add_cross_attention", False)
                    or getattr(cfg, "position_embedding_type", "absolute") != "absolute"):
                return None
            emb = model.bert.embeddings
            layers = [_Layer(layer.attention.self.query, layer.attention.self.key, layer.attention.self.value,
                             layer.attention.output.dense, layer.attention.output.LayerNorm, layer.intermediate.dense,
                             layer.intermediate.intermediate_act_fn, layer.output.dense, layer.output.LayerNorm)
                      for layer in model.bert.encoder.layer]

            def embed(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
                # HF's order: (word + token type 0) + position, then LayerNorm (dropout is off in eval)
                x = emb.word_embeddings(ids) + emb.token_type_embeddings.weight[0]
                return emb.LayerNorm(x + emb.position_embeddings(pos))

            return cls(embed, layers, model.cls.predictions.transform, cfg.num_attention_heads, "bert")
        if kind == "distilbert" and hasattr(model, "distilbert") and hasattr(model, "vocab_transform"):
            emb = model.distilbert.embeddings
            layers = [_Layer(layer.attention.q_lin, layer.attention.k_lin, layer.attention.v_lin, layer.attention.out_lin,
                             layer.sa_layer_norm, layer.ffn.lin1, layer.ffn.activation, layer.ffn.lin2, layer.output_layer_norm)
                      for layer in model.distilbert.transformer.layer]

            def embed(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
                return emb.LayerNorm(emb.word_embeddings(ids) + emb.position_embeddings(pos))

            def transform(x: torch.Tensor) -> torch.Tensor:
                return model.vocab_layer_norm(model.activation(model.vocab_transform(x)))

            return cls(embed, layers, transform, cfg.n_heads, "distilbert")
        return None

    def _qkv(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Concatenated Q/K/V weights [3D, D] and biases [3D], rebuilt when a source tensor changed."""
        sources = [t for layer in self.layers for m in (layer.q, layer.k, layer.v) for t in (m.weight, m.bias)]
        versions = [t._version for t in sources] + [t.data_ptr() for t in sources]
        if versions != self._versions:
            with torch.no_grad():
                self._fused = [(torch.cat([layer.q.weight, layer.k.weight, layer.v.weight]), torch.cat([layer.q.bias, layer.k.bias, layer.v.bias]))
                               for layer in self.layers]
            self._versions = versions
        return self._fused

    def compile(self) -> None:
        """torch.compile the forward (dynamic shapes); the Q/K/V check stays outside the graph."""
        self._run = torch.compile(self._forward, dynamic=True)

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
                 segments: torch.Tensor | None = None) -> torch.Tensor:
        """ids int64 [T] (texts back to back), positions int64 [T] (0-based within each text),
        cu_seqlens int32 [B+1] (text b is rows cu[b]:cu[b+1]), max_len (host int, >= the longest text),
        segments int32 [T] (the text of each row; derived from cu_seqlens when None)
        -> [T, D] transformed hidden states (the model's dtype)."""
        return self._run(ids, positions, cu_seqlens, max_len, self._qkv(), segments)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
                 qkv: list[tuple[torch.Tensor, torch.Tensor]], segments: torch.Tensor | None) -> torch.Tensor:
        x = self._embed(ids, positions)
        T, D = x.shape
        heads = self.heads
        if segments is None and x.is_cuda and self.attention == "packed":   # once for all layers
            segments = text_of_rows(cu_seqlens, T)
        for layer, (w_qkv, b_qkv) in zip(self.layers, qkv):
            qkv = F.linear(x, w_qkv, b_qkv).view(T, 3, heads, D // heads)
            a = varlen_attention(qkv[:, 0], qkv[:, 1], qkv[:, 2], cu_seqlens, max_len, segments, self.attention)
            a = a.reshape(T, D)
            x = _add_norm(layer.norm1, F.linear(a, layer.out.weight, layer.out.bias), x)
            h = _up_projection(layer, x, self.gelu_epilogue)
            x = _add_norm(layer.norm2, F.linear(h, layer.down.weight, layer.down.bias), x)
        return self._transform(x)


_HF_GELUS = ("GELUActivation", "GELUTanh", "PytorchGELUTanh", "NewGELUActivation")   # erf and the tanh forms


def _is_gelu(act: Callable[[torch.Tensor], torch.Tensor]) -> bool:
    """F.gelu, torch's nn.GELU and Hugging Face's GELU activations, by exact class (a subclass may change
    forward), and without hooks (the fused GEMM does not call the module)."""
    if act is F.gelu:
        return True
    if not isinstance(act, nn.Module) or act._forward_hooks or act._forward_pre_hooks:
        return False
    try:
        from transformers import activations
    except ImportError:
        hf: tuple[type, ...] = ()
    else:
        hf = tuple(getattr(activations, name) for name in _HF_GELUS if hasattr(activations, name))
    return type(act) is nn.GELU or type(act) in hf


def _up_projection(layer: _Layer, x: torch.Tensor, fuse: bool) -> torch.Tensor:
    """act(up(x)); GELU layers in fp16 / bf16 on CUDA as one GEMM with a GELU epilogue when ``fuse``."""
    if fuse and layer.gelu and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and layer.up.bias is not None:
        return torch._addmm_activation(layer.up.bias, x, layer.up.weight.t(), use_gelu=True)
    return layer.act(F.linear(x, layer.up.weight, layer.up.bias))


def _add_norm(norm: nn.Module, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """norm(h + x), in one fused kernel on CUDA for a plain LayerNorm over the last dim."""
    if isinstance(norm, nn.LayerNorm) and norm.normalized_shape == (h.shape[-1],):
        return add_layer_norm(h, x, norm.weight, norm.bias, norm.eps)
    return norm(h + x)


def _layout(lengths: torch.Tensor, n_tokens: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(cu_seqlens int64 [B+1], text of each token, its position in the text) of texts of ``lengths``."""
    lengths = lengths.to(torch.int64)
    cu = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths, 0, out=cu[1:])
    return (cu, *ragged_positions(torch.zeros_like(lengths), lengths, n_tokens))


def pack_batch(input_ids: torch.Tensor, lengths: torch.Tensor, n_tokens: int) -> dict[str, Any]:
    """Padded batch -> packed inputs, on input_ids' device without a host sync.

    input_ids [B, L] (text b in row b, its first lengths[b] positions real), lengths int [B] (same
    device), n_tokens = sum(lengths) known on the host -> dict(ids [T] int64, positions [T] int64,
    segments [T] int32 (text of each token), cu_seqlens [B+1] int32, max_len L)."""
    cu, seg, pos = _layout(lengths, n_tokens)
    return {"ids": input_ids[seg, pos], "positions": pos, "segments": seg.to(torch.int32),
            "cu_seqlens": cu.to(torch.int32), "max_len": input_ids.shape[1]}


def pack_tokens(tokens: torch.Tensor, lengths: torch.Tensor, n_tokens: int, max_len: int) -> dict[str, Any]:
    """``pack_batch`` of a batch given as its texts' ids back to back (tokens int [T], lengths int [B], both
    on one device; max_len >= the longest text, the width the padded batch would have)."""
    cu, seg, pos = _layout(lengths, n_tokens)
    return {"ids": tokens.to(torch.int64), "positions": pos, "segments": seg.to(torch.int32),
            "cu_seqlens": cu.to(torch.int32), "max_len": max_len}
