"""InvertedIndex: the GPU inverted index (term-major padded postings + doc-major CSR) and its disk format.

Fields and layout: docs/architecture.md ("Inverted index"). On disk an index is a directory::

    meta.json          {"format": "lsr-index", "version": 1, "vocab_size", "n_docs", "n_postings",
                        "n_padded_postings", "weight_dtype": "float32", "padding": 32, "block_size",
                        "n_blocks", "metadata": {...encoder description...},
                        "files": {"<name>.npy" | "docnos.arrow": {"sha256", "dtype", "shape"}}}
                       compact postings (lsr.index.compact): "version": 2, "postings": "compact",
                       "weight_dtype": "bfloat16" | "float16"; doc_ids.npy / scores.npy hold int16
                       (local id / weight bits). Version 1 is still written for the float32 layout, so
                       older lsr reads those indexes and refuses compact ones by their version.
    doc_ids.npy scores.npy offsets.npy lengths.npy padded_lengths.npy max_scores.npy block_offsets.npy
    doc_indptr.npy doc_indices.npy doc_values.npy        (the doc-major CSR)
    docnos.arrow       Arrow IPC file, one large_string column "docno"

Plain .npy files (never pickled) load with mmap; meta.json is written last, and the directory is
built under ``<path>.tmp-<random>`` and renamed into place, so a reader never sees a partial index.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lsr.index.build import (
    DEFAULT_BLOCK_SIZE,
    PAD,
    POSTING_TENSORS,
    PostingArrays,
    build_postings,
    check_block_size,
    n_blocks_for,
)
from lsr.index.compact import (
    AUTO,
    COMPACT,
    FLOAT32,
    LAYOUTS,
    MAX_COMPACT_BLOCK,
    MIN_COMPACT_BLOCK,
    WEIGHT_DTYPES,
    check_compact_block_size,
    check_compact_postings,
    decode_postings,
    weight_dtype_name,
)
from lsr.sparse import SparseVectors
from lsr.storage.files import atomic_directory, fsynced_write, recover_directory
from lsr.storage.formats import check_format_version
from lsr.storage.provenance import check_replaceable
from lsr.storage.shards import read_manifest, read_vectors, sha256_file

__all__ = ["FORMAT", "VERSION", "InvertedIndex"]

FORMAT = "lsr-index"
VERSION = 2             # read up to this; written: 1 (float32 postings) or 2 (compact postings)
META = "meta.json"
DOCNOS = "docnos.arrow"
METADATA = "metadata.parquet"   # lsr.index.metadata: filter columns attached to the index
_DOC_FIELDS = {"doc_indptr": "indptr", "doc_indices": "indices", "doc_values": "values"}  # file -> CSR member


def _expected_arrays(meta: dict[str, Any]) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """File stem -> (dtype, shape) implied by meta.json's sizes (never trust per-file shapes alone)."""
    P, V, n, nnz, nb = (int(meta[k]) for k in ("n_padded_postings", "vocab_size", "n_docs", "n_postings",
                                                   "n_blocks"))
    i32, i64, f32 = np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float32)
    i16 = np.dtype(np.int16)   # compact: uint16 local ids / 16-bit float weights, as bits
    compact = meta.get("postings", FLOAT32) == COMPACT
    return {"doc_ids": (i16 if compact else i32, (P,)), "scores": (i16 if compact else f32, (P,)),
            "offsets": (i64, (V,)), "lengths": (i32, (V,)), "padded_lengths": (i32, (V,)),
            "max_scores": (f32, (V,)), "block_offsets": (i64, (V, nb + 1)),
            "doc_indptr": (i64, (n + 1,)), "doc_indices": (i32, (nnz,)), "doc_values": (f32, (nnz,))}


