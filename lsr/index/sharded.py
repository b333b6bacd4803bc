"""ShardedIndex: a collection split into P contiguous doc ranges, each an ``InvertedIndex``, in one folder.

On disk::

    manifest.json   {"format": "lsr-sharded-index", "version": 1, "vocab_size", "n_docs", "n_postings",
                     "block_size", "metadata": {...},
                     "max_scores": {"sha256"},
                     "partitions": [{"dir": "part-00000", "doc_start", "n_docs", "n_postings",
                                     "meta_sha256"}, ...]}
    max_scores.npy  float32 [V]: every term's largest weight over the whole collection
    part-00000/ ... lsr index directories (``InvertedIndex.save``), local doc numbering 0..n_p-1; every
                    one listed in the manifest (loading refuses a folder holding one it does not list)

Partition p holds the global docs [doc_start, doc_start + n_docs); a hit's global doc index is its local
one + doc_start. The split is by equal doc counts, so it follows from n_docs alone and a rank reads
only the vector shards of its own range.

Why a collection-wide ``max_scores``: the Triton search paths sum in fixed point with a per-query
scale taken from the index's per-term maxima (``lsr.search.kernels.fixed.query_scales``). A partition
loaded with its own, smaller maxima would pick another scale and round some scores differently; with the
collection's maxima every partition scores every doc exactly as the unsharded index does, so the merged
top-k is bit-identical. Loading installs them in each partition.

The folder is built under a temporary name and renamed into place (``lsr.storage.files.atomic_directory``).
``ShardedIndex.build`` builds it in this process; the steps it takes (``PartitionBuild``: the partitions, one at
a time or several in threads, then the manifest) are the ones every rank of a torchrun job takes on its share
of the partitions (``lsr.parallel.sharded_build``, which coordinates the ranks).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lsr.index.build import DEFAULT_BLOCK_SIZE, check_block_size
from lsr.index.inverted import InvertedIndex, is_index_file
from lsr.sparse import SparseVectors
from lsr.storage.files import atomic_directory, fsynced_write
from lsr.storage.formats import check_format_version
from lsr.storage.provenance import check_replaceable
from lsr.storage.shards import read_manifest, read_vector_rows, refuse_unlisted, sha256_file

__all__ = ["FORMAT", "PartitionBuild", "ShardedIndex", "check_index_target", "check_partition_count", "is_sharded",
           "partition_bounds", "read_partition_docnos", "read_sharded_manifest"]

FORMAT = "lsr-sharded-index"
VERSION = 1
MANIFEST = "manifest.json"
MAX_SCORES = "max_scores.npy"
PARTITION_NAME = re.compile(r"part-\d{5,}")  # _part's names (a temporary folder is never inside the index)


def partition_bounds(n_docs: int, n_partitions: int) -> list[int]:
    """P + 1 doc boundaries of P contiguous ranges whose sizes differ by at most one."""
    if isinstance(n_partitions, bool) or not isinstance(n_partitions, int) or n_partitions < 1:
        raise ValueError(f"the number of partitions must be a positive integer, got {n_partitions!r}")
    return [n_docs * p // n_partitions for p in range(n_partitions + 1)]


def check_partition_count(n_docs: int, n_partitions: int, source: object = "the collection") -> int:
    """``n_partitions`` if a collection of ``n_docs`` documents (read from ``source``) can be split into that
    many non-empty partitions (one for an empty collection), else ValueError naming the largest count. More
    partitions than documents is a mistake (a count meant for another collection, or GPUs taken for
    partitions), and building them would write one folder per document for minutes: refused before any work."""
    partition_bounds(n_docs, n_partitions)  # the same refusal of a count that is not a positive integer
    if n_partitions > max(n_docs, 1):
        raise ValueError(f"{n_partitions} partitions asked for the {n_docs} documents of {source}: a partition "
                         f"holds at least one document, so ask for at most {max(n_docs, 1)} (--partitions / "
                         "index.partitions; one per GPU is the usual count)")
    return n_partitions


def is_sharded(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a sharded index folder (its manifest says so; nothing else is checked)."""
    mf = Path(path) / MANIFEST
    try:
        return mf.is_file() and json.loads(mf.read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def _bad(mf: Path, problem: str) -> ValueError:
    return ValueError(f"{mf}: {problem}; the sharded index is corrupt (rebuild it with lsr index --partitions)")


def read_sharded_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """manifest.json of a sharded index, checked for format, version and contiguous partitions."""
    path = Path(path)
    mf = path / MANIFEST
    if not mf.is_file():
        raise FileNotFoundError(f"{mf} is missing: {path} is not a sharded lsr index (lsr index --partitions "
                                "writes one)")
    try:
        m = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise _bad(mf, f"not valid JSON ({e})") from e
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise ValueError(f"{mf}: format {m.get('format') if isinstance(m, dict) else None!r} is not {FORMAT!r}")
    check_format_version(mf, m.get("version"), VERSION, rebuild="rebuild the index with lsr index --partitions")
    try:
        parts, n_docs = m["partitions"], int(m["n_docs"])
        int(m["vocab_size"])
        starts = [int(p["doc_start"]) for p in parts]
        sizes = [int(p["n_docs"]) for p in parts]
        dirs = [str(p["dir"]) for p in parts]
    except (KeyError, TypeError, ValueError) as e:
        raise _bad(mf, f"missing or bad entry {e}") from e
    if not parts:
        raise _bad(mf, "no partitions listed")
    ends = [s + n for s, n in zip(starts, sizes)]
    if starts[0] != 0 or starts[1:] != ends[:-1] or ends[-1] != n_docs or min(sizes) < 0:
        raise _bad(mf, f"partitions do not tile docs [0, {n_docs}) contiguously (starts {starts}, sizes {sizes})")
    if any(Path(d).name != d or d in ("", ".", "..") for d in dirs) or len(set(dirs)) != len(dirs):
        raise _bad(mf, f"partition folders {dirs} must be distinct plain names")
    # a listing, no reads
    refuse_unlisted(path, PARTITION_NAME, dirs, "partition", "rebuild the index (lsr index --partitions)")
    return m


@dataclass(frozen=True)
class PartitionBuild:
    """The build of a sharded index folder, partition by partition: the vectors (SparseVectors or a vector
    folder, of which a partition reads only its rows), the partitions' document boundaries and the settings
    every partition is built with. ``build_partitions`` builds some of them into a folder, ``write_manifest``
    completes it; one process takes every partition (``ShardedIndex.build``), the ranks of a job their shares
    (``lsr.parallel.sharded_build.build_on_ranks``)."""

    vectors: SparseVectors | Path
    bounds: list[int]
    vocab_size: int
    metadata: dict[str, Any]
    device: str | torch.device = "cpu"
    block_size: int = DEFAULT_BLOCK_SIZE
    postings: str = "auto"
    workers: int = 1

    @classmethod
    def of(cls, vectors: SparseVectors | str | os.PathLike, n_partitions: int, *, device: str | torch.device = "cpu",
           block_size: int = DEFAULT_BLOCK_SIZE, metadata: dict[str, Any] | None = None, postings: str = "auto",
           workers: int = 1) -> PartitionBuild:
        """The build of ``n_partitions`` of ``vectors``; a bad block size, or more partitions than documents
        (``check_partition_count``), is refused here, before any work. ``metadata`` defaults to the vector
        folder's."""
        check_block_size(block_size)
        if isinstance(vectors, SparseVectors):
            n_docs, vocab = len(vectors), vectors.vocab_size
        else:
            vectors = Path(vectors)
            manifest = read_manifest(vectors)
            n_docs, vocab = int(manifest["n_rows"]), int(manifest["vocab_size"])
            metadata = manifest.get("metadata", {}) if metadata is None else metadata
        check_partition_count(n_docs, n_partitions, "the vectors" if isinstance(vectors, SparseVectors) else vectors)
        return cls(vectors, partition_bounds(n_docs, n_partitions), vocab, json.loads(json.dumps(metadata or {})),
                   device, block_size, postings, workers)

    @property
    def n_partitions(self) -> int:
        return len(self.bounds) - 1

    def build_partitions(self, folder: Path, partitions: Iterable[int]) -> None:
        """Build, save into ``folder`` and drop each of ``partitions`` (``workers`` at once, in threads: torch
        and pyarrow release the GIL), so peak memory is ``workers`` partitions."""
        mine = list(partitions)
        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(mine)))) as pool:
            list(pool.map(lambda p: self._build_one(folder, p), mine))

    def _build_one(self, folder: Path, p: int) -> None:
        a, b = self.bounds[p], self.bounds[p + 1]
        v = self.vectors
        rows = v[a:b] if isinstance(v, SparseVectors) else read_vector_rows(v, a, b)
        InvertedIndex.build(rows, device=self.device, block_size=self.block_size, metadata=self.metadata,
                            postings=self.postings).save(folder / _part(p))

    def write_manifest(self, folder: Path) -> None:
        """max_scores.npy (the partitions' term maxima combined) and manifest.json of the built partitions."""
        _write_manifest(folder, self.bounds, self.vocab_size, self.block_size, self.metadata)


