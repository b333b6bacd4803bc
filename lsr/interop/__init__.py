"""Adapters between lsr and the formats and tools of the field.

* ``anserini``: Anserini / Pyserini JsonVectorCollection documents and pre-encoded query files (token
  repeated or weighted, ``.gz`` accepted) to and from ``SparseVectors``.
"""

from lsr.interop.anserini import *  # noqa: F403 - the package re-exports the Anserini adapters
from lsr.interop.anserini import __all__  # noqa: F401
