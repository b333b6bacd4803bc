"""The trainable side of a ``SpladeEncoder``: its towers' parameters, a differentiable encode through the
Sparton head, and one gradient computation (plain, or GradCache-style in chunks).

The encoder's towers keep the masked LM (or decoder LLM, ``lsr.encode.splade.causal``) with its decoder replaced by
an identity (the body's ``.logits`` are the transformed / final hidden states) and a detached view of the decoder
weights for inference. Training uses the
decoder's own parameters, so the optimizer's in-place updates are what inference sees next (dev
evaluation and checkpoints need no copy).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from lsr.encode.sparton import sparton_head
from lsr.encode.splade.checkpoint import mask_terms
from lsr.encode.splade.st_checkpoint import activate

__all__ = ["TowerPair", "TrainableEncoder", "adamw_kernel", "checkpoint_activations", "decoder_of"]


def decoder_of(tower: Any) -> nn.Linear:
    """The decoder Linear (a decoder LLM's LM head) a tower detached from its model (its parameters are trained)."""
    if tower.static:
        raise NotImplementedError("training a static (inference-free) query tower is not supported; "
                                  "start from a checkpoint whose queries are encoded by a model")
    if tower.pooling != "max":
        raise NotImplementedError(f"{tower.name}: training supports max pooling, not {tower.pooling!r}")
    return tower._decoder_slots[0][2]


class TrainableEncoder:
    """Wraps a ``SpladeEncoder`` for training: ``named_parameters()``, ``train()`` / ``eval()``, ``encode(kind,
    texts)`` -> float32 [n, V] with autograd, and ``backward(loss_fn, queries, docs)``. ``head``: the Sparton
    head's implementation ("auto", "triton", "torch"), or a function that replaces the head (benchmarks
    compare a plain torch head) called as ``head(hidden, weight, bias, mask, "auto", deterministic)``."""

    def __init__(self, encoder: Any, *, head: str | Callable[..., torch.Tensor] = "auto", deterministic: bool = False,
                 bf16: bool = True, gradient_checkpointing: bool = False) -> None:
        self.encoder = encoder
        # (hidden, weight, bias, mask, implementation, deterministic) -> [B, V]
        self.head = sparton_head if isinstance(head, str) else head
        self.head_impl = head if isinstance(head, str) else "auto"
        self.towers = {"query": encoder._towers["query"], "doc": encoder._towers["doc"]}
        self.decoders = {kind: decoder_of(t) for kind, t in self.towers.items()}
        self.deterministic = deterministic
        self.device = encoder.device
        self.amp = bf16 and self.device.type == "cuda"
        self.tokens = 0  # real tokens encoded with a gradient so far (throughput)
        self.pair: nn.Module = TowerPair(self)  # what a step's forward calls (DDP's wrapper when distributed)
        self.ddp: nn.Module | None = None
        for tower in self.unique_towers():
            tower.model.requires_grad_(True)
            if gradient_checkpointing:
                checkpoint_activations(tower.model)

    def unique_towers(self) -> list[Any]:
        q, d = self.towers["query"], self.towers["doc"]
        return [d] if q is d else [q, d]

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """Every trainable parameter once (tied ones too), in a fixed order."""
        seen, out = set(), []
        for kind, tower in zip(("doc", "query"), reversed(self.unique_towers())):
            for module, prefix in ((tower.model, "model"), (self.decoders[kind], "decoder")):
                for name, p in module.named_parameters():
                    if id(p) not in seen:
                        seen.add(id(p))
                        out.append((f"{kind}.{prefix}.{name}", p))
        return out

    def train(self, mode: bool = True) -> TrainableEncoder:
        for tower in self.unique_towers():
            tower.model.train(mode)
        return self

    def eval(self) -> TrainableEncoder:
        return self.train(False)

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16) if self.amp else nullcontext()

    def distribute(self, sharding: str = "ddp") -> None:
        """Train data-parallel over the ranks of the current process group: DDP wraps the towers (its
        constructor broadcasts rank 0's weights) and averages the gradients during the backward; or
        ``sharding="fsdp"``: FSDP2 shards them, each transformer layer apart (parameters become DTensors).
        Both through ``lsr.parallel.training``."""
        from lsr.parallel.training import data_parallel, shard_model

        if sharding == "fsdp":
            shard_model(self.pair, [layer for tower in self.pair.towers for layer in _layer_list(tower)])
            return
        self.ddp = self.pair = data_parallel(TowerPair(self), self.device)

    def _tokenize(self, kind: str, texts: Sequence[str]) -> Any:
        prepared = self.encoder.prepare(list(texts), kind, batch_size=max(1, len(texts)),
                                          max_tokens=1 << 62)  # one batch: no token budget
        if torch.is_grad_enabled():
            self.tokens += prepared.n_tokens
        (batch,) = prepared.batches
        return batch

    def _input_order(self, y: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        order = rows.to(self.device)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order), device=self.device)
        return y[inverse]

    def encode(self, kind: str, texts: Sequence[str]) -> torch.Tensor:
        """SPLADE vectors float32 [n, V] of ``texts`` in input order (one padded batch), differentiable
        when grad is enabled."""
        batch = self._tokenize(kind, texts)
        return self._input_order(self.encode_ids(kind, batch.input_ids, batch.attention_mask), batch.rows)

    def encode_pair(self, queries: Sequence[str], docs: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and documents in one forward of ``pair`` (DDP needs one forward per backward)."""
        qb, db = self._tokenize("query", queries), self._tokenize("doc", docs)
        q, d = self.pair((qb.input_ids, qb.attention_mask), (db.input_ids, db.attention_mask))
        return self._input_order(q, qb.rows), self._input_order(d, db.rows)

    def encode_ids(self, kind: str, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Token ids [B, L] + mask -> SPLADE vectors float32 [B, V] (the benchmark feeds ids directly)."""
        tower, decoder = self.towers[kind], self.decoders[kind]
        ids = input_ids.to(self.device, non_blocking=True)
        mask = attention_mask.to(self.device, non_blocking=True)
        with self.autocast():
            hidden = tower.body(input_ids=ids, attention_mask=mask).logits
            y = self.head(hidden, decoder.weight, decoder.bias, mask.bool(), self.head_impl, self.deterministic)
        return mask_terms(activate(y.float(), tower.activation), tower.term_mask)

    def backward(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict]],
                 queries: Sequence[str], docs: Sequence[str], chunk: int | None = None
                 ) -> tuple[torch.Tensor, dict, torch.Tensor, torch.Tensor]:
        """loss_fn(q [B, V], d [N, V]) -> (loss, logs); accumulate its gradient into the parameters.

        ``chunk`` (GradCache, Gao et al. 2021): encode without a graph in chunks of ``chunk`` texts, take
        the loss's gradient w.r.t. the vectors, then re-encode chunk by chunk with a graph and push that
        gradient through (dropout replays its random state), so the parameter gradient is the full
        batch's while only one chunk's activations live at a time. Returns (loss, logs, q, d) detached."""
        if chunk is None or chunk >= max(len(queries), len(docs)):
            with self.autocast():  # one region: both towers reuse its bf16 copies of the weights
                q, d = self.encode_pair(queries, docs)
            loss, logs = loss_fn(q, d)
            loss.backward()
            return loss.detach(), logs, q.detach(), d.detach()
        parts = [(kind, texts[i:i + chunk]) for kind, texts in (("query", queries), ("doc", docs))
                 for i in range(0, len(texts), chunk)]
        states, reps = [], []
        with torch.no_grad():
            for kind, texts in parts:
                states.append(_rng_state(self.device))
                reps.append(self.encode(kind, texts))
        n_q = -(-len(queries) // chunk)
        q = torch.cat(reps[:n_q]).requires_grad_()
        d = torch.cat(reps[n_q:]).requires_grad_()
        loss, logs = loss_fn(q, d)
        loss.backward()
        grads = list(q.grad.split(chunk)) + list(d.grad.split(chunk))
        after = _rng_state(self.device)
        for (kind, texts), state, grad in zip(parts, states, grads, strict=True):
            _set_rng_state(self.device, state)
            self.encode(kind, texts).backward(grad)
        _set_rng_state(self.device, after)
        if self.ddp is not None:  # the chunks ran outside DDP's forward: no gradient was averaged yet
            from lsr.parallel.training import average_gradients

            average_gradients([p for _, p in self.named_parameters()])
        return loss.detach(), logs, q.detach(), d.detach()


def _layer_list(tower: nn.Module) -> nn.ModuleList | list:
    """A tower's transformer layers: the members of its first layer list (none when it has no list)."""
    layer_lists = [m for m in tower.modules() if isinstance(m, nn.ModuleList)]
    return layer_lists[0] if layer_lists else []


class TowerPair(nn.Module):
    """The trained modules (towers and decoders) as one ``nn.Module`` whose forward encodes a batch of
    queries and one of documents, each ``(input_ids, attention_mask)``: what DDP wraps."""

    def __init__(self, trainable: TrainableEncoder) -> None:
        super().__init__()
        self.towers = nn.ModuleList([t.model for t in trainable.unique_towers()])
        self.decoders = nn.ModuleList(list({id(m): m for m in trainable.decoders.values()}.values()))
        object.__setattr__(self, "trainable", trainable)  # a back reference, not a submodule

    def forward(self, query: tuple[torch.Tensor, torch.Tensor], doc: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.trainable.encode_ids("query", *query), self.trainable.encode_ids("doc", *doc)


def adamw_kernel(device: torch.device | str, deterministic: bool = False, capturable: bool = False) -> dict[str, bool]:
    """torch.optim.AdamW's implementation flags: the fused kernel on CUDA (one launch per group of tensors,
    elementwise, so run-to-run identical), else foreach (per-tensor loops when ``deterministic``);
    ``capturable``: on CUDA, the fused kernel that a CUDA graph can capture (its step count and learning rate
    stay on the device)."""
    if torch.device(device).type == "cuda":
        return {"fused": True, "capturable": True} if capturable else {"fused": True}
    return {"foreach": not deterministic}


def checkpoint_activations(model: nn.Module) -> None:
    """Recompute the backbone's activations in the backward (non-reentrant torch.utils.checkpoint)."""
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.get_rng_state(), torch.cuda.get_rng_state(device) if device.type == "cuda" else None


def _set_rng_state(device: torch.device, state: tuple[torch.Tensor, torch.Tensor | None]) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)
