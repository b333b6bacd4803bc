"""Loading a checkpoint's weights so that a half-loaded model is refused instead of encoding noise.

transformers starts every parameter the checkpoint lacks (or holds in another shape) at random and only warns in
its load report, so a folder without its LM head, its MLM decoder or its input embedding would encode, exit 0,
with random weights. ``load_model`` loads with ``output_loading_info=True`` and turns what that reports into one
line naming the checkpoint, the weights and the fix (``CheckpointError``); ``check_vocabulary`` refuses a
tokenizer whose ids run past the embedding rows (it would fail mid-encode with "index out of range in self").

* missing weights: a key counts as missing only when no loaded parameter shares its tensor, so a tied head
  (``tie_word_embeddings``: Qwen3's ``lm_head``, BERT's ``cls.predictions.decoder``) that the checkpoint leaves
  out, as ``save_pretrained`` does, is recognised as tied and loads.
* shapes: loaded with ``ignore_mismatched_sizes=True`` so the mismatch is reported here (config.json's
  ``vocab_size`` against the embedding's rows, say) rather than as transformers' "set ignore_mismatched_sizes".
* transformers' own load report is silenced during the load (its findings are this module's message); its
  "Loading weights" bar only shows when lsr logs at INFO (``-v``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

__all__ = ["CheckpointError", "check_vocabulary", "load_model", "tokenizer_size"]

log = logging.getLogger(__name__)
_SHOWN = 3  # weight names quoted in a message


class CheckpointError(ValueError):
    """A checkpoint that would load only in part (missing or mis-shaped weights, a tokenizer past the embedding)."""


def _not_a_load_report(record: logging.LogRecord) -> bool:
    """False for transformers' load report and its tied-weight notes (this module reports those findings)."""
    text = str(record.msg)
    return "LOAD REPORT" not in text and "tied weights mapping" not in text


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' load report (and, unless lsr logs at INFO, its progress bar) off for the block."""
    from transformers.utils import logging as hf_logging

    # a filter, not a level: transformers reads that logger's level to decide on other warnings
    report = logging.getLogger("transformers.modeling_utils")
    bars = hf_logging.is_progress_bar_enabled()
    report.addFilter(_not_a_load_report)
    if not logging.getLogger("lsr").isEnabledFor(logging.INFO):
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        report.removeFilter(_not_a_load_report)
        if bars:
            hf_logging.enable_progress_bar()


def load_model(auto: Any, name: str, **kw: Any) -> nn.Module:
    """``auto.from_pretrained(name, **kw)``, refused with a ``CheckpointError`` when weights are missing or
    mis-shaped (see the module doc)."""
    with _quiet_transformers():
        model, info = auto.from_pretrained(name, output_loading_info=True, ignore_mismatched_sizes=True, **kw)
    _check_shapes(name, model, info.get("mismatched_keys") or ())
    _check_missing(name, model, set(info.get("missing_keys") or ()), sorted(info.get("unexpected_keys") or ()))
    if info.get("unexpected_keys"):
        log.info("%s: %d checkpoint weights are not used by %s (e.g. %s)", name, len(info["unexpected_keys"]),
                 type(model).__name__, ", ".join(sorted(info["unexpected_keys"])[:_SHOWN]))
    return model


def _names(keys: list[str]) -> str:
    return ", ".join(keys[:_SHOWN]) + (f" and {len(keys) - _SHOWN} more" if len(keys) > _SHOWN else "")


def _module_name(model: nn.Module, module: nn.Module | None) -> str | None:
    return next((n for n, m in model.named_modules() if m is module), None) if module is not None else None


def _check_missing(name: str, model: nn.Module, missing: set[str], unexpected: list[str]) -> None:
    """Refuse weights the checkpoint lacks, unless tied to one it has (shared tensor, loaded under another name)."""
    tensors = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers(remove_duplicate=False))
    aliases: dict[int, set[str]] = {}
    for key, t in tensors.items():
        aliases.setdefault(id(t), set()).add(key)
    absent = sorted(k for k in missing if k not in tensors or aliases[id(tensors[k])] <= missing)
    if not absent:
        return
    base, embed = model.base_model_prefix, _module_name(model, model.get_input_embeddings())
    in_head = [k for k in absent if base and not k.startswith(base + ".")]  # BERT's cls.*, a causal LM's lm_head.*
    in_embed = [k for k in absent if embed and k.startswith(embed + ".")]
    masked = type(model).__name__.endswith("ForMaskedLM")
    parts = [("the MLM head" if masked else "the LM head") if in_head else "", "the input embedding" if in_embed else ""]
    what = " and ".join(p for p in parts if p) or "weights of the model's layers"
    fix = "re-save the complete model with save_pretrained"
    head = _module_name(model, model.get_output_embeddings())
    if in_head == [f"{head}.weight"] and not in_embed and not getattr(model.config, "tie_word_embeddings", False):
        fix = f'if its LM head is the input embedding, set "tie_word_embeddings": true in its config.json; otherwise {fix}'
    elif in_head and masked:
        fix += " of the masked LM (a base model saved without its MLM head cannot weigh vocabulary terms)"
    stray = f"; {len(unexpected)} checkpoint weights match no parameter (e.g. {unexpected[0]})" if unexpected else ""
    raise CheckpointError(f"{name}: the checkpoint lacks {what} ({_names(absent)}): transformers would start "
                          f"{'them' if len(absent) > 1 else 'it'} at random and every vector would be noise{stray}; "
                          f"{fix}")


def _check_shapes(name: str, model: nn.Module, mismatched: Any) -> None:
    """Refuse weights whose shape differs from the one config.json implies (vocab_size first)."""
    rows = sorted((str(k), tuple(a), tuple(b)) for k, a, b in mismatched)
    if not rows:
        return
    vocab = getattr(model.config, "vocab_size", None)
    for key, ckpt, built in rows:
        if ckpt and built and built[0] == vocab and ckpt[0] != vocab:
            raise CheckpointError(f"{name}: config.json says vocab_size {vocab} but the weights have {ckpt[0]} rows "
                                  f"({key} is {list(ckpt)}); set \"vocab_size\": {ckpt[0]} in its config.json (or "
                                  "re-save the model with save_pretrained)")
    key, ckpt, built = rows[0]
    raise CheckpointError(f"{name}: the weights do not fit config.json: {key} is {list(ckpt)} in the checkpoint but "
                          f"{list(built)} by the config ({_names([r[0] for r in rows])}); correct config.json to the "
                          "weights' shapes or re-save the model with save_pretrained")


def tokenizer_size(tokenizer: Any) -> int:
    """The number of token ids a tokenizer can emit (its largest id + 1, added tokens included)."""
    return max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)


_RESIZE = ("use the tokenizer saved with this model, or resize the embedding to the tokenizer "
           "(model.resize_token_embeddings(len(tokenizer))), train it and re-save")


def check_vocabulary(name: str, tokenizer: Any, rows: int, what: str = "the model's embedding",
                     fix: str = _RESIZE) -> None:
    """Refuse a tokenizer that emits ids at or past ``rows`` (the rows of ``what``), with ``fix``."""
    size = tokenizer_size(tokenizer)
    if size > rows:
        raise CheckpointError(f"{name}: the tokenizer has {size} tokens but {what} has {rows} rows (ids "
                              f"{rows}..{size - 1} have none): {fix}")
