"""Runs one documentation page's Python blocks in one interpreter, in page order, as a reader pasting them
into one session would: a later block may use the names an earlier block of the same page defined.

Started by tests/docs/test_code_blocks.py (never imported). Protocol: the parent writes one block file path
per line on stdin; the block runs in the shared namespace with file descriptors 1 and 2 sent to
``<path>.log`` (so the output of C code and child processes is captured too); then ``ok`` or ``error`` is
written, one line, on the control channel, which is this process's original stdout.
"""

from __future__ import annotations

import os
import sys
import traceback


def serve_blocks() -> None:
    control = os.fdopen(os.dup(1), "w")
    namespace: dict = {"__name__": "__main__"}
    while path := sys.stdin.readline().strip():
        with open(path, encoding="utf-8") as source, open(path + ".log", "w", encoding="utf-8") as log:
            code = source.read()
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                exec(compile(code, path, "exec"), namespace)
                status = "ok"
            except BaseException:  # SystemExit too: the block failed, the page's later blocks still run
                traceback.print_exc()
                status = "error"
            sys.stdout.flush()
            sys.stderr.flush()
        control.write(status + "\n")
        control.flush()


# The guard matters: a block may start worker processes with the spawn method, which re-import __main__.
if __name__ == "__main__":
    serve_blocks()
