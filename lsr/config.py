"""Job configuration: one schema of frozen dataclasses, read from YAML with ``--set key=value`` overrides.

A config is a few top-level keys (``name``, ``output``, ``device``) and sections. ``RunConfig`` (``lsr
run``: encode -> index -> search -> evaluate) and ``TrainConfig`` (``lsr train``, ``lsr.train.config``)
share the sections they have in common: ``encoder`` (``EncoderConfig``), ``data`` (``DataConfig``) and
``evaluation`` (``EvaluationConfig``). In YAML a section is a nested mapping; on the command line a key
is addressed by its dotted path (``--set encoder.batch_size=1024``, ``--set evaluation.metrics=[RR@10]``);
values are parsed as YAML.

Every key is documented, with its default, in the docstring under its field. The loader checks every
schema alike: unknown keys, types, allowed values (``choice``) and ranges (``at_least``, ``within``); a schema's
``validate`` adds the rules that relate keys. Each error is one line naming the dotted key and what it
accepts. ``configs/*.yaml`` are examples, each with the metrics it is expected to reach.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lsr.search.config import SearchConfig
from lsr.utils.devices import DEVICE_HELP, is_device_name
from lsr.utils.ranges import BLOCK_SIZES, PARTITIONS, WORKERS, NumberRange
from lsr.utils.schema import at_least, check_type, check_value, choice, type_hints, within

__all__ = ["HEAD_IMPLS", "MAXSIM_IMPLS", "MOVED_KEYS", "ConfigSchema", "DataConfig", "EncoderConfig",
           "EvaluationConfig", "IndexConfig", "InputsConfig", "RerankConfig", "RunConfig", "apply_overrides",
           "config_from_dict", "load_config", "read_yaml_config", "search_config_from_overrides"]

HEAD_IMPLS = ("auto", "triton", "torch")     # the Sparton head's implementation (auto: Triton on CUDA)
MAXSIM_IMPLS = ("auto", "triton", "torch")   # the MaxSim kernel's implementation (auto: Triton on CUDA)
DTYPES = ("bfloat16", "bf16", "float16", "fp16", "float32", "fp32")

S = TypeVar("S", bound="ConfigSchema")


@dataclass(frozen=True)
class DataConfig:
    """Where queries, documents and judgements come from (``lsr.data.sources.load_dataset``)."""

    dataset: str | None = None
    """ir_datasets id, local folder (BEIR / TSV layout), ``hf:ORG/NAME`` or a Parquet/JSONL spec; required by
    ``lsr run`` and by ``lsr train`` unless ``triples`` is given."""
    split: str | None = None
    """Split of a local BEIR folder (``qrels/<split>.tsv``): test, dev, train ...; None: the dataset's own."""


@dataclass(frozen=True)
class EncoderConfig:
    """Which encoder makes the vectors, and how."""

    kind: str = choice("bm25", ("bm25", "splade"))
    """"bm25" (lexical, no weights) or "splade" (a masked-LM or decoder-LLM checkpoint with the Sparton head)."""
    model: str | None = None
    """SPLADE: Hugging Face id or local path (required for splade)."""
    query_model: str | None = None
    """SPLADE: a separate query encoder checkpoint (same vocabulary); None: ``model`` encodes queries too."""
    max_length_query: int | None = at_least(None, 1)
    """Query tokens kept; None: the checkpoint's own (sentence-transformers), else 64."""
    max_length_doc: int | None = at_least(None, 1)
    """Document tokens kept; None: the checkpoint's own (sentence-transformers), else 256."""
    batch_size: int | None = at_least(None, 1)
    """Texts per batch; None: the encoder's own default (token-budgeted batches)."""
    dtype: str | None = choice(None, DTYPES)
    """bfloat16 | float16 | float32; None: bf16 on CUDA, fp32 on the CPU. Training: the autocast precision
    (bfloat16 or float32; the master weights stay float32)."""
    head: str = choice("auto", HEAD_IMPLS)
    """SPLADE: the Sparton head's implementation: auto (Triton on CUDA, the torch twin elsewhere), triton, torch."""
    doc_top_k: int | None = at_least(None, 1)
    """Keep the k largest weights of each document vector; None: all."""
    k1: float = at_least(0.9, 0)
    """BM25 term-frequency saturation."""
    b: float = within(0.4, NumberRange(float, 0, 1))
    """BM25 length normalisation, in [0, 1]."""
    shard_rows: int = at_least(100_000, 1)
    """Documents per Parquet shard (the resume granularity)."""
    tokenize_workers: int | None = within(None, WORKERS)
    """SPLADE: tokenizer processes; None: min(8, cores - 4) on CUDA, 0 = in-process."""
    compile: bool = False
    """SPLADE: torch.compile the backbone (pays off for millions of passages; the first batches compile)."""
    attention: str | None = choice(None, ("causal", "bidirectional"))
    """SPLADE decoder LLMs (Qwen3, Llama, Mistral): causal or bidirectional attention; None: the model's own (causal)."""


