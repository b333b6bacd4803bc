"""Evaluation with ir-measures (pytrec_eval under the hood), keyed by the caller's metric strings.

Conventions (as in ir-measures / ``trec_eval -c``): only judged queries count, and a judged query
missing from the run scores 0. TREC DL reports recall and MAP at relevance level 2
(``R(rel=2)@1000``, ``AP(rel=2)``, Pyserini's ``trec_eval -l 2``); MS MARCO MRR@10 is ``RR@10``.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lsr.storage.files import PathLike

log = logging.getLogger(__name__)

__all__ = ["BEIR_METRICS", "DL_METRICS", "MSMARCO_METRICS", "evaluate", "parse_metrics", "per_query"]

MSMARCO_METRICS = ("RR@10", "nDCG@10", "R@1000")
DL_METRICS = ("nDCG@10", "R(rel=2)@1000", "AP(rel=2)")
BEIR_METRICS = ("nDCG@10", "R@100", "R@1000")

RunLike = Mapping[str, Mapping[str, float]] | PathLike
QrelsLike = Mapping[str, Mapping[str, int]] | PathLike


def parse_metrics(metrics: str | Sequence[str]) -> dict[str, Any]:
    """Metric strings -> {string: ir_measures measure}; an unknown metric raises ValueError."""
    import ir_measures

    if isinstance(metrics, str):  # one metric; not split on commas ("P(rel=2,judged_only=True)@10")
        metrics = (metrics,)
    out: dict[str, Any] = {}
    for text in metrics:
        try:
            out[text] = ir_measures.parse_measure(text)
        except (NameError, ValueError, SyntaxError, TypeError, KeyError, AssertionError) as e:
            raise ValueError(f"unknown metric {text!r} ({type(e).__name__}: {e}); use ir-measures names such as RR@10, "
                             "nDCG@10, R@1000, R(rel=2)@1000, AP(rel=2) (https://ir-measur.es/en/latest/measures.html)"
                             ) from None
        params, supported = getattr(out[text], "params", {}), getattr(out[text], "SUPPORTED_PARAMS", None)
        unknown = sorted(set(params) - set(supported)) if supported is not None else []
        if unknown:
            raise ValueError(f"unknown metric {text!r}: no parameter {unknown[0]!r} (it takes "
                             f"{', '.join(sorted(supported)) or 'none'}); see https://ir-measur.es/en/latest/measures.html")
        cutoff = params.get("cutoff")
        # trec_eval aborts the process on a cutoff below 1 (pytrec_eval asserts in C)
        if cutoff is not None and (isinstance(cutoff, bool) or not isinstance(cutoff, int) or cutoff < 1):
            raise ValueError(f"metric {text!r}: the cutoff after @ must be a whole number >= 1, got {cutoff!r}")
    if not out:
        raise ValueError("no metrics given")
    return out


def _as_run(run: RunLike) -> Mapping[str, Mapping[str, float]]:
    if isinstance(run, Mapping):   # run files are checked as they are read; a dict here
        for qid, docs in run.items():
            bad = next((d for d, s in docs.items()
                        if isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(s)), None)
            if bad is not None:
                raise ValueError(f"run: query {qid!r}, doc {bad!r} has score {docs[bad]!r}; scores must be finite "
                                 "numbers (a NaN would rank by the dict's order)")
        return run
    from lsr.data.runs import read_run

    return read_run(run)


def _as_qrels(qrels: QrelsLike) -> Mapping[str, Mapping[str, int]]:
    """A qrels dict, a TREC / BEIR qrels file, or a dataset spec (folder or ir_datasets id)."""
    if isinstance(qrels, Mapping):
        out = qrels
    else:
        from lsr.data import sources as data

        out = data.read_qrels(qrels) if Path(qrels).is_file() else data.load_dataset(str(qrels)).qrels
    if not out:
        raise ValueError(f"no relevance judgements in {qrels if not isinstance(qrels, Mapping) else 'the qrels'}")
    return out


def evaluate(run: RunLike, qrels: QrelsLike, metrics: str | Sequence[str] = MSMARCO_METRICS, *,
             require_overlap: bool = False) -> dict[str, float]:
    """Mean of each metric over the judged queries.

    Args:
        run: a run dict (qid -> docno -> score) or a TREC / MS MARCO run file (``.gz`` ok).
        qrels: a qrels dict, a TREC or BEIR qrels file, or a dataset spec for :func:`lsr.data.sources.load_dataset`.
        metrics: ir-measures strings, e.g. ``("RR@10", "nDCG@10", "R@1000")`` or :data:`DL_METRICS`.
        require_overlap: raise ValueError when no judged query has results in the run (every metric would be
            0: usually a run evaluated against another collection's qrels); ``lsr evaluate`` sets it.

    Returns:
        {metric string exactly as passed: value}.
    """
    import ir_measures

    parsed = parse_metrics(metrics)
    qrels_map, run_map = _as_qrels(qrels), _as_run(run)
    what = "the run" if isinstance(run, Mapping) else str(run)
    if require_overlap and not any(q in run_map for q in qrels_map):
        raise ValueError(f"{what} has results for none of the {len(qrels_map)} judged queries (run query ids e.g. "
                         f"{next(iter(run_map), None)!r}, judged e.g. {next(iter(qrels_map))!r}): are these the "
                         "qrels of the run's queries?")
    note_missing_queries(qrels_map, run_map, what)
    agg = ir_measures.calc_aggregate(list(parsed.values()), qrels_map, run_map)
    return {text: float(agg[m]) for text, m in parsed.items()}


def note_missing_queries(qrels: Mapping[str, Any], answered: Any, what: str) -> None:
    """Log a warning when judged queries have no results in ``answered`` (a set or mapping of query ids):
    they count 0, and a run cut short or written for other queries should not pass as a low score."""
    missing = [q for q in qrels if q not in answered]
    if missing:
        log.warning("%s has no results for %d of the %d judged queries (e.g. %r); they count 0, as with trec_eval -c",
                    what, len(missing), len(qrels), missing[0])


def per_query(run: RunLike, qrels: QrelsLike, metrics: str | Sequence[str] = MSMARCO_METRICS
              ) -> dict[str, dict[str, float]]:
    """Per-query values: {metric string: {qid: value}} over the judged queries (e.g. for significance tests)."""
    import ir_measures

    parsed = parse_metrics(metrics)
    by_measure: dict[Any, dict[str, float]] = {m: {} for m in parsed.values()}
    for row in ir_measures.iter_calc(list(parsed.values()), _as_qrels(qrels), _as_run(run)):
        by_measure[row.measure][row.query_id] = float(row.value)
    return {text: by_measure[m] for text, m in parsed.items()}
