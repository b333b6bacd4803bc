"""Metadata columns kept beside an index: ``metadata.parquet``, one row per document in doc-index order.

Filters (``lsr.index.filter_expr``) are expressions over these columns (``year``, ``lang``, ``source`` ...),
taken from the corpus: a JSONL (BEIR ``_id``, or ``docno`` / ``docid`` / ``doc_id`` / ``id``; ``.gz`` too) or a
Parquet file with such an id column. ``metadata_from_corpus`` joins the file's rows onto the index's docnos (a
document the file lacks gets nulls; rows of other documents are ignored), ``save_metadata`` writes the file
into the index folder and ``load_metadata`` reads it back, checked.

The file is stamped (Parquet schema metadata, key ``lsr.metadata``) with its row count and the sha256 of the
docnos it was joined onto (joined by "\\n"), so a file from another index, or one whose rows were dropped or
reordered by an edit, is refused rather than silently filtering the wrong documents. The values themselves
are not checksummed: an edit that keeps the rows and the stamp changes what filters see.

A sharded index keeps one file at its top level, in global doc order (partition p's docs from its
``doc_start`` on, as ``ShardedIndex.docnos``); its partitions hold none.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from lsr.index.filter_nodes import column_kind
from lsr.index.inverted import DOCNOS, METADATA, InvertedIndex
from lsr.index.sharded import is_sharded, read_partition_docnos, read_sharded_manifest
from lsr.storage.files import atomic_write_bytes, open_binary
from lsr.storage.formats import check_format_version

__all__ = ["ID_COLUMNS", "METADATA", "TEXT_COLUMNS", "docnos_sha256", "index_docnos", "load_metadata",
           "metadata_from_corpus", "save_metadata"]

ID_COLUMNS = ("_id", "docno", "docid", "doc_id", "id")    # the first one a file has is its id column
TEXT_COLUMNS = frozenset({"text", "title", "contents", "body"})   # left out unless asked for by name
STAMP_KEY = b"lsr.metadata"
STAMP_FORMAT, STAMP_VERSION = "lsr-metadata", 1
_MIXED = re.compile(r"Column\(/?([^)]*)\) changed from (\w+) to (\w+)")


def _reattach(index_dir: str | os.PathLike) -> str:
    return f"re-attach it with `lsr index --metadata CORPUS --out {index_dir} --overwrite`"


def docnos_sha256(docnos: list[str]) -> str:
    """The sha256 of the docnos joined by "\\n": what ties a metadata file to the index it was made for."""
    h = hashlib.sha256()
    for i, d in enumerate(docnos):
        h.update(("\n" + d if i else d).encode())
    return h.hexdigest()


def index_docnos(index_dir: str | os.PathLike) -> list[str]:
    """The docnos of a plain or sharded index folder, in (global) doc-index order; no posting array is read."""
    path = Path(index_dir)
    if is_sharded(path):
        return [d for p in range(len(read_sharded_manifest(path)["partitions"]))
                for d in read_partition_docnos(path, p)]
    meta = InvertedIndex.read_meta(path)
    with pa.memory_map(str(path / DOCNOS)) as source:
        docnos = pa.ipc.open_file(source).read_all().column("docno").to_pylist()
    if len(docnos) != int(meta["n_docs"]):
        raise ValueError(f"index file {path / DOCNOS} holds {len(docnos)} docnos, meta.json says {meta['n_docs']}")
    return docnos


def _read_corpus(path: Path, columns: list[str] | None) -> pa.Table:
    """A JSONL (.gz) or Parquet corpus file as an Arrow table (types as Arrow infers them); of a Parquet file only
    the id and ``columns`` are read (all with None)."""
    if not path.is_file():
        raise FileNotFoundError(f"metadata file {path} not found")
    name = path.name.lower().removesuffix(".gz")
    try:
        if name.endswith(".parquet"):
            names = pq.read_schema(path).names
            for c in columns or ():
                if c not in names:
                    raise ValueError(f"{path} has no column {c!r}; its columns are {', '.join(names)}")
            keep = None if columns is None else [c for c in names if c in ID_COLUMNS or c in columns]
            return pq.read_table(path, columns=keep)
        if not name.endswith((".jsonl", ".json", ".ndjson")):
            raise ValueError(f"{path}: a metadata file is .jsonl, .jsonl.gz or .parquet")
        with open_binary(path) as f:   # pyarrow.json skips a UTF-8 BOM itself
            return pj.read_json(f, read_options=pj.ReadOptions(block_size=1 << 24))
    except pa.ArrowInvalid as e:
        mixed = _MIXED.search(str(e))
        if mixed:
            col, a, b = mixed.groups()
            raise ValueError(f"{path}: column {col!r} mixes {a} and {b} values; write one type per column "
                             "(e.g. every year a number)") from None
        raise ValueError(f"{path} cannot be read as {'Parquet' if name.endswith('.parquet') else 'JSON Lines'}: "
                         f"{' '.join(str(e).split())}") from None


def _id_column(path: Path, table: pa.Table) -> pa.ChunkedArray:
    for name in ID_COLUMNS:
        if name in table.column_names:
            ids = table.column(name)
            break
    else:
        raise ValueError(f"{path}: no id column (one of {', '.join(ID_COLUMNS)}); its columns are "
                         f"{', '.join(table.column_names) or 'none'}")
    if not (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type) or pa.types.is_integer(ids.type)):
        raise ValueError(f"{path}: id column {name!r} has type {ids.type}; ids are strings or integers")
    ids = pc.cast(ids, pa.string())
    if ids.null_count:
        row = pc.index(pc.is_null(ids), True).as_py()
        raise ValueError(f"{path}: row {row + 1} has no {name!r}; every row needs an id")
    counts = pc.value_counts(ids)
    dup = pc.filter(counts.field("values"), pc.greater(counts.field("counts"), 1))
    if len(dup):
        raise ValueError(f"{path}: id {dup[0].as_py()!r} appears more than once; keep one row per document")
    return ids


def _pick(path: Path, table: pa.Table, columns: list[str] | None) -> list[str]:
    if columns is None:
        picked = [c for c in table.column_names if c not in ID_COLUMNS and c.lower() not in TEXT_COLUMNS
                  and column_kind(table.schema.field(c).type) is not None]   # nested values: named, then refused
        if not picked:
            raise ValueError(f"{path} has no metadata columns besides the id and the text ({', '.join(table.column_names)}"
                             "); name the ones to keep (--metadata-columns)")
        return picked
    for c in columns:
        if c not in table.column_names:
            raise ValueError(f"{path} has no column {c!r}; its columns are {', '.join(table.column_names)}")
        if c in ID_COLUMNS:
            raise ValueError(f"{path}: column {c!r} is the id column (filters see docnos through it, not as metadata)")
        if column_kind(table.schema.field(c).type) is None:
            raise ValueError(f"{path}: column {c!r} has type {table.schema.field(c).type}; metadata columns hold "
                             "numbers, strings, booleans or dates (flatten nested values into columns of their own)")
    if not columns or len(set(columns)) != len(columns):
        raise ValueError(f"metadata columns {','.join(columns)!r}: name each column once (at least one)")
    return list(columns)


def metadata_from_corpus(path: str | os.PathLike, docnos: list[str], columns: list[str] | None = None) -> pa.Table:
    """The ``columns`` of the corpus file ``path`` (None: every filterable column but the id and the text-like
    ones, ``text`` / ``title`` / ``contents`` / ``body``), one row per entry of ``docnos``, in that order.

    Documents the file lacks get nulls; its rows of documents not in ``docnos`` are ignored. A duplicate id, a
    row without one, an asked column the file lacks, a column mixing types, or a file sharing no id with
    ``docnos`` is a one-line ValueError naming the file. The schema's ``lsr.missing`` metadata counts the docnos
    the file lacks. Reads the whole file (Arrow's readers are multithreaded; Parquet reads only the columns)."""
    path = Path(path)
    table = _read_corpus(path, columns)
    ids = _id_column(path, table)
    picked = _pick(path, table, columns)
    rows = pc.index_in(pa.array(docnos, pa.string()), value_set=ids.combine_chunks())
    found = len(rows) - rows.null_count
    if docnos and not found:
        raise ValueError(f"{path}: none of the index's {len(docnos)} docnos (e.g. {docnos[0]!r}) is an id of this file; "
                         "is it the corpus of this index?")
    out = table.select(picked).take(rows)
    decoded = [pc.cast(c, c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in out.columns]
    out = pa.Table.from_arrays(decoded, names=picked)   # categorical Parquet columns as their values
    return out.replace_schema_metadata({b"lsr.missing": str(len(docnos) - found).encode()})


def _stamp(n_rows: int, docnos_hash: str) -> bytes:
    return json.dumps({"format": STAMP_FORMAT, "version": STAMP_VERSION, "n_rows": n_rows,
                       "docnos_sha256": docnos_hash}).encode()


def save_metadata(index_dir: str | os.PathLike, table: pa.Table, overwrite: bool = False,
                  docnos: list[str] | None = None) -> Path:
    """Write ``table`` (one row per document of the index at ``index_dir``, in doc-index order) as
    ``index_dir/metadata.parquet``, stamped with its row count and the docnos' sha256; returns the file.

    ``docnos``: the index's (read from the folder when None). The write is atomic (a temporary file next to it,
    fsynced, renamed); an existing file is refused unless ``overwrite``."""
    index_dir = Path(index_dir)
    docnos = index_docnos(index_dir) if docnos is None else docnos
    target = index_dir / METADATA
    if table.num_rows != len(docnos):
        raise ValueError(f"metadata for {target}: {table.num_rows} rows, the index has {len(docnos)} documents")
    for f in table.schema:
        if column_kind(f.type) is None:
            raise ValueError(f"metadata for {target}: column {f.name!r} has type {f.type}; metadata columns hold "
                             "numbers, strings, booleans or dates")
    if len(set(table.column_names)) != table.num_columns or not all(table.column_names):
        raise ValueError(f"metadata for {target}: column names must be unique and non-empty, got {table.column_names}")
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists; pass --overwrite (overwrite=True) to replace it")
    table = table.replace_schema_metadata({STAMP_KEY: _stamp(table.num_rows, docnos_sha256(docnos))})
    with atomic_write_bytes(target, replace=overwrite) as fh:
        pq.write_table(table, fh, compression="zstd")
    return target


def _n_docs(index_dir: Path) -> int:
    return int((read_sharded_manifest(index_dir) if is_sharded(index_dir) else InvertedIndex.read_meta(index_dir))["n_docs"])


def load_metadata(index_dir: str | os.PathLike, docnos: list[str] | None = None) -> pa.Table | None:
    """The metadata table of the index at ``index_dir`` (one row per document, doc-index order), or None when it
    has none. Its stamp is checked: the row count against the index (``docnos`` when given, else its meta), and
    with ``docnos`` the docnos' sha256. A damaged, edited or foreign file is a one-line ValueError naming it."""
    index_dir = Path(index_dir)
    f = index_dir / METADATA
    if not f.is_file():
        return None
    try:
        table = pq.read_table(f)
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{f} cannot be read as Parquet ({' '.join(str(e).split())}): it is damaged; "
                         f"{_reattach(index_dir)}") from None
    try:
        stamp = json.loads((table.schema.metadata or {})[STAMP_KEY])
        n_rows, digest = int(stamp["n_rows"]), str(stamp["docnos_sha256"])
        if stamp.get("format") != STAMP_FORMAT:
            raise ValueError
    except (KeyError, ValueError, TypeError):
        raise ValueError(f"{f} has no lsr stamp (it was written by another tool, or edited and saved without its "
                         f"schema metadata); {_reattach(index_dir)}") from None
    check_format_version(f, stamp.get("version"), STAMP_VERSION, rebuild=_reattach(index_dir))
    n_docs = len(docnos) if docnos is not None else _n_docs(index_dir)
    if table.num_rows != n_rows or n_rows != n_docs:
        raise ValueError(f"{f} holds {table.num_rows} rows, its stamp says {n_rows} and the index has {n_docs} "
                         f"documents: it was truncated or edited, or belongs to another index; {_reattach(index_dir)}")
    if docnos is not None and docnos_sha256(docnos) != digest:
        raise ValueError(f"{f} was made for other documents (the docnos' sha256 differs from its stamp): the index "
                         f"was rebuilt or the file copied from another index; {_reattach(index_dir)}")
    return table.replace_schema_metadata(None)