@dataclass(frozen=True)
class IndexConfig:
    """How the inverted index is built (``lsr.index``)."""

    block_size: int = within(65536, BLOCK_SIZES)
    """Documents per posting block (a power of two up to 1,048,576)."""
    partitions: int = within(1, PARTITIONS)
    """> 1: a sharded index (docs/guide/scaling.md), searched partition by partition; at most 65,536."""
    postings: str = "auto"
    """compact (4 bytes a posting, weights exact in bf16/fp16) where it fits, else float32 (auto); or either
    one forced; same results."""


@dataclass(frozen=True)
class InputsConfig:
    """Pre-encoded vectors a run searches instead of encoding them (``lsr.pipeline``)."""

    query_vectors: str | None = None
    """Pre-encoded queries: Anserini TSV(.gz) or an lsr vector directory."""
    query_scale: float | None = None
    """Anserini quantisation scale of ``query_vectors``; None: lsr.interop's default."""
    doc_vectors: str | None = None
    """Pre-encoded documents: an lsr vector directory or pyserini JSONL file(s)."""
    vocab: str | None = None
    """vocab.txt / tokenizer folder of pre-encoded token vectors."""


@dataclass(frozen=True)
class FilterConfig:
    """The documents the run's search may return (docs/guide/filters.md); every field given must hold."""

    where: str | None = None
    """An expression over the index's metadata columns (``index.metadata``), e.g. ``year >= 2015 and lang == 'en'``."""
    allow_docnos: str | None = None
    """A file of docnos (one per line): only these are searched."""
    deny_docnos: str | None = None
    """A file of docnos (one per line): these are never returned."""
    missing: str = choice("error", ("error", "ignore"))
    """Listed docnos the index lacks: an error, or skipped."""


@dataclass(frozen=True)
class RerankConfig:
    """Optional second stage (lsr.rerank): rescore each query's top-k with a late-interaction model."""

    model: str | None = None
    """Local PyLate / colbert-ir checkpoint; None: no rerank stage."""
    k: int = at_least(100, 1)
    """Documents per query reranked (the rest is dropped)."""
    batch_size: int = at_least(32, 1)
    """Documents per encoder batch."""
    query_batch: int = at_least(64, 1)
    """Queries per MaxSim call."""
    cache: str | None = None
    """Document embedding cache folder; None: ``<output>/doc-embeddings``."""
    dtype: str | None = choice(None, DTYPES)
    """Encoder dtype; None: bf16 on CUDA, fp32 on the CPU."""
    maxsim: str = choice("auto", MAXSIM_IMPLS)
    """The MaxSim kernel's implementation: auto (Triton on CUDA), triton, torch."""


