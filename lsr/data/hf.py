"""Hugging Face ``datasets`` as a source of documents, queries and qrels.

Two spec forms reach here through :func:`lsr.data.sources.load_dataset` (and so ``lsr run`` configs and the CLI):

* ``hf:ORG/NAME[?options]``: a dataset on the Hub (or in the local ``datasets`` cache) in the BEIR
  layout that ``mteb/*`` and ``BeIR/*`` publish: config ``corpus`` (split ``corpus``), config
  ``queries`` (split ``queries``) and qrels in config ``default`` with one split per evaluation split
  (``split``, default ``test``). ``BeIR/*`` keeps its qrels in a separate repository:
  ``hf:BeIR/scifact?qrels=BeIR/scifact-qrels``.
* ``PATH.parquet`` / ``PATH.jsonl`` / ``PATH.jsonl.gz`` / ``PATH.json`` with options: a local corpus
  file, read through ``datasets``' Parquet / JSON builders in streaming mode (no copy in the cache).
  ``queries=`` and ``qrels=`` name local files (Parquet / JSONL, or the TSV / TREC files
  :mod:`lsr.data.sources` reads). The qrels file is the split: a ``split`` argument is ignored.

Options (``?key=value&key=value``):

====================  =====================================================================================
``corpus``            ``CONFIG[@SPLIT]`` of the corpus (hf:, default ``corpus@corpus``)
``queries``           hf: ``CONFIG[@SPLIT]`` or ``ORG/REPO[:CONFIG][@SPLIT]`` (default ``queries@queries``);
                      files: a path; ``none`` for no queries
``qrels``             as ``queries`` (hf default ``default@<split>``); ``none`` for no qrels
``id`` ``title``      corpus columns (defaults ``_id``, ``title``, ``text``; ``title=`` for none); the
``text``              document text is ``title + " " + text`` as in lsr's BEIR folders
``query_id``          query columns (defaults ``_id``, ``text``)
``query_text``
``streaming``         ``1``: stream the hf: corpus instead of downloading it first (large corpora)
``revision``          hf: a branch, tag or commit
====================  =====================================================================================

As for BEIR folders, the queries are those the qrels judge. Offline (``HF_HUB_OFFLINE=1`` or no network)
a dataset that is not in the ``datasets`` cache raises :class:`lsr.data.dataset.DatasetUnavailableError` with
one line saying what to place where.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from lsr.data.dataset import Dataset, DatasetUnavailableError
from lsr.data.readers import (
    check_new,
    iter_json_objects,
    qrels_from_rows,
    read_qrels,
    read_topics_tsv,
    text_field,
    unique_docs,
)
from lsr.storage.files import count_lines
from lsr.utils.ids import check_id

__all__ = ["TABLE_SUFFIXES", "Source", "SpecTables", "handles", "load_hf_dataset", "load_spec", "parse_spec"]

TABLE_SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json", ".json.gz")
_OPTIONS = ("corpus", "queries", "qrels", "id", "title", "text", "query_id", "query_text", "streaming", "revision")
_QRELS_COLUMNS = (("query-id", "query_id", "qid"), ("corpus-id", "corpus_id", "doc_id", "docno"),
                  ("score", "relevance", "label"))
_BATCH = 4096


@dataclass(frozen=True)
class Source:
    """One table: a Hub dataset (``repo`` + ``config`` + ``split``) or a local file (``path``)."""

    repo: str | None = None
    config: str | None = None
    split: str | None = None
    path: Path | None = None
    revision: str | None = None

    def __str__(self) -> str:
        if self.path is not None:
            return str(self.path)
        return f"hf:{self.repo}" + (f":{self.config}" if self.config else "") + (f"@{self.split}" if self.split else "")


def _is_table(path: str) -> bool:
    return path.lower().endswith(TABLE_SUFFIXES)


def handles(spec: str) -> bool:
    """True for ``hf:`` ids and for local Parquet / JSON(L) files (options after ``?`` allowed)."""
    path = spec.partition("?")[0]
    return spec.startswith("hf:") or (_is_table(path) and Path(path).expanduser().is_file())


def _parse_options(query: str, spec: str) -> dict[str, str]:
    try:
        options = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        raise ValueError(f"{spec!r}: options after '?' are key=value pairs joined by '&' (e.g. ?text=body&id=docid), "
                         f"got {query!r}") from None
    unknown = sorted(set(options) - set(_OPTIONS))
    if unknown:
        raise ValueError(f"{spec!r}: unknown option {unknown[0]!r} (known: {', '.join(_OPTIONS)})")
    return options


def _hub_source(value: str, repo: str, revision: str | None) -> Source:
    """``CONFIG[@SPLIT]`` in ``repo``, or ``ORG/REPO[:CONFIG][@SPLIT]``."""
    value, _, split = value.partition("@")
    if "/" in value:
        repo, _, config = value.partition(":")
        return Source(repo=repo, config=config or None, split=split or None, revision=revision)
    return Source(repo=repo, config=value or None, split=split or None, revision=revision)


@dataclass(frozen=True)
class SpecTables:
    """What a spec names: the tables to read and how (``parse_spec``); ``None`` for no queries / qrels."""

    corpus: Source
    queries: Source | None
    qrels: Source | None
    columns: dict[str, str]
    streaming: bool


def parse_spec(spec: str, split: str | None = None) -> SpecTables:
    """The tables of an ``hf:`` id or a local table file spec (module docstring), nothing read yet."""
    head, _, query = spec.partition("?")
    opts = _parse_options(query, spec)
    columns = {k: opts[k] for k in ("id", "title", "text", "query_id", "query_text") if k in opts}
    streaming = opts.get("streaming", "0").lower() in ("1", "true", "yes")
    if head.startswith("hf:"):
        repo, revision = head[3:].strip("/"), opts.get("revision")
        if repo.count("/") != 1 or not all(repo.split("/")):
            raise ValueError(f"{spec!r}: expected hf:ORG/NAME, a dataset on the Hugging Face Hub (e.g. hf:mteb/scifact)")
        split = split or "test"
        corpus = _hub_source(opts.get("corpus", "corpus@corpus"), repo, revision)
        queries = _hub_source(opts.get("queries", "queries@queries"), repo, revision)
        qrels = _hub_source(opts.get("qrels", "default"), repo, revision)
        qrels = qrels if qrels.split else Source(qrels.repo, qrels.config, split, revision=revision)
    else:
        corpus = Source(path=Path(head).expanduser())
        queries, qrels = (Source(path=Path(opts[k]).expanduser()) if opts.get(k) else None for k in ("queries", "qrels"))
        streaming = True
    none = {key for key in ("queries", "qrels") if opts.get(key, "").lower() == "none"}
    return SpecTables(corpus, None if "queries" in none else queries, None if "qrels" in none else qrels, columns,
                      streaming)


def load_spec(spec: str, split: str | None = None, *, download: bool = True) -> Dataset:
    """The :class:`lsr.data.dataset.Dataset` of an ``hf:`` id or a local table file spec (module docstring)."""
    tables = parse_spec(spec, split)
    return load_hf_dataset(tables.corpus, tables.queries, tables.qrels, columns=tables.columns,
                           streaming=tables.streaming, name=spec, download=download)


def load_hf_dataset(corpus: Source | None, queries: Source | None = None, qrels: Source | None = None, *,
                    columns: Mapping[str, str] | None = None, streaming: bool = False, name: str = "hf",
                    download: bool = True) -> Dataset:
    """A Dataset from tables: documents streamed from ``corpus``, queries and qrels read into memory.

    ``columns`` maps lsr's names (``id``, ``title``, ``text``, ``query_id``, ``query_text``) to the
    tables' column names; ``title`` may be ``""`` (no title column)."""
    cols = {"id": "_id", "title": "title", "text": "text", "query_id": "_id", "query_text": "text", **(columns or {})}
    judged = _read_qrels(qrels, download) if qrels is not None else {}
    topics = _read_queries(queries, cols, download) if queries is not None else {}
    if judged and topics:
        missing = [q for q in judged if q not in topics]
        if missing:
            raise ValueError(f"{qrels} judges query {missing[0]!r}, which is not in {queries}")
        topics = {q: topics[q] for q in judged}  # BEIR: a split's queries are those it judges
    n_docs = _n_rows(corpus, streaming, download) if corpus is not None else None
    source = (lambda: unique_docs(_iter_docs(corpus, cols, streaming, download), str(corpus))) if corpus else None
    return Dataset(name=name, queries=topics, qrels=judged, n_docs=n_docs, docs_source=source)


