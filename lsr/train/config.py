"""Training configuration (``lsr train``): the run config's shared sections plus training's own.

``TrainConfig`` reuses ``lsr.config``'s sections for what it shares with ``lsr run`` (``encoder``,
``data``, ``evaluation``; ``eval_data`` is a second ``DataConfig``, the dev set) and the same loader
(YAML + ``--set section.key=value``, one-line errors naming the dotted key). Training's own sections:
``negatives``, ``loss``, ``optim`` and ``schedule``. Required: ``encoder.model``, ``output`` and one of
``data.dataset`` / ``triples``. Overrides address keys by their section, e.g.
``lsr train CONFIG --set optim.max_steps=100 --set encoder.head=torch``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsr.config import (
    ConfigSchema,
    DataConfig,
    EncoderConfig,
    EvaluationConfig,
    check_evaluation,
    config_from_dict,
    load_config,
)
from lsr.utils.schema import at_least, choice

__all__ = ["LOSSES", "NEGATIVES", "LossConfig", "NegativesConfig", "OptimConfig", "ScheduleConfig", "TrainConfig",
           "cuda_graph_refused", "load_train_config", "train_config_from_dict"]

LOSSES = ("infonce", "margin_mse", "kl")
NEGATIVES = ("none", "bm25", "model")


@dataclass(frozen=True)
class NegativesConfig:
    """Hard negatives of dataset pairs, mined with lsr's own index."""

    mine: str = choice("none", NEGATIVES)
    """none | bm25 (mined once with lsr's BM25 and exact search) | model (the model being trained)."""
    count: int = at_least(1, 0)
    """Hard negatives per query in a batch."""
    depth: int = at_least(50, 1)
    """Mined negatives are drawn from the top ``depth`` non-positives ..."""
    skip: int = at_least(0, 0)
    """... after skipping the top ``skip`` (likely unjudged positives)."""
    refresh: bool = False
    """mine=model: re-mine with the current model every epoch."""


@dataclass(frozen=True)
class LossConfig:
    """The ranking loss and the sparsity regularisers."""

    kind: str = choice("infonce", LOSSES)
    """infonce | margin_mse | kl (the last two distil ``teacher_scores``)."""
    teacher_scores: str | None = None
    """TSV ``qid<TAB>docid<TAB>score`` (margin_mse / kl), with ``data.dataset``."""
    temperature: float = 1.0
    """infonce / kl: scores are divided by it (> 0)."""
    in_batch_negatives: bool = True
    """infonce: the other queries' documents are negatives too."""
    gather_across_ranks: bool = False
    """Under torchrun: gather every rank's query and document vectors (and their gradients), so in-batch
    negatives, FLOPS and distillation see the global batch; False: each rank's part alone."""
    in_batch_groups: int = at_least(1, 1)
    """One process: split each batch into this many groups with their own in-batch negatives and FLOPS,
    as that many ranks do without ``gather_across_ranks`` (continues such a run on one GPU)."""
    flops_query: float = at_least(5e-4, 0)
    """FLOPS regulariser weight of the queries (SPLADE's lambda_q)."""
    flops_doc: float = at_least(1e-3, 0)
    """FLOPS regulariser weight of the documents (SPLADE's lambda_d)."""
    flops_warmup_steps: int = at_least(0, 0)
    """The FLOPS weights grow quadratically to their value over these steps."""
    l1_query: float = at_least(0.0, 0)
    """L1 weight of the queries."""
    l1_doc: float = at_least(0.0, 0)
    """L1 weight of the documents."""


