"""Training data: (query, positive, hard negatives) examples and their length-bucketed batches.

Sources:

* a dataset (local BEIR / TSV folder or ir_datasets id, via ``lsr.data.sources.load_dataset``): every judged
  (query, document) pair with a grade > 0 is a positive; the documents are held in memory;
* a triples TSV (``query<TAB>positive<TAB>negative[<TAB>negative...]``, MS MARCO's triples layout):
  texts are given, ids are made up (one id per distinct text).

Hard negatives are mined with lsr's own exact index (``mine_negatives``): BM25 or the model being
trained encodes the corpus, ``InvertedIndex`` + ``Searcher`` retrieve each training query's top
documents, and the non-positives among them (after skipping the top ``negatives.skip``) are the
candidates an epoch samples from. Teacher scores (``qid<TAB>docid<TAB>score``) feed MarginMSE / KL; with
them and no mining, a query's candidates are its teacher-scored non-positives.

Everything random draws from ``numpy.random.default_rng((seed, epoch))``, so an epoch's batches are a
function of (seed, epoch) alone: resuming mid-epoch replays them and skips the ones already done.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lsr.config import DataConfig
from lsr.storage.files import iter_lines
from lsr.train.config import TrainConfig

__all__ = ["Example", "TrainData", "epoch_batches", "load_train_data", "mine_negatives", "read_teacher_scores"]

log = logging.getLogger("lsr.train")


@dataclass(frozen=True)
class Example:
    """One query with its positive and hard-negative document ids."""

    qid: str
    positive: str
    negatives: tuple[str, ...] = ()


@dataclass
class TrainData:
    queries: dict[str, str]
    docs: dict[str, str]
    pairs: list[tuple[str, str]]                       # (qid, positive docid)
    positives: dict[str, set[str]]                     # qid -> every positive docid (never a negative)
    candidates: dict[str, list[str]] = field(default_factory=dict)  # qid -> hard-negative candidates
    teacher: dict[str, dict[str, float]] | None = None  # qid -> {docid: teacher score}
    fixed_negatives: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)  # triples' own negatives


def read_teacher_scores(path: str) -> dict[str, dict[str, float]]:
    """``qid<TAB>docid<TAB>score`` lines (whitespace-separated also accepted) -> {qid: {docid: score}}."""
    out: dict[str, dict[str, float]] = {}
    for lineno, line in iter_lines(path):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 3:
            raise ValueError(f"{path}:{lineno}: expected 'qid docid score', got {line[:80]!r}")
        try:
            score = float(parts[2])
        except ValueError:
            raise ValueError(f"{path}:{lineno}: the score {parts[2]!r} is not a number") from None
        if not math.isfinite(score):   # one NaN makes every loss of its batches NaN
            raise ValueError(f"{path}:{lineno}: the score {parts[2]!r} is not a finite number")
        scores = out.setdefault(parts[0], {})
        if parts[1] in scores:
            raise ValueError(f"{path}:{lineno}: a second score for query {parts[0]!r} and document {parts[1]!r}")
        scores[parts[1]] = score
    if not out:
        raise ValueError(f"{path}: no teacher scores")
    return out


def _from_dataset(source: DataConfig) -> TrainData:
    from lsr.data.sources import load_dataset

    ds = load_dataset(source.dataset, source.split)
    if not ds.qrels:
        raise ValueError(f"dataset {source.dataset} (split {source.split}) has no qrels: training needs judged "
                         "positives")
    docs = dict(ds.docs_iter())
    positives = {q: {d for d, g in judged.items() if g > 0 and d in docs} for q, judged in ds.qrels.items()}
    positives = {q: p for q, p in positives.items() if p and q in ds.queries}
    pairs = sorted((q, d) for q, ps in positives.items() for d in ps)
    if not pairs:
        raise ValueError(f"dataset {source.dataset}: no judged positive is in the corpus")
    return TrainData({q: ds.queries[q] for q in positives}, docs, pairs, positives)


def _from_triples(path: str, count: int) -> TrainData:
    """The triples file; a line that gives negatives gives at least ``count`` (none: random ones are drawn)."""
    queries: dict[str, str] = {}
    docs: dict[str, str] = {}
    qid_of: dict[str, str] = {}
    did_of: dict[str, str] = {}
    pairs, fixed, positives = [], {}, {}

    def doc_id(text: str) -> str:
        if text not in did_of:
            did_of[text] = f"d{len(did_of)}"
            docs[did_of[text]] = text
        return did_of[text]

    for lineno, line in iter_lines(path):
        parts = line.split("\t")
        if not line.strip():
            continue
        if len(parts) < 2 or not all(p.strip() for p in parts):
            raise ValueError(f"{path}:{lineno}: expected 'query<TAB>positive[<TAB>negative...]' with no empty field")
        q = parts[0].strip()
        qid = qid_of.setdefault(q, f"q{len(qid_of)}")
        queries[qid] = q
        pos = doc_id(parts[1].strip())
        positives.setdefault(qid, set()).add(pos)
        pairs.append((qid, pos))
        fixed[(qid, pos)] = tuple(dict.fromkeys(doc_id(t.strip()) for t in parts[2:]))
        if 0 < len(fixed[(qid, pos)]) < count:
            raise ValueError(f"{path}:{lineno}: {len(fixed[(qid, pos)])} distinct negative(s), fewer than "
                             f"negatives.count={count}: lower negatives.count, or give each line as many")
    if not pairs:
        raise ValueError(f"{path}: no triples")
    return TrainData(queries, docs, pairs, positives, fixed_negatives=fixed)


def load_train_data(cfg: TrainConfig) -> TrainData:
    """The configured dataset or triples file, with teacher scores attached (mining happens later)."""
    data = _from_triples(cfg.triples, cfg.negatives.count) if cfg.triples else _from_dataset(cfg.data)
    teacher_scores = cfg.loss.teacher_scores
    if teacher_scores:
        data.teacher = read_teacher_scores(teacher_scores)
        before = len(data.pairs)
        data.pairs = [(q, d) for q, d in data.pairs if d in data.teacher.get(q, {})]
        if not data.pairs:
            raise ValueError(f"{teacher_scores} scores none of the training positives (ids must match the dataset)")
        if len(data.pairs) < before:
            log.warning("%d of %d positives have no teacher score and are skipped", before - len(data.pairs), before)
        if cfg.negatives.mine == "none":
            data.candidates = {q: [d for d in scored if d not in data.positives.get(q, ()) and d in data.docs]
                               for q, scored in data.teacher.items()}
    return data


def mine_negatives(data: TrainData, encoder: Any, *, depth: int, skip: int, device: str) -> dict[str, list[str]]:
    """Hard-negative candidates per query: the top ``depth`` documents of ``encoder`` (a fitted
    ``LexicalEncoder`` or a ``SpladeEncoder``) that are not positives, minus the top ``skip`` of those,
    retrieved with lsr's exact search over an index of ``data.docs``."""
    from lsr.index.inverted import InvertedIndex
    from lsr.search.searcher import Searcher

    doc_ids = list(data.docs)
    vectors = encoder.encode_document([data.docs[d] for d in doc_ids], ids=doc_ids)
    index = InvertedIndex.build(vectors, device=device, metadata=encoder.describe())
    qids = sorted({q for q, _ in data.pairs})
    queries = encoder.encode_query([data.queries[q] for q in qids], ids=qids)
    most = max((len(data.positives.get(q, ())) for q in qids), default=0)
    _, idx = Searcher(index, device=device).search(queries.to(device), k=min(depth + most, len(doc_ids)),
                                                   query_metadata=encoder.describe())
    out = {}
    for q, row in zip(qids, idx.cpu().tolist()):
        negs = [doc_ids[i] for i in row if i >= 0 and doc_ids[i] not in data.positives.get(q, ())][:depth]
        out[q] = negs[skip:]
    return out


