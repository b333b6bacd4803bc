"""``lsr.pyterrier``: the PyTerrier transformers of :mod:`lsr.interop.pyterrier` under a short name.

    from lsr.pyterrier import LsrIndex, doc_encoder, query_encoder
"""

from lsr.interop.pyterrier import *  # noqa: F403 - a short alias of the interop module
from lsr.interop.pyterrier import __all__  # noqa: F401