@dataclass(eq=False)
class ShardedIndex:
    """P partitions (``InvertedIndex`` with local doc numbering) and the global doc index of each one's
    first doc. Partitions not loaded (``ShardedIndex.load(..., partitions=[...])``) are None."""

    partitions: list[InvertedIndex | None]
    doc_starts: list[int]
    vocab_size: int
    n_docs: int
    metadata: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    _docnos: list[str] | None = None

    @property
    def n_partitions(self) -> int:
        return len(self.partitions)

    @property
    def docnos(self) -> list[str]:
        """External ids of all docs in global order (read from the partitions' docno files if not loaded)."""
        if self._docnos is None:
            out: list[str] = []
            for p, part in enumerate(self.partitions):
                if part is None:
                    if self.path is None:
                        raise ValueError(f"partition {p} is not loaded and the index has no folder to read it from")
                    out += read_partition_docnos(self.path, p)
                else:
                    out += part.docnos
            self._docnos = out
        return self._docnos

    def memory_bytes(self) -> int:
        return sum(p.memory_bytes() for p in self.partitions if p is not None)

    def __repr__(self) -> str:
        return (f"ShardedIndex(n_docs={self.n_docs}, vocab_size={self.vocab_size}, partitions={self.n_partitions}, "
                f"loaded={sum(p is not None for p in self.partitions)})")

    # ------------------------------------------------------------------ build
    @classmethod
    def build(cls, vectors: SparseVectors | str | os.PathLike, n_partitions: int, out: str | os.PathLike,
              device: str | torch.device = "cpu", block_size: int = DEFAULT_BLOCK_SIZE,
              metadata: dict[str, Any] | None = None, overwrite: bool = False, workers: int = 1,
              postings: str = "auto") -> Path:
        """Build the P partitions of ``vectors`` (SparseVectors or a vector directory) in this process and save
        the folder; ``n_partitions`` above the documents is refused before any work (``check_partition_count``).

        Each partition is read (only its rows of a vector directory), built on ``device``, saved and
        dropped, so peak memory is ``workers`` partitions. ``workers`` > 1 builds partitions in threads
        (it pays on a many-core CPU). Returns the folder's path. ``postings``: the partitions' posting layout
        (``InvertedIndex.build``; with "auto" each partition takes its own, which does not change results).
        Every rank of a torchrun job building its share: ``lsr.parallel.sharded_build.build_on_ranks``.
        """
        plan = PartitionBuild.of(vectors, n_partitions, device=device, block_size=block_size, metadata=metadata,
                                 postings=postings, workers=workers)
        out = Path(out)
        check_index_target(out, overwrite)
        with atomic_directory(out, overwrite=overwrite) as tmp:
            plan.build_partitions(tmp, range(plan.n_partitions))
            plan.write_manifest(tmp)
        return out

    @classmethod
    def from_vectors(cls, vectors: SparseVectors, n_partitions: int, device: str | torch.device | None = None,
                     block_size: int = DEFAULT_BLOCK_SIZE, metadata: dict[str, Any] | None = None,
                     partitions: list[int] | None = None, postings: str = "auto") -> ShardedIndex:
        """The sharded index of ``vectors`` in memory (nothing written), with only ``partitions`` built
        (default all): a rank of a distributed job builds its own. ``postings``: as in ``build``."""
        bounds = partition_bounds(len(vectors), n_partitions)
        wanted = set(range(n_partitions) if partitions is None else partitions)
        max_scores = torch.zeros(vectors.vocab_size, dtype=torch.float32, device=vectors.device)
        max_scores.scatter_reduce_(0, vectors.indices.long(), vectors.values, reduce="amax")
        metadata = json.loads(json.dumps(metadata or {}))
        built: list[InvertedIndex | None] = []
        for p in range(n_partitions):
            if p not in wanted:
                built.append(None)
                continue
            index = InvertedIndex.build(vectors[bounds[p]:bounds[p + 1]], device=device, block_size=block_size,
                                        metadata=metadata, postings=postings)
            index.max_scores = max_scores.to(index.device)
            built.append(index)
        return cls(built, bounds[:-1], vectors.vocab_size, len(vectors), metadata)

    # ------------------------------------------------------------------ load
    @classmethod
    def load(cls, path: str | os.PathLike, device: str | torch.device = "cpu", partitions: list[int] | None = None,
             mmap: bool = True, verify: bool = True) -> ShardedIndex:
        """Load a sharded index folder (all partitions, or only those listed in ``partitions``).

        Every loaded partition is checked against the manifest (its meta.json checksum, doc count and
        vocabulary) and gets the collection-wide ``max_scores`` (see the module docstring).
        """
        path = Path(path)
        m = read_sharded_manifest(path)
        n_p = len(m["partitions"])
        wanted = range(n_p) if partitions is None else partitions
        if any(not 0 <= p < n_p for p in wanted):
            raise ValueError(f"{path} has partitions 0..{n_p - 1}; asked for {list(wanted)}")
        max_scores = _load_max_scores(path, m, verify)
        loaded: list[InvertedIndex | None] = [None] * n_p
        for p in wanted:
            loaded[p] = _load_partition(path, m, p, max_scores, device, mmap, verify)
        return cls(loaded, [int(e["doc_start"]) for e in m["partitions"]], int(m["vocab_size"]), int(m["n_docs"]),
                   m.get("metadata") or {}, path)


