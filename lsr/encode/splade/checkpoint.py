"""Loading a Hugging Face masked-LM checkpoint for SPLADE: the model cut before its decoder, its tokenizer.

* ``MaskedLMTower``: one checkpoint as backbone + MLM transform (``body``) and decoder (``weight``, ``bias``),
  with its vocabulary, padding id and position limit (decoder LLMs: ``lsr.encode.splade.causal.CausalLMTower``).
* ``mask_terms``: zero the vocabulary entries a tower masks (``term_mask``) in pooled [B, V] weights.
* ``TextTokenizer``: texts -> token id arrays (a private, thread-safe copy of the fast tokenizer; worker
  processes through ``tokenize_pool``).
* ``resolve_local_files_only``: offline rules (HF_HUB_OFFLINE, an unreachable hub) with a one-line message
  saying what to place where when a model is missing.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import urllib.parse
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lsr.encode.backbone.varlen_body import VarlenBody
from lsr.encode.splade.load_checks import CheckpointError, check_vocabulary, load_model
from lsr.encode.tokenize.pool import TokenizerPool, load_tokenizer, tokenize_function

__all__ = ["NO_LIMIT", "MaskedLMTower", "TextTokenizer", "downloads_off", "mask_terms", "resolve_dtype",
           "resolve_local_files_only", "tokenizer_facts"]

_TRUE = {"1", "ON", "YES", "TRUE"}
NO_LIMIT = 1_000_000  # a max length at or above this means "no limit"


def resolve_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
    out = getattr(torch, names.get(dtype, dtype), None)
    if not isinstance(out, torch.dtype):
        raise TypeError(f"unknown dtype {dtype!r} (use bfloat16, float16 or float32)")
    return out


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Can a TCP connection to the hub endpoint be opened within ``timeout`` s? (no HTTP request)."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # a proxy decides; huggingface_hub's own timeouts apply
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)),
                                      timeout=timeout):
            return True
    except OSError:
        return False


def downloads_off(local_files_only: bool | None) -> tuple[bool, str]:
    """(True, why) when nothing may be downloaded: ``local_files_only=True``, HF_HUB_OFFLINE /
    TRANSFORMERS_OFFLINE set, or (for None) the hub unreachable."""
    if local_files_only is not None:
        return local_files_only, "local_files_only=True"
    offline = [k for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if os.environ.get(k, "").upper() in _TRUE]
    if offline:
        return True, f"{offline[0]}=1"
    return not _hub_reachable(), "the Hugging Face hub is unreachable"


def resolve_local_files_only(name: str, local_files_only: bool | None, revision: str | None) -> bool:
    """Decide whether to load ``name`` from disk only; fail fast with a clear message when the model
    is neither a directory nor cached and downloading is impossible (instead of hub retries)."""
    p = Path(name).expanduser()
    if p.is_dir():
        return True
    if p.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise FileNotFoundError(f"{name!r} is not a model directory (expected a save_pretrained() folder "
                                "with config.json, the weights and the tokenizer files)")
    local_files_only, why = downloads_off(local_files_only)
    if not local_files_only:
        return False
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name, revision=revision, local_files_only=True)
    except OSError as e:
        from huggingface_hub import constants

        raise OSError(f"model {name!r} is not a local directory and is not in the Hugging Face cache "
                      f"({constants.HF_HUB_CACHE}), and downloads are off ({why}). Download it where the hub "
                      f"is reachable (`hf download {name}`) and copy the cache or a save_pretrained() "
                      "directory here, then pass that path (or unset HF_HUB_OFFLINE when online).") from e
    return True


def tokenizer_facts(tokenizer: Any, vocab_size: int) -> tuple[list[str], int, int | None]:
    """(term id -> token for ``vocab_size`` ids, padding id, length limit or None) of a HF tokenizer.
    Ids the tokenizer lacks (decoders may pad V past it) get placeholder names."""
    inverse = {i: t for t, i in tokenizer.get_vocab().items()}
    vocab = [inverse.get(i, f"[id{i}]") for i in range(vocab_size)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    limit = tokenizer.model_max_length  # tokenizers without a limit report ~1e30
    return vocab, pad_id, int(limit) if limit and limit < NO_LIMIT else None


def mask_terms(y: torch.Tensor, term_mask: torch.Tensor | None) -> torch.Tensor:
    """Pooled weights [B, V] with the entries of ``term_mask`` (bool [V], True = dropped) set to 0 (differentiable;
    ``y`` itself when there is no mask)."""
    return y if term_mask is None else y.masked_fill(term_mask, 0)


class TextTokenizer:
    """texts -> token ids truncated to ``max_length`` with the tokenizer's special tokens.

    Uses a private copy of the Rust tokenizer configured once (truncation on, padding off), so
    calls from a worker thread never race with the HF wrapper mutating its settings; ``pool`` starts
    worker processes holding the same copy."""

    def __init__(self, tokenizer: Any, max_length: int, add_special_tokens: bool = True) -> None:
        self.tokenizer, self.max_length, self.add_special_tokens = tokenizer, max_length, add_special_tokens
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._fast = None
        if backend is not None:
            spec = backend.to_str()
            if not add_special_tokens:  # the post-processor is what adds [CLS] / [SEP] (<s> / </s>)
                spec = json.dumps({**json.loads(spec), "post_processor": None})
            self._fast = load_tokenizer(spec, max_length)
            self._tokenize = tokenize_function(spec, max_length)

    def __call__(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """-> (flat int32 [sum lengths] token ids, lengths int64 [n])."""
        texts = texts if isinstance(texts, list) else list(texts)
        if self._fast is not None:
            return self._tokenize(texts)  # bulk WordPiece or Rust: lsr.encode.tokenize.pool.tokenize_function
        ids = self.tokenizer(texts, truncation=True, max_length=self.max_length,
                             add_special_tokens=self.add_special_tokens)["input_ids"]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        return np.fromiter(itertools.chain.from_iterable(ids), np.int32, int(lengths.sum())), lengths

    def pool(self, workers: int, **options: Any) -> TokenizerPool | None:
        """Worker processes tokenizing like this object (None for a slow, Python-only tokenizer); ``options``:
        ``TokenizerPool``'s ``chunk`` / ``pipe_bytes``."""
        return None if self._fast is None else TokenizerPool(self._fast.to_str(), self.max_length, workers, **options)


