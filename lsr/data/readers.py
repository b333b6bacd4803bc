"""Readers of the files a dataset is made of: topics (TSV, BEIR JSONL), qrels (TREC, BEIR) and document streams.

Every reader checks ids as it reads them (``lsr.storage.files.check_id``: ids a run file can hold) and
refuses duplicates, naming the file and line.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from lsr.data.dataset import DocsIter, Qrels
from lsr.storage.files import PathLike, check_id, iter_lines, iter_tsv_pairs

__all__ = ["check_new", "qrels_from_rows", "read_beir_qrels", "read_beir_queries", "read_jsonl", "read_qrels",
           "read_topics_tsv", "read_trec_qrels", "unique_docs"]


def check_new(seen: dict | set, key: Any, what: str, where: str) -> None:
    """Refuse a second ``key`` (an id, a judgement) in one file: one line naming it and where."""
    if key in seen:
        raise ValueError(f"{where}: duplicate {what} {key!r}")


def read_topics_tsv(path: PathLike) -> dict[str, str]:
    """``qid<TAB>text`` lines -> {qid: text}."""
    out: dict[str, str] = {}
    for n, qid, text in iter_tsv_pairs(path, "qid<TAB>text"):
        check_id(qid, "query id", f"{path}:{n}")
        check_new(out, qid, "query id", f"{path}:{n}")
        out[qid] = text
    return out


def read_jsonl(path: PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, object) of a BEIR JSONL file; every object has a string or integer ``_id``."""
    for n, line in iter_lines(path):
        if line.strip():
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: invalid JSON ({e})") from None
            if not isinstance(obj, dict) or "_id" not in obj:
                got = "no '_id'" if isinstance(obj, dict) else f"a JSON {type(obj).__name__}"
                raise ValueError(f"{path}:{n}: expected a JSON object with '_id' (BEIR layout), got {got}")
            if isinstance(obj["_id"], bool) or not isinstance(obj["_id"], (str, int)):
                raise ValueError(f"{path}:{n}: '_id' must be a string or an integer, got {json.dumps(obj['_id'])}")
            yield n, obj


def read_beir_queries(path: PathLike) -> dict[str, str]:
    """BEIR ``queries.jsonl`` (``_id``, ``text``) -> {qid: text}."""
    out: dict[str, str] = {}
    for n, obj in read_jsonl(path):
        qid = str(obj["_id"])
        check_id(qid, "query id", f"{path}:{n}")
        check_new(out, qid, "query id", f"{path}:{n}")
        out[qid] = str(obj.get("text", "")).strip()
    return out


def qrels_from_rows(rows: Iterable[tuple[int, str, str, str]], path: PathLike) -> Qrels:
    """(line, qid, docno, grade) rows -> {qid: {docno: grade}}, ids checked, duplicates refused."""
    qrels: Qrels = {}
    for n, qid, docno, grade in rows:
        where = f"{path}:{n}" if n else str(path)
        check_id(qid, "query id", where)
        check_id(docno, f"doc id (judged for query {qid!r})", where)
        try:
            rel = int(grade)
        except ValueError:
            raise ValueError(f"{path}:{n}: relevance {grade!r} is not an integer") from None
        docs = qrels.setdefault(qid, {})
        check_new(docs, docno, f"judgement for query {qid!r}: doc", f"{path}:{n}")
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
