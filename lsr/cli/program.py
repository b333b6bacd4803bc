"""The ``lsr`` program: its parser (each command registered by its module of lsr.cli), the dispatch, and the one
line every error leaves as."""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from lsr import __version__
from lsr.cli.args import HelpFormatter
from lsr.errors import UsageError
from lsr.utils.console import error_line

__all__ = ["add_command", "build_parser", "main"]

# Each module has ``register(sub, add_command)``, which adds its parser(s) with ``add_command(sub, name, help, func)``;
# the stage libraries are imported when a command runs (``lsr --help`` stays fast).
COMMAND_MODULES: tuple[str, ...] = ("lsr.cli.encode", "lsr.cli.index", "lsr.cli.search", "lsr.cli.evaluate",
                                    "lsr.cli.run", "lsr.cli.interop", "lsr.cli.serve", "lsr.cli.train",
                                    "lsr.cli.rerank", "lsr.cli.doctor")
_OUTPUT_FLAGS = ("out", "json", "cache")   # the flags that name something a command writes


def add_command(sub: argparse._SubParsersAction, name: str, text: str, func: Callable[[argparse.Namespace], int] | None = None,
             ) -> argparse.ArgumentParser:
    """A sub-command parser whose options show their defaults; ``func`` handles the parsed arguments."""
    p = sub.add_parser(name, help=text, description=text, formatter_class=HelpFormatter)
    if func is not None:
        p.set_defaults(func=func)
    return p


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="lsr", description="GPU learned sparse retrieval: encode, index, search, evaluate",
                                 formatter_class=HelpFormatter)
    ap.add_argument("--version", action="version", version=f"lsr {__version__}")
    ap.add_argument("-v", "--verbose", action="store_true", help="log each step (and the traceback of an error)")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        importlib.import_module(module).register(sub, add_command)
    return ap


def _check_output_flags(args: argparse.Namespace) -> None:
    """Before any work: an output path below an existing file (``--out notes.txt/run``) is refused with one line."""
    from lsr.storage.provenance import file_in_the_way

    for name in _OUTPUT_FLAGS:
        value = getattr(args, name, None)
        blocker = file_in_the_way(value) if isinstance(value, str) else None
        if blocker is not None:
            raise NotADirectoryError(f"--{name} {value}: {blocker} is a file, not a folder; choose another --{name}")


def _output_flag(filename: str, args: argparse.Namespace | None) -> tuple[str, str] | None:
    """(``--out PATH`` or ``FILE (in --out PATH)``, ``--out``) when ``filename`` is an output flag's path or lies
    inside it (``--json``, ``--cache`` too)."""
    for name in _OUTPUT_FLAGS if args is not None else ():
        value = getattr(args, name, None)
        if isinstance(value, str) and Path(value) in (Path(filename), *Path(filename).parents):
            where = f"--{name} {value}" if Path(value) == Path(filename) else f"{filename} (in --{name} {value})"
            return where, f"--{name}"
    return None


def _one_line(e: BaseException, args: argparse.Namespace | None = None) -> str:
    """The error as one line; a full disk and a denied permission say so and what to do (naming the output flag
    the user gave when the file is, or is inside, its path)."""
    where = f" writing {e.filename}" if isinstance(e, OSError) and e.filename else ""
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on device{where}: free space or choose another --out"
    if isinstance(e, OSError) and e.errno == errno.EFBIG:
        return f"the file size limit (ulimit -f) was reached{where}: raise it or choose another --out"
    if isinstance(e, (FileExistsError, NotADirectoryError)) and e.filename:
        from lsr.storage.provenance import file_in_the_way

        # mkdir(parents=True) names the file itself; open() and mkdir() below it name the path they wanted
        blocker = Path(e.filename) if Path(e.filename).is_file() else file_in_the_way(e.filename)
        if blocker is not None:
            return f"{e.filename}: {blocker} is a file, not a folder; choose another output path"
    if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        flag = _output_flag(str(e.filename), args) if e.filename else None
        denied = "read-only file system" if e.errno == errno.EROFS else "permission denied"
        if flag is not None:
            return f"{denied} writing {flag[0]}: check its folder's permissions or choose another {flag[1]}"
        return f"{denied}: {e.filename or e} (check its permissions or choose another path)"
    if isinstance(e, IsADirectoryError):
        return f"{e.filename} is a directory; a file was expected"
    text = " ".join(str(e).split()) or type(e).__name__
    known = (ValueError, OSError, RuntimeError, LookupError, ImportError, NotImplementedError)
    return text if isinstance(e, known) else f"{type(e).__name__}: {text}"


def main(argv: list[str] | None = None) -> int:
    # idle OpenMP threads sleep instead of spinning: on a CPU shared with other processes a spinning
    # thread takes the core a working one needs (read when torch loads, i.e. later than this)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:   # argparse has printed its one line (a bad option: 2) or the help / version (0)
        return 0 if e.code is None else e.code if isinstance(e.code, int) else 2
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s: %(message)s")
    from lsr.parallel.watchdog import report_as

    report_as(f"lsr {args.command}")   # the line a distributed job's heartbeat prints, should a rank stop
    try:
        _check_output_flags(args)
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        error_line(f"lsr {args.command}: interrupted")
        return 130
    except Exception as e:  # noqa: BLE001 - every error leaves as one line, never a traceback
        if args.verbose:
            import traceback

            traceback.print_exc()
        error_line(f"lsr {args.command}: error: {_one_line(e, args)}")
        return 2 if isinstance(e, UsageError) else 1
