"""The dataset record every source returns: queries and qrels in memory, documents streamed.

Sources (``lsr.data.sources`` for local folders and the shipped topics, ``lsr.data.irds``, ``lsr.data.hf``)
build a :class:`Dataset`; this module holds only what they share, so that none of them imports another.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LOCAL_HINT", "OFFLINE_VARS", "Dataset", "DatasetUnavailableError", "DocsIter", "Qrels", "offline"]

Qrels = dict[str, dict[str, int]]
DocsIter = Iterator[tuple[str, str]]

OFFLINE_VARS = ("LSR_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
LOCAL_HINT = ("or use a local folder: load_dataset('path/to/folder[:split]') with the BEIR layout (corpus.jsonl, "
               "queries.jsonl, qrels/<split>.tsv) or the TSV layout (collection.tsv, queries.tsv, qrels.tsv)")


class DatasetUnavailableError(FileNotFoundError):
    """The data a dataset needs is not on this machine (and could not or may not be downloaded)."""


@dataclass
class Dataset:
    """Queries and qrels in memory; documents streamed by :meth:`docs_iter`."""

    name: str
    queries: dict[str, str]
    qrels: Qrels
    n_docs: int | None = None
    docs_source: Callable[[], DocsIter] | None = field(default=None, repr=False, compare=False)
    # where the documents come from (lsr.storage.provenance: file path, size and mtime, or an ir_datasets id),
    # recorded with every artefact made from them so that none is reused for other documents
    docs_origin: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def docs_iter(self) -> DocsIter:
        """Iterate ``(doc_id, text)`` in collection order; raises if the documents are unavailable."""
        if self.docs_source is None:
            raise DatasetUnavailableError(f"dataset {self.name!r} has no documents")
        return self.docs_source()

    @property
    def docs(self) -> DocsIter:
        """Same as :meth:`docs_iter` (a fresh iterator each time)."""
        return self.docs_iter()



def offline() -> bool:
    """Whether an offline variable (``OFFLINE_VARS``) is set to anything but empty / 0 / false / no."""
    return any(os.environ.get(v, "").strip().lower() not in ("", "0", "false", "no") for v in OFFLINE_VARS)
