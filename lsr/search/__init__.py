"""Exact top-k search over an ``InvertedIndex``.

Module map (``lsr.search.plan``'s docstring tells how one search is carried out):

* ``config``: ``SearchConfig``, every knob of a search, grouped by the plan step that reads it (the ``search:``
  section of a run config, ``--set search.<key>=...``).
* ``plan``: the printable ``SearchPlan`` of a batch (``plan_search``), with the reason for each choice; the block
  route's part is ``block_planner``, the span scorers' abilities are the registry ``scorers``. Executors only read
  the plan.
* ``searcher``: ``Searcher`` (query batching, memory bounds, docno mapping, ``explain``), ``exact_topk`` and the
  torch backend (a weighted gather-sum per document over the doc CSR).
* ``sharded``: ``ShardedSearcher``, the partitions of a ``ShardedIndex`` searched in turn on one device, merged
  exactly (``merge_hit_lists``; distributed search merges the ranks' lists with it too).
* ``filters``: ``DocFilter``, which documents a search may return (docno lists, masks, metadata expressions);
  ``filtered``: its routes (subset, mask, widen), planned by selectivity (``Searcher.search(filter=...)``).
* ``factory``: ``open_searcher``, the searcher of an index or index folder, sharded or not.
* ``gpu_search``: the gpu backend: the block route (``block_path``, its records ``block_plan``, the fallback chain
  ``fallbacks``, CUDA graphs ``graphs``, work items ``work_items``, spans ``spans``) and the dense-scatter route.
* ``index_cache``: what searches keep per index (plans, work items, graphs, counts of what ran), one ``clear()``.
* ``select``: the top-k selection family over packed (score, doc) keys.
* ``kernels/``: the Triton and CUDA kernels, each beside its launcher and torch twin; ``kernels/cuda/`` holds
  the CUDA C++ sources compiled at first use by NVRTC.

The names below are imported on first use (``lsr.config`` reads ``lsr.search.config`` without loading torch);
triton loads only once the gpu backend runs.
"""

from __future__ import annotations

from lsr.utils.lazy import lazy_exports

_EXPORTS = {
    "lsr.search.config": ("SearchConfig",),
    "lsr.search.factory": ("open_searcher",),
    "lsr.search.filters": ("DocFilter",),
    "lsr.search.plan": ("SearchPlan", "plan_search"),
    "lsr.search.searcher": ("ENCODER_IDENTITY_KEYS", "Searcher", "check_compatible", "exact_topk"),
    "lsr.search.sharded": ("ShardedSearcher",),
}
__all__ = ["ENCODER_IDENTITY_KEYS", "DocFilter", "SearchConfig", "SearchPlan", "Searcher", "ShardedSearcher", "check_compatible",
           "exact_topk", "open_searcher", "plan_search"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
