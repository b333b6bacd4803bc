"""Tokenization at corpus scale.

* ``wordpiece``: bulk BERT WordPiece tokenization, equal to the Rust ``tokenizers`` output.
* ``pool`` / ``worker``: tokenizer worker processes (the pool, and what runs inside each worker).
* ``batching``: tokenized texts cut into length-sorted batches.
"""