def _part(p: int) -> str:
    return f"part-{p:05d}"


def _write_manifest(d: Path, bounds: list[int], vocab: int, block_size: int, metadata: dict[str, Any]) -> None:
    """max_scores.npy (the partitions' term maxima combined) and manifest.json of the built partitions in ``d``."""
    entries, max_scores = [], np.zeros(vocab, np.float32)
    for p in range(len(bounds) - 1):
        meta = InvertedIndex.read_meta(d / _part(p))
        np.maximum(max_scores, np.load(d / _part(p) / "max_scores.npy", allow_pickle=False), out=max_scores)
        entries.append({"dir": _part(p), "doc_start": bounds[p], "n_docs": bounds[p + 1] - bounds[p],
                        "n_postings": int(meta["n_postings"]), "meta_sha256": sha256_file(d / _part(p) / "meta.json")})
    fsynced_write(d / MAX_SCORES, lambda fh: np.save(fh, max_scores, allow_pickle=False))
    manifest = {"format": FORMAT, "version": VERSION, "vocab_size": vocab, "n_docs": bounds[-1],
                "n_postings": sum(e["n_postings"] for e in entries), "block_size": int(block_size),
                "metadata": metadata, "max_scores": {"sha256": sha256_file(d / MAX_SCORES)}, "partitions": entries}
    fsynced_write(d / MANIFEST, lambda fh: fh.write(json.dumps(manifest, indent=1).encode()))


