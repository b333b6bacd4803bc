"""The command line, one module a command (``lsr.cli.encode``, ``.index``, ``.search``, ``.evaluate``, ``.run``,
``.interop``, ``.serve``, ``.train``, ``.rerank``; the program in ``lsr.cli.program``): no stage package imports it. Commands: ``lsr encode | index | search | evaluate | run | train | serve | rerank |
export-ciff | import-ciff``; flags mean one thing across commands (``lsr.cli.args``).

Every command prints its result. Errors are one line on stderr (``lsr <command>: error: ...``), never a
traceback (``-v`` prints it too), with exit code 2 for usage errors (bad options or config values) and
1 for runtime errors (missing or bad files, a full disk, a failed step); an interrupt exits 130.
"""

from __future__ import annotations

from lsr.cli.program import build_parser, main
from lsr.errors import UsageError

__all__ = ["UsageError", "build_parser", "main"]
