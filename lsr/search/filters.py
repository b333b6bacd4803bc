"""``DocFilter``: which documents a search may return (guide: docs/guide/filters.md).

A filter is built from docno lists (``allow`` / ``deny``), a boolean ``mask`` over the index's documents or an
expression over the metadata columns kept beside the index (``where("year >= 2015 and lang == 'en'")``,
``lsr.index.filter_expr``), combined with ``&``, ``|`` and ``~``. ``resolve`` turns it into one boolean mask
over the index's document indices; the search routes (``lsr.search.filtered``) only ever see that mask.

Docnos of an ``allow`` / ``deny`` list that the index does not hold are an error naming a few of them (a typo or
another collection's ids would otherwise silently filter everything out); ``missing="ignore"`` skips them, for
lists that legitimately span several indexes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

if TYPE_CHECKING:  # pragma: no cover
    from lsr.index.filter_expr import FilterExpr

__all__ = ["DocFilter", "FilterInput", "as_filter", "filter_of", "mask_key", "read_docnos"]

_MISSING = ("error", "ignore")


@dataclass(frozen=True, eq=False)
class DocFilter:
    """A filter over an index's documents; build one with the class methods and combine with ``& | ~``."""

    kind: str
    docnos: pa.Array | None = None          # allow / deny
    bits: np.ndarray | None = None          # mask
    expr: FilterExpr | None = None          # where
    parts: tuple[DocFilter, ...] = ()       # and / or / not
    missing: str = "error"

    # ------------------------------------------------------------------ building
    @classmethod
    def allow(cls, docnos: Iterable[str], missing: str = "error") -> DocFilter:
        """Only these documents (docnos); ``missing="ignore"`` skips docnos the index does not hold."""
        return cls("allow", docnos=_docno_array(docnos), missing=_check_missing(missing))

    @classmethod
    def deny(cls, docnos: Iterable[str], missing: str = "error") -> DocFilter:
        """Every document but these (e.g. the ones a user has seen)."""
        return cls("deny", docnos=_docno_array(docnos), missing=_check_missing(missing))

    @classmethod
    def mask(cls, allowed: Sequence[bool] | np.ndarray | torch.Tensor) -> DocFilter:
        """The documents whose entry is True: one entry per document index of the index searched."""
        bits = allowed.detach().cpu().numpy() if isinstance(allowed, torch.Tensor) else np.asarray(allowed)
        if bits.ndim != 1 or bits.dtype != np.bool_:
            raise ValueError(f"a filter mask is a 1-d boolean array (one entry per document), got dtype {bits.dtype} "
                             f"and shape {tuple(bits.shape)}")
        return cls("mask", bits=bits)

    @classmethod
    def where(cls, expression: str | FilterExpr) -> DocFilter:
        """The documents whose metadata columns satisfy ``expression`` (``lsr.index.filter_expr``)."""
        from lsr.index.filter_expr import parse_filter

        return cls("where", expr=parse_filter(expression) if isinstance(expression, str) else expression)

    def __and__(self, other: DocFilter) -> DocFilter:
        return DocFilter("and", parts=(self, as_filter(other)))

    def __or__(self, other: DocFilter) -> DocFilter:
        return DocFilter("or", parts=(self, as_filter(other)))

    def __invert__(self) -> DocFilter:
        return DocFilter("not", parts=(self,))

    # ------------------------------------------------------------------ resolving
    def resolve(self, docnos: pa.Array, metadata: pa.Table | Callable[[], pa.Table | None] | None = None) -> np.ndarray:
        """The mask of allowed documents, bool [n_docs], for an index whose docnos are ``docnos`` (in document
        order) and whose metadata columns are ``metadata`` (rows in document order; or a function returning them,
        called only when an expression reads them: an index folder's columns are not read for other filters)."""
        n = len(docnos)
        if self.kind in ("allow", "deny"):
            hit = pc.is_in(docnos, value_set=self.docnos).to_numpy(zero_copy_only=False)
            if self.missing == "error":
                _check_known(self.docnos, docnos, int(hit.sum()), self.kind)
            return hit if self.kind == "allow" else ~hit
        if self.kind == "mask":
            if len(self.bits) != n:
                raise ValueError(f"a filter mask has {len(self.bits)} entries, the index {n} documents: "
                                 "give one entry per document index")
            return self.bits
        if self.kind == "where":
            if callable(metadata):
                metadata = metadata()
            if metadata is None:
                raise ValueError(f"filter {str(self.expr)!r} reads metadata columns, and this index has none: attach "
                                 "them with `lsr index --metadata CORPUS` (or filter by docnos)")
            return np.asarray(self.expr.evaluate(metadata), dtype=np.bool_)
        masks = [p.resolve(docnos, metadata) for p in self.parts]
        if self.kind == "not":
            return ~masks[0]
        return (np.logical_and if self.kind == "and" else np.logical_or).reduce(masks)

    def reads_metadata(self) -> bool:
        """Whether resolving needs the index's metadata columns."""
        return self.kind == "where" or any(p.reads_metadata() for p in self.parts)

    def __str__(self) -> str:
        if self.kind in ("allow", "deny"):
            return f"{self.kind} {len(self.docnos):,} docnos"
        if self.kind == "mask":
            return f"mask of {int(self.bits.sum()):,} / {len(self.bits):,} documents"
        if self.kind == "where":
            return str(self.expr)
        if self.kind == "not":
            return f"not ({self.parts[0]})"
        return f" {self.kind} ".join(f"({p})" for p in self.parts)