@dataclass(frozen=True)
class OptimConfig:
    """AdamW, the batch and the training step's numerics."""

    batch_size: int = at_least(32, 1)
    """Queries per step and rank (each with a positive and ``negatives.count`` documents); under torchrun
    the global batch is world size x batch_size."""
    grad_cache_chunk: int | None = at_least(None, 1)
    """GradCache: encode in chunks of this many texts (a batch beyond memory); None: the whole batch at once."""
    lr: float = 2e-5
    """Peak learning rate (> 0)."""
    weight_decay: float = at_least(0.01, 0)
    """AdamW weight decay (not on biases and LayerNorm weights)."""
    warmup_steps: int = at_least(0, 0)
    """Linear warm-up, then linear decay to 0 at the last step."""
    max_steps: int | None = at_least(None, 1)
    """Steps to train; None: epochs x batches per epoch."""
    epochs: int = at_least(1, 1)
    """Passes over the training pairs (when ``max_steps`` is None)."""
    max_grad_norm: float | None = 1.0
    """Gradient clipping norm (> 0); None: no clipping."""
    bucket_batches: int = at_least(50, 1)
    """Length bucketing: this many batches' worth of pairs are sorted by length."""
    separate_towers: bool = False
    """Query and document towers start equal but are trained apart."""
    deterministic: bool = False
    """Deterministic head backward and torch's deterministic algorithms (bit-identical seeded runs)."""
    gradient_checkpointing: bool = False
    """Recompute the backbone's activations in the backward (larger batches)."""
    sharding: str = choice("ddp", ("ddp", "fsdp"))
    """Under torchrun: ddp (every rank holds the model) or fsdp (parameters, gradients and optimizer state
    sharded over the ranks, torch's FSDP2; for models whose training state does not fit one GPU)."""
    cuda_graph: str | bool = "auto"
    """The whole step (compiled forward, backward, clipping, AdamW) captured as CUDA graphs and replayed, so
    that a small batch's step is not bound by the host issuing its kernels (``lsr.train.graph_step``):
    auto | on | off (YAML's true / false read as on / off). auto: on where it can run (a CUDA device, one
    process, no ``grad_cache_chunk``, ``deterministic``, ``gradient_checkpointing`` or ``loss.in_batch_groups``),
    else off; on: an error where it cannot. Queries are padded to ``encoder.max_length_query`` and documents to
    a multiple of 64 tokens (at most ``max_length_doc``), one graph per such bucket (an epoch's short last batch
    runs uncaptured); the backbone is compiled; the graphs' temporaries stay reserved in one shared pool."""

    @property
    def cuda_graph_mode(self) -> str:
        """``cuda_graph`` as "auto", "on" or "off"."""
        if isinstance(self.cuda_graph, bool):
            return "on" if self.cuda_graph else "off"
        return self.cuda_graph


@dataclass(frozen=True)
class ScheduleConfig:
    """When the loop logs, evaluates and saves."""

    log_every: int = at_least(10, 1)
    """Steps between lines of OUTPUT/log.jsonl."""
    progress: bool = True
    """Show a progress bar."""
    eval_every: int | None = at_least(None, 1)
    """Steps between dev evaluations (of ``eval_data``); None: only at the end."""
    eval_max_docs: int | None = at_least(None, 0)
    """A dev evaluation searches the judged documents + this many others; None: all of them."""
    save_every: int | None = at_least(None, 1)
    """Steps between resumable checkpoints; None: only the final model."""
    keep_checkpoints: int | None = at_least(2, 1)
    """Newest checkpoints kept; None: all."""


def _train_encoder() -> EncoderConfig:
    return EncoderConfig(kind="splade", max_length_query=64, max_length_doc=256)