def _load_npy(f: Path, entry: dict[str, Any], dtype: np.dtype, shape: tuple[int, ...], mmap: bool,
              verify: bool) -> torch.Tensor:
    if not f.exists():
        raise FileNotFoundError(f"index file {f} is missing")
    if verify and sha256_file(f) != entry.get("sha256"):
        raise ValueError(f"index file {f} fails its sha256 checksum: it is corrupt or was modified")
    try:
        # an empty array cannot be memory-mapped; it costs nothing to read
        arr = np.load(f, mmap_mode="r" if mmap and math.prod(shape) else None, allow_pickle=False)
    except Exception as e:  # truncated header/data, not an .npy file, pickled object array...
        raise ValueError(f"index file {f} cannot be read as a .npy array: {e}") from e
    if arr.dtype != dtype or tuple(arr.shape) != shape:
        raise ValueError(f"index file {f} holds {arr.dtype} {tuple(arr.shape)}, meta.json implies {dtype} {shape}")
    with warnings.catch_warnings():
        # read-only mmap: the tensors share the page cache and are never written by lsr
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


def is_index_file(name: str) -> bool:
    """Whether an entry of an index directory is one ``save`` writes (an overwrite may replace it)."""
    return name in (META, DOCNOS, METADATA) or name.endswith(".npy")


def _weights_ok(t: torch.Tensor, zero_ok: bool) -> bool:
    """Every weight finite and > 0 (>= 0 with ``zero_ok``: padding). Two reductions, no temporary: a NaN makes
    the min NaN, which fails the comparison."""
    if t.numel() == 0:
        return True
    lo, hi = t.min().float(), t.max().float()
    return bool((lo >= 0) if zero_ok else (lo > 0)) and bool(hi < float("inf"))


