"""Process state (lsr.utils.runtime): named failure memories warn once, are listed by failures() until
reset_failures(); per_device makes one object per (kind, GPU) for the process, also under threads."""

from __future__ import annotations

import threading
import warnings

import pytest

from lsr.utils.runtime import (
    FailureMemory,
    describe_failures,
    failure_memory,
    failures,
    memories,
    per_device,
    reset_failures,
)


def test_a_registered_memory_warns_once_and_is_listed_until_reset():
    memory = failure_memory("tests.runtime.kernel", "the test kernel", "the twin runs")
    assert failure_memory("tests.runtime.kernel", "another text", "ignored") is memory   # one per name
    assert memory in memories() and not memory.failed and "tests.runtime.kernel" not in failures()
    with pytest.warns(UserWarning, match=r"the test kernel failed \(RuntimeError: no such op\); the twin runs"):
        memory.record(RuntimeError("no such   op"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # a second failure is remembered, not warned about
        memory.record("a second reason")
    assert memory.failed and memory.count == 2 and memory.why == "RuntimeError: no such op"
    assert failures()["tests.runtime.kernel"] == "RuntimeError: no such op"
    assert any(line.startswith("tests.runtime.kernel: the test kernel failed, 2 times") for line in describe_failures())
    reset_failures()
    assert not memory.failed and "tests.runtime.kernel" not in failures()


def test_a_private_memory_is_not_in_the_report():
    mine = FailureMemory("tests.runtime.private", "a stand-in", "nothing", warn=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mine.record(ValueError("boom"))
    assert mine.failed and "tests.runtime.private" not in failures()


def test_per_device_makes_one_object_per_kind_and_device_under_threads():
    made, got = [], []

    def make():
        made.append(1)
        return object()

    threads = [threading.Thread(target=lambda: got.append(per_device("tests.runtime.thing", 3, make)))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and len({id(g) for g in got}) == 1
    assert per_device("tests.runtime.thing", 4, make) is not got[0] and len(made) == 2