def check_index_target(out: Path, overwrite: bool) -> None:
    """Whether a sharded index may be written at ``out``: a new path, or (``overwrite``) an lsr index or an empty
    folder; FileExistsError / ValueError saying why not."""
    if not out.exists():
        return
    if not overwrite:
        raise FileExistsError(f"{out} already exists; pass overwrite=True (lsr index --overwrite) to replace it")
    if not (is_sharded(out) or (out / "meta.json").is_file() or (out.is_dir() and not any(out.iterdir()))):
        raise ValueError(f"refusing to overwrite {out}: it is not an lsr index directory")
    check_replaceable(out, lambda name: is_index_file(name) or name == MANIFEST or name.startswith("part-"), "index")


def _load_max_scores(path: Path, m: dict[str, Any], verify: bool) -> torch.Tensor:
    f = path / MAX_SCORES
    if not f.is_file():
        raise FileNotFoundError(f"{f} is missing: the sharded index is incomplete (rebuild it)")
    if verify and sha256_file(f) != (m.get("max_scores") or {}).get("sha256"):
        raise ValueError(f"{f} fails its sha256 checksum: it is corrupt or was modified")
    try:
        arr = np.load(f, allow_pickle=False)
    except Exception as e:  # truncated or not an .npy file
        raise ValueError(f"{f} cannot be read as a .npy array: {e}") from e
    if arr.dtype != np.float32 or arr.shape != (int(m["vocab_size"]),):
        raise ValueError(f"{f} holds {arr.dtype} {arr.shape}, the manifest implies float32 ({m['vocab_size']},)")
    return torch.from_numpy(arr)


