"""One job at a time in an output folder: a lock file naming the job that works there.

Two distributed encodings into one folder would drop each other's claims and publish over each other
(``lsr.parallel.encode_units``); so the first job's rank 0 creates ``OUT/.lsr-encode.lock`` (with O_EXCL)
holding its host, pid and start time, and removes it when the job ends, with or without an error. A second
job is refused with one line naming the holder, before it touches the folder. A lock whose holder is gone (a
killed job, on this host: same boot, no such process any more) is taken over, so a resume after a crash needs
nothing; a holder on another host cannot be checked from here, so the message says which file to delete if no
job runs there any more.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from lsr.parallel.watchdog import ProcessId

__all__ = ["LOCK_NAME", "FolderLock"]

LOCK_NAME = ".lsr-encode.lock"


class FolderLock:
    """The lock of ``folder`` (``acquire`` / ``release``, by the one process that writes the folder's plan)."""

    def __init__(self, folder: str | os.PathLike, name: str = LOCK_NAME) -> None:
        self.folder = Path(folder)
        self.path = self.folder / name   # (another kind of writer, e.g. a live index's, has its own name)

    def _holder(self) -> tuple[ProcessId, str] | None:
        """(the holding process, since when) as the lock file says, or None when it cannot be read."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return ProcessId(data["host"], data["boot"], int(data["pid"]), data["start"]), str(data["since"])
        except FileNotFoundError:
            raise
        except (OSError, ValueError, KeyError, TypeError):
            return None   # a holder killed between creating the file and writing it

    def acquire(self) -> bool:
        """Create the lock for this process: True; False when this process holds it already (an outer step of
        the same job took it, and releases it). FileExistsError (one line naming the holder) while another
        job that may still run holds it. Takes over the lock of a job that is gone."""
        self.folder.mkdir(parents=True, exist_ok=True)
        me = ProcessId.this()
        for _ in range(3):   # (a stale lock removed, then created again by us or by a racing job)
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                try:
                    held = self._holder()
                except FileNotFoundError:
                    continue
                if held is not None and held[0] == me:
                    return False
                if held is None or (held[0].local() and not held[0].alive()):
                    self.path.unlink(missing_ok=True)   # its job was killed: nobody works here any more
                    continue
                raise FileExistsError(self._refusal(*held)) from None
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({**asdict(me), "since": time.strftime("%Y-%m-%d %H:%M:%S")}, f)
            return True
        raise FileExistsError(f"{self.folder}: another job keeps taking {self.path}; let it finish, or choose "
                              "another folder")

    def _refusal(self, holder: ProcessId, since: str) -> str:
        where = "" if holder.local() else (f"; it runs on another host, so lsr cannot tell whether it still "
                                           f"does: if no job writes {self.folder} any more, delete {self.path}")
        return (f"{self.folder} is being written by another job ({holder}, since {since}): wait for it to end, "
                f"or write into another folder{where}")

    def release(self) -> None:
        """Remove the lock if this process holds it (a refused job leaves the holder's in place)."""
        with contextlib.suppress(FileNotFoundError):
            held = self._holder()
            if held is not None and held[0] == ProcessId.this():
                self.path.unlink()
