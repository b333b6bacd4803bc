"""The vector directory format (contract: docs/architecture.md): its names, its manifest, its Arrow table.

A vector directory holds ``part-00000.parquet`` ... (columns ``id`` string, ``indices`` list<int32>,
``values`` list<float32>) and ``manifest.json``::

    {"format": "lsr-vectors", "version": 1, "vocab_size": V, "n_rows": n, "nnz": m,
     "metadata": {...encoder / model / max_length ...},
     "shards": [{"file": "part-00000.parquet", "rows": r, "nnz": z, "sha256": "..."}, ...]}

A complete directory holds no ``part-NNNNN.parquet`` its manifest does not list (the readers refuse one).
The readers (``lsr.storage.shards``) and the writer (``lsr.storage.shard_writer``) both build on this module.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lsr.sparse import SparseVectors
from lsr.storage.files import read_json
from lsr.storage.formats import check_format_version

__all__ = ["FORMAT", "MANIFEST", "SHARD_NAME", "VERSION", "check_shard_entry", "check_shard_rows", "read_manifest",
           "refuse_unlisted", "sha256_file", "table_to_vectors", "unlisted_entries", "vectors_to_table"]

FORMAT = "lsr-vectors"
VERSION = 1
MANIFEST = "manifest.json"
# the names ShardWriter gives shards (part-00000.parquet, ...; more digits past 99999); its temporary
# files (.part-00000.parquet.<pid>-<random>.tmp) do not match
SHARD_NAME = re.compile(r"part-\d{5,}\.parquet")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    """The file's SHA-256 hex digest, read in ``chunk``-byte blocks."""
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
    """The checked manifest of a vector directory (or of the manifest file ``path``)."""
    p = Path(path)
    mf = p / MANIFEST if p.is_dir() else p
    if not mf.exists() or (p.is_file() and p.name != MANIFEST):
        raise FileNotFoundError(_not_a_vector_folder(p))
    manifest = read_json(mf, "the directory is corrupt")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{mf}: format {found!r} is not {FORMAT!r}")
    if "version" in manifest:   # manifests of the first lsr releases had none
        check_format_version(mf, manifest["version"], VERSION, rebuild="encode the vectors again with lsr encode")
    _check_manifest(manifest, mf)
    return manifest


def _not_a_vector_folder(p: Path) -> str:
    """What ``p`` is instead of a vector folder, what was expected and how to make one."""
    expected = "expects a vector folder written by lsr encode (manifest.json + Parquet shards)"
    anserini = ("to use Anserini / pyserini JSON vectors, set inputs.doc_vectors to the file or folder and "
                "inputs.vocab to its vocabulary in an `lsr run` config (or read them with "
                "lsr.interop.anserini.read_anserini_documents)")
    name = p.name.lower()
    if p.is_file() and name.endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz")):
        return f"{p} is a JSON file, but lsr {expected}; {anserini}"
    if p.is_file() and name.endswith(".ciff"):
        return f"{p} is a CIFF file, but lsr {expected}; convert it with `lsr import-ciff {p} --out VECTORS_DIR`"
    if p.is_file():
        return f"{p} is a file, but lsr {expected}; run `lsr encode` to write one"
    if p.is_dir() and (p / "meta.json").is_file():
        return f"{p} is an index (meta.json), not vectors: lsr {expected}; search it with `lsr search --index {p}`"
    if p.is_dir() and any(q.name.endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz")) for q in p.iterdir()):
        return f"no {MANIFEST} in {p}: lsr {expected}; {anserini}"
    return f"no {MANIFEST} in {p}: not an lsr vector directory (lsr encode writes one)"


def _check_manifest(manifest: dict[str, Any], mf: Path) -> None:
    """Entries and totals: every shard a plain file name inside the folder, rows and nnz adding up."""
    shards = manifest.get("shards")
    if not isinstance(shards, list) or not all(isinstance(s, dict) for s in shards):
        raise ValueError(f"{mf}: 'shards' must be a list of shard entries; the directory is corrupt")
    for key in ("vocab_size", "n_rows", "nnz"):
        if not isinstance(manifest.get(key), int) or isinstance(manifest.get(key), bool) or manifest[key] < 0:
            raise ValueError(f"{mf}: {key!r} must be a non-negative integer, got {manifest.get(key)!r}")
    for s in shards:
        check_shard_entry(s, mf)
    rows, nnz = sum(s["rows"] for s in shards), sum(s["nnz"] for s in shards)
    if (rows, nnz) != (manifest["n_rows"], manifest["nnz"]):
        raise ValueError(f"{mf}: n_rows / nnz say {manifest['n_rows']} / {manifest['nnz']} but the shards hold "
                         f"{rows} / {nnz}; the directory is corrupt")


def check_shard_entry(entry: Any, where: str | os.PathLike) -> None:
    """A shard's manifest entry (from ``where``: a manifest, or a distributed encoding's ``part-NNNNN.json``): a
    JSON object with a plain file name inside the vector folder, non-negative integer ``rows`` and ``nnz`` and a
    ``sha256``; else a one-line ValueError naming ``where``."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: a shard entry must be a JSON object, got {type(entry).__name__}; the folder is corrupt")
    name = entry.get("file")
    if not isinstance(name, str) or not name or name in (".", "..") or Path(name).name != name or "\\" in name:
        raise ValueError(f"{where}: shard entry {name!r} is not a file name inside the vector folder")
    if not all(isinstance(entry.get(k), int) and not isinstance(entry[k], bool) and entry[k] >= 0
               for k in ("rows", "nnz")) or not isinstance(entry.get("sha256"), str):
        raise ValueError(f"{where}: shard {name} needs non-negative integer 'rows' and 'nnz' and a 'sha256'")


def check_shard_rows(file: str | os.PathLike, entry: dict[str, Any], where: str | os.PathLike) -> None:
    """The shard ``file`` holds the ``rows`` its entry in ``where`` says (its Parquet footer's count: no data is
    read), so that a folder is never published or resumed with a row count that was edited; one line if not."""
    import pyarrow.parquet as pq

    try:
        rows = pq.ParquetFile(file).metadata.num_rows
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"shard {file} cannot be read as Parquet ({' '.join(str(e).split())}); the folder is "
                         "corrupt: encode into a new folder") from None
    if rows != entry["rows"]:
        raise ValueError(f"{where} says shard {entry['file']} holds {entry['rows']} rows, but {file} holds {rows}: "
                         "the entry was edited; restore it, or encode into a new folder")


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
