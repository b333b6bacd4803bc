"""Reading vector directories (Parquet shards + manifest; the format: ``lsr.storage.vector_format``).

``read_vectors`` loads a whole directory, ``iter_shards`` one shard at a time, ``read_vector_rows`` a row
range (only the shards that hold it); every shard's checksum, row and nnz counts are checked against the
manifest. ``write_vectors`` writes a directory in one call through ``ShardWriter``
(``lsr.storage.shard_writer``): files are written to temporary names and renamed into place, and the
manifest is rewritten after each shard, so a killed writer leaves a directory whose manifest lists only
complete shards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from lsr.sparse import SparseVectors
from lsr.storage.shard_writer import ShardWriter
from lsr.storage.vector_format import (
    FORMAT,
    MANIFEST,
    SHARD_NAME,
    VERSION,
    check_shard_entry,
    check_shard_rows,
    read_manifest,
    refuse_unlisted,
    sha256_file,
    table_to_vectors,
    unlisted_entries,
    vectors_to_table,
)

# the format's names are defined in lsr.storage.vector_format (which the writer imports too) and named here
# as well: this module is where readers of vector directories look for them
__all__ = ["FORMAT", "MANIFEST", "SHARD_NAME", "VERSION", "check_shard_entry", "check_shard_rows", "iter_shards",
           "read_manifest", "read_vector_rows",
           "read_vectors", "refuse_unlisted", "sha256_file", "table_to_vectors", "unlisted_entries",
           "vectors_to_table", "write_vectors"]


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
