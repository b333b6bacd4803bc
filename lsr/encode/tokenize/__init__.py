"""Tokenization at corpus scale.

Module map:

* ``wordpiece``: ``FastWordPiece``, bulk BERT WordPiece tokenization equal to the Rust ``tokenizers`` output.
* ``pool``: ``TokenizerPool``, tokenizer worker processes (raw buffers over pipes).
* ``worker``: what runs inside each worker (started by path, so it imports nothing of lsr at load time).
* ``batching``: tokenized texts cut into length-sorted batches (``PreparedTexts`` of ``TokenBatch``).
"""

from lsr.encode.tokenize.batching import PreparedTexts, TokenBatch, length_sorted_batches
from lsr.encode.tokenize.pool import TokenizerPool, default_workers, load_tokenizer
from lsr.encode.tokenize.wordpiece import FastWordPiece

__all__ = ["FastWordPiece", "PreparedTexts", "TokenBatch", "TokenizerPool", "default_workers", "length_sorted_batches",
           "load_tokenizer"]
