"""Live indexes: documents added, replaced and deleted without a rebuild, crash-safe (``LiveIndex``), and searched
exactly alongside (``LiveSearcher``): docs/guide/filters.md, "Live updates"."""

from lsr.live.index import LiveIndex, is_live
from lsr.live.search import LiveSearcher

__all__ = ["LiveIndex", "LiveSearcher", "is_live"]