@dataclass(frozen=True)
class EvaluationConfig:
    """What is measured (ir-measures strings) and the results a config documents."""

    metrics: tuple[str, ...] = ("RR@10", "nDCG@10", "R@1000")
    """ir-measures metric strings (``lsr train``'s default: nDCG@10, R@100)."""
    expected: Mapping[str, float] = field(default_factory=dict)
    """Documented reference results {metric: value}; ``lsr run --check`` compares against them."""
    tolerance: float = at_least(0.005, 0)
    """Largest difference from ``expected`` that ``--check`` accepts."""
    expected_on: DataConfig = field(default_factory=DataConfig)
    """The data ``expected`` was measured on (``dataset``, ``split``); a run config file that gives ``expected``
    without it measured them on its own ``data`` (before ``--set``). A run on other data records no expected
    values and refuses ``--check``."""

    def missed(self, metrics: Mapping[str, float]) -> dict[str, tuple[float | None, float]]:
        """{metric: (measured or None, expected)} of the expected metrics ``metrics`` misses by more than
        ``tolerance`` (or lacks)."""
        return {m: (metrics.get(m), v) for m, v in self.expected.items()
                if metrics.get(m) is None or abs(metrics[m] - v) > self.tolerance}


class ConfigSchema:
    """What every config (run, train) can do: ``validate``, ``to_dict`` and ``save``."""

    def validate(self: S) -> S:
        """Check the rules that relate keys (one-line ValueError naming them); returns the config."""
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML-ready data: sections as dicts, tuples as lists."""
        return _plain(self)

    def save(self, path: str | Path) -> None:
        from lsr.storage.files import atomic_write_text

        atomic_write_text(path, yaml.safe_dump(self.to_dict(), sort_keys=False))


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return list(value)
    return dict(value) if isinstance(value, Mapping) else value


@dataclass(frozen=True)
class RunConfig(ConfigSchema):
    """One end-to-end job (``lsr run``)."""

    name: str = "lsr-run"
    """Job name (the TREC run tag)."""
    output: str = "runs/lsr-run"
    """Output folder: vectors, index, runs, metrics.json."""
    device: str = "auto"
    """auto | cpu | cuda | cuda:N."""
    data: DataConfig = field(default_factory=DataConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    index: IndexConfig = field(default_factory=IndexConfig)
    inputs: InputsConfig = field(default_factory=InputsConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)

    def validate(self) -> RunConfig:
        from lsr.index.compact import CHOICES

        enc = self.encoder
        if not self.data.dataset:
            raise ValueError("config.data.dataset is required (an ir_datasets id or a local folder)")
        if enc.kind == "splade" and not enc.model and not self.inputs.doc_vectors:
            raise ValueError("config.encoder.kind=splade needs encoder.model (a Hugging Face id or a local path)")
        if self.index.postings not in CHOICES:
            raise ValueError(f"config.index.postings must be one of {', '.join(CHOICES)}, got {self.index.postings!r}")
        check_evaluation(self.evaluation)
        return self

    def expected_holds(self) -> bool:
        """Whether ``evaluation.expected`` was measured on this config's data (``evaluation.expected_on``; no
        record of it: they were given together)."""
        on, data = self.evaluation.expected_on, self.data
        return on.dataset is None or (on.split == data.split and data.dataset is not None
                                      and (on.dataset == data.dataset or _same_folder(on.dataset, data.dataset)))


def _same_folder(a: str, b: str) -> bool:
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    return pa.is_dir() and pb.is_dir() and pa.resolve() == pb.resolve()


def check_common(cfg: Any) -> None:
    """The checks of the top-level keys every schema has (device)."""
    if not is_device_name(cfg.device):
        raise ValueError(f"config.device must be {DEVICE_HELP}, got {cfg.device!r}")


def check_evaluation(evaluation: EvaluationConfig, where: str = "config.evaluation") -> None:
    """Every metric (and every expected one) is an ir-measures string lsr evaluates."""
    from lsr.evaluation.measures import parse_metrics

    try:
        parse_metrics(evaluation.metrics)
        if evaluation.expected:
            parse_metrics(tuple(evaluation.expected))
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


MOVED_KEYS = {"search.query_vectors": "inputs.query_vectors", "search.query_scale": "inputs.query_scale",
              "search.doc_vectors": "inputs.doc_vectors", "search.vocab": "inputs.vocab",
              "search.query_batch": "search.batches.size"}
"""Keys of earlier configs and where they are now: such a key is refused with one line naming its new place."""


def _unknown(base: Any, unknown: list[str], where: str) -> ValueError:
    """The error for unknown keys: the known ones, and the section a misplaced key belongs to."""
    fields = dataclasses.fields(base)
    prefix = where.removeprefix("config").lstrip(".")
    prefix += "." if prefix else ""
    hints = [f"{prefix}{f.name}.{key}" for key in unknown for f in fields if dataclasses.is_dataclass(getattr(base, f.name))
             and key in {s.name for s in dataclasses.fields(getattr(base, f.name))}]
    hint = f"; did you mean {', '.join(hints)}?" if hints else ""
    return ValueError(f"unknown key(s) in {where}: {unknown} (known: {sorted(f.name for f in fields)}){hint}")


def _build(base: Any, data: Any, where: str) -> Any:
    """``base`` (a config or section instance) with the keys of ``data`` replaced, each checked."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where} must be a mapping of keys to values, got {data!r}")
    fields = {f.name: f for f in dataclasses.fields(base)}
    unknown = sorted(set(data) - set(fields))
    for key in unknown:
        moved = MOVED_KEYS.get(f"{where}.{key}".removeprefix("config."))
        if moved is not None:
            raise ValueError(f"{where}.{key} is now {moved}: rename the key")
    if unknown:
        raise _unknown(base, unknown, where)
    hints = type_hints(type(base))
    changes = {}
    for key, value in data.items():
        current = getattr(base, key)
        if dataclasses.is_dataclass(current):   # a section: its schema's defaults, then the given keys
            changes[key] = _build(current, {} if value is None else value, f"{where}.{key}")
            continue
        value = check_type(value, hints[key], f"{where}.{key}")
        check_value(value, fields[key], type(value), f"{where}.{key}")
        changes[key] = value
    return dataclasses.replace(base, **changes)


