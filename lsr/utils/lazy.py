"""PEP 562 lazy exports for package ``__init__`` modules: a public name is imported when it is first used.

A package whose names live in torch- or pyarrow-heavy modules can then export them
(``from lsr.storage import read_vectors``) while ``import lsr.storage.files`` stays light.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, Iterable[str]],
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``exports`` maps a module to the public names it defines;
    a name is imported from its module on first use and then cached in the package. Submodules are reached
    as usual (``from package import module`` imports it)."""
    names = {name: module for module, defined in exports.items() for name in defined}

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
