"""sentence-transformers ``SparseEncoder`` checkpoints: reading their layout into lsr towers.

Two layouts are understood (module class names as sentence-transformers 5.x and 6.x write them):

* SPLADE: ``modules.json`` = [``Transformer`` (task ``fill-mask``) or ``MLMTransformer``, ``SpladePooling``];
  one model for queries and documents.
* Router (inference-free and asymmetric models): ``modules.json`` = [``Router``]; its
  ``router_config.json`` (``config.json`` in older saves) names the modules of each route
  (``structure``) and how tasks map to routes (``route_mappings``, ``default_route``). The query and
  document routes are each either [Transformer / MLMTransformer, SpladePooling] or
  [``SparseStaticEmbedding``]: a weight per vocabulary entry, the query vector being the weights of
  the query's distinct tokens (tokenized without special tokens), as in naver/splade-v3-doc or the
  OpenSearch neural-sparse doc models.

``SpladePooling``'s ``pooling_strategy`` (max | sum) and ``activation_function`` (relu | log1p_relu)
and the Transformer's max length (``max_seq_length`` in ``sentence_bert_config.json``, else the
tokenizer's ``model_max_length``) become the tower's settings. Writing checkpoints lives in
``lsr.encode.splade.st_save``.
"""

from __future__ import annotations

import ast
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lsr.encode.splade.causal import load_tower
from lsr.encode.splade.checkpoint import NO_LIMIT, MaskedLMTower, downloads_off, tokenizer_facts
from lsr.encode.splade.load_checks import check_vocabulary

__all__ = ["Route", "StCheckpoint", "StaticTower", "activate", "find_st_folder", "load_route", "load_st_towers",
           "pool_logits", "read_st_checkpoint"]

MODULES = "modules.json"
LSR_CONFIG = "lsr_config.json"  # lsr's own settings (separate query / document max lengths), ignored by ST
_TRANSFORMERS = {"Transformer", "MLMTransformer"}


@dataclass
class Route:
    """One route of a checkpoint: ``kind`` "mlm" (masked LM + SpladePooling) or "static" (token weights)."""

    kind: str
    path: Path
    pooling: str = "max"
    activation: str = "relu"
    max_length: int | None = None  # from sentence_bert_config.json; None: the tokenizer's limit
    dimension: int | None = None  # SpladePooling's recorded output size, checked against the vocabulary


@dataclass
class StCheckpoint:
    folder: Path
    doc: Route
    query: Route
    prompts: dict[str, str] = field(default_factory=dict)  # "query" / "doc" -> text prepended before tokenizing
    lsr: dict[str, Any] = field(default_factory=dict)  # lsr_config.json, when lsr wrote the checkpoint


def _read_json(path: Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path} is missing: not a complete sentence-transformers {what}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-save the checkpoint") from None


def find_st_folder(name: str, local_files_only: bool | None, revision: str | None) -> Path | None:
    """The local folder of a sentence-transformers checkpoint (a directory with ``modules.json``, or a hub
    repository that has one, downloaded or taken from the cache), or None for anything else."""
    p = Path(name).expanduser()
    if p.is_dir():
        return p if (p / MODULES).is_file() else None
    if p.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        return None
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError

    offline, _ = downloads_off(local_files_only)
    try:
        hf_hub_download(name, MODULES, revision=revision, local_files_only=offline)
        return Path(snapshot_download(name, revision=revision, local_files_only=offline))
    except (OSError, EntryNotFoundError):  # not an ST repository, or not available: the plain HF path explains
        return None


def read_st_checkpoint(folder: str | os.PathLike) -> StCheckpoint:
    """Parse ``modules.json`` (and the Router / pooling / Transformer configs) of a checkpoint folder."""
    folder = Path(folder)
    modules = [(_class_name(m, folder), folder / m.get("path", "")) for m in _read_json(folder / MODULES, "checkpoint")]
    if len(modules) == 1 and modules[0][0] in ("Router", "Asym"):
        doc, query = _read_router(modules[0][1])
    else:
        doc = query = _read_route(modules, folder / MODULES)
    prompts: dict[str, str] = {}
    if (folder / "config_sentence_transformers.json").is_file():
        saved = _read_json(folder / "config_sentence_transformers.json", "checkpoint").get("prompts") or {}
        prompts = {"query": saved.get("query") or "", "doc": saved.get("document") or ""}
    lsr = _read_json(folder / LSR_CONFIG, "checkpoint") if (folder / LSR_CONFIG).is_file() else {}
    return StCheckpoint(folder, doc, query, prompts, lsr)


def _class_name(entry: Any, folder: Path) -> str:
    if not isinstance(entry, dict) or not isinstance(entry.get("type"), str):
        raise ValueError(f"{folder / MODULES}: every entry needs a 'type' string, got {entry!r}")
    return entry["type"].rsplit(".", 1)[-1]


