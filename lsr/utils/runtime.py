"""Process state of lsr: what failed in this process and runs another way instead, and the per-device objects that
live as long as the process.

    FLASH = failure_memory("encode.flash_attention", "flash attention (varlen)", "the sdpa twin runs")
    if not FLASH.failed:
        try:
            ...
        except RuntimeError as e:
            FLASH.record(e)        # warns once; every later call takes the fall-back without trying again
    failures()                     # {"encode.flash_attention": "RuntimeError: ..."}: what was disabled, and why
    reset_failures()               # forget them all (tests/conftest.py does, around every test)

Why one home: an optional kernel that fails to compile, an operation a torch build lacks, a CUDA-graph capture
that cannot hold its body: each is tried once, warned about once and then avoided for the process. Kept in one
registry, ``lsr doctor`` and the ``--explain`` outputs can say what was disabled and why, and a test's failure
never leaks into the next test.

``per_device(name, index, make)`` is the process's one object of a kind per GPU (a capture stream and its lock, a
copy stream): made on first use, kept for the process. This module imports nothing heavy (no torch): the
registry must be readable where torch cannot be imported.

Module-level state that stays beside its owner, because it decides no route: compiled kernels and pure memos
(``functools.cache`` in ``lsr.search.kernels``, the CIFF message classes, the plan and stemmer ``lru_cache``s),
the per-index caches of a search, the CPU head's transposed weights (keyed by the weight, dropped with it), the
``gc.freeze`` flag of ``lsr.serve.gcwatch``, the watchdog's command name, and the capture counts of
``lsr.utils.cuda_graphs``.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["FailureMemory", "describe_failures", "failure_memory", "failures", "failures_block", "memories", "per_device", "reset_failures"]

T = TypeVar("T")

_LOCK = threading.Lock()
_MEMORIES: dict[str, FailureMemory] = {}          # name -> its memory, in registration order
_PER_DEVICE: dict[tuple[str, int], Any] = {}      # (kind, device index) -> its object


class FailureMemory:
    """That ``what`` failed in this process (``failed``), why (``why``: the first failure), and how often (``count``);
    ``fallback`` says what runs instead. ``record`` warns once (``warn=False``: silent, for fall-backs that are
    expected on some torch builds and cost little). Made with ``failure_memory`` it is registered under ``name``
    (``failures()`` lists it); made directly it is private to its owner (a test's stand-in)."""

    def __init__(self, name: str, what: str, fallback: str, *, warn: bool = True,
                 category: type[Warning] = UserWarning) -> None:
        self.name, self.what, self.fallback = name, what, fallback
        self.warn, self.category = warn, category
        self.why: str | None = None
        self.count = 0
        self._lock = threading.Lock()

    @property
    def failed(self) -> bool:
        return self.why is not None

    def record(self, error: BaseException | str, *, stacklevel: int = 2) -> None:
        """Remember ``error`` (an exception or a sentence); the first one is ``why`` and is warned about."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {' '.join(str(error).split())}"
        with self._lock:
            self.count += 1
            first = self.why is None
            if first:
                self.why = text[:400]
        if first and self.warn:
            warnings.warn(f"{self.what} failed ({self.why}); {self.fallback}", self.category, stacklevel=stacklevel + 1)

    def reset(self) -> None:
        """Forget the failures (the route is tried again)."""
        with self._lock:
            self.why, self.count = None, 0

    def describe(self) -> str:
        """One line: the name, what failed and why, what runs instead (or that nothing failed)."""
        if not self.failed:
            return f"{self.name}: ok ({self.what})"
        times = f", {self.count} times" if self.count > 1 else ""
        return f"{self.name}: {self.what} failed{times} ({self.why}); {self.fallback}"

    def __repr__(self) -> str:
        return f"FailureMemory({self.describe()!r})"


def failure_memory(name: str, what: str, fallback: str, *, warn: bool = True,
                   category: type[Warning] = UserWarning) -> FailureMemory:
    """The registered memory ``name`` (made and registered at the first call; a module imported again gets the same
    one, with what it remembers)."""
    with _LOCK:
        memory = _MEMORIES.get(name)
        if memory is None:
            memory = _MEMORIES[name] = FailureMemory(name, what, fallback, warn=warn, category=category)
        return memory


def memories() -> list[FailureMemory]:
    """Every registered memory (failed or not), in registration order."""
    with _LOCK:
        return list(_MEMORIES.values())


def failures() -> dict[str, str]:
    """What failed in this process and was disabled: name -> why (the first failure)."""
    return {m.name: m.why for m in memories() if m.why is not None}


def describe_failures() -> list[str]:
    """One line per disabled route (``FailureMemory.describe``): empty when nothing failed."""
    return [m.describe() for m in memories() if m.failed]


def failures_block() -> str:
    """What an ``--explain`` output ends with: the routes this process disabled, one line each ("" when none)."""
    lines = describe_failures()
    return "\n".join(["disabled in this process:", *(f"  {line}" for line in lines)]) if lines else ""


def reset_failures() -> None:
    """Forget every failure of the process (tests: one test's failure must not change the next one's route)."""
    for memory in memories():
        memory.reset()


def per_device(kind: str, index: int, make: Callable[[], T]) -> T:
    """The process's one ``kind`` object of GPU ``index`` (``make()`` at the first call, under a lock: two threads
    asking at once get the same one)."""
    with _LOCK:
        key = (kind, index)
        if key not in _PER_DEVICE:
            _PER_DEVICE[key] = make()
        return _PER_DEVICE[key]
