"""Small helpers every stage shares.

* ``devices``: the device names lsr accepts, checked in one place, and ``resolve_device`` ("auto" -> cuda / cpu).
* ``env``: settings read from environment variables (``env_seconds``: timeouts in seconds).
* ``ids``: the one rule for query and document ids that go into run files (``check_id``, ``first_bad_id``).
* ``ragged``: index arithmetic on ragged (CSR-like) layouts.
* ``kernels``: the optional Triton import, backend choice and launcher argument checks.
* ``lazy``: PEP 562 lazy exports for package ``__init__`` modules.

The names below are imported on first use: importing ``lsr.utils`` loads no torch.
"""

from __future__ import annotations

from lsr.utils.lazy import lazy_exports

_EXPORTS = {
    "lsr.utils.devices": ("check_device", "resolve_device", "torch_device"),
    "lsr.utils.lazy": ("lazy_exports",),
    "lsr.utils.ragged": ("ragged_positions", "segment_ids"),
}
__all__ = ["check_device", "lazy_exports", "ragged_positions", "resolve_device", "segment_ids", "torch_device"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
