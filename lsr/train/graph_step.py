"""The training step as CUDA graphs (``optim.cuda_graph``): the whole step captured once per batch shape and
replayed.

    plan = plan_train_step(cfg, device, distributed=False)   # printable: the route and why
    step = GraphStep(model, optimizer, cfg.loss, cfg.optim.max_grad_norm, graph_batch=cfg.optim.batch_size)
    loss, logs, grad_norm, counts = step.run(data, batch, step_index, lr)

Why: a small-batch step is host-bound. The host takes as long to issue the eager step's few hundred kernels
(backbone, Sparton head, loss, backward, clipping, AdamW) as the GPU takes to run them, and the GPU idles
half of that time (docs/performance/train.md). Replaying a captured graph issues the whole step in one call.

What is captured: the compiled backbone's forward (compiled: no host syncs left in it), the Sparton head,
the loss (``batch_loss.loss_terms``), the backward, foreach gradient clipping and the fused, capturable AdamW
step. Everything that changes from step to step lives in device tensors written before the replay: the
padded token ids and masks, the loss's exclusion mask and teacher scores, the FLOPS weights of the step
and the learning rate (the optimizer's groups hold one 0-d tensor). The graph writes the loss, its parts,
the non-zero counts and the gradient norm into one output vector, read once per step.

Shapes: queries are padded to ``max_length_query``, documents to a bucket (the batch's longest rounded up to
a multiple of ``DOC_BUCKET``, at most ``max_length_doc``); one graph per (queries, documents) shape, all
drawing on one memory pool (they never run at once, so their temporaries share it). A batch of another
size than ``graph_batch`` (an epoch's short last batch) runs the same step uncaptured. Padded positions are
masked in attention and in the head, so the loss is the eager step's up to rounding.

The first batch of a shape is the warm-up: it runs as a real step on a side stream (compiling, autotuning,
creating the optimizer state), then the capture records the next ones (capturing runs nothing). A host sync
left in the step (a backbone whose compiled forward still reads a value back), which no capture can hold, is
found there by CUDA's sync check: the steps then run uncaptured, with a warning in the log, as they do where a
capture fails for another reason (the failure memory ``train.graph_step`` of ``lsr.utils.runtime`` keeps why).
A non-finite loss skips the update inside the graph (the fused AdamW's ``found_inf``), as the eager step
raises before stepping; the trainer then raises on the loss it reads.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lsr.encode.tokenize.batching import TokenBatch
from lsr.train.batch_loss import LOSS_PARTS, LossInputs, loss_inputs, loss_terms
from lsr.train.config import LossConfig, TrainConfig, cuda_graph_refused
from lsr.train.data import Example, TrainData
from lsr.train.model import TrainableEncoder
from lsr.utils.cuda_graphs import GraphSet, capture_graph
from lsr.utils.plans import Plan, Step
from lsr.utils.runtime import failure_memory

__all__ = ["CAPTURE_FAILED", "DOC_BUCKET", "GraphStep", "StepInputs", "StepPlan", "doc_width", "plan_train_step"]

log = logging.getLogger("lsr.train")

DOC_BUCKET = 64  # document widths are multiples of this: few graphs, little padding
_INPUTS = ("q_ids", "q_mask", "d_ids", "d_mask", "exclude", "teacher")  # a shape's device input tensors
_OUTPUTS = ("loss", *LOSS_PARTS, "nnz_q", "nnz_d", "grad_norm")  # the output vector's entries
# (silent: the trainer's log says it, where a training run's messages go)
CAPTURE_FAILED = failure_memory("train.graph_step", "capturing the training step as CUDA graphs",
                                "the steps run uncaptured", warn=False)


@dataclass(frozen=True)
class StepPlan(Plan):
    """The training step's route: ``graph`` (CUDA graphs) or eager, and why."""

    graph: bool
    reason: str

    def title(self) -> str:
        return "train plan"

    def plan_steps(self) -> tuple[Step, ...]:
        return (Step("step", "CUDA graph" if self.graph else "eager", self.reason),)


