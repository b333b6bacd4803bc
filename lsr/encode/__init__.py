"""Encoders: text to ``SparseVectors``.

Module map:

* ``base``: the ``Encoder`` protocol every encoder follows (``encode_query`` / ``encode_document`` /
  ``describe``) and the deprecated plural aliases.
* ``splade``: ``SpladeEncoder``, a Hugging Face masked LM with the Sparton head (``kernels/``).
* ``checkpoint``: loading checkpoints and tokenizers (local folders, hub ids, the offline rules).
* ``varlen_body``: the padding-free BERT / DistilBERT forward used on CUDA.
* ``lexical`` / ``analyzer``: BM25 weights over a Lucene-like English analyzer.
* ``corpus``: ``encode_corpus``, a document stream to resumable Parquet shards.
* ``tokenize_pool``: tokenizer worker processes that feed ``encode_corpus`` and long ``encode_document`` calls.
* ``tokenize_worker``: what runs in those processes (tokenize functions, the wire format, the worker loop).
* ``wordpiece``: bulk BERT WordPiece tokenization, the Rust tokenizer's ids at a fraction of its cost.
* ``extract``: the head's dense weights to CSR rows, gathered back into input order.
* ``kernels/``: the Sparton heads and the fused add + LayerNorm, each with its torch twin.

``import lsr`` stays light: this package is resolved lazily and imports nothing heavy itself.
"""