FilterInput = DocFilter | np.ndarray | torch.Tensor | str


def as_filter(value: FilterInput) -> DocFilter:
    """A ``DocFilter`` from a filter, a boolean mask (array or tensor) or a metadata expression (str)."""
    if isinstance(value, DocFilter):
        return value
    if isinstance(value, str):
        return DocFilter.where(value)
    if isinstance(value, (np.ndarray, torch.Tensor, list, tuple)):
        return DocFilter.mask(value)
    raise TypeError(f"a filter is a DocFilter, a boolean mask or a metadata expression (str), got {type(value).__name__}")


def read_docnos(path: str | os.PathLike) -> list[str]:
    """A docno list file: one docno per line (a UTF-8 BOM, surrounding spaces and blank lines are ignored)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text at byte {e.start} (a docno list holds one docno per line)") from None
    return [line.strip() for line in text.splitlines() if line.strip()]


def filter_of(where: str | None = None, allow_docnos: str | os.PathLike | None = None,
              deny_docnos: str | os.PathLike | None = None, missing: str = "error") -> DocFilter | None:
    """The filter of a metadata expression and docno list files (all that are given must hold), or None: what
    ``lsr search --filter / --allow-docnos / --deny-docnos`` and a run config's ``filter:`` section give."""
    parts = [DocFilter.where(where)] if where else []
    if allow_docnos:
        parts.append(DocFilter.allow(read_docnos(allow_docnos), missing))
    if deny_docnos:
        parts.append(DocFilter.deny(read_docnos(deny_docnos), missing))
    out = parts[0] if parts else None
    for p in parts[1:]:
        out = out & p
    return out


def _docno_array(docnos: Iterable[str]) -> pa.Array:
    if isinstance(docnos, str):
        raise TypeError("a docno list is a list of docnos, got one str: wrap it in a list")
    arr = docnos if isinstance(docnos, (pa.Array, pa.ChunkedArray)) else pa.array(list(docnos), type=pa.large_string())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_string(arr.type) and not pa.types.is_large_string(arr.type):
        raise ValueError(f"docnos are strings, got an array of {arr.type}")
    if arr.null_count:
        raise ValueError(f"a docno list holds {arr.null_count} missing (null) docnos: drop them")
    return arr.cast(pa.large_string())


def _check_missing(missing: str) -> str:
    if missing not in _MISSING:
        raise ValueError(f"missing must be one of {_MISSING}, got {missing!r}")
    return missing


def _check_known(listed: pa.Array, docnos: pa.Array, n_hit: int, kind: str) -> None:
    """One line naming up to 3 listed docnos the index lacks (``n_hit``: the index's docs the list holds)."""
    if n_hit >= len(pc.unique(listed)):
        return
    unknown = pc.filter(listed, pc.invert(pc.is_in(listed, value_set=docnos)))
    unknown = pc.unique(unknown).to_pylist()
    shown = ", ".join(repr(d) for d in unknown[:3]) + (", ..." if len(unknown) > 3 else "")
    raise ValueError(f"{len(unknown):,} docno(s) of the {kind} list are not in the index ({shown}): check the list, or "
                     "pass missing='ignore' (lsr search --filter-missing ignore) to skip them")


def mask_key(mask: np.ndarray) -> bytes:
    """A cache key of a resolved mask (its packed bits' digest)."""
    import hashlib

    return hashlib.blake2b(np.packbits(mask).tobytes(), digest_size=16).digest() + len(mask).to_bytes(8, "little")

