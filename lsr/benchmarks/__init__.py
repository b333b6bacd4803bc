"""Benchmark-only code, apart from the library's public face: what ``scripts/bench_*.py`` and some tests share.

* ``harness``: environment and commit capture, timing with quantiles, peak memory, result files and tables.
* ``synth``: seeded synthetic SPLADE-like collections calibrated to MS MARCO statistics.
* ``loadgen``: the closed-loop HTTP load generator of ``bench_serve``.

The names below are imported on first use (``from lsr.benchmarks import synth_docs``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lsr.utils.lazy import lazy_exports

if TYPE_CHECKING:  # pragma: no cover
    from lsr.benchmarks.harness import PeakMemory, Results, environment, quantiles, time_calls
    from lsr.benchmarks.loadgen import run_load
    from lsr.benchmarks.synth import SynthSpec, synth_docs, synth_queries

_EXPORTS = {
    "PeakMemory": "lsr.benchmarks.harness",
    "Results": "lsr.benchmarks.harness",
    "SynthSpec": "lsr.benchmarks.synth",
    "environment": "lsr.benchmarks.harness",
    "quantiles": "lsr.benchmarks.harness",
    "run_load": "lsr.benchmarks.loadgen",
    "synth_docs": "lsr.benchmarks.synth",
    "synth_queries": "lsr.benchmarks.synth",
    "time_calls": "lsr.benchmarks.harness",
}
__all__ = ["PeakMemory", "Results", "SynthSpec", "environment", "quantiles", "run_load", "synth_docs",
           "synth_queries", "time_calls"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