def _sample_negatives(data: TrainData, qid: str, positive: str, n: int, rng: np.random.Generator,
                      all_docs: Sequence[str]) -> tuple[tuple[str, ...], bool]:
    """``n`` distinct negatives of ``qid``: drawn from its triples line or mined candidates, topped up with
    random documents that are not positives when those are fewer (then the flag is True)."""
    fixed = data.fixed_negatives.get((qid, positive))
    pool: Sequence[str] = fixed if fixed else data.candidates.get(qid) or ()
    if len(pool) >= n:
        return tuple(pool[int(i)] for i in rng.choice(len(pool), size=n, replace=False)), False
    if pool and data.teacher is not None:   # a random document has no teacher score to distil
        raise ValueError(f"query {qid!r} has {len(pool)} teacher-scored negative candidates, fewer than "
                         f"negatives.count={n}: lower negatives.count, or raise negatives.depth")
    picks = list(dict.fromkeys(pool))
    avoid = data.positives.get(qid, set())
    others = len(all_docs) - len(avoid & data.docs.keys())
    if others < n:
        raise ValueError(f"negatives.count is {n} but query {qid!r} has only {others} documents that are not its "
                         "positives: lower negatives.count")
    taken = set(picks)
    while len(picks) < n:
        d = all_docs[int(rng.integers(len(all_docs)))]
        if d not in avoid and d not in taken:
            picks.append(d)
            taken.add(d)
    return tuple(picks), bool(pool)


def epoch_batches(data: TrainData, cfg: TrainConfig, epoch: int, batch_size: int | None = None
                  ) -> list[list[Example]]:
    """The epoch's batches: pairs shuffled, sorted by document length within windows of
    ``optim.bucket_batches`` batches (similar lengths pad little), cut into batches whose order is shuffled.
    A function of (seed, epoch, batch size) only; ``batch_size``: the global batch (default
    ``optim.batch_size``, one process's)."""
    rng = np.random.default_rng((cfg.seed, epoch))
    all_docs = list(data.docs)
    order = rng.permutation(len(data.pairs))
    examples, short = [], set()
    for i in order:
        q, d = data.pairs[int(i)]
        negatives, topped_up = _sample_negatives(data, q, d, cfg.negatives.count, rng, all_docs)
        examples.append(Example(q, d, negatives))
        if topped_up:
            short.add(q)
    if short:
        log.warning("%d queries (e.g. %r) have fewer than negatives.count=%d hard-negative candidates; random "
                    "documents fill the rest (raise negatives.depth, or lower negatives.count)", len(short),
                    min(short), cfg.negatives.count)
    batch_size = batch_size or cfg.optim.batch_size
    window = batch_size * cfg.optim.bucket_batches
    batches = []
    for w0 in range(0, len(examples), window):
        chunk = sorted(examples[w0:w0 + window], key=lambda e: len(data.docs[e.positive]))
        batches += [chunk[b0:b0 + batch_size] for b0 in range(0, len(chunk), batch_size)]
    return [batches[int(i)] for i in rng.permutation(len(batches))]
