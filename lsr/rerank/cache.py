"""On-disk cache of document token embeddings, keyed by document id and model fingerprint.

Layout: ``ROOT/<fingerprint>/part-NNNNN.safetensors``, each part holding ``embeddings`` float16 [T, dim] (the
kept tokens of its documents, concatenated), ``offsets`` int64 [n + 1] and, in the safetensors metadata, the
document ids (JSON). Parts are written atomically and never modified, so an interrupted run keeps every
finished part and a later run encodes only what is missing. No pickle anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

__all__ = ["DocEmbeddingCache"]

STORE_DTYPE = torch.float16  # unit vectors: fp16 keeps more mantissa than bf16, half of fp32's bytes


class DocEmbeddingCache:
    """``get(ids)`` -> list of [n_i, dim] float16 CPU tensors (None where not cached); ``add(ids, embs)``.

    ``root=None`` keeps everything in memory (nothing is written)."""

    def __init__(self, root: str | Path | None, fingerprint: str) -> None:
        self.dir = Path(root) / fingerprint if root is not None else None
        self._where: dict[str, tuple[int, int]] = {}   # doc id -> (part, row)
        self._parts: list[tuple[torch.Tensor, torch.Tensor]] = []  # loaded lazily: (embeddings, offsets)
        self._paths: list[Path | None] = []
        if self.dir is not None and self.dir.is_dir():
            from safetensors import safe_open

            for path in sorted(self.dir.glob("part-*.safetensors")):
                with safe_open(str(path), framework="pt") as f:
                    ids = json.loads((f.metadata() or {}).get("ids", "[]"))
                self._register(ids, path, None)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, doc_id: str) -> bool:
        return doc_id in self._where

    def _register(self, ids: Sequence[str], path: Path | None, loaded) -> None:
        part = len(self._paths)
        self._paths.append(path)
        self._parts.append(loaded)
        for row, doc_id in enumerate(ids):
            self._where.setdefault(doc_id, (part, row))

    def _part(self, part: int) -> tuple:
        """(embeddings, offsets): tensors for parts made in this process, else a slice view of the open file
        (only the rows asked for are read, so a large cache is never loaded whole)."""
        if self._parts[part] is None:
            from safetensors import safe_open

            f = safe_open(str(self._paths[part]), framework="pt")
            self._parts[part] = (f.get_slice("embeddings"), f.get_tensor("offsets"))
        return self._parts[part]

    def get(self, ids: Sequence[str]) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        for doc_id in ids:
            hit = self._where.get(doc_id)
            if hit is None:
                out.append(None)
                continue
            emb, off = self._part(hit[0])
            out.append(emb[int(off[hit[1]]):int(off[hit[1] + 1])])
        return out

    def add(self, ids: Sequence[str], embeddings: Sequence[torch.Tensor]) -> None:
        """Store one part (embeddings rounded to float16; what ``get`` returns from now on)."""
        if not ids:
            return
        lengths = torch.tensor([e.shape[0] for e in embeddings], dtype=torch.int64)
        offsets = torch.zeros(len(ids) + 1, dtype=torch.int64)
        offsets[1:] = torch.cumsum(lengths, 0)
        flat = torch.cat([e.detach().to("cpu", STORE_DTYPE) for e in embeddings]).contiguous()
        path = None
        if self.dir is not None:
            from safetensors.torch import save

            from lsr.storage.files import atomic_write_bytes

            n = len(self._paths)
            while (self.dir / f"part-{n:05d}.safetensors").exists():  # never replace a finished part
                n += 1
            path = self.dir / f"part-{n:05d}.safetensors"
            blob = save({"embeddings": flat, "offsets": offsets}, metadata={"ids": json.dumps(list(ids))})
            with atomic_write_bytes(path) as f:
                f.write(blob)
        self._register(ids, path, (flat, offsets))
