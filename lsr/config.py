"""Job configuration: frozen dataclasses loaded from YAML, with ``--set key=value`` overrides.

A config describes one reproducible run of the pipeline (encode -> index -> search -> evaluate);
``configs/*.yaml`` are examples, each with the metrics it is expected to reach.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lsr.utils.devices import is_device_name

__all__ = ["EncoderConfig", "IndexConfig", "RerankConfig", "RunConfig", "SearchConfig", "apply_overrides",
           "load_config", "validate_config"]


@dataclass(frozen=True)
class EncoderConfig:
    """Which encoder makes the vectors. ``kind``: "bm25" (lexical, no weights) or "splade"."""

    kind: str = "bm25"
    model: str | None = None            # HF id or local path (splade)
    query_model: str | None = None      # optional separate query encoder (splade)
    max_length_query: int | None = None  # None: the checkpoint's own (sentence-transformers), else 64
    max_length_doc: int | None = None    # None: the checkpoint's own (sentence-transformers), else 256
    batch_size: int | None = None       # None: the encoder's own default (token-budgeted batches)
    dtype: str | None = None            # "bfloat16" | "float16" | "float32"; default: bf16 on CUDA, fp32 on CPU
    doc_top_k: int | None = None        # keep the k largest weights per document vector
    k1: float = 0.9                     # bm25
    b: float = 0.4                      # bm25
    shard_rows: int = 100_000
    tokenize_workers: int | None = None  # tokenizer processes (splade); None: min(8, cores - 4) on CUDA, 0 = in-process
    compile: bool = False               # torch.compile the backbone (splade): pays off for millions of passages


@dataclass(frozen=True)
class IndexConfig:
    block_size: int = 65536
    partitions: int = 1                 # > 1: a sharded index (docs/scaling.md), searched partition by partition
    postings: str = "auto"              # "compact" (4 bytes a posting, weights exact in bf16/fp16) where it fits, else
                                        # "float32"; or either one forced; same results


@dataclass(frozen=True)
class SearchConfig:
    k: int = 1000
    query_batch: int | None = None
    backend: str = "auto"
    query_vectors: str | None = None    # pre-encoded queries: Anserini TSV(.gz) or an lsr vector directory
    query_scale: float | None = None    # Anserini quantisation scale for query_vectors (None: lsr.interop default)
    doc_vectors: str | None = None      # pre-encoded documents: lsr vector directory or pyserini JSONL file(s)
    vocab: str | None = None            # vocab.txt / tokenizer dir for pre-encoded token vectors


@dataclass(frozen=True)
class RerankConfig:
    """Optional second stage (lsr.rerank): rescore each query's top-k with a late-interaction model."""

    model: str | None = None            # local PyLate / colbert-ir checkpoint; None: no rerank stage
    k: int = 100
    batch_size: int = 32                # documents per encoder batch
    query_batch: int = 64               # queries per MaxSim call
    cache: str | None = None            # document embedding cache; None: <output>/doc-embeddings
    dtype: str | None = None            # encoder dtype; default: bf16 on CUDA, fp32 on CPU
    backend: str = "auto"               # MaxSim: auto | triton | torch


@dataclass(frozen=True)
class RunConfig:
    """One end-to-end job."""

    name: str = "lsr-run"
    dataset: str = "data/scifact"       # ir_datasets id or local folder (BEIR / TSV layout)
    split: str | None = None
    output: str = "runs/lsr-run"
    device: str = "auto"
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)
    metrics: tuple[str, ...] = ("RR@10", "nDCG@10", "R@1000")
    expected: Mapping[str, float] = field(default_factory=dict)   # documented reference results
    tolerance: float = 0.005

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["metrics"] = list(self.metrics)
        d["expected"] = dict(self.expected)
        return d

    def save(self, path: str | Path) -> None:
        from lsr.storage.files import atomic_write_text

        atomic_write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))


_SECTIONS = {"encoder": EncoderConfig, "index": IndexConfig, "search": SearchConfig, "rerank": RerankConfig}