# ------------------------------------------------------------------------------------------ readers
def _open(src: Source, streaming: bool, download: bool) -> Any:
    """``datasets.load_dataset`` for one table, with one-line errors for missing data."""
    try:
        import datasets
    except ImportError:
        raise DatasetUnavailableError(f"{src} needs the `datasets` package: pip install 'lsr-gpu[datasets]'") from None
    if src.path is not None:
        if not src.path.is_file():
            raise DatasetUnavailableError(f"{src.path} does not exist")
        builder = "parquet" if src.path.name.lower().endswith(".parquet") else "json"
        if builder == "parquet":
            _parquet_rows(src.path)   # a damaged file: one line naming it (datasets logs pyarrow's words twice)
        return datasets.load_dataset(builder, data_files=str(src.path), split="train", streaming=True)
    try:
        with _hub_offline(not download):
            return datasets.load_dataset(src.repo, src.config, split=src.split, streaming=streaming,
                                         revision=src.revision)
    except (ConnectionError, OSError) as e:
        raise DatasetUnavailableError(_offline_message(src, e)) from None
    except ValueError as e:  # e.g. an unknown split or config: datasets lists the available ones
        raise ValueError(f"{src}: {' '.join(str(e).split())}") from None


@contextlib.contextmanager
def _hub_offline(offline: bool) -> Iterator[None]:
    """Offline mode for this call only (``download=False``, LSR_OFFLINE): the flags that huggingface_hub and
    datasets read from HF_HUB_OFFLINE when imported, switched on and restored."""
    if not offline:
        yield
        return
    import datasets.config
    import huggingface_hub.constants

    saved = huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE
    huggingface_hub.constants.HF_HUB_OFFLINE = datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        huggingface_hub.constants.HF_HUB_OFFLINE, datasets.config.HF_HUB_OFFLINE = saved


