"""Training configuration: one flat dataclass read from YAML, with ``--set key=value`` overrides.

Every field has a default except ``model``, ``dataset`` (or ``triples``) and ``output``; ``validate``
checks the whole config before any work, so a typo fails at once with a one-line message naming the
key and what it accepts.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lsr.config import _check_type, apply_overrides, read_yaml_config

__all__ = ["LOSSES", "NEGATIVES", "TrainConfig", "load_train_config", "train_config_from_dict"]

LOSSES = ("infonce", "margin_mse", "kl")
NEGATIVES = ("none", "bm25", "model")


@dataclass(frozen=True)
class TrainConfig:
    """One SPLADE training run (see configs/train-*.yaml for an annotated example)."""

    model: str = ""                      # HF masked LM / SPLADE / sentence-transformers sparse checkpoint
    output: str = ""                     # run folder: checkpoints, log.jsonl, model/ (the final checkpoint)
    name: str = "splade-train"
    # data
    dataset: str | None = None           # local BEIR/TSV folder or ir_datasets id: queries + qrels -> positives
    split: str | None = "train"
    triples: str | None = None           # TSV "query<TAB>positive<TAB>negative..." texts (instead of dataset)
    negatives: str = "none"              # hard negatives for dataset pairs: none | bm25 | model (lsr's own index)
    n_negatives: int = 1                 # hard negatives per query in a batch
    mine_depth: int = 50                 # mined negatives are drawn from the top mine_depth non-positives
    mine_skip: int = 0                   # ... after skipping the top mine_skip (likely unjudged positives)
    mine_refresh: bool = False           # negatives=model: re-mine with the current model every epoch
    teacher_scores: str | None = None    # TSV "qid<TAB>docid<TAB>score" (margin_mse / kl)
    max_length_query: int = 64
    max_length_doc: int = 256
    # model
    separate_towers: bool = False        # query and document towers start equal but are trained apart
    head_backend: str = "auto"           # Sparton head: auto (Triton on CUDA) | triton | torch
    deterministic: bool = False          # deterministic head backward + torch deterministic algorithms
    bf16: bool = True                    # bf16 autocast on CUDA (ignored on the CPU)
    gradient_checkpointing: bool = False  # recompute the backbone's activations in the backward
    compile: bool = False                # torch.compile the backbone (fewer kernel launches; the first steps compile)
    # loss
    loss: str = "infonce"                # infonce | margin_mse | kl
    temperature: float = 1.0             # infonce / kl: scores are divided by it
    in_batch_negatives: bool = True      # infonce: the other queries' documents are negatives too
    flops_query: float = 5e-4            # FLOPS regulariser weights (SPLADE: lambda_q, lambda_d)
    flops_doc: float = 1e-3
    flops_warmup_steps: int = 0          # the weights grow quadratically to their value over these steps
    l1_query: float = 0.0
    l1_doc: float = 0.0
    # optimisation
    batch_size: int = 32                 # queries per step (each with a positive and n_negatives documents)
    grad_cache_chunk: int | None = None  # GradCache: encode in chunks of this many texts (batch beyond memory)
    lr: float = 2e-5
    weight_decay: float = 0.01
    warmup_steps: int = 0                # linear warm-up, then linear decay to 0 at the last step
    max_steps: int | None = None         # None: epochs x batches per epoch
    epochs: int = 1
    max_grad_norm: float | None = 1.0
    bucket_batches: int = 50             # length bucketing: sort this many batches' worth of pairs by length
    seed: int = 0
    device: str = "auto"
    # logging, evaluation, checkpoints
    log_every: int = 10
    progress: bool = True
    eval_dataset: str | None = None      # dev data (folder[:split] or ir_datasets id) searched with lsr
    eval_split: str | None = None
    eval_every: int | None = None        # steps between evaluations (None: only at the end)
    eval_metrics: tuple[str, ...] = ("nDCG@10", "R@100")
    eval_max_docs: int | None = None     # evaluate on the judged documents + this many others (None: all)
    save_every: int | None = None        # steps between checkpoints (None: only the final model)
    keep_checkpoints: int | None = 2     # newest checkpoints kept (None: all)
    resume: str | None = None            # a checkpoint folder, or "auto": the newest one under output
    overwrite: bool = False              # replace an existing output/model
    metadata: Mapping[str, float] = field(default_factory=dict)  # free numbers recorded in the log header

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (list(v) if isinstance(v := getattr(self, f.name), tuple) else
                         dict(v) if isinstance(v, Mapping) else v) for f in dataclasses.fields(self)}

    def save(self, path: str | Path) -> None:
        from lsr.storage.files import atomic_write_text

        atomic_write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))


def _at_least(cfg: TrainConfig, names: Sequence[str], low: float) -> None:
    for name in names:
        value = getattr(cfg, name)
        if value is not None and value < low:
            raise ValueError(f"config.{name} must be >= {low:g}, got {value}")


def _one_of(cfg: TrainConfig, name: str, options: Sequence[str]) -> None:
    if getattr(cfg, name) not in options:
        raise ValueError(f"config.{name} must be one of {', '.join(options)}, got {getattr(cfg, name)!r}")


def validate(cfg: TrainConfig) -> TrainConfig:
    """Check the whole config (one-line ValueError naming the key); returns it."""
    from lsr.evaluation.measures import parse_metrics

    if not cfg.model:
        raise ValueError("config.model is required (a Hugging Face id or a local model folder)")
    if not cfg.output:
        raise ValueError("config.output is required (the folder for checkpoints, the log and the model)")
    if (cfg.dataset is None) == (cfg.triples is None):
        raise ValueError("config: set exactly one of dataset (queries + qrels) and triples (a TSV file)")
    _one_of(cfg, "loss", LOSSES)
    _one_of(cfg, "negatives", NEGATIVES)
    _one_of(cfg, "head_backend", ("auto", "triton", "torch"))
    _at_least(cfg, ("batch_size", "max_length_query", "max_length_doc", "epochs", "mine_depth", "log_every",
                    "bucket_batches", "grad_cache_chunk", "max_steps", "eval_every", "save_every",
                    "keep_checkpoints"), 1)
    _at_least(cfg, ("n_negatives", "mine_skip", "warmup_steps", "flops_warmup_steps", "flops_query", "flops_doc",
                    "l1_query", "l1_doc", "weight_decay", "eval_max_docs"), 0)
    if cfg.lr <= 0 or cfg.temperature <= 0 or (cfg.max_grad_norm is not None and cfg.max_grad_norm <= 0):
        raise ValueError("config.lr, config.temperature and config.max_grad_norm must be > 0")
    if cfg.loss != "infonce" and cfg.teacher_scores is None:
        raise ValueError(f"config.loss={cfg.loss} distils a teacher: set config.teacher_scores (qid, docid, score TSV)")
    if cfg.teacher_scores is not None and cfg.dataset is None:
        raise ValueError("config.teacher_scores names query and document ids: use it with dataset, not triples")
    if cfg.loss == "margin_mse" and cfg.n_negatives != 1:
        raise ValueError("config.loss=margin_mse compares one positive with one negative: set n_negatives: 1")
    if cfg.loss != "infonce" and cfg.n_negatives < 1:
        raise ValueError(f"config.loss={cfg.loss} needs hard negatives: set n_negatives >= 1")
    if cfg.dataset is not None and cfg.n_negatives > 0 and cfg.negatives == "none" and cfg.teacher_scores is None:
        raise ValueError("config.n_negatives > 0 needs negatives: bm25 or model (or teacher_scores to draw them "
                         "from), or set n_negatives: 0")
    if cfg.mine_skip >= cfg.mine_depth:
        raise ValueError(f"config.mine_skip ({cfg.mine_skip}) must be < mine_depth ({cfg.mine_depth})")
    if not (cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:")):
        raise ValueError(f"config.device must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    parse_metrics(cfg.eval_metrics)
    return cfg


def train_config_from_dict(data: Mapping[str, Any]) -> TrainConfig:
    """A validated TrainConfig from a mapping (unknown keys and wrong types raise ValueError)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"a training config is a mapping of keys to values, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"unknown key(s) in config: {unknown} (known: {sorted(names)})")
    hints = typing.get_type_hints(TrainConfig)
    kwargs = {}
    for key, value in data.items():
        if key == "eval_metrics" and isinstance(value, str):
            value = [value]
        kwargs[key] = _check_type(value, hints[key], f"config.{key}")
    return validate(TrainConfig(**kwargs))


def load_train_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Read a YAML training config (or start from defaults) and apply ``--set key=value`` overrides."""
    return train_config_from_dict(apply_overrides(read_yaml_config(path), overrides))
