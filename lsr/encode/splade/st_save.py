"""Writing an lsr SPLADE encoder as a sentence-transformers ``SparseEncoder`` checkpoint.

The folder uses the module names sentence-transformers 5.x writes (6.x maps them to its own classes), so
both load it with ``SparseEncoder(folder)``:

* one model for queries and documents: the Hugging Face masked LM and tokenizer at the root,
  ``sentence_bert_config.json`` (``max_seq_length`` = lsr's document max length), and
  ``1_SpladePooling/config.json``; ``modules.json`` = [MLMTransformer, SpladePooling];
* a different query side (a token weight table, or a second model): ``modules.json`` = [Router], its
  ``router_config.json`` and one sub-folder per module (``query_0_SparseStaticEmbedding`` or
  ``query_0_MLMTransformer`` + ``query_1_SpladePooling``; ``document_0_MLMTransformer`` +
  ``document_1_SpladePooling``).

``config_sentence_transformers.json`` marks the model type, the dot-product similarity and the prompts;
``lsr_config.json`` keeps lsr's separate query / document max lengths (sentence-transformers has one
max length per model, the document one, and ignores the file). The folder is built under a temporary
name and renamed into place.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lsr.encode.splade.checkpoint import MaskedLMTower
from lsr.encode.splade.st_checkpoint import LSR_CONFIG, MODULES, StaticTower
from lsr.storage.files import atomic_directory, atomic_write_text

__all__ = ["save_st_checkpoint"]

_TYPES = {"MLMTransformer": "sentence_transformers.sparse_encoder.models.MLMTransformer",
          "SpladePooling": "sentence_transformers.sparse_encoder.models.SpladePooling",
          "SparseStaticEmbedding": "sentence_transformers.sparse_encoder.models.SparseStaticEmbedding",
          "Router": "sentence_transformers.models.Router"}


def _write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def _check_target(folder: Path, overwrite: bool) -> None:
    if not folder.exists() or (folder.is_dir() and not any(folder.iterdir())):
        return
    if not overwrite:
        raise FileExistsError(f"{folder} already exists; pass overwrite=True to replace it")
    if not folder.is_dir() or not ((folder / MODULES).is_file() or (folder / "config.json").is_file()):
        raise ValueError(f"refusing to overwrite {folder}: it is not a model folder (no modules.json or config.json)")


def _save_mlm(tower: MaskedLMTower, body: Path, pooling: Path, max_length: int) -> None:
    tower.save_pretrained(body)
    _write_json(body / "sentence_bert_config.json", {"max_seq_length": max_length, "do_lower_case": False})
    _write_json(pooling / "config.json", {"pooling_strategy": tower.pooling, "activation_function": tower.activation,
                                          "word_embedding_dimension": int(tower.weight.shape[0])})


def _save_static(tower: StaticTower, folder: Path, max_length: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    saved = tower.tokenizer.model_max_length
    tower.tokenizer.model_max_length = max_length  # sentence-transformers truncates static queries there
    try:
        tower.save_pretrained(folder)
    finally:
        tower.tokenizer.model_max_length = saved
    _write_json(folder / "config.json", {"frozen": False})


def _save_router(root: Path, doc: MaskedLMTower, query: MaskedLMTower | StaticTower, max_length_doc: int,
                 max_length_query: int) -> None:
    structure: dict[str, list[str]] = {"query": [], "document": []}
    for route, tower, length in (("query", query, max_length_query), ("document", doc, max_length_doc)):
        if tower.static:
            structure[route] = [f"{route}_0_SparseStaticEmbedding"]
            _save_static(tower, root / structure[route][0], length)
        else:
            structure[route] = [f"{route}_0_MLMTransformer", f"{route}_1_SpladePooling"]
            _save_mlm(tower, root / structure[route][0], root / structure[route][1], length)
    types = {m: _TYPES[m.split("_", 2)[2]] for ids in structure.values() for m in ids}
    _write_json(root / "router_config.json", {"types": types, "structure": structure,
                                              "parameters": {"default_route": "document", "allow_empty_key": True}})
    _write_json(root / MODULES, [{"idx": 0, "name": "0", "path": "", "type": _TYPES["Router"]}])


def save_st_checkpoint(folder: str | os.PathLike, doc: MaskedLMTower, query: MaskedLMTower | StaticTower, *,
                       max_length_doc: int, max_length_query: int, prompts: dict[str, str] | None = None,
                       overwrite: bool = False) -> Path:
    """Write the towers of an lsr encoder as a sentence-transformers SparseEncoder checkpoint in ``folder``
    (an existing non-empty folder only with ``overwrite=True``, and only if it holds a model); returns it."""
    folder = Path(folder)
    _check_target(folder, overwrite)
    with atomic_directory(folder, overwrite=overwrite) as tmp:
        if query is doc:
            _save_mlm(doc, tmp, tmp / "1_SpladePooling", max_length_doc)
            _write_json(tmp / MODULES, [
                {"idx": 0, "name": "0", "path": "", "type": _TYPES["MLMTransformer"]},
                {"idx": 1, "name": "1", "path": "1_SpladePooling", "type": _TYPES["SpladePooling"]}])
        else:
            _save_router(tmp, doc, query, max_length_doc, max_length_query)
        prompts = prompts or {}
        _write_json(tmp / "config_sentence_transformers.json", {
            "model_type": "SparseEncoder", "similarity_fn_name": "dot", "default_prompt_name": None,
            "prompts": {"query": prompts.get("query", ""), "document": prompts.get("doc", "")}})
        attention = {"attention": doc.attention} if doc.attention is not None else {}  # a decoder LLM's, reloaded
        _write_json(tmp / LSR_CONFIG, {"max_length_query": max_length_query, "max_length_doc": max_length_doc}
                    | attention)
    return folder
