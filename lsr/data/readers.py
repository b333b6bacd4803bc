"""Readers of the files a dataset is made of: topics (TSV, BEIR JSONL), qrels (TREC, BEIR) and document streams.

Every reader checks ids as it reads them (``lsr.utils.ids.check_id``: ids a run file can hold) and
refuses duplicates, naming the file and line.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from lsr.data.dataset import DocsIter, Qrels
from lsr.storage.files import PathLike, iter_lines, iter_tsv_pairs, open_binary, open_text
from lsr.utils.ids import check_id

__all__ = ["DOC_HEADER_IDS", "QUERY_HEADER_IDS", "check_new", "iter_json_objects", "iter_tsv_rows", "json_type",
           "qrels_from_rows", "read_beir_qrels", "read_beir_queries", "read_jsonl", "read_qrels", "read_topics_tsv",
           "read_trec_qrels", "text_field", "tsv_has_header", "unique_docs"]

log = logging.getLogger(__name__)

# the id column's name in the first row of a TSV collection / topics file that has a header (MS MARCO's files
# have none; files exported from pandas or BEIR tools often do): that row is column names, not a document
DOC_HEADER_IDS = frozenset({"id", "_id", "docid", "doc_id", "doc-id", "docno", "doc_no", "pid", "passage_id",
                            "passage-id", "corpus_id", "corpus-id", "did"})
QUERY_HEADER_IDS = frozenset({"id", "_id", "qid", "query_id", "query-id", "queryid", "topic", "topic_id",
                              "topic-id"})
_COLUMN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,39}")   # a column name: one word, not a text


def _is_header(key: str, value: str, header_ids: frozenset[str]) -> bool:
    """Whether a first row ``key<TAB>value`` names columns: a known id column name and a one-word text column."""
    return key.lower() in header_ids and _COLUMN_NAME.fullmatch(value) is not None


def iter_tsv_rows(path: PathLike, what: str, header_ids: frozenset[str]) -> Iterator[tuple[int, str, str]]:
    """``iter_tsv_pairs`` without a header row: a first row whose id is a column name of ``header_ids`` and whose
    text is one word (``id<TAB>text``, ``docid<TAB>text``, ``pid<TAB>passage``...) is skipped, with an info line."""
    first = True
    for n, key, value in iter_tsv_pairs(path, what):
        if first and _is_header(key, value, header_ids):
            log.info("%s:%d: skipping the header row %r (column names, not data)", path, n, f"{key}\t{value}")
            first = False
            continue
        first = False
        yield n, key, value


def tsv_has_header(path: PathLike, what: str, header_ids: frozenset[str]) -> bool:
    """Whether ``iter_tsv_rows`` skips the first row of ``path`` (reads that row only): the row count to subtract
    from ``count_lines``."""
    return any(_is_header(key, value, header_ids) for _, key, value in itertools.islice(iter_tsv_pairs(path, what), 1))


def check_new(seen: dict | set, key: Any, what: str, where: str) -> None:
    """Refuse a second ``key`` (an id, a judgement) in one file: one line naming it and where."""
    if key in seen:
        raise ValueError(f"{where}: duplicate {what} {key!r}")


def read_topics_tsv(path: PathLike) -> dict[str, str]:
    """``qid<TAB>text`` lines -> {qid: text} (a header row, e.g. ``qid<TAB>text``, skipped: ``iter_tsv_rows``)."""
    out: dict[str, str] = {}
    for n, qid, text in iter_tsv_rows(path, "qid<TAB>text", QUERY_HEADER_IDS):
        check_id(qid, "query id", f"{path}:{n}")
        check_new(out, qid, "query id", f"{path}:{n}")
        out[qid] = text
    return out


def iter_json_objects(path: PathLike, expected: str = "a JSON object") -> Iterator[tuple[str, dict]]:
    """(where, object) of a JSON Lines file, or of a ``.json`` file holding one JSON array of objects; ``where``
    is ``path:line`` (``path row i`` in an array). A line that is not a JSON object is refused, naming the file
    and line and what was ``expected``."""
    if str(path).lower().endswith((".json", ".json.gz")) and _starts_with_array(path):   # .jsonl: lines only
        try:
            with open_text(path) as f:
                rows = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON ({e})") from None
        for i, obj in enumerate(rows):
            if not isinstance(obj, dict):
                raise ValueError(f"{path} row {i}: expected {expected}, got {json_type(obj)}")
            yield f"{path} row {i}", obj
        return
    for n, line in iter_lines(path):
        if line.strip():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: invalid JSON ({e}); one JSON object per line expected") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{n}: expected {expected}, got {json_type(obj)}")
            yield f"{path}:{n}", obj


def _starts_with_array(path: PathLike) -> bool:
    """Whether the file's first character (after a BOM and white space) opens a JSON array. A file that cannot
    be read says so when its lines are read."""
    try:
        with open_binary(path) as f:
            return f.read(4096).removeprefix(b"\xef\xbb\xbf").lstrip()[:1] == b"["
    except (OSError, EOFError, zlib.error):
        return False


def json_type(value: Any) -> str:
    """A value's type in JSON's words ("a JSON array" for a list), for errors."""
    names = {dict: "a JSON object", list: "a JSON array", str: "a string", bool: "a boolean", int: "a number",
             float: "a number"}
    return "null" if value is None else names.get(type(value), f"a {type(value).__name__}")


def read_jsonl(path: PathLike) -> Iterator[tuple[str, dict]]:
    """(where, object) of a BEIR JSONL file (``where``: ``path:line``); every object has a string or integer
    ``_id``."""
    expected = "a JSON object with '_id' (BEIR layout)"
    for where, obj in iter_json_objects(path, expected):
        if "_id" not in obj:
            raise ValueError(f"{where}: expected {expected}, got no '_id'")
        if isinstance(obj["_id"], bool) or not isinstance(obj["_id"], (str, int)):
            raise ValueError(f"{where}: '_id' must be a string or an integer, got {json.dumps(obj['_id'])}")
        yield where, obj


def text_field(value: Any, field: str, where: str, *, required: bool, fix: str = "") -> str:
    """A row's text field, stripped. Strings only (an empty one is fine): a number or a list is not converted
    and a missing or null text is not read as empty (``required``; an optional field, e.g. a title, may be
    missing). ``fix`` ends the error (how to pick another field)."""
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        got = "missing or null" if value is None else f"{json_type(value)} {_short(value)}, not a string"
        raise ValueError(f"{where}: the {field} field is {got}; every row needs a string (\"\" for an empty one)"
                         + (f"; {fix}" if fix else ""))
    return value.strip()


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_beir_queries(path: PathLike) -> dict[str, str]:
    """BEIR ``queries.jsonl`` (``_id``, ``text``) -> {qid: text}."""
    out: dict[str, str] = {}
    for where, obj in read_jsonl(path):
        qid = str(obj["_id"])
        check_id(qid, "query id", where)
        check_new(out, qid, "query id", where)
        out[qid] = text_field(obj.get("text"), "'text'", where, required=True)
    return out


def qrels_from_rows(rows: Iterable[tuple[int | str, str, str, str]], path: PathLike) -> Qrels:
    """(line, qid, docno, grade) rows -> {qid: {docno: grade}}, ids checked, duplicates refused. ``line`` is a
    line number (0: unknown) or where the row is, as errors name it (``file row 3``)."""
    qrels: Qrels = {}
    for n, qid, docno, grade in rows:
        where = n if isinstance(n, str) else f"{path}:{n}" if n else str(path)
        check_id(qid, "query id", where)
        check_id(docno, f"doc id (judged for query {qid!r})", where)
        try:
            rel = int(grade)
        except ValueError:
            raise ValueError(f"{where}: relevance {grade!r} is not an integer") from None
        docs = qrels.setdefault(qid, {})
        check_new(docs, docno, f"judgement for query {qid!r}: doc", where)
        docs[docno] = rel
    return qrels


def _split_rows(path: PathLike, n_cols: int, header: bool) -> Iterator[tuple[int, list[str]]]:
    """Whitespace-split rows of n_cols; with ``header``, a first line whose last column is not an integer
    (``query-id corpus-id score``) is skipped, and a first line of data is kept."""
    for n, line in iter_lines(path):
        parts = line.split()
        if not parts:
            continue
        if header:
            header = False
            if not parts[-1].lstrip("+-").isdigit():
                continue
        if len(parts) != n_cols:
            raise ValueError(f"{path}:{n}: expected {n_cols} columns, got {len(parts)}: {line!r}")
        yield n, parts


def read_trec_qrels(path: PathLike) -> Qrels:
    """TREC qrels (``qid iter docno grade``, whitespace separated; the iter column is ignored)."""
    return qrels_from_rows(((n, p[0], p[2], p[3]) for n, p in _split_rows(path, 4, False)), path)


def read_beir_qrels(path: PathLike) -> Qrels:
    """BEIR qrels TSV (``query-id corpus-id score``; a header line first, as BEIR writes it, or none)."""
    return qrels_from_rows(((n, p[0], p[1], p[2]) for n, p in _split_rows(path, 3, True)), path)


def read_qrels(path: PathLike) -> Qrels:
    """A TREC (4 columns) or BEIR (3 columns, an optional header) qrels file, told apart by the first line."""
    for _, line in iter_lines(path):
        if line.strip():
            return read_beir_qrels(path) if len(line.split()) == 3 else read_trec_qrels(path)
    return {}


def unique_docs(docs: DocsIter, source: PathLike) -> DocsIter:
    """``docs`` as they come, refusing a doc id seen before in ``source``."""
    seen: set[str] = set()  # ~100 bytes per id: fine for MS MARCO-sized corpora on a GPU host
    for doc_id, text in docs:
        check_new(seen, doc_id, "doc id", str(source))
        seen.add(doc_id)
        yield doc_id, text
