"""Test setup shared by the whole suite.

Without a GPU, Triton kernels run in interpreter mode. TRITON_INTERPRET is read when a kernel is
decorated, so it is set here, before any kernel module is imported.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# LSR_TEST_GPUS=N spreads pytest-xdist workers over N GPUs (worker gwI sees GPU I mod N only), so a multi-GPU
# machine runs the GPU suite N times as wide; tests that need several GPUs then skip, run them without it
if os.environ.get("LSR_TEST_GPUS") and os.environ.get("PYTEST_XDIST_WORKER", "").startswith("gw"):
    os.environ["CUDA_VISIBLE_DEVICES"] = str(int(os.environ["PYTEST_XDIST_WORKER"][2:]) % int(os.environ["LSR_TEST_GPUS"]))

try:
    import torch

    HAS_CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a hard dependency
    HAS_CUDA = False

if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

DEV = "cuda" if HAS_CUDA else "cpu"
REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The real offline data shipped in the repository (data/, see data/README.md)."""
    return DATA


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    return DATA / "bert-base-uncased"


@pytest.fixture
def poison():
    """torch.empty / empty_like return NaN / junk inside the test (lsr.testing.poisoned_allocations)."""
    from lsr.testing import poisoned_allocations

    with poisoned_allocations():
        yield



@pytest.fixture(autouse=True)
def _fresh_failure_memories():
    """Every test starts with no route disabled: one test's failure (a capture, an optional kernel) never changes
    another's route (lsr.utils.runtime)."""
    from lsr.utils.runtime import reset_failures

    reset_failures()
    yield
    reset_failures()
