"""ColBERT-style late-interaction encoder: HF encoder -> linear projection -> L2 normalisation, per token.

Tokenisation follows ColBERT / PyLate: a marker token is inserted after the first special token
(``[CLS] [Q] query ... [SEP]``, ``[CLS] [D] passage ... [SEP]``); queries are padded to ``query_length`` with
the mask token (query augmentation), whose embeddings take part in scoring (the encoder attends to them only
when ``attend_to_expansion_tokens``); document tokens in the skiplist (punctuation) and padding are dropped.

Two checkpoint layouts are read:

* PyLate (sentence-transformers): ``modules.json`` = [Transformer, Dense]; the Dense folder holds
  ``config.json`` (in/out features, bias, Identity activation) and ``linear.weight``; the ColBERT settings
  come from ``config_sentence_transformers.json`` (query_prefix, document_prefix, query_length,
  document_length, do_query_expansion, attend_to_expansion_tokens, skiplist_words).
* colbert-ir (``HF_ColBERT``): a plain HF folder whose weights hold ``bert.*`` and ``linear.weight``;
  settings from ``artifact.metadata`` when present (query_maxlen, doc_maxlen, mask_punctuation,
  attend_to_mask_tokens, query_token_id, doc_token_id), ColBERTv2's defaults otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import string
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

__all__ = ["ColbertEncoder", "ColbertSettings", "read_colbert_checkpoint"]


@dataclass(frozen=True)
class ColbertSettings:
    query_prefix: str = "[unused0]"
    document_prefix: str = "[unused1]"
    query_length: int = 32
    document_length: int = 180
    do_query_expansion: bool = True
    attend_to_expansion_tokens: bool = False
    skiplist_words: tuple[str, ...] = field(default_factory=lambda: tuple(string.punctuation))


@dataclass(frozen=True)
class ColbertCheckpoint:
    body: Path                  # folder AutoModel loads
    projection: Path            # safetensors / bin file holding linear.weight (+ linear.bias)
    settings: ColbertSettings


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); re-save the checkpoint") from None


def _weights_file(folder: Path) -> Path:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{folder} has no model.safetensors or pytorch_model.bin: not a complete checkpoint")


def _local_folder(name: str) -> Path:
    """``name`` as a folder: a local directory, or a hub repository taken from the cache / downloaded."""
    p = Path(name).expanduser()
    if p.is_dir():
        return p
    if p.exists() or name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise FileNotFoundError(f"late-interaction checkpoint {name!r} not found (a local folder or a hub id)")
    from huggingface_hub import snapshot_download

    from lsr.encode.splade.checkpoint import downloads_off

    offline, why = downloads_off(None)
    try:
        return Path(snapshot_download(name, local_files_only=offline))
    except Exception as e:  # noqa: BLE001 - hub errors of every kind: one message
        raise OSError(f"checkpoint {name!r} is not a local folder and could not be fetched from the hub "
                      f"({why if offline else type(e).__name__}): pass the path of a downloaded copy") from None


def read_colbert_checkpoint(folder: str | os.PathLike) -> ColbertCheckpoint:
    """Find the encoder body, the projection weights and the ColBERT settings of a checkpoint folder."""
    folder = _local_folder(str(folder))
    if (folder / "modules.json").is_file():
        modules = _json(folder / "modules.json")
        kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
        if len(modules) != 2 or kinds[0] != "Transformer" or kinds[1] != "Dense":
            raise ValueError(f"{folder / 'modules.json'}: expected a PyLate model [Transformer, Dense], got {kinds}")
        dense = folder / modules[1].get("path", "")
        act = _json(dense / "config.json").get("activation_function", "torch.nn.modules.linear.Identity")
        if not str(act).endswith("Identity"):
            raise ValueError(f"{dense}: Dense activation {act} is not supported (only Identity, as ColBERT uses)")
        st = folder / "config_sentence_transformers.json"
        cfg = _json(st) if st.is_file() else {}
        known = {k: cfg[k] for k in ColbertSettings.__dataclass_fields__ if cfg.get(k) is not None}
        if "skiplist_words" in known:
            known["skiplist_words"] = tuple(known["skiplist_words"])
        settings = ColbertSettings(**({"query_prefix": "[Q] ", "document_prefix": "[D] "} | known))
        return ColbertCheckpoint(folder / modules[0].get("path", ""), _weights_file(dense), settings)
    meta_path = folder / "artifact.metadata"
    meta = _json(meta_path) if meta_path.is_file() else {}
    settings = ColbertSettings(
        query_prefix=meta.get("query_token_id", "[unused0]"), document_prefix=meta.get("doc_token_id", "[unused1]"),
        query_length=int(meta.get("query_maxlen", 32)), document_length=int(meta.get("doc_maxlen", 180)),
        attend_to_expansion_tokens=bool(meta.get("attend_to_mask_tokens", False)),
        skiplist_words=tuple(string.punctuation) if meta.get("mask_punctuation", True) else ())
    return ColbertCheckpoint(folder, _weights_file(folder), settings)


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(path, map_location="cpu", weights_only=True)  # weights only: no code runs


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


class ColbertEncoder:
    """Token embeddings of queries and documents; ``fingerprint`` names the model + settings + dtype."""

    def __init__(self, checkpoint: str | os.PathLike, device: str | torch.device = "cpu",
                 dtype: torch.dtype | str | None = None, query_length: int | None = None,
                 document_length: int | None = None) -> None:
        from transformers import AutoModel, AutoTokenizer

        from lsr.encode.splade.checkpoint import resolve_dtype

        ckpt = read_colbert_checkpoint(checkpoint)
        s = ckpt.settings
        overrides = {k: v for k, v in (("query_length", query_length), ("document_length", document_length)) if v}
        self.settings = s = ColbertSettings(**(asdict(s) | overrides))
        if s.query_length < 3 or s.document_length < 3:
            raise ValueError("query_length and document_length must be >= 3 (special tokens + marker + text)")
        self.device = torch.device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.tokenizer = AutoTokenizer.from_pretrained(ckpt.body)
        from transformers.utils import logging as hf_logging

        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # colbert-ir: "linear.weight unused" and the unused pooler are expected
        try:
            self.body = AutoModel.from_pretrained(ckpt.body, torch_dtype=self.dtype).to(self.device).eval()
        finally:
            hf_logging.set_verbosity(verbosity)
        weights = _load_tensors(ckpt.projection)
        if "linear.weight" not in weights:
            raise ValueError(f"{ckpt.projection} has no 'linear.weight': not a ColBERT projection")
        self.weight = weights["linear.weight"].to(self.device, self.dtype)
        bias = weights.get("linear.bias")
        self.bias = bias.to(self.device, self.dtype) if bias is not None else None
        if self.weight.shape[1] != self.body.config.hidden_size:
            raise ValueError(f"linear.weight is {list(self.weight.shape)} but the encoder's hidden size is "
                             f"{self.body.config.hidden_size}: the projection belongs to another model")
        self.query_marker = self._token_id(s.query_prefix)
        self.doc_marker = self._token_id(s.document_prefix)
        self.mask_id = self.tokenizer.mask_token_id if self.tokenizer.mask_token_id is not None \
            else self.tokenizer.pad_token_id
        ids = self.tokenizer.convert_tokens_to_ids(list(s.skiplist_words)) if s.skiplist_words else []
        unk = self.tokenizer.unk_token_id
        self.skiplist = torch.tensor(sorted({i for i in ids if i is not None and i != unk}), dtype=torch.long)
        parts = [_file_digest(f) for f in sorted(set(ckpt.body.glob("*.safetensors")) | set(ckpt.body.glob("*.bin"))
                                                  | {ckpt.projection})]
        self.fingerprint = hashlib.sha256(json.dumps([parts, asdict(s), str(self.dtype)]).encode()).hexdigest()[:32]

    @property
    def dim(self) -> int:
        return int(self.weight.shape[0])

    def _token_id(self, prefix: str) -> int:
        for cand in (prefix, prefix.strip()):
            i = self.tokenizer.convert_tokens_to_ids(cand)
            if i is not None and i != self.tokenizer.unk_token_id:
                return int(i)
        raise ValueError(f"marker token {prefix!r} is not in the tokenizer's vocabulary: the checkpoint's tokenizer "
                         "must contain its query/document markers")

    def _tokenize(self, texts: Sequence[str], length: int, marker: int, pad_to_length: bool):
        enc = self.tokenizer(list(texts), max_length=length - 1, truncation=True, return_tensors="pt",
                             padding="max_length" if pad_to_length else True)
        ids, att = enc["input_ids"], enc["attention_mask"]
        ids = torch.cat([ids[:, :1], torch.full_like(ids[:, :1], marker), ids[:, 1:]], dim=1)
        att = torch.cat([att[:, :1], torch.ones_like(att[:, :1]), att[:, 1:]], dim=1)
        return ids, att.bool()

    @torch.inference_mode()
    def _embed(self, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        hidden = self.body(input_ids=ids.to(self.device), attention_mask=attention.to(self.device)).last_hidden_state
        out = torch.nn.functional.linear(hidden, self.weight, self.bias)
        return torch.nn.functional.normalize(out.float(), dim=-1).to(self.dtype)

    def encode_queries(self, texts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """[N, query_length, dim] embeddings and their bool mask (all true with query expansion)."""
        s = self.settings
        ids, att = self._tokenize(texts, s.query_length, self.query_marker, s.do_query_expansion)
        keep = att.clone()
        if s.do_query_expansion:
            ids = ids.masked_fill(~att, self.mask_id)  # padding becomes [MASK]: query augmentation
            keep[:] = True
            if s.attend_to_expansion_tokens:
                att = keep
        return self._embed(ids, att), keep.to(self.device)

    def encode_documents(self, texts: Sequence[str]) -> list[torch.Tensor]:
        """One [n_i, dim] tensor per text: its kept tokens (no padding, no skiplist tokens)."""
        s = self.settings
        ids, att = self._tokenize(texts, s.document_length, self.doc_marker, False)
        emb = self._embed(ids, att)
        keep = att & ~torch.isin(ids, self.skiplist)
        return [e[k.to(self.device)] for e, k in zip(emb, keep)]