def _read_route(modules: list[tuple[str, Path]], where: Path) -> Route:
    """[Transformer, SpladePooling] or [SparseStaticEmbedding] -> Route; anything else is refused."""
    names = [n for n, _ in modules]
    if names == ["SparseStaticEmbedding"]:
        return Route("static", modules[0][1])
    if len(names) != 2 or names[0] not in _TRANSFORMERS or names[1] != "SpladePooling":
        raise ValueError(f"{where}: modules {names} are not a SPLADE model; lsr loads [Transformer (fill-mask) or "
                         "MLMTransformer, SpladePooling] and [SparseStaticEmbedding] routes")
    body, pooling = modules[0][1], modules[1][1]
    sbert = _transformer_config(body)
    if names[0] == "Transformer" and sbert.get("transformer_task", "fill-mask") != "fill-mask":
        raise ValueError(f"{body}: a SPLADE Transformer module needs transformer_task 'fill-mask', "
                         f"got {sbert['transformer_task']!r}")
    if sbert.get("do_lower_case"):
        raise NotImplementedError(f"{body}: do_lower_case=true is not supported; lowercase the texts yourself "
                                  "or use an uncased tokenizer")
    cfg = _read_json(pooling / "config.json", "SpladePooling module")
    route = Route("mlm", body, cfg.get("pooling_strategy", "max"), cfg.get("activation_function", "relu"),
                  sbert.get("max_seq_length"), cfg.get("embedding_dimension", cfg.get("word_embedding_dimension")))
    if route.pooling not in ("max", "sum") or route.activation not in ("relu", "log1p_relu"):
        raise ValueError(f"{pooling / 'config.json'}: pooling_strategy {route.pooling!r} / activation_function "
                         f"{route.activation!r} not supported (max|sum, relu|log1p_relu)")
    return route


def _transformer_config(body: Path) -> dict[str, Any]:
    for name in ("sentence_bert_config.json", "sentence_distilbert_config.json", "sentence_roberta_config.json",
                 "sentence_xlm-roberta_config.json"):
        if (body / name).is_file():
            return _read_json(body / name, "Transformer module")
    return {}


def _read_router(folder: Path) -> tuple[Route, Route]:
    """(document route, query route) of a Router module folder (the query route may be the same Route)."""
    path = folder / "router_config.json"
    cfg = _read_json(path if path.is_file() else folder / "config.json", "Router module")
    types, structure, params = cfg.get("types") or {}, cfg.get("structure") or {}, cfg.get("parameters") or {}
    try:
        mappings = {ast.literal_eval(k) if isinstance(k, str) else k: v
                    for k, v in (params.get("route_mappings") or {}).items()}
    except (ValueError, SyntaxError):
        raise ValueError(f"{path}: route_mappings keys must read as (task, modality) tuples") from None
    routes: dict[str, Route] = {}

    def route_of(task: str) -> Route:
        key = next((mappings[k] for k in ((task, "text"), (task, None), (None, "text"), (None, None)) if k in mappings),
                   task if task in structure else params.get("default_route"))
        if key is None and params.get("allow_empty_key", True) and structure:
            key = next(iter(structure))
        if key not in structure:
            raise ValueError(f"{path}: no route for task {task!r} (routes: {sorted(structure)})")
        if key not in routes:
            ids = structure[key]
            if any(i not in types for i in ids):
                raise ValueError(f"{path}: route {key!r} names modules without a type: {ids}")
            routes[key] = _read_route([(types[i].rsplit(".", 1)[-1], folder / i) for i in ids], path)
        return routes[key]

    return route_of("document"), route_of("query")


class StaticTower:
    """A ``SparseStaticEmbedding`` route: query vector[t] = weight[t] for every distinct token t of the text
    (tokenized without special tokens, truncated to the tokenizer's limit); no model runs."""

    static = True
    varlen = term_mask = attention = None
    pooling = activation = architecture = "SparseStaticEmbedding"

    def __init__(self, path: Path, device: torch.device) -> None:
        from transformers import AutoTokenizer

        self.name, self.revision = str(path), None
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.table = _load_weight(path).to(device=device, dtype=torch.float32)
        if self.table.ndim != 1 or not bool(torch.isfinite(self.table).all()) or bool((self.table < 0).any()):
            raise ValueError(f"{path}: the token weight table must be a finite, non-negative [vocab] vector")
        check_vocabulary(str(path), self.tokenizer, self.table.shape[0], "the token weight table",
                         "use the tokenizer saved with this table, or give the table one weight per token id")
        self.vocab, self.pad_id, self.max_positions = tokenizer_facts(self.tokenizer, self.table.shape[0])

    def encode(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, L] token ids and mask -> [B, V] weights of each row's distinct unmasked tokens."""
        present = torch.zeros(input_ids.shape[0], self.table.shape[0], dtype=torch.bool, device=input_ids.device)
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)[:, None].expand_as(input_ids)
        real = mask.bool()
        present[rows[real], input_ids[real]] = True  # duplicates collapse: a token counts once
        return present * self.table

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        from safetensors.torch import save_file

        save_file({"weight": self.table.detach().cpu().contiguous()}, str(Path(folder) / "model.safetensors"))
        self.tokenizer.save_pretrained(folder)