def _offline_message(src: Source, e: BaseException) -> str:
    cache = os.environ.get("HF_DATASETS_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "datasets")
    return (f"{src} is not in the local datasets cache and the Hugging Face Hub cannot be reached "
            f"({type(e).__name__}): run `datasets.load_dataset({src.repo!r}, {src.config!r}, split={src.split!r})` "
            f"once with network access (it fills {cache}), or download the table as Parquet/JSONL and pass the "
            "file instead (e.g. corpus.parquet?queries=queries.parquet&qrels=test.tsv)")


def _iter_rows(src: Source, streaming: bool, download: bool, wanted: Mapping[str, str],
               optional: tuple[str, ...] = ()) -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, {lsr name: value}) for the ``wanted`` columns (lsr name -> table column) of each row of ``src``;
    ``where`` names the file and line (JSON) or row. A column of ``optional`` that the table lacks reads as None.
    Local JSON files are read here, not by ``datasets``: its Arrow reader turns a number in a text column into
    a string and names neither the file nor the line of a malformed one."""
    if _is_json(src):
        if not src.path.is_file():
            raise DatasetUnavailableError(f"{src.path} does not exist")
        for where, obj in iter_json_objects(src.path):
            for key, col in wanted.items():
                if col and col not in obj and key not in optional:
                    raise ValueError(f"{where}: no field {col!r} (for {key}; fields: {sorted(obj)[:20]}); fill it "
                                     f"(\"\" for an empty {key}), or map another with ?{key}=COLUMN")
            yield where, {key: obj.get(col) if col else "" for key, col in wanted.items()}
        return
    table = _open(src, streaming, download)
    n = 0
    for batch in table.iter(batch_size=_BATCH):
        size = len(next(iter(batch.values()))) if batch else 0
        cols = {}
        for key, col in wanted.items():
            if col and col not in batch and key not in optional:
                raise ValueError(f"{src} has no column {col!r} (for {key}; columns: {sorted(batch)}): "
                                 f"map it with ?{key}=COLUMN")
            cols[key] = batch[col] if col in batch else [None if col else ""] * size
        for i in range(size):
            yield f"{src} row {n + i}", {key: values[i] for key, values in cols.items()}
        n += size


def _row_id(value: Any, what: str, where: str, option: str | None) -> str:
    """A row's id as text: a string or an integer. A null id is refused (``str(None)`` would give every such row
    the id 'None'), and so is a float (a column with a null becomes float in pandas: 1.0, nan). ``option``: the
    spec option that picks the column, if there is one."""
    pick = f", or pick another with ?{option}=COLUMN" if option else ""
    if value is None:
        raise ValueError(f"{where}: the {what} is null (missing); every row needs one: fill the column{pick}")
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{where}: the {what} must be a string or an integer, got {type(value).__name__} "
                         f"{value!r}; fix the column{pick}")
    text = str(value)
    check_id(text, what, where)
    return text


def _iter_docs(src: Source, cols: Mapping[str, str], streaming: bool, download: bool) -> Iterator[tuple[str, str]]:
    wanted = {k: cols[k] for k in ("id", "title", "text")}
    # the default title column may be absent (BEIR folders: title optional); one the user named may not
    optional = ("title",) if cols["title"] == "title" else ()
    for where, row in _iter_rows(src, streaming, download, wanted, optional):
        doc_id = _row_id(row["id"], "doc id", where, "id")
        title = text_field(row["title"], f"title ({wanted['title']!r})", where, required=False,
                           fix="fix it, or pick another column with ?title=COLUMN (title= for none)")
        text = text_field(row["text"], f"text ({wanted['text']!r})", where, required=True,
                          fix="fix it, or pick another column with ?text=COLUMN")
        yield doc_id, f"{title} {text}".strip()


def _is_json(src: Source) -> bool:
    return src.path is not None and src.path.name.lower().endswith((".json", ".jsonl", ".json.gz", ".jsonl.gz"))


def _is_text_file(src: Source) -> bool:
    return src.path is not None and not _is_table(src.path.name)


def _read_queries(src: Source, cols: Mapping[str, str], download: bool) -> dict[str, str]:
    if _is_text_file(src):
        return read_topics_tsv(src.path)
    out: dict[str, str] = {}
    rows = _iter_rows(src, False, download, {"id": cols["query_id"], "text": cols["query_text"]})
    for where, row in rows:
        qid = _row_id(row["id"], "query id", where, "query_id")
        check_new(out, qid, "query id", where)
        out[qid] = text_field(row["text"], f"query text ({cols['query_text']!r})", where, required=True,
                              fix="fix it, or pick another column with ?query_text=COLUMN")
    return out


def _read_qrels(src: Source, download: bool) -> dict[str, dict[str, int]]:
    if _is_text_file(src):
        return read_qrels(src.path)
    names = _columns(src, download)
    picked = []
    for choices in _QRELS_COLUMNS:
        found = next((c for c in choices if c in names), None)
        if found is None:
            raise ValueError(f"{src}: qrels need one of the columns {choices} (columns: {sorted(names)})")
        picked.append(found)
    rows = _iter_rows(src, False, download, dict(zip(("query_id", "doc_id", "grade"), picked)))
    return qrels_from_rows(((where, _row_id(r["query_id"], "query id", where, None),
                             _row_id(r["doc_id"], "doc id", where, None), _grade(r["grade"], where))
                            for where, r in rows), str(src))


def _columns(src: Source, download: bool) -> set[str]:
    """The column names of a table (of a local JSON file: its first object's fields)."""
    if _is_json(src):
        return set(next((obj for _, obj in iter_json_objects(src.path)), {}))
    return set(_open(src, False, download).column_names or [])


def _grade(value: Any, where: str) -> str:
    """A relevance grade: an integer (a float only when whole: 1.0 from a pandas column), as text."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"{where}: the relevance grade must be an integer, got {value!r}")
    return str(value)


def _n_rows(src: Source, streaming: bool, download: bool) -> int | None:
    """Row count for the progress bar, when it is known without reading the data."""
    if src.path is not None:
        if src.path.name.lower().endswith(".parquet") and src.path.is_file():
            return _parquet_rows(src.path)
        return count_lines(src.path) if src.path.is_file() else None
    table = _open(src, streaming, download)
    if not streaming:
        return len(table)
    splits = getattr(getattr(table, "info", None), "splits", None) or {}
    info = splits.get(src.split) if hasattr(splits, "get") else None
    return getattr(info, "num_examples", None)


def _parquet_rows(path: Path) -> int:
    """The row count in a local Parquet file's footer; a file that is not Parquet is a one-line ValueError naming
    it (pyarrow's message names no file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{path} is not a readable Parquet file ({' '.join(str(e).split())}); write it again "
                         "(e.g. pandas' DataFrame.to_parquet), or give a .jsonl file") from None