@dataclass(eq=False)
class InvertedIndex(PostingArrays):
    """Term-major, warp-padded, block-aligned postings (the PostingArrays fields) plus the doc-major
    CSR, on one device.

    Shapes: P padded postings, V = vocab_size terms, NB = n_blocks doc blocks of block_size docs.
    doc_ids int32 [P] (-1 = padding), scores float32 [P] (0 in padding), offsets int64 [V],
    lengths int32 [V], padded_lengths int32 [V], max_scores float32 [V], block_offsets int64 [V, NB + 1];
    ``docs`` is the doc-major SparseVectors whose ids are the docnos.
    """

    docs: SparseVectors
    vocab_size: int
    n_docs: int
    metadata: dict[str, Any] = field(default_factory=dict)

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, vectors: SparseVectors | str | os.PathLike, device: str | torch.device | None = None,
              block_size: int = DEFAULT_BLOCK_SIZE, metadata: dict[str, Any] | None = None, *,
              max_memory_bytes: int | None = None, postings: str = AUTO) -> InvertedIndex:
        """Index document vectors (SparseVectors, or a vector directory written by ``lsr.storage.shards``).

        Args:
            vectors: n docs; their ids become the docnos.
            device: where to build and keep the index (default: the vectors' device).
            block_size: docs per block, a power of two <= 2^20.
            metadata: JSON-serialisable encoder description (default for a vector directory: its
                manifest's metadata); the Searcher compares it with the queries'.
            max_memory_bytes: budget for build temporaries (see ``lsr.index.build.build_postings``).
            postings: "auto" (compact where the weights allow it, else float32), "float32" (8 bytes per
                posting) or "compact" (4 bytes; weights must be exactly bf16 or fp16 values, e.g. vectors
                encoded in bf16: ``lsr.index.compact``). Both give the same search results.
        """
        if not isinstance(vectors, SparseVectors):
            if metadata is None:
                metadata = read_manifest(vectors).get("metadata", {})
            vectors = read_vectors(vectors, device=device or "cpu")
        if device is not None:
            vectors = vectors.to(device)
        metadata = json.loads(json.dumps(metadata or {}))  # fail now, not at save time
        arrays = build_postings(vectors, block_size, max_memory_bytes, postings)
        return cls(**vars(arrays), docs=vectors, vocab_size=vectors.vocab_size, n_docs=len(vectors),
                   metadata=metadata)

    # ------------------------------------------------------------------ basics
    @property
    def docnos(self) -> list[str]:
        """External doc ids, one per doc index."""
        return self.docs.ids

    @property
    def device(self) -> torch.device:
        return self.doc_ids.device

    @property
    def n_postings(self) -> int:
        """Real postings (non-zeros of the collection), without padding."""
        return self.docs.nnz

    @property
    def n_padded_postings(self) -> int:
        """Length of ``doc_ids`` / ``scores``, padding included."""
        return self.doc_ids.numel()

    def _tensors(self) -> dict[str, torch.Tensor]:
        out = {f: getattr(self, f) for f in POSTING_TENSORS}
        out.update({name: getattr(self.docs, member) for name, member in _DOC_FIELDS.items()})
        return out

    def memory_bytes(self) -> int:
        """Bytes held by all tensors (postings and doc-major CSR)."""
        return sum(t.numel() * t.element_size() for t in self._tensors().values())

    def to(self, device: str | torch.device) -> InvertedIndex:
        """A copy of the index on ``device`` (the same object's tensors if already there)."""
        moved = {f: getattr(self, f).to(device) for f in POSTING_TENSORS}
        return InvertedIndex(**moved, docs=self.docs.to(device), vocab_size=self.vocab_size, n_docs=self.n_docs,
                             block_size=self.block_size, n_blocks=self.n_blocks, metadata=dict(self.metadata))

    def term_postings(self, term: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Real postings of one term (debugging): doc ids int32 [lengths[term]] ascending, scores float32."""
        if not 0 <= term < self.vocab_size:
            raise IndexError(f"term {term} is outside the vocabulary [0, {self.vocab_size})")
        a = int(self.offsets[term])
        b = a + int(self.padded_lengths[term])
        d, w = self.doc_ids[a:b], self.scores[a:b]
        if self.postings == COMPACT:
            d, w = decode_postings(d, w, self.block_offsets[term:term + 1] - a, self.block_size)
        keep = d >= 0
        return d[keep], w[keep]

    def __repr__(self) -> str:
        return (f"InvertedIndex(n_docs={self.n_docs}, vocab_size={self.vocab_size}, n_postings={self.n_postings}, "
                f"padded={self.n_padded_postings}, block_size={self.block_size}, postings={self.postings}, "
                f"device={self.device})")

    def check(self) -> None:
        """Cheap structural checks of the per-term arrays (no pass over the postings); ValueError if broken."""
        V, P = self.vocab_size, self.n_padded_postings
        bo = self.block_offsets
        if bo.shape != (V, self.n_blocks + 1) or self.offsets.shape != (V,) or self.docs.vocab_size != V:
            raise ValueError("index arrays disagree with vocab_size / n_blocks")
        if self.n_blocks != n_blocks_for(self.n_docs, self.block_size) or len(self.docs) != self.n_docs:
            raise ValueError("n_blocks / n_docs disagree with block_size and the doc-major CSR")
        if V == 0:
            return
        steps = bo[:, 1:] - bo[:, :-1]
        problems = {
            "offsets[0] != 0": int(self.offsets[0]) != 0,
            "block_offsets[:, 0] != offsets": not torch.equal(bo[:, 0], self.offsets),
            "lists are not contiguous": not torch.equal(bo[1:, 0], bo[:-1, -1]),
            "padded_lengths disagree with block_offsets": not torch.equal(bo[:, -1] - bo[:, 0],
                                                                          self.padded_lengths.long()),
            f"segments not padded to multiples of {PAD}": bool(((steps < 0) | (steps % PAD != 0)).any()),
            "lengths exceed padded_lengths": bool((self.lengths > self.padded_lengths).any()),
            "end of the last list != number of postings": int(bo[-1, -1]) != P,
            "sum of lengths != doc-major nnz": int(self.lengths.long().sum()) != self.docs.nnz,
            "compact postings need 32 <= block_size <= 65536": self.postings == COMPACT and not (
                MIN_COMPACT_BLOCK <= self.block_size <= MAX_COMPACT_BLOCK),
        }
        bad = [k for k, v in problems.items() if v]
        if bad:
            raise ValueError("inconsistent inverted index: " + "; ".join(bad))

    def check_ids(self) -> None:
        """Range checks of every stored id (one vectorised pass): doc ids in the postings within
        [-1, n_docs) (-1 = padding), term ids of the doc-major CSR within [0, vocab_size), its row
        pointer non-decreasing from 0 to nnz. Checksums cannot catch a file edited with its checksum."""
        d, csr = self.doc_ids, self.docs
        problems = []
        if self.postings == COMPACT:
            problems += check_compact_postings(d, self.scores, self.block_size, csr.nnz)
        elif d.numel() and (int(d.min()) < -1 or int(d.max()) >= self.n_docs):
            problems.append(f"posting doc ids span [{int(d.min())}, {int(d.max())}], outside [-1, {self.n_docs})")
        if csr.indices.numel() and (int(csr.indices.min()) < 0 or int(csr.indices.max()) >= self.vocab_size):
            problems.append(f"term ids span [{int(csr.indices.min())}, {int(csr.indices.max())}], outside "
                            f"[0, {self.vocab_size})")
        ip = csr.indptr
        if int(ip[0]) != 0 or int(ip[-1]) != csr.indices.numel() or bool((ip[1:] < ip[:-1]).any()):
            problems.append("the doc-major row pointer is not non-decreasing from 0 to nnz")
        if not _weights_ok(csr.values, zero_ok=False):
            problems.append("the doc-major weights hold NaN, inf or values <= 0")
        if not _weights_ok(self.scores, zero_ok=True):   # 0: padding
            problems.append("the posting weights hold NaN, inf or negative values")
        if problems:
            raise ValueError("inconsistent inverted index: " + "; ".join(problems))

    # ------------------------------------------------------------------ disk
    def save(self, path: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write the index directory ``path`` atomically (see the module docstring for the format).

        With ``overwrite=True`` an existing index at ``path`` is replaced only once the new one is
        complete; if anything fails, the old index stays where it was.
        """
        path = Path(path)
        if path.exists():
            if not overwrite:
                raise FileExistsError(f"{path} already exists; pass overwrite=True (lsr index --overwrite) to replace it")
            if not (path / META).is_file() and not (path.is_dir() and not any(path.iterdir())):
                raise ValueError(f"refusing to overwrite {path}: it is not an lsr index directory")
            check_replaceable(path, is_index_file, "index")
        with atomic_directory(path, overwrite=overwrite) as tmp:
            self._write_files(tmp)
        return path

    def _write_files(self, d: Path) -> None:
        files: dict[str, Any] = {}
        for name, t in self._tensors().items():
            if t.dtype in WEIGHT_DTYPES.values():   # numpy has no bfloat16: 16-bit weights as their bits
                t = t.view(torch.int16)
            arr = t.detach().cpu().numpy()
            f = d / f"{name}.npy"
            fsynced_write(f, lambda fh, a=arr: np.save(fh, a, allow_pickle=False))
            files[f.name] = {"sha256": sha256_file(f), "dtype": str(arr.dtype), "shape": list(arr.shape)}
        table = pa.table({"docno": pa.array(self.docnos, type=pa.large_string())})

        def write_arrow(fh: Any) -> None:
            with pa.ipc.new_file(fh, table.schema) as writer:
                writer.write_table(table)

        fsynced_write(d / DOCNOS, write_arrow)
        files[DOCNOS] = {"sha256": sha256_file(d / DOCNOS), "dtype": "large_string", "shape": [self.n_docs]}
        compact = self.postings == COMPACT
        meta = {"format": FORMAT, "version": 2 if compact else 1, "vocab_size": self.vocab_size,
                "n_docs": self.n_docs, "n_postings": self.n_postings, "n_padded_postings": self.n_padded_postings,
                "postings": self.postings, "weight_dtype": weight_dtype_name(self.scores.dtype), "padding": PAD,
                "block_size": self.block_size, "n_blocks": self.n_blocks, "metadata": self.metadata, "files": files}
        fsynced_write(d / META, lambda fh: fh.write(json.dumps(meta, indent=1).encode()))

    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu", mmap: bool = True,
             verify: bool = True) -> InvertedIndex:
        """Load an index directory written by ``save``.

        Args:
            path: the directory.
            device: where the tensors go; on CPU with ``mmap`` they stay memory-mapped (read-only).
            mmap: map the .npy files instead of reading them.
            verify: check every file's sha256 (reads everything once; skip on huge trusted indexes).

        Raises:
            FileNotFoundError: the directory, meta.json or a listed file is missing.
            ValueError: a corrupt, truncated or inconsistent file (the message names it).
        """
        path = Path(path)
        if not path.exists():
            recover_directory(path)  # an --overwrite publish killed between its two renames: roll back
        meta = cls.read_meta(path)
        try:
            expected = _expected_arrays(meta)
            check_block_size(meta["block_size"])
            if meta.get("postings") == COMPACT:
                check_compact_block_size(meta["block_size"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path / META} is missing or has a bad entry: {e}") from e
        files = meta.get("files") or {}
        tensors = {}
        for name, (dtype, shape) in expected.items():
            fname = f"{name}.npy"
            if fname not in files:
                raise ValueError(f"{path / META} does not list {fname}")
            tensors[name] = _load_npy(path / fname, files[fname], dtype, shape, mmap, verify)
        if meta.get("postings") == COMPACT:
            tensors["scores"] = tensors["scores"].view(WEIGHT_DTYPES[meta["weight_dtype"]])
        docnos = cls._read_docnos(path / DOCNOS, files.get(DOCNOS), int(meta["n_docs"]), verify)
        docs = SparseVectors(tensors.pop("doc_indptr"), tensors.pop("doc_indices"), tensors.pop("doc_values"),
                             docnos, int(meta["vocab_size"]), validate=False)
        index = cls(**tensors, docs=docs, vocab_size=int(meta["vocab_size"]), n_docs=int(meta["n_docs"]),
                    block_size=int(meta["block_size"]), n_blocks=int(meta["n_blocks"]),
                    metadata=meta.get("metadata") or {})
        try:
            index.check()
            index.check_ids()
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e
        return index if torch.device(device) == index.device else index.to(device)

    @staticmethod
    def read_meta(path: str | os.PathLike) -> dict[str, Any]:
        """meta.json of an index directory, with its format and version checked."""
        path = Path(path)
        if not path.is_dir():
            raise FileNotFoundError(f"no index directory at {path}")
        mf = path / META
        if not mf.is_file():
            raise FileNotFoundError(f"{mf} is missing: {path} is not an lsr index (or its write did not finish)")
        try:
            meta = json.loads(mf.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{mf} is not valid JSON ({e}); the index is corrupt") from e
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(f"{mf}: format {meta.get('format') if isinstance(meta, dict) else None!r} "
                             f"is not {FORMAT!r}")
        check_format_version(mf, meta.get("version"), VERSION, rebuild="rebuild the index with lsr index")
        layout = meta.get("postings", FLOAT32)
        weights = (FLOAT32,) if layout == FLOAT32 else tuple(WEIGHT_DTYPES)
        if meta.get("padding") != PAD or layout not in LAYOUTS or meta.get("weight_dtype") not in weights:
            raise ValueError(f"{mf}: padding {meta.get('padding')!r} / postings {layout!r} / weight dtype "
                             f"{meta.get('weight_dtype')!r} are not supported (expects {PAD} / float32 / float32, "
                             f"or {PAD} / compact / one of {tuple(WEIGHT_DTYPES)})")
        return meta

    @staticmethod
    def _read_docnos(f: Path, entry: dict[str, Any] | None, n_docs: int, verify: bool) -> list[str]:
        if entry is None:
            raise ValueError(f"{f.parent / META} does not list {DOCNOS}")
        if not f.exists():
            raise FileNotFoundError(f"index file {f} is missing")
        if verify and sha256_file(f) != entry.get("sha256"):
            raise ValueError(f"index file {f} fails its sha256 checksum: it is corrupt or was modified")
        try:
            with pa.memory_map(str(f)) as source:
                column = pa.ipc.open_file(source).read_all().column("docno")
                nulls = column.null_count
                docnos = column.to_pylist()
        except Exception as e:  # ArrowInvalid, KeyError for a missing column, ...
            raise ValueError(f"index file {f} cannot be read as an Arrow docno table: {e}") from e
        if len(docnos) != n_docs or nulls:
            raise ValueError(f"index file {f} holds {len(docnos)} docnos (nulls not allowed), meta.json says {n_docs}")
        return docnos
