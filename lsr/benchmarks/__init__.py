"""Benchmark-only code, apart from the library's public face: what ``scripts/bench_*.py`` share.

* ``harness``: environment and commit capture, timing with quantiles, peak memory, result files.
* ``synth``: seeded synthetic SPLADE-like collections calibrated to MS MARCO statistics.
* ``loadgen``: the closed-loop HTTP load generator of ``bench_serve``.
"""
