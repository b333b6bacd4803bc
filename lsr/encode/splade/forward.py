"""One prepared batch through a SPLADE tower on the device: the route from token ids to [B, V] weights.

Two routes, chosen per batch by ``uses_packed_body``:

* padding-free: BERT / DistilBERT towers with max pooling run ``lsr.encode.backbone.varlen_body`` on the batch's
  packed tokens (flash attention; on CUDA in fp16/bf16 by default), and the packed Sparton head pools those tokens
  directly (``lsr.encode.sparton.packed_tokens_sparton_head``);
* padded: the masked LM's own forward on [B, L] ids (its decoder replaced by an identity, so it returns the
  transformed states), then ``lsr.encode.sparton.sparton_head`` (which may pack the real tokens for inference where
  that pays) or, for sum pooling, ``st_checkpoint.pool_logits``.

A static tower (the inference-free query route) has no model: it weights the text's own tokens. Decoder LLMs
(``lsr.encode.splade.causal``) take the padded route; their ``term_mask`` entries are zeroed in the pooled weights.
``plan_encode`` says which route a batch takes and why (``SpladeEncoder.explain``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from lsr.encode.backbone.varlen_body import pack_batch, pack_tokens
from lsr.encode.sparton import (
    DEFAULT_DISPATCH,
    HeadFacts,
    SpartonPlan,
    packed_tokens_sparton_head,
    sparton_head,
)
from lsr.encode.splade.checkpoint import MaskedLMTower, mask_terms
from lsr.encode.splade.st_checkpoint import StaticTower, activate, pool_logits
from lsr.encode.tokenize.batching import TokenBatch
from lsr.utils.plans import Plan, Step

__all__ = ["TORCH_HEAD_BYTES", "EncodePlan", "encode_batch", "head_weights", "plan_encode", "uses_packed_body"]

TORCH_HEAD_BYTES = 1 << 28  # the torch twin builds [rows, S, V] fp32 logits: cap them at 256 MiB per call


def uses_packed_body(tower: MaskedLMTower | StaticTower, varlen: bool | None, device: torch.device,
                     dtype: torch.dtype) -> bool:
    """Would inference run this tower's batches padding-free (so batches need not be padded)? ``varlen``: the
    encoder's option (None: where flash attention runs, i.e. CUDA fp16/bf16; True: wherever the body covers the
    architecture; False: never)."""
    if tower.varlen is None or tower.pooling != "max" or varlen is False:
        return False  # (the padding-free path feeds the max-pooling packed head only)
    return bool(varlen) or (device.type == "cuda" and dtype in (torch.float16, torch.bfloat16))


def head_weights(tower: MaskedLMTower, hidden: torch.Tensor, mask: torch.Tensor, *, backend: str,
                 packed: bool) -> torch.Tensor:
    """[B, L, D] transformed states -> [B, V] SPLADE weights (hidden's dtype), before the tower's activation.
    ``packed``: inference may let several short texts share a token tile (the dispatch decides where it pays)."""
    if hidden.shape[-1] != tower.weight.shape[1]:
        raise NotImplementedError(f"{tower.architecture}: the MLM head does not end in its decoder Linear "
                                  f"(got states of width {hidden.shape[-1]}); this architecture is not supported")
    triton = backend == "triton" or (backend == "auto" and hidden.device.type == "cuda")
    packed = packed and triton and not torch.is_grad_enabled()
    B, L, _ = hidden.shape
    # the twin builds [rows, L, V] logits: bounded rows per call (the kernels never build them)
    rows = B if triton else max(1, TORCH_HEAD_BYTES // max(1, L * tower.weight.shape[0] * 4))
    return torch.cat([sparton_head(hidden[i:i + rows], tower.weight, tower.bias, mask[i:i + rows], backend=backend,
                                   packed=packed) for i in range(0, B, rows)])


def encode_batch(tower: MaskedLMTower | StaticTower, batch: TokenBatch, *, device: torch.device, backend: str,
                 packed_body: bool, packed_head: bool, head: bool = True) -> torch.Tensor:
    """One prepared batch -> [B, V] SPLADE weights (``head=False``: the transformed states, [T, D] packed or
    [B, L, D] padded, for profiling). ``packed_body``: ``uses_packed_body`` for this tower; ``packed_head``: the
    encoder's ``packed`` option (see ``head_weights``)."""
    if tower.static:  # no model: the weights of the text's tokens
        return tower.encode(batch.input_ids.to(device, non_blocking=True),
                            batch.attention_mask.to(device, non_blocking=True))
    if packed_body and batch.lengths is not None and not torch.is_grad_enabled():
        lengths = batch.lengths.to(device, non_blocking=True)
        if batch.tokens is not None:  # the batch's ids back to back: no padded form on the host
            packed = pack_tokens(batch.tokens.to(device, non_blocking=True), lengths, batch.n_tokens, batch.width)
        else:
            packed = pack_batch(batch.input_ids.to(device, non_blocking=True), lengths, batch.n_tokens)
        states = tower.varlen(packed["ids"], packed["positions"], packed["cu_seqlens"], packed["max_len"],
                              packed["segments"])
        if not head:  # (BERT / DistilBERT transforms keep the width the decoder takes: no check needed)
            return states
        return activate(packed_tokens_sparton_head(states, packed["segments"], len(batch.rows), tower.weight,
                                                   tower.bias, backend=backend), tower.activation)
    input_ids = batch.input_ids.to(device, non_blocking=True)
    mask = batch.attention_mask.to(device, non_blocking=True)
    hidden = tower.body(input_ids=input_ids, attention_mask=mask).logits  # decoder is an Identity
    if not head:
        return hidden
    if tower.pooling == "sum":
        return pool_logits(hidden, tower.weight, tower.bias, mask, tower.activation, TORCH_HEAD_BYTES)
    y = activate(head_weights(tower, hidden, mask, backend=backend, packed=packed_head), tower.activation)
    return mask_terms(y, tower.term_mask)


@dataclass(frozen=True)
class EncodePlan(Plan):
    """The routes one batch of a tower takes: the body (``"static"``, ``"padding-free"`` or ``"hf-padded"``), why,
    and the head's ``SpartonPlan`` (None for a static tower)."""

    architecture: str
    body: str
    body_reason: str
    head: SpartonPlan | None
    kind: str = ""        # "doc" / "query" where the caller says which tower (``SpladeEncoder.explain``)

    def title(self) -> str:
        return f"encode plan: {self.architecture}" + (f", {self.kind} batches" if self.kind else "")

    def plan_steps(self) -> tuple[Step, ...]:
        body = (Step("body", self.body, self.body_reason),)
        if self.head is None:
            return (*body, Step("head", "none", "a token weight table"))
        return (*body, Step("head", self.head.variant, self.head.reason), Step("backward", self.head.backward))


def _body_route(tower: MaskedLMTower, varlen: bool | None, device: torch.device, dtype: torch.dtype,
                train: bool) -> tuple[str, str]:
    if tower.varlen is None:
        kind = f"decoder LLM, {tower.attention} attention" if tower.attention else "architecture"
        return "hf-padded", f"{kind}: the padding-free body covers BERT / DistilBERT only; Hugging Face's forward"
    if train:
        return "hf-padded", "training runs Hugging Face's forward (the padding-free body is inference-only)"
    if tower.pooling != "max":
        return "hf-padded", f"{tower.pooling} pooling (the padding-free path feeds the max-pooling head only)"
    if uses_packed_body(tower, varlen, device, dtype):
        return "padding-free", "packed tokens, flash / packed attention, no padding computed"
    why = "varlen=False" if varlen is False else "flash attention needs CUDA fp16/bf16 (varlen=None)"
    return "hf-padded", why


def plan_encode(tower: MaskedLMTower | StaticTower, *, varlen: bool | None, device: torch.device, dtype: torch.dtype,
                backend: str, packed: bool, batch: int, seq: int, train: bool = False) -> EncodePlan:
    """The routes ``encode_batch`` (``train``: ``TrainableEncoder``) takes for a [batch, seq] batch of ``tower``."""
    if tower.static:
        return EncodePlan(tower.architecture, "static", "a token weight table, no model runs", None)
    body, why = _body_route(tower, varlen, device, dtype, train)
    if body == "padding-free":
        head = SpartonPlan("packed", "the padding-free body hands over packed tokens (fwd_packed)", "none (inference)")
    elif tower.pooling == "sum":
        head = SpartonPlan("torch", "sum pooling: st_checkpoint.pool_logits (the Sparton kernels max-pool)",
                           "torch autograd" if train else "none (inference)")
    else:
        # a zero-stride stand-in with the batch's shape: the plan reads shapes, dtype and device only
        hidden = torch.empty((), device=tower.weight.device, dtype=dtype).expand(batch, seq, tower.weight.shape[1])
        facts = replace(HeadFacts.of(hidden, tower.weight, tower.bias), dtype=dtype, needs_grad=train)
        head = DEFAULT_DISPATCH.plan(facts, backend=backend, packed=packed and not train)
    return EncodePlan(tower.architecture, body, why, head)