def config_from_dict(data: Mapping[str, Any], schema: type[S] = RunConfig) -> S:  # type: ignore[assignment]
    """A validated config of ``schema`` from a nested mapping (the YAML layout)."""
    cfg = _build(schema(), data, "config")
    check_common(cfg)
    return cfg.validate()


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings (values parsed as YAML) to a nested dict, in place."""
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if node is None:   # an empty section in the YAML (``encoder:``)
                node = data[p] = {}
            if not isinstance(node, dict):
                raise ValueError(f"--set {key}: {p!r} is not a section")
        try:
            value = yaml.safe_load(raw)
            # "hf:" (a spec cut short) is YAML's {hf: null}, a mapping no key takes: keep the text, so that the
            # key's own check names what is wrong with it
            if isinstance(value, dict) and raw.strip().endswith(":") and not raw.lstrip().startswith("{"):
                value = raw.strip()
            node[parts[-1]] = value
        except yaml.YAMLError:
            raise ValueError(f"--set {item}: the value is not valid YAML (quote strings: key='[x')") from None
    return data


def search_config_from_overrides(overrides: Sequence[str], base: SearchConfig | None = None) -> SearchConfig:
    """A ``SearchConfig`` from ``--set search.<key>=<value>`` strings (``lsr search``), checked like a run config's
    ``search:`` section."""
    data = apply_overrides({}, overrides)
    others = sorted(set(data) - {"search"})
    if others:
        raise ValueError(f"--set {others[0]}...: only search.<key> can be set here (e.g. search.route=block)")
    return _build(base or SearchConfig(), data.get("search") or {}, "search")


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


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (),
                schema: type[S] = RunConfig) -> S:  # type: ignore[assignment]
    """Read a YAML config of ``schema`` (RunConfig, or lsr.train's TrainConfig), or start from its defaults,
    apply ``--set section.key=value`` overrides and validate it."""
    data = read_yaml_config(path)
    evaluation, measured_on = data.get("evaluation"), data.get("data")
    if (schema is RunConfig and isinstance(evaluation, dict) and evaluation.get("expected")
            and "expected_on" not in evaluation and isinstance(measured_on, dict)):
        evaluation["expected_on"] = dict(measured_on)  # the file's own data, whatever --set changes
    return config_from_dict(apply_overrides(data, overrides), schema)