def plan_train_step(cfg: TrainConfig, device: torch.device | str, distributed: bool) -> StepPlan:
    """Where ``cfg.optim.cuda_graph`` sends the step on ``device`` (``distributed``: under torchrun with more
    than one rank). ``on`` where the graph cannot run is a one-line ValueError naming the key and why."""
    mode = cfg.optim.cuda_graph_mode
    if mode == "off":
        return StepPlan(False, "optim.cuda_graph=off")
    blockers = [] if torch.device(device).type == "cuda" else [f"the device is {device} (CUDA graphs need a GPU)"]
    if distributed:
        blockers.append("torchrun runs several ranks (the graph step runs in one process; DDP's gradient "
                        "all-reduce is not captured)")
    blockers += cfg.cuda_graph_conflicts()
    if blockers and mode == "on":
        raise cuda_graph_refused(blockers[0])
    if blockers:
        return StepPlan(False, f"optim.cuda_graph={mode}: off, {blockers[0]}")
    return StepPlan(True, f"optim.cuda_graph={mode}: compiled forward, backward, clipping and AdamW replayed as "
                          f"one graph per document-length bucket (multiples of {DOC_BUCKET} tokens)")


def doc_width(longest: int, max_length: int) -> int:
    """The padded width of a document batch whose longest text has ``longest`` tokens: the next multiple of
    ``DOC_BUCKET``, at most ``max_length`` (texts are truncated to it)."""
    return min(max_length, -(-max(longest, 1) // DOC_BUCKET) * DOC_BUCKET)


@dataclass
class StepInputs:
    """One step's tensors: token ids and masks int64 of the queries [B, Lq] and documents [N, Ld] (positives,
    then each query's negatives), and the loss's ``LossInputs``."""

    q_ids: torch.Tensor
    q_mask: torch.Tensor
    d_ids: torch.Tensor
    d_mask: torch.Tensor
    loss: LossInputs

    @property
    def shape(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(self.q_ids.shape), tuple(self.d_ids.shape)

    def named(self) -> dict[str, torch.Tensor]:
        """The tensors a shape's step copies onto the device, by name (teacher scores only where there are some)."""
        given = (self.q_ids, self.q_mask, self.d_ids, self.d_mask, self.loss.exclude, self.loss.teacher)
        return {k: v for k, v in zip(_INPUTS, given, strict=True) if v is not None}


@dataclass
class _Slots:
    """The device tensors one shape's step reads (written in place before each run)."""

    tensors: dict[str, torch.Tensor]
    loss: LossInputs


class GraphStep:
    """The training step of ``model`` + ``optimizer`` (a fused, capturable AdamW on CUDA) as CUDA graphs.

    ``loss_cfg``: the loss; ``max_grad_norm``: the clipping bound (None: no clipping). ``graph_batch``: the
    number of queries a captured batch has (others run uncaptured; None: every size is captured).
    ``graphs=False`` runs the same step without capturing anything (any device: the CPU tests compare it with
    the eager step)."""

    def __init__(self, model: TrainableEncoder, optimizer: torch.optim.Optimizer, loss_cfg: LossConfig,
                 max_grad_norm: float | None, *, graph_batch: int | None = None, graphs: bool = True) -> None:
        self.model, self.optimizer, self.loss_cfg = model, optimizer, loss_cfg
        self.max_grad_norm, self.graph_batch = max_grad_norm, graph_batch
        self.device = model.device
        self.graphs = graphs and self.device.type == "cuda"
        self.params = [p for group in optimizer.param_groups for p in group["params"]]
        for p in self.params:  # gradients live outside the graphs: every graph zeroes and fills the same ones
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.lr = torch.zeros((), device=self.device)  # the learning rate every group reads, written per step
        self.flops_weights = torch.zeros(2, device=self.device)  # (query, document) FLOPS weights of the step
        self.skip = torch.zeros((), device=self.device)  # 1 where the loss is non-finite: AdamW skips the update
        if all(group.get("fused") for group in optimizer.param_groups):
            # GradScaler's protocol: the fused AdamW leaves weights, moments and step count as they were
            # where ``found_inf`` is non-zero (an eager step raises before stepping on such a loss)
            optimizer.found_inf = self.skip
        # (graph, output vector) per shape, all in one memory pool: they never run at once, so their temporaries share it
        self.cache: GraphSet[tuple[torch.cuda.CUDAGraph, torch.Tensor]] = GraphSet(CAPTURE_FAILED)
        self.uncapturable: str | None = None  # why the step cannot be captured (found by the warm-up), or None
        self._slots: dict[tuple, _Slots] = {}

    @property
    def captured(self) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
        """The (query ids, document ids) shapes that have a graph, in capture order."""
        return [shape for shape in self.cache if self.cache.graphs.get(shape) is not None]

    # ------------------------------------------------------------------ texts -> tensors (host)
    def batch_inputs(self, data: TrainData, batch: list[Example], step: int) -> tuple[StepInputs, int]:
        """``batch``'s padded token ids (queries to ``max_length_query``, documents to their bucket) and loss
        inputs on the host, and its real token count."""
        encoder = self.model.encoder
        queries = [data.queries[e.qid] for e in batch]
        docs = [data.docs[d] for d in [e.positive for e in batch] + [n for e in batch for n in e.negatives]]
        q = self._padded("query", queries, encoder.max_length_query)
        d = self._padded("doc", docs, None)
        inputs = StepInputs(q.input_ids, q.attention_mask, d.input_ids, d.attention_mask,
                            loss_inputs(self.loss_cfg, data, batch, step, "cpu"))
        return inputs, q.n_tokens + d.n_tokens

    def _padded(self, kind: str, texts: list[str], width: int | None) -> TokenBatch:
        encoder = self.model.encoder
        flat, lengths = encoder.tokenize(texts, kind)
        if width is None:
            width = doc_width(int(lengths.max()), encoder.max_length_doc)
        return TokenBatch(None, None, torch.arange(len(texts)), torch.from_numpy(lengths.astype(np.int32)),
                          int(lengths.sum()), tokens=torch.from_numpy(np.ascontiguousarray(flat, np.int32)),
                          width=width, pad_id=encoder.tower(kind).pad_id)

    def run(self, data: TrainData, batch: list[Example], step: int, lr: float
            ) -> tuple[float, dict[str, Any], float | None, dict[str, Any]]:
        """One training step on ``batch`` at learning rate ``lr``: (loss, its log fields, the gradient norm
        before clipping (None without clipping), counts: nnz_q / n_q, nnz_d / n_d, tokens)."""
        inputs, tokens = self.batch_inputs(data, batch, step)
        values = dict(zip(_OUTPUTS, self.step_tensors(inputs, lr).tolist(), strict=True))  # the one host read
        logs = {k: values[k] for k in LOSS_PARTS} | {"flops_weight_q": inputs.loss.w_q,
                                                      "flops_weight_d": inputs.loss.w_d}
        counts = {"nnz_q": values["nnz_q"], "n_q": inputs.q_ids.shape[0], "nnz_d": values["nnz_d"],
                  "n_d": inputs.d_ids.shape[0], "tokens": tokens}
        grad_norm = None if self.max_grad_norm is None else values["grad_norm"]
        return values["loss"], logs, grad_norm, counts

    # ------------------------------------------------------------------ tensors -> one step (device)
    def step_tensors(self, inputs: StepInputs, lr: float) -> torch.Tensor:
        """One step on ``inputs`` (host or device tensors) at learning rate ``lr``; returns the device vector
        of ``_OUTPUTS`` (loss, its parts, nnz of queries and documents, gradient norm), valid until the next
        step of the same shape."""
        slots = self._slots.get(inputs.shape) or self._new_slots(inputs)
        for name, value in inputs.named().items():
            slots.tensors[name].copy_(value, non_blocking=True)
        self.flops_weights.copy_(torch.tensor([float(inputs.loss.w_q), float(inputs.loss.w_d)]), non_blocking=True)
        self._set_lr(lr)
        if inputs.shape in self.cache:
            captured = self.cache.get(inputs.shape)
            if captured is None:   # its capture failed
                return self._compute(slots)
            captured[0].replay()
            return captured[1]
        other_size = self.graph_batch is not None and inputs.q_ids.shape[0] != self.graph_batch
        if not self.graphs or other_size or self.uncapturable is not None:
            return self._compute(slots)
        out = self._warm_up(slots)
        if self.uncapturable is None:
            self._capture(inputs.shape, slots)
        return out

    def _capture(self, shape: tuple, slots: _Slots) -> None:
        """The shape's graph (the warm-up ran the step already: no second eager run); a failure is remembered, and
        the shape's steps run uncaptured."""
        captured = self.cache.lookup(shape, lambda pool: capture_graph(lambda: self._compute(slots), self.device,
                                                                       pool=pool, warm_up=False))
        if captured is None:
            log.warning("capturing the training step as a CUDA graph failed (%s): it runs uncaptured",
                        CAPTURE_FAILED.why)

    def _new_slots(self, inputs: StepInputs) -> _Slots:
        tensors = {k: torch.empty_like(v, device=self.device) for k, v in inputs.named().items()}
        static = LossInputs(tensors["exclude"], tensors.get("teacher"), self.flops_weights[0], self.flops_weights[1])
        slots = self._slots[inputs.shape] = _Slots(tensors, static)
        return slots

    def _set_lr(self, lr: float) -> None:
        if not self.graphs:  # (an uncaptured optimizer off CUDA may not take a tensor learning rate)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            return
        for group in self.optimizer.param_groups:  # a resumed optimizer's groups hold the checkpoint's number
            if group["lr"] is not self.lr:
                group["lr"] = self.lr
        self.lr.fill_(lr)

    def _warm_up(self, slots: _Slots) -> torch.Tensor:
        """This shape's first batch as a real step on a side stream (compiles the backbone, autotunes the
        kernels, creates the optimizer state), then one more forward and backward (whose gradients the next
        step zeroes) with CUDA's sync check raising: nothing then runs for the first time inside the capture,
        and a host sync (which a capture cannot hold) turns the graphs off with a warning instead of failing."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        before = torch.cuda.get_sync_debug_mode()
        with torch.cuda.stream(side):
            out = self._compute(slots)
            torch.cuda.set_sync_debug_mode("error")
            try:
                self._forward_backward(slots)
            except RuntimeError as e:
                self.uncapturable = " ".join(str(e).split())
                CAPTURE_FAILED.record(f"the step syncs with the host: {self.uncapturable}")
                log.warning("the training step syncs with the host (%s): it runs uncaptured, without CUDA graphs",
                            self.uncapturable)
            finally:
                torch.cuda.set_sync_debug_mode(before)
        torch.cuda.current_stream(self.device).wait_stream(side)
        return out

    def _forward_backward(self, slots: _Slots) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor,
                                                        torch.Tensor]:
        model, t = self.model, slots.tensors
        self.optimizer.zero_grad(set_to_none=False)  # in place: the gradients' memory stays the graphs' input
        with model.autocast():  # one region: both towers reuse its bf16 copies of the weights
            q = model.encode_ids("query", t["q_ids"], t["q_mask"])
            d = model.encode_ids("doc", t["d_ids"], t["d_mask"])
        loss, parts = loss_terms(self.loss_cfg, q, d, slots.loss)
        loss.backward()
        return loss.detach(), parts, q.detach(), d.detach()

    def _compute(self, slots: _Slots) -> torch.Tensor:
        """The step the graph captures: forward, backward, clipping, AdamW; no host sync."""
        loss, parts, q, d = self._forward_backward(slots)
        if self.max_grad_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm, foreach=True)
        else:
            norm = torch.full((), math.nan, device=self.device)
        self.skip.copy_(~torch.isfinite(loss))
        with warnings.catch_warnings():  # (warm-ups and short batches step uncaptured on purpose)
            warnings.filterwarnings("ignore", message="This instance was constructed with capturable=True")
            self.optimizer.step()
        values = (loss, *(parts[k] for k in LOSS_PARTS), (q > 0).sum(), (d > 0).sum(), norm)
        return torch.stack([v.double() for v in values])
