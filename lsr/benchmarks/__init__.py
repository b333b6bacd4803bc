"""Benchmark-only code, apart from the library's public face: what ``scripts/bench_*.py`` and some tests share.

* ``harness``: environment and commit capture, timing with quantiles, peak memory, result files and tables.
* ``synth``: seeded synthetic SPLADE-like collections calibrated to MS MARCO statistics.
* ``loadgen``: the closed-loop HTTP load generator of ``bench_serve``.

The names below are imported on first use (``from lsr.benchmarks import synth_docs``).
"""

from __future__ import annotations

from lsr.utils.lazy import lazy_exports

_EXPORTS = {
    "lsr.benchmarks.harness": ("PeakMemory", "Results", "environment", "quantiles", "time_calls"),
    "lsr.benchmarks.loadgen": ("run_load",),
    "lsr.benchmarks.synth": ("SynthSpec", "synth_docs", "synth_queries"),
}
__all__ = ["PeakMemory", "Results", "SynthSpec", "environment", "quantiles", "run_load", "synth_docs",
           "synth_queries", "time_calls"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