def _load_weight(path: Path) -> torch.Tensor:
    if (path / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(path / "model.safetensors"))
    elif (path / "pytorch_model.bin").is_file():
        state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{path}: no model.safetensors or pytorch_model.bin with the token weights")
    if "weight" not in state:
        raise ValueError(f"{path}: the weights file has no 'weight' tensor (found {sorted(state)})")
    return state["weight"]


def load_route(route: Route, device: torch.device, dtype: torch.dtype, attn_implementation: str | None, *,
               attention: str | None = None, mask_special_tokens: bool = True) -> MaskedLMTower | StaticTower:
    """Build the tower of one route (local folder) with the route's pooling, activation and max length
    (``attention`` / ``mask_special_tokens``: for a decoder LLM, see ``lsr.encode.splade.causal``)."""
    if route.kind == "static":
        return StaticTower(route.path, device)
    tower = load_tower(str(route.path), device, dtype, True, None, attn_implementation, attention=attention,
                       mask_special_tokens=mask_special_tokens)
    tower.pooling, tower.activation = route.pooling, route.activation
    if route.dimension is not None and route.dimension != tower.weight.shape[0]:
        raise ValueError(f"{route.path}: SpladePooling says {route.dimension} dimensions but the decoder has "
                         f"{tower.weight.shape[0]}")
    if route.max_length is not None:  # sentence-transformers truncates there, whatever the tokenizer says
        tower.max_positions = max(tower.max_positions or 0, int(route.max_length))
    return tower


def default_length(route: Route, tower: MaskedLMTower | StaticTower) -> int:
    """The max length sentence-transformers uses for this route (the tokenizer's limit when none is set)."""
    if route.max_length is not None:
        return int(route.max_length)
    return tower.max_positions or NO_LIMIT


def load_st_towers(ckpt: StCheckpoint, device: torch.device, dtype: torch.dtype, attn_implementation: str | None, *,
                   attention: str | None = None, mask_special_tokens: bool = True
                   ) -> tuple[MaskedLMTower, MaskedLMTower | StaticTower, dict[str, Any]]:
    """(document tower, query tower, defaults) of a checkpoint; defaults holds ``max_length_doc`` /
    ``max_length_query`` (lsr's saved values, else the ones sentence-transformers uses) and ``prompts``.
    ``attention``: a decoder LLM's (None: the one lsr saved with the checkpoint, else the model's own)."""
    if ckpt.doc.kind != "mlm":
        raise ValueError(f"{ckpt.folder}: the document route must run a masked LM, not a {ckpt.doc.kind} module")
    kw = {"attention": attention or ckpt.lsr.get("attention"), "mask_special_tokens": mask_special_tokens}
    doc = load_route(ckpt.doc, device, dtype, attn_implementation, **kw)
    query = doc if ckpt.query is ckpt.doc else load_route(ckpt.query, device, dtype, attn_implementation, **kw)
    defaults = {"max_length_doc": ckpt.lsr.get("max_length_doc") or default_length(ckpt.doc, doc),
                "max_length_query": ckpt.lsr.get("max_length_query") or default_length(ckpt.query, query),
                "prompts": ckpt.prompts}
    return doc, query, defaults


def pool_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mask: torch.Tensor,
                activation: str, max_bytes: int) -> torch.Tensor:
    """Sum pooling (the original SPLADE): [B, V] = sum_s log1p(relu(H_s·Eᵀ + b)) over unmasked positions
    (one more log1p per position for ``activation="log1p_relu"``).

    A torch path (the Sparton kernels max-pool); rows are processed in groups whose [rows, S, V] logits
    stay under ``max_bytes``."""
    B, L, _ = hidden.shape
    rows = max(1, max_bytes // max(1, L * weight.shape[0] * hidden.element_size()))
    out = []
    for i in range(0, B, rows):
        logits = torch.nn.functional.linear(hidden[i:i + rows], weight, bias)
        act = torch.log1p(torch.relu(logits))
        act = torch.log1p(act) if activation == "log1p_relu" else act
        out.append((act * mask[i:i + rows, :, None].to(act.dtype)).sum(1))
    return torch.cat(out)


def activate(y: torch.Tensor, activation: str) -> torch.Tensor:
    """Pooled log1p(relu) weights -> the tower's activation: "log1p_relu" adds one more log1p (monotone, so
    applying it after max pooling equals applying it per position)."""
    return torch.log1p(y) if activation == "log1p_relu" else y
