"""Evaluation of runs, keyed by ir-measures metric strings.

Module map:

* ``measures``: ``evaluate`` / ``per_query`` through ir-measures (pytrec_eval) on a run dict or file.
* ``topk``: ``evaluate_topk``, the same trec_eval definitions computed on [B, k] search results without
  building a run dict (RR, nDCG, R, P, AP; other measures fall back to ir-measures).

Importing this package is cheap: ir-measures is imported on first use.
"""

from lsr.evaluation.measures import BEIR_METRICS, DL_METRICS, MSMARCO_METRICS, evaluate, parse_metrics, per_query

__all__ = ["BEIR_METRICS", "DL_METRICS", "MSMARCO_METRICS", "evaluate", "parse_metrics", "per_query"]