class MaskedLMTower:
    """One masked-LM checkpoint: ``body`` (backbone + MLM transform: the model with its decoder
    replaced by an identity, so ``.logits`` are the transformed hidden states [B, S, D]) and the
    decoder's ``weight`` [V, D] / ``bias`` [V].

    ``pooling`` ("max" | "sum") and ``activation`` (sentence-transformers' names: "relu" gives
    log1p(relu(x)), "log1p_relu" gives log1p(log1p(relu(x)))) say how the encoder pools the logits;
    plain checkpoints are max / relu, sentence-transformers ``SpladePooling`` configs may differ."""

    static = False  # a model-free (token weight table) tower is ``lsr.encode.splade.st_checkpoint.StaticTower``
    auto_class = "AutoModelForMaskedLM"  # the transformers class that loads the checkpoint
    attention: str | None = None  # decoder towers: "causal" | "bidirectional"; masked LMs attend both ways
    term_mask: torch.Tensor | None = None  # bool [V]: vocabulary entries whose weight is always 0 (None: none)

    def __init__(self, name: str, device: torch.device, dtype: torch.dtype, local_files_only: bool | None,
                 revision: str | None, attn_implementation: str | None) -> None:
        import transformers

        self.check_folder(name)
        kw = {"revision": revision, "local_files_only": resolve_local_files_only(name, local_files_only, revision)}
        self.name = name
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(name, **kw)
        auto = getattr(transformers, self.auto_class)
        try:  # missing or mis-shaped weights are refused, tied heads recognised: lsr.encode.splade.load_checks
            model = load_model(auto, name, dtype=dtype, attn_implementation=attn_implementation, **kw)
        except CheckpointError:
            raise
        except (ValueError, ImportError):  # this architecture has no such attention implementation
            model = load_model(auto, name, dtype=dtype, **kw)
        check_vocabulary(name, self.tokenizer, model.get_input_embeddings().weight.shape[0])
        model.to(device).eval()
        decoder = model.get_output_embeddings()
        if not isinstance(decoder, nn.Linear):
            raise NotImplementedError(f"{type(model).__name__}: the output embedding is {type(decoder).__name__}, "
                                      "not a Linear decoder; cannot build a SPLADE head")
        self.weight, self.bias = decoder.weight.detach(), (decoder.bias.detach() if decoder.bias is not None else None)
        self._decoder_slots = [(module, child_name, decoder) for module in model.modules()
                               for child_name, child in module.named_children() if child is decoder]
        for module, child_name, _ in self._decoder_slots:  # detach the decoder; the rest of the head stays
            setattr(module, child_name, nn.Identity())
        self.model = self.body = model  # ``body`` may become a compiled wrapper; ``model`` stays the module
        self.pooling, self.activation = "max", "relu"
        self.varlen = VarlenBody.from_model(model)  # padding-free forward, None for other architectures
        self.architecture = type(model).__name__
        self.revision = getattr(model.config, "_commit_hash", None) or revision
        V = self.weight.shape[0]
        self.vocab, self.pad_id, self.max_positions = tokenizer_facts(self.tokenizer, V)

    @staticmethod
    def check_folder(name: str) -> None:
        """A local folder must hold a Hugging Face checkpoint (config.json); hub ids pass."""
        if Path(name).is_dir() and not (Path(name) / "config.json").is_file():
            raise FileNotFoundError(f"{name} has no config.json: not a Hugging Face checkpoint folder; give a folder "
                                    "with config.json, the weights and the tokenizer (save_pretrained writes one), "
                                    "or a hub id")

    @contextmanager
    def decoder_attached(self) -> Iterator[nn.Module]:
        """The whole model, its decoder back in place, for the duration of the block (saving, checks)."""
        for module, child_name, decoder in self._decoder_slots:
            setattr(module, child_name, decoder)
        try:
            yield self.model
        finally:
            for module, child_name, _ in self._decoder_slots:
                setattr(module, child_name, nn.Identity())

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        """Write the whole model (decoder included) and the tokenizer with ``save_pretrained``."""
        with self.decoder_attached() as model:
            model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
