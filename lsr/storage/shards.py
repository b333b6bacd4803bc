"""Parquet shards of sparse vectors, with a manifest (contract: docs/architecture.md).

A vector directory holds ``part-00000.parquet`` ... (columns ``id`` string, ``indices`` list<int32>,
``values`` list<float32>) and ``manifest.json``::

    {"format": "lsr-vectors", "version": 1, "vocab_size": V, "n_rows": n, "nnz": m,
     "metadata": {...encoder / model / max_length ...},
     "shards": [{"file": "part-00000.parquet", "rows": r, "nnz": z, "sha256": "..."}, ...]}

A complete directory holds no ``part-NNNNN.parquet`` its manifest does not list (the readers refuse one).

The writer, ``ShardWriter``, lives in ``lsr.storage.shard_writer`` (``from lsr.storage.shards import ShardWriter`` still works):
files are written to temporary names and renamed into place, and the manifest is rewritten after each shard,
so a killed writer leaves a directory whose manifest lists only complete shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from lsr.sparse import SparseVectors

__all__ = ["write_vectors", "read_vectors", "read_manifest", "iter_shards", "read_vector_rows",
           "refuse_unlisted", "sha256_file", "unlisted_entries"]

FORMAT = "lsr-vectors"
VERSION = 1
MANIFEST = "manifest.json"
# the names ShardWriter gives shards (part-00000.parquet, ...; more digits past 99999); its temporary
# files (.part-00000.parquet.<pid>-<random>.tmp) do not match
SHARD_NAME = re.compile(r"part-\d{5,}\.parquet")


def __getattr__(name: str) -> Any:
    """``ShardWriter`` and ``PARQUET_OPTIONS`` from ``lsr.storage.shard_writer`` (which imports this module)."""
    if name in ("ShardWriter", "PARQUET_OPTIONS"):
        from lsr.storage import shard_writer

        return getattr(shard_writer, name)
    raise AttributeError(f"module 'lsr.storage.shards' has no attribute {name!r}")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def vectors_to_table(vectors: SparseVectors) -> pa.Table:
    """SparseVectors -> Arrow table (id, indices list<int32>, values list<float32>)."""
    ip = vectors.indptr.cpu().numpy()
    offsets = pa.array(ip.astype(np.int32) if ip[-1] < 2**31 else ip,
                       type=pa.int32() if ip[-1] < 2**31 else pa.int64())
    list_type = pa.ListArray if offsets.type == pa.int32() else pa.LargeListArray
    indices = list_type.from_arrays(offsets, pa.array(vectors.indices.cpu().numpy(), type=pa.int32()))
    values = list_type.from_arrays(offsets, pa.array(vectors.values.cpu().numpy(), type=pa.float32()))
    return pa.table({"id": pa.array(vectors.ids, type=pa.string()), "indices": indices, "values": values})


def table_to_vectors(table: pa.Table, vocab_size: int | None, device: str | torch.device = "cpu",
                     validate: bool = True) -> SparseVectors:
    """Arrow table with id/indices/values columns -> SparseVectors."""
    for col in ("id", "indices", "values"):
        if col not in table.column_names:
            raise ValueError(f"vector table lacks the column {col!r} (has {table.column_names})")
    ind = table.column("indices").combine_chunks()
    val = table.column("values").combine_chunks()
    if len(ind) and (ind.null_count or val.null_count):
        raise ValueError("vector table has null rows")
    ind_off = np.asarray(ind.offsets, dtype=np.int64)
    val_off = np.asarray(val.offsets, dtype=np.int64)
    if not np.array_equal(ind_off - ind_off[0], val_off - val_off[0]):
        raise ValueError("indices and values have different lengths in some row")
    indptr = (ind_off - ind_off[0]).copy()
    flat_i = np.array(ind.flatten(), dtype=np.int32)
    flat_v = np.array(val.flatten(), dtype=np.float32)
    ids = table.column("id").to_pylist()
    return SparseVectors(torch.from_numpy(indptr), torch.from_numpy(flat_i), torch.from_numpy(flat_v), ids,
                         vocab_size, device=device, validate=validate)


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    mf = p / MANIFEST if p.is_dir() else p
    if not mf.exists():
        raise FileNotFoundError(f"no {MANIFEST} in {p}: not an lsr vector directory (lsr encode writes one)")
    try:
        manifest = json.loads(mf.read_text(encoding="utf-8-sig"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{mf} is not valid JSON ({e}); the directory is corrupt") from e
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{mf}: format {found!r} is not {FORMAT!r}")
    if not isinstance(manifest.get("version", 0), int) or manifest.get("version", 0) > VERSION:
        raise ValueError(f"{mf}: format version {manifest['version']!r} is not supported by this lsr (reads up to {VERSION})")
    _check_manifest(manifest, mf)
    return manifest


def _check_manifest(manifest: dict[str, Any], mf: Path) -> None:
    """Entries and totals: every shard a plain file name inside the folder, rows and nnz adding up."""
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
        raise ValueError(f"{mf}: 'shards' must be a list of shard entries; the directory is corrupt")
    for key in ("vocab_size", "n_rows", "nnz"):
        if not isinstance(manifest.get(key), int) or isinstance(manifest.get(key), bool) or manifest[key] < 0:
            raise ValueError(f"{mf}: {key!r} must be a non-negative integer, got {manifest.get(key)!r}")
    for s in shards:
        name = s.get("file")
        if not isinstance(name, str) or not name or name in (".", "..") or Path(name).name != name or "\\" in name:
            raise ValueError(f"{mf}: shard entry {name!r} is not a file name inside the vector folder")
        if not all(isinstance(s.get(k), int) and s[k] >= 0 for k in ("rows", "nnz")) or not isinstance(
                s.get("sha256"), str):
            raise ValueError(f"{mf}: shard {name} needs non-negative integer 'rows' and 'nnz' and a 'sha256'")
    rows, nnz = sum(s["rows"] for s in shards), sum(s["nnz"] for s in shards)
    if (rows, nnz) != (manifest["n_rows"], manifest["nnz"]):
        raise ValueError(f"{mf}: n_rows / nnz say {manifest['n_rows']} / {manifest['nnz']} but the shards hold "
                         f"{rows} / {nnz}; the directory is corrupt")


def unlisted_entries(folder: str | os.PathLike, pattern: re.Pattern[str], listed: Iterable[str]) -> list[str]:
    """Entries of ``folder`` named as ``pattern`` (a writer's shard or partition names) that ``listed``
    lacks, sorted: one directory listing, nothing read."""
    names = set(listed)
    with os.scandir(folder) as entries:
        return sorted(e.name for e in entries if pattern.fullmatch(e.name) and e.name not in names)


def refuse_unlisted(folder: str | os.PathLike, pattern: re.Pattern[str], listed: Iterable[str], what: str,
                    remedy: str) -> None:
    """A one-line ValueError when ``folder`` holds a ``what`` (named as ``pattern``) its manifest does not list:
    a manifest edited (or restored from an older copy) to drop one, with totals that still add up, would
    otherwise load less without a word. ``remedy``: the fix besides restoring the manifest."""
    stray = unlisted_entries(folder, pattern, listed)
    if stray:
        more = f" (and {len(stray) - 1} more)" if len(stray) > 1 else ""
        raise ValueError(f"{folder} holds the {what} {stray[0]}{more}, which its {MANIFEST} does not list: the "
                         f"manifest was edited or replaced; restore the manifest that lists it, or {remedy}")


def _check_no_stray_shards(p: Path, manifest: dict[str, Any]) -> None:
    """A complete folder holds no shard its manifest leaves out. An unfinished folder is not checked: a killed
    writer with several write threads may have finished shards after the listed ones, which its resume
    rewrites (or removes)."""
    if manifest.get("complete"):
        refuse_unlisted(p, SHARD_NAME, (s["file"] for s in manifest["shards"]), "shard file",
                        "remove the file if it is not part of these vectors")


def write_vectors(path: str | os.PathLike, vectors: SparseVectors, metadata: Mapping[str, Any] | None = None,
                  shard_rows: int = 100_000) -> dict[str, Any]:
    """Write all of ``vectors`` to a new vector directory; returns the manifest."""
    from lsr.storage.shard_writer import ShardWriter

    w = ShardWriter(path, vectors.vocab_size, metadata, shard_rows)
    w.add(vectors)
    return w.close()


def _read_shard(p: Path, manifest: dict[str, Any], s: dict[str, Any], device: str | torch.device,
                verify: bool) -> SparseVectors:
    f = p / s["file"]
    if not f.exists():
        raise FileNotFoundError(f"shard {f} listed in the manifest is missing")
    if verify and sha256_file(f) != s["sha256"]:
        raise ValueError(f"shard {f} fails its checksum: the file is corrupt or was modified")
    try:
        table = pq.read_table(f)
    except Exception as e:  # pyarrow raises several types for damaged files
        raise ValueError(f"shard {f} cannot be read as Parquet: {e}") from e
    vec = table_to_vectors(table, manifest["vocab_size"], device)
    if len(vec) != s["rows"] or vec.nnz != s["nnz"]:
        raise ValueError(f"shard {f} has {len(vec)} rows / {vec.nnz} nnz, manifest says {s['rows']} / {s['nnz']}")
    return vec


def iter_shards(path: str | os.PathLike, device: str | torch.device = "cpu",
                verify: bool = True) -> Iterator[SparseVectors]:
    """Yield each shard of a vector directory as SparseVectors (checksums verified)."""
    p = Path(path)
    manifest = read_manifest(p)
    _check_no_stray_shards(p, manifest)
    for s in manifest["shards"]:
        yield _read_shard(p, manifest, s, device, verify)


def read_vector_rows(path: str | os.PathLike, start: int, stop: int, device: str | torch.device = "cpu",
                     verify: bool = True) -> SparseVectors:
    """Rows [start, stop) of a complete vector directory, reading only the shards that hold them."""
    p = Path(path)
    manifest = read_manifest(p)
    if not manifest.get("complete"):
        raise ValueError(f"{p} is an unfinished vector directory ({manifest['n_rows']} rows so far); "
                         "rerun the encoder with resume to finish it")
    if not 0 <= start <= stop <= manifest["n_rows"]:
        raise ValueError(f"rows [{start}, {stop}) are outside {p}'s {manifest['n_rows']} rows")
    _check_no_stray_shards(p, manifest)
    parts, first = [], 0
    for s in manifest["shards"]:
        last = first + s["rows"]
        if first < stop and last > start:
            vec = _read_shard(p, manifest, s, device, verify)
            parts.append(vec[max(start - first, 0):min(stop, last) - first])
        first = last
    if not parts:
        return SparseVectors(torch.zeros(1, dtype=torch.int64), [], [], [], manifest["vocab_size"], device=device)
    return SparseVectors.concat(parts) if len(parts) > 1 else parts[0]


def read_vectors(path: str | os.PathLike, device: str | torch.device = "cpu", verify: bool = True,
                 allow_incomplete: bool = False) -> SparseVectors:
    """Read a vector directory (or one .parquet file) into SparseVectors on ``device``."""
    p = Path(path)
    if p.is_file() and p.suffix == ".parquet":
        return table_to_vectors(pq.read_table(p), None, device)
    manifest = read_manifest(p)
    if not manifest.get("complete") and not allow_incomplete:
        raise ValueError(f"{p} is an unfinished vector directory ({manifest['n_rows']} rows so far); "
                         "rerun the encoder with resume to finish it")
    parts = list(iter_shards(p, device, verify))
    if not parts:
        return SparseVectors(torch.zeros(1, dtype=torch.int64), [], [], [], manifest["vocab_size"], device=device)
    return SparseVectors.concat(parts)
