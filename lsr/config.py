"""Job configuration: frozen dataclasses loaded from YAML, with ``--set key=value`` overrides.

A config describes one reproducible run of the pipeline (encode -> index -> search -> evaluate);
``configs/*.yaml`` are examples, each with the metrics it is expected to reach.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["EncoderConfig", "IndexConfig", "SearchConfig", "RunConfig", "load_config", "apply_overrides"]


@dataclass(frozen=True)
class EncoderConfig:
    """Which encoder makes the vectors. ``kind``: "bm25" (lexical, no weights) or "splade"."""

    kind: str = "bm25"
    model: str | None = None            # HF id or local path (splade)
    query_model: str | None = None      # optional separate query encoder (splade)
    max_length_query: int = 64
    max_length_doc: int = 256
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
    metrics: tuple[str, ...] = ("RR@10", "nDCG@10", "R@1000")
    expected: Mapping[str, float] = field(default_factory=dict)   # documented reference results
    tolerance: float = 0.005

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["metrics"] = list(self.metrics)
        d["expected"] = dict(self.expected)
        return d

    def save(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


_SECTIONS = {"encoder": EncoderConfig, "index": IndexConfig, "search": SearchConfig}


def _build(cls: type, data: Mapping[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"unknown key(s) in {where}: {sorted(unknown)} (known: {sorted(names)})")
    kwargs = {}
    for key, value in data.items():
        if key in _SECTIONS and cls is RunConfig:
            value = _build(_SECTIONS[key], value or {}, f"{where}.{key}")
        elif key == "metrics":
            value = tuple([value] if isinstance(value, str) else value)
        kwargs[key] = value
    return cls(**kwargs)


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
        node[parts[-1]] = yaml.safe_load(raw)
    return data


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML config (or start from defaults) and apply ``--set`` overrides."""
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"config {p} not found")
        data = yaml.safe_load(p.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{p}: a config is a YAML mapping")
    return from_dict(apply_overrides(data, overrides))
