"""TREC and MS MARCO run files.

A run is ``dict[str, dict[str, float]]``: qid -> docno -> score, each inner dict in rank order (best
first). That is the shape ir-measures / pytrec_eval take directly.

* TREC: ``qid Q0 docno rank score tag`` (whitespace separated), ranks from 1.
* MS MARCO: ``qid\\tdocno\\trank``. It has no scores, so :func:`read_msmarco` sets
  ``score = 1 / rank``: positive, strictly decreasing with the rank, so any evaluation tool ranks
  the documents exactly as the file does.

Files ending in ``.gz`` are read and written gzip-compressed; writes are atomic (temp file + rename).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lsr.storage.files import (
    PathLike,
    arrow_strings,
    atomic_write,
    atomic_write_bytes,
    iter_lines,
    to_numpy,
)
from lsr.utils.ids import check_id, first_bad_arrow_id, first_bad_id

__all__ = [
    "Run",
    "detect_run_format",
    "from_topk",
    "read_msmarco",
    "read_run",
    "read_trec",
    "write_msmarco",
    "write_topk",
    "write_trec",
]

Run = dict[str, dict[str, float]]
ROWS_PER_THREAD = 100_000  # run lines formatted per thread by write_topk (by default)


def from_topk(qids: Sequence[str], docnos: Sequence[str], scores: Any, doc_idx: Any) -> Run:
    """Turn search output into a run.

    Args:
        qids: B query ids, one per row.
        docnos: external doc ids; ``doc_idx`` indexes into it.
        scores: float [B, k] (torch tensor or ndarray), sorted descending per row.
        doc_idx: int64 [B, k]; -1 marks padding (fewer than k hits) and is skipped.
    """
    s, d = to_numpy(scores), to_numpy(doc_idx)
    if s.ndim != 2 or s.shape != d.shape:
        raise ValueError(f"scores {s.shape} and doc_idx {d.shape} must both be [B, k]")
    if len(qids) != s.shape[0]:
        raise ValueError(f"got {len(qids)} qids for {s.shape[0]} rows of results")
    if d.size and int(d.max()) >= len(docnos):
        raise ValueError(f"doc index {int(d.max())} is out of range for {len(docnos)} docnos")
    run: Run = {}
    for qid, row_s, row_d in zip(qids, s.tolist(), d.tolist()):
        qid = str(qid)
        if qid in run:
            raise ValueError(f"duplicate query id {qid!r}")
        run[qid] = {docnos[j]: float(v) for v, j in zip(row_s, row_d) if j >= 0}
    return run


def _ranked(run: Mapping[str, Mapping[str, float]]):
    """Yield (qid, rank, docno, score), score descending; ties keep insertion order (stable sort)."""
    for qid, docs in run.items():
        items = sorted(docs.items(), key=lambda kv: -kv[1])
        for rank, (docno, score) in enumerate(items, 1):
            yield str(qid), rank, str(docno), float(score)


_FINITE_FIX = "run files need finite scores: check the vectors for huge weights (a dot product overflowed)"


def write_trec(run: Mapping[str, Mapping[str, float]], path: PathLike, tag: str = "lsr") -> None:
    """Write a TREC run (``qid Q0 docno rank score tag``).

    Documents are sorted by score (descending; ties keep the run's order) and ranked from 1. Scores
    are written with ``repr``: the shortest text that reads back to the same float (>= 6 significant
    digits, exact round trip), so near-ties are never collapsed by rounding.
    """
    check_id(tag, "run tag", str(path))
    with atomic_write(path) as f:
        for qid, rank, docno, score in _ranked(run):
            if rank == 1:
                check_id(qid, "query id", str(path))
            check_id(docno, f"docno (query {qid!r})", str(path))
            if not math.isfinite(score):
                raise ValueError(f"{path}: query {qid!r}, doc {docno!r} has score {score}; {_FINITE_FIX}")
            f.write(f"{qid} Q0 {docno} {rank} {score!r} {tag}\n")


def write_topk(path: PathLike | Mapping[str, PathLike], qids: Sequence[str], docnos: Any, scores: Any,
               doc_idx: Any, fmt: str = "trec", tag: str = "lsr", replace: bool = True,
               threads: int | None = None) -> int:
    """Write search output ([B, k] arrays in rank order) straight to TREC and/or MS MARCO runs.

    The vectorised twin of ``write_trec(from_topk(...))`` for large runs: columns are built once with
    Arrow and written by its CSV writer (several files in parallel threads). Scores are float32 printed
    as the shortest text that reads back to the same float32. Padding (doc index -1) is skipped.

    Args:
        path: the run file, or ``{"trec": path, "msmarco": path}`` to write both from one pass.
        fmt: format of a single ``path``: "trec" or "msmarco".
        replace: replace existing files; False raises FileExistsError for an existing one, also one
            that another process creates meanwhile (the file is published by a no-replace link).
        threads: formatting threads (at most one per query); default: one per ``ROWS_PER_THREAD`` run lines,
            at most the CPU count and 16. The files are the same for any count.
    Returns:
        the number of lines written per file.
    """
    import numpy as np

    targets = dict(path) if isinstance(path, Mapping) else {fmt: path}
    if not targets or set(targets) - {"trec", "msmarco"}:
        raise ValueError(f"formats must be 'trec' or 'msmarco', not {sorted(targets)}")
    s, d = to_numpy(scores).astype(np.float32), to_numpy(doc_idx).astype(np.int64)
    if s.ndim != 2 or s.shape != d.shape or len(qids) != s.shape[0]:
        raise ValueError(f"scores {s.shape} / doc_idx {d.shape} must be [B, k] with B = {len(qids)} qids")
    where = ", ".join(map(str, targets.values()))
    check_id(tag, "run tag", where)
    rows = _TopkRows(_checked_qids(qids, where), s, d, docnos, tag, where)
    # Slices of whole queries are formatted in parallel threads (Arrow's take / cast / CSV writer
    # release the GIL), then concatenated in order: the file is the same for any number of slices.
    if threads is None:
        threads = min(os.cpu_count() or 1, 16, -(-rows.n // ROWS_PER_THREAD))
    n_parts = max(1, min(len(qids), threads))
    bounds = np.linspace(0, len(qids), n_parts + 1).astype(np.int64)
    slices = [(int(bounds[i]), int(bounds[i + 1]), list(targets)) for i in range(n_parts)]
    if n_parts == 1:
        parts = [rows.render(*slices[0])]
    else:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(n_parts) as pool:
            parts = list(pool.map(lambda sl: rows.render(*sl), slices))
    for f, target in targets.items():
        _write_bytes([p[f] for p in parts], Path(target), replace)
    return rows.n


def _checked_qids(qids: Sequence[str], where: str) -> list[str]:
    """Query ids as strings: one-line errors for an id a run file cannot hold and for duplicates."""
    qid_strs = [str(q) for q in qids]
    bad = first_bad_id(qid_strs)
    if bad is not None:
        check_id(qid_strs[bad], f"query id (row {bad})", where)
    if len(set(qid_strs)) != len(qids):
        raise ValueError(f"{where}: duplicate query ids")
    return qid_strs


class _TopkRows:
    """The checked columns of ``write_topk``'s [B, k] output (padding dropped), rendered by query slices."""

    def __init__(self, qids: list[str], s: Any, d: Any, docnos: Any, tag: str, where: str) -> None:
        import numpy as np
        import pyarrow as pa

        self.valid = d >= 0
        finite = np.isfinite(s) | ~self.valid
        if not finite.all():
            row, col = (int(x[0]) for x in np.nonzero(~finite))
            raise ValueError(f"{where}: query {qids[row]!r} has score {s[row, col]} at rank {col + 1}; {_FINITE_FIX}")
        self.docs = arrow_strings(docnos)
        self.flat = d[self.valid]
        if self.flat.size and int(self.flat.max()) >= len(self.docs):
            raise ValueError(f"doc index {int(self.flat.max())} is out of range for {len(self.docs)} docnos")
        bad = first_bad_arrow_id(self.docs)
        if bad is not None:
            check_id(self.docs[bad].as_py() or "", f"docno (doc index {bad})", where)
        self.n, self.s, self.tag = len(self.flat), s, tag
        self.qids = pa.array(qids, pa.string())
        self.counts = self.valid.sum(1)
        self.row_start = np.concatenate([[0], np.cumsum(self.counts)])

    def render(self, qa: int, qb: int, formats: list[str]) -> dict[str, bytes]:
        """The lines of queries [qa, qb) in each format."""
        import numpy as np
        import pyarrow as pa

        pa_, pb = int(self.row_start[qa]), int(self.row_start[qb])
        v = self.valid[qa:qb]
        cols = {"q": self.qids.take(pa.array(np.repeat(np.arange(qa, qb), self.counts[qa:qb]))),
                "d": self.docs.take(pa.array(self.flat[pa_:pb])), "r": pa.array((np.nonzero(v)[1] + 1).astype(np.int32))}
        out = {}
        for f in formats:
            if f == "trec":
                zeros = pa.array(np.zeros(pb - pa_, np.int32))  # constant columns: one dictionary entry each
                table = pa.table({"q": cols["q"], "q0": pa.DictionaryArray.from_arrays(zeros, pa.array(["Q0"])),
                                  "d": cols["d"], "r": cols["r"], "s": pa.array(self.s[qa:qb][v]).cast(pa.string()),
                                  "t": pa.DictionaryArray.from_arrays(zeros, pa.array([self.tag]))})
            else:
                table = pa.table(cols)
            out[f] = _csv_bytes(table, " " if f == "trec" else "\t")
        return out


def _csv_bytes(table: Any, delimiter: str) -> Any:
    """Arrow table -> headerless, unquoted delimited text (an Arrow buffer)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    sink = pa.BufferOutputStream()
    if table.num_rows:
        pacsv.write_csv(table, sink, pacsv.WriteOptions(include_header=False, delimiter=delimiter,
                                                        quoting_style="none"))
    return sink.getvalue()


def _write_bytes(chunks: Sequence[Any], path: Path, replace: bool = True) -> None:
    """Write buffers in order to ``path`` (gzip for .gz), atomically."""
    with atomic_write_bytes(path, replace=replace) as f:
        for chunk in chunks:
            f.write(memoryview(chunk))


def write_msmarco(run: Mapping[str, Mapping[str, float]], path: PathLike) -> None:
    """Write an MS MARCO run (``qid\\tdocno\\trank``), ranks from 1 in score order."""
    with atomic_write(path) as f:
        for qid, rank, docno, score in _ranked(run):
            if rank == 1:
                check_id(qid, "query id", str(path))
            check_id(docno, f"docno (query {qid!r})", str(path))
            if not math.isfinite(score):   # a NaN has no place in the order the ranks record
                raise ValueError(f"{path}: query {qid!r}, doc {docno!r} has score {score}; {_FINITE_FIX}")
            f.write(f"{qid}\t{docno}\t{rank}\n")


def _build(rows: list[tuple[str, str, float, int]], path: PathLike, ranks: bool = False) -> Run:
    """rows of (qid, docno, score, line) -> run sorted best first; duplicates raise. ``ranks``: the scores
    are 1 / rank (MS MARCO), so two equal scores of a query are one rank given twice, which raises too."""
    per_q: dict[str, list[tuple[str, float, int]]] = {}
    seen: dict[tuple[str, str], int] = {}
    for qid, docno, score, line in rows:
        if (qid, docno) in seen:
            raise ValueError(f"{path}:{line}: duplicate (query {qid!r}, doc {docno!r}); "
                             f"first seen on line {seen[qid, docno]}")
        seen[qid, docno] = line
        per_q.setdefault(qid, []).append((docno, score, line))
    run = {}
    for qid, docs in per_q.items():
        docs.sort(key=lambda d: -d[1])   # best first; stable, so equal scores keep the file order
        if ranks:
            _check_ranks(qid, docs, path)
        run[qid] = {docno: score for docno, score, _ in docs}
    return run


def _check_ranks(qid: str, docs: list[tuple[str, float, int]], path: PathLike) -> None:
    """Refuse one rank given twice in a query's list sorted by score = 1 / rank."""
    for (_, a, first), (_, b, line) in zip(docs, docs[1:]):
        if a == b:
            raise ValueError(f"{path}:{line}: query {qid!r} has rank {round(1 / a)} again (first on line {first}): "
                             "the order is ambiguous, or the file was cut short; give each document of a query "
                             "its own rank")


def _rows(path: PathLike, n_cols: int, fmt: str):
    for n, line in iter_lines(path):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != n_cols:
            raise ValueError(f"{path}:{n}: expected {n_cols} columns for a {fmt} run, got {len(parts)}: {line!r}")
        check_id(parts[0], "query id", f"{path}:{n}")
        check_id(parts[2 if n_cols == 6 else 1], "docno", f"{path}:{n}")
        yield n, parts


def read_trec(path: PathLike) -> Run:
    """Read a TREC run (6 columns); each query's documents come back sorted by score, best first.

    A last line whose run tag is a shorter prefix of the tag on the line before is refused: a file cut
    short inside its last tag would otherwise be read as complete."""
    rows = []
    tags = ("", "")
    for n, (qid, _q0, docno, _rank, score, tag) in _rows(path, 6, "TREC"):
        try:
            value = float(score)
        except ValueError:
            raise ValueError(f"{path}:{n}: score {score!r} is not a number") from None
        if not math.isfinite(value):
            raise ValueError(f"{path}:{n}: score {score!r} of query {qid!r}, doc {docno!r} is not finite; "
                             "evaluation tools cannot rank it: fix or drop the line")
        rows.append((qid, docno, value, n))
        tags = (tags[1], tag)
    before, last = tags
    if len(rows) > 1 and last != before and before.startswith(last):
        raise ValueError(f"{path}:{rows[-1][3]}: the last line's run tag {last!r} is the start of {before!r} on the "
                         "line before: the file looks cut short; write or copy it again")
    return _build(rows, path)


def read_msmarco(path: PathLike) -> Run:
    """Read an MS MARCO run (``qid docno rank``); score = 1 / rank (see the module docstring). Two documents
    at one rank of a query are refused: their order is ambiguous (and a file cut inside its last rank
    repeats an earlier rank)."""
    rows = []
    for n, (qid, docno, rank) in _rows(path, 3, "MS MARCO"):
        if not rank.isdigit() or not 1 <= int(rank) < 1 << 26:   # 1 / rank stays distinct below 2**26
            raise ValueError(f"{path}:{n}: rank {rank!r} is not an integer in [1, {1 << 26})")
        rows.append((qid, docno, 1.0 / int(rank), n))
    return _build(rows, path, ranks=True)


def detect_run_format(path: PathLike) -> str:
    """``"trec"`` (6 columns) or ``"msmarco"`` (3 columns), from the first non-empty line."""
    for n, line in iter_lines(path):
        cols = len(line.split())
        if cols == 0:
            continue
        if cols == 6:
            return "trec"
        if cols == 3:
            return "msmarco"
        raise ValueError(f"{path}:{n}: {cols} columns; expected a TREC (6) or MS MARCO (3) run")
    raise ValueError(f"{path} is an empty run file")


def read_run(path: PathLike) -> Run:
    """Read a TREC or MS MARCO run, detected by its number of columns."""
    return read_trec(path) if detect_run_format(path) == "trec" else read_msmarco(path)