def _load_partition(path: Path, m: dict[str, Any], p: int, max_scores: torch.Tensor, device: str | torch.device,
                    mmap: bool, verify: bool) -> InvertedIndex:
    entry = m["partitions"][p]
    d = path / entry["dir"]
    if verify and (d / "meta.json").is_file() and sha256_file(d / "meta.json") != entry.get("meta_sha256"):
        raise ValueError(f"{d / 'meta.json'} does not match the sharded manifest's checksum: the partition was "
                         "replaced or modified")
    index = InvertedIndex.load(d, device="cpu", mmap=mmap, verify=verify)
    if index.n_docs != int(entry["n_docs"]) or index.vocab_size != int(m["vocab_size"]):
        raise ValueError(f"{d} holds {index.n_docs} docs over {index.vocab_size} terms, the sharded manifest says "
                         f"{entry['n_docs']} over {m['vocab_size']}")
    if bool((index.max_scores > max_scores).any()):
        raise ValueError(f"{path / MAX_SCORES} is below partition {p}'s term maxima: it is stale or corrupt")
    index.max_scores = max_scores
    return index if torch.device(device) == index.device else index.to(device)


def read_partition_docnos(path: str | os.PathLike, p: int) -> list[str]:
    """Docnos of partition ``p`` only (no posting arrays read): what rank 0 needs to write a run."""
    path = Path(path)
    m = read_sharded_manifest(path)
    d = path / m["partitions"][p]["dir"]
    meta = InvertedIndex.read_meta(d)
    from lsr.index.inverted import DOCNOS

    return InvertedIndex._read_docnos(d / DOCNOS, (meta.get("files") or {}).get(DOCNOS), int(meta["n_docs"]),
                                      verify=True)