def _check_type(value: Any, hint: Any, where: str) -> Any:
    """``value`` if it has the type ``hint`` (int accepted for float), else ValueError naming ``where``."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return value
        base = typing.get_origin(option) or option
        if base is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):   # YAML's .nan / .inf: every comparison with them passes or fails silently
                raise ValueError(f"{where} must be a finite number, got {value!r}")
            return float(value)
        if base is int and isinstance(value, int) and not isinstance(value, bool):
            return value
        if base in (str, bool) and isinstance(value, base):
            return value
        if base is tuple and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        if base is Mapping and isinstance(value, Mapping) and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value.values()):
            return {str(k): float(v) for k, v in value.items()}
    names = {type(None): "null", tuple: "a list of strings", Mapping: "a mapping of metric to finite number"}
    want = " or ".join(names.get(typing.get_origin(o) or o, getattr(o, "__name__", str(o))) for o in options)
    raise ValueError(f"{where} must be {want}, got {value!r}")


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping of keys to values, got {data!r}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"unknown key(s) in {where}: {sorted(unknown)} (known: {sorted(names)})")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key in _SECTIONS and cls is RunConfig:
            value = _build(_SECTIONS[key], value or {}, f"{where}.{key}")
        else:
            if key == "metrics" and isinstance(value, str):
                value = [value]
            value = _check_type(value, hints[key], f"{where}.{key}")
        kwargs[key] = value
    return cls(**kwargs)


def _positive(where: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"{where} must be >= 1, got {value}")


def validate_config(cfg: RunConfig) -> RunConfig:
    """Check a whole config before any work (so a bad metric cannot fail after encoding); returns it."""
    from lsr.evaluation.measures import parse_metrics
    from lsr.index.build import check_block_size
    from lsr.index.compact import CHOICES

    enc, search = cfg.encoder, cfg.search
    if enc.kind not in ("bm25", "splade"):
        raise ValueError(f"config.encoder.kind must be 'bm25' or 'splade', got {enc.kind!r}")
    if enc.kind == "splade" and not enc.model and not search.doc_vectors:
        raise ValueError("config.encoder.kind=splade needs encoder.model (a Hugging Face id or a local path)")
    if enc.dtype not in (None, "bfloat16", "bf16", "float16", "fp16", "float32", "fp32"):
        raise ValueError(f"config.encoder.dtype must be bfloat16, float16 or float32, got {enc.dtype!r}")
    for name in ("max_length_query", "max_length_doc", "batch_size", "doc_top_k", "shard_rows"):
        _positive(f"config.encoder.{name}", getattr(enc, name))
    if enc.k1 < 0 or not 0 <= enc.b <= 1:
        raise ValueError(f"config.encoder: bm25 needs k1 >= 0 and 0 <= b <= 1, got k1={enc.k1}, b={enc.b}")
    _positive("config.search.k", search.k)
    _positive("config.search.query_batch", search.query_batch)
    if search.backend not in ("auto", "torch", "gpu"):
        raise ValueError(f"config.search.backend must be auto, torch or gpu, got {search.backend!r}")
    for name in ("k", "batch_size", "query_batch"):
        _positive(f"config.rerank.{name}", getattr(cfg.rerank, name))
    if cfg.rerank.backend not in ("auto", "torch", "triton"):
        raise ValueError(f"config.rerank.backend must be auto, torch or triton, got {cfg.rerank.backend!r}")
    check_block_size(cfg.index.block_size)
    if cfg.index.postings not in CHOICES:
        raise ValueError(f"config.index.postings must be auto, float32 or compact, got {cfg.index.postings!r}")
    _positive("config.index.partitions", cfg.index.partitions)
    if not is_device_name(cfg.device):
        raise ValueError(f"config.device must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    if cfg.tolerance < 0:
        raise ValueError(f"config.tolerance must be >= 0, got {cfg.tolerance}")
    parse_metrics(cfg.metrics)
    if cfg.expected:
        parse_metrics(tuple(cfg.expected))
    return cfg


def from_dict(data: Mapping[str, Any]) -> RunConfig:
    return _build(RunConfig, data, "config")


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings (values parsed as YAML) to a nested dict, in place."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {p!r} is not a section")
        try:
            node[parts[-1]] = yaml.safe_load(raw)
        except yaml.YAMLError:
            raise ValueError(f"--set {item}: the value is not valid YAML (quote strings: key='[x')") from None
    return data


def read_yaml_config(path: str | Path | None) -> dict[str, Any]:
    """The YAML mapping in ``path`` ({} for None); one-line errors for a missing file or bad YAML."""
    if path is None:
        return {}
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"config {p} not found")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8-sig")) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{p} is not valid YAML: {' '.join(str(e).split())}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: a config is a YAML mapping")
    return data


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML config (or start from defaults) and apply ``--set`` overrides."""
    return validate_config(from_dict(apply_overrides(read_yaml_config(path), overrides)))