@dataclass(frozen=True)
class TrainConfig(ConfigSchema):
    """One SPLADE training run (see configs/train-*.yaml for an annotated example)."""

    name: str = "splade-train"
    """Run name."""
    output: str = ""
    """Run folder (required): checkpoints, log.jsonl, eval.jsonl, metrics.json, model/ (the final checkpoint)."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    seed: int = 0
    """Seeds the initialisation, the batches and the negatives (an epoch's batches depend on seed and epoch only)."""
    encoder: EncoderConfig = field(default_factory=_train_encoder)
    """The model trained: ``model`` (required; HF masked LM, SPLADE or sentence-transformers sparse checkpoint),
    ``max_length_query`` / ``max_length_doc`` (training's defaults: 64 / 256), ``head``, ``dtype`` (autocast),
    ``compile``; kind must stay splade."""
    data: DataConfig = field(default_factory=lambda: DataConfig(split="train"))
    """Training queries + qrels (judged pairs are the positives); split defaults to train."""
    triples: str | None = None
    """TSV ``query<TAB>positive<TAB>negative...`` texts, instead of ``data.dataset``."""
    negatives: NegativesConfig = field(default_factory=NegativesConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    eval_data: DataConfig = field(default_factory=DataConfig)
    """Dev data searched exactly with lsr during training; dataset None: no evaluation."""
    evaluation: EvaluationConfig = field(default_factory=lambda: EvaluationConfig(metrics=("nDCG@10", "R@100")))
    """Dev metrics (training's default: nDCG@10, R@100)."""
    resume: str | None = None
    """A checkpoint folder, or "auto": the newest one under ``output``."""
    overwrite: bool = False
    """Replace an earlier run in ``output``."""
    metadata: Mapping[str, float] = field(default_factory=dict)
    """Free numbers recorded in the log header."""

    def validate(self) -> TrainConfig:
        enc = self.encoder
        if not enc.model:
            raise ValueError("config.encoder.model is required (a Hugging Face id or a local model folder)")
        if not self.output:
            raise ValueError("config.output is required (the folder for checkpoints, the log and the model)")
        if enc.kind != "splade" or enc.query_model:
            raise ValueError("config.encoder: training trains one SPLADE checkpoint (kind: splade, no query_model; "
                             "optim.separate_towers trains apart query and document towers)")
        if enc.dtype not in (None, "bfloat16", "bf16", "float32", "fp32"):
            raise ValueError(f"config.encoder.dtype: training autocasts in bfloat16 or runs in float32, got {enc.dtype!r}")
        if (self.data.dataset is None) == (self.triples is None):
            raise ValueError("config: set exactly one of data.dataset (queries + qrels) and triples (a TSV file)")
        self._check_loss()
        neg = self.negatives
        if neg.skip >= neg.depth:
            raise ValueError(f"config.negatives.skip ({neg.skip}) must be < negatives.depth ({neg.depth})")
        if neg.mine != "none" and neg.count > neg.depth - neg.skip:
            raise ValueError(f"config.negatives.count ({neg.count}) must be <= negatives.depth - negatives.skip "
                             f"({neg.depth} - {neg.skip}): a query's negatives are drawn without repeats from its "
                             "mined candidates; raise negatives.depth or lower negatives.count")
        check_evaluation(self.evaluation)
        self._check_cuda_graph()
        return self

    def cuda_graph_conflicts(self) -> list[str]:
        """The keys of this config that keep the training step off CUDA graphs, each with why (the device
        and the process count are the step plan's: ``lsr.train.graph_step.plan_train_step``)."""
        optim, out = self.optim, []
        if optim.grad_cache_chunk is not None:
            out.append("optim.grad_cache_chunk is set (GradCache encodes in chunks of host-driven passes)")
        if optim.deterministic:
            out.append("optim.deterministic is true (eager attention and torch's deterministic algorithms)")
        if optim.gradient_checkpointing:
            out.append("optim.gradient_checkpointing is true (its recomputation is not captured yet)")
        if self.loss.in_batch_groups > 1:
            out.append("loss.in_batch_groups > 1 (the grouped loss runs eagerly)")
        return out

    def _check_cuda_graph(self) -> None:
        mode = self.optim.cuda_graph_mode
        if mode not in ("auto", "on", "off"):
            raise ValueError(f"config.optim.cuda_graph must be auto, on or off, got {self.optim.cuda_graph!r}")
        conflicts = self.cuda_graph_conflicts()
        if mode == "on" and conflicts:
            raise cuda_graph_refused(conflicts[0])

    def _check_loss(self) -> None:
        loss, optim, negatives = self.loss, self.optim, self.negatives
        for key, value in (("optim.lr", optim.lr), ("loss.temperature", loss.temperature),
                           ("optim.max_grad_norm", optim.max_grad_norm)):
            if value is not None and value <= 0:
                raise ValueError(f"config.{key} must be > 0, got {value}")
        if loss.kind != "infonce" and loss.teacher_scores is None:
            raise ValueError(f"config.loss.kind={loss.kind} distils a teacher: set config.loss.teacher_scores "
                             "(qid, docid, score TSV)")
        if loss.teacher_scores is not None and self.data.dataset is None:
            raise ValueError("config.loss.teacher_scores names query and document ids: use it with data.dataset, "
                             "not triples")
        if loss.kind == "margin_mse" and negatives.count != 1:
            raise ValueError("config.loss.kind=margin_mse compares one positive with one negative: set "
                             "negatives.count: 1")
        if loss.kind != "infonce" and negatives.count < 1:
            raise ValueError(f"config.loss.kind={loss.kind} needs hard negatives: set negatives.count >= 1")
        if (self.data.dataset is not None and negatives.count > 0 and negatives.mine == "none"
                and loss.teacher_scores is None):
            raise ValueError("config.negatives.count > 0 needs negatives.mine: bm25 or model (or "
                             "loss.teacher_scores to draw them from), or set negatives.count: 0")

    @property
    def autocast_bf16(self) -> bool:
        """Whether the steps run under bf16 autocast (on CUDA): encoder.dtype None or bfloat16."""
        return self.encoder.dtype in (None, "bfloat16", "bf16")


def cuda_graph_refused(reason: str) -> ValueError:
    """The error of ``optim.cuda_graph: on`` where the graph step cannot run, for ``reason``."""
    return ValueError(f"config.optim.cuda_graph=on cannot run: {reason}; set optim.cuda_graph: auto (or off), or "
                      "change what keeps it off")


def train_config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """A validated TrainConfig from a nested mapping (unknown keys and wrong types raise ValueError)."""
    return config_from_dict(data, TrainConfig)


def load_train_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML training config (or start from defaults) and apply ``--set section.key=value`` overrides."""
    return load_config(path, overrides, TrainConfig)
