"""The GPU inverted index: ``InvertedIndex`` (lsr.index.inverted) and its builder (lsr.index.build).

``import lsr`` stays light because lsr resolves ``lsr.index`` lazily; importing this package loads torch.
"""

from lsr.index.build import PAD, PostingArrays, build_postings
from lsr.index.inverted import InvertedIndex

__all__ = ["PAD", "InvertedIndex", "PostingArrays", "build_postings"]
