"""Exact top-k search over an ``InvertedIndex``.

Module map (``lsr.search.plan``'s docstring tells how one search is carried out):

* ``config``: ``SearchConfig``, every knob of a search (backend, route, kernels, tuning, caches).
* ``plan``: the one dispatch module: the printable ``SearchPlan`` of a batch and the reason for each choice.
* ``searcher``: ``Searcher`` (query batching, memory bounds, docno mapping, ``explain``), ``exact_topk`` and the
  torch backend (a weighted gather-sum per document over the doc CSR).
* ``sharded``: ``ShardedSearcher``, the partitions of a ``ShardedIndex`` searched in turn on one device, merged
  exactly (``merge_hit_lists``; distributed search merges the ranks' lists with it too).
* ``factory``: ``open_searcher``, the searcher of an index or index folder, sharded or not.
* ``gpu_search``: the gpu backend: the block route (``block_path``, its records ``block_plan``, the fallback chain
  ``fallbacks``, CUDA graphs ``graphs``, work items ``work_items``, spans ``spans``) and the dense-scatter route.
* ``select``: the top-k selection family over packed (score, doc) keys.
* ``kernels/``: the Triton and CUDA kernels, each beside its launcher and torch twin; ``kernels/cuda/`` holds
  the CUDA C++ sources compiled at first use by NVRTC.

``import lsr`` stays light because lsr resolves ``lsr.search`` lazily; importing this package loads torch, and
triton only once the gpu backend runs.
"""

from lsr.search.config import SearchConfig
from lsr.search.factory import open_searcher
from lsr.search.plan import SearchPlan
from lsr.search.searcher import ENCODER_IDENTITY_KEYS, Searcher, check_compatible, exact_topk
from lsr.search.sharded import ShardedSearcher

__all__ = ["ENCODER_IDENTITY_KEYS", "SearchConfig", "SearchPlan", "Searcher", "ShardedSearcher", "check_compatible",
           "exact_topk", "open_searcher"]
