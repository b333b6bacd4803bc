"""One line on stderr in one write, so the ranks of a torchrun job that share a pipe never splice their lines."""

from __future__ import annotations

import io
import os
import sys


def error_line(text: str) -> None:
    """Write ``text`` and its newline to stderr as one ``write(2)``: a pipe keeps writes up to PIPE_BUF (4 KiB)
    whole, where ``print`` writes the text and the newline apart and another rank's line can land between them."""
    sys.stderr.flush()
    bars = getattr(sys.modules.get("tqdm"), "tqdm", None)
    # a live progress bar (another thread's, e.g. when the heartbeat ends the job) ends its line with "\r"
    # only: the error starts on a line of its own
    start = "\n" if bars is not None and getattr(bars, "_instances", None) else ""
    data = (start + text.replace("\n", " ") + "\n").encode("utf-8", "replace")
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # a captured or replaced stream (pytest, IDEs)
        sys.stderr.write(data.decode("utf-8"))
        sys.stderr.flush()
        return
    os.write(fd, data)
