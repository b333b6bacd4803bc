"""The SPLADE encoder: a Hugging Face masked LM (or sentence-transformers sparse checkpoint) with the Sparton head.

* ``encoder``: ``SpladeEncoder`` (``from_pretrained``, ``encode_query`` / ``encode_document``, ``decode``).
* ``checkpoint``: masked-LM checkpoints and tokenizers (local folders, hub ids, the offline rules).
* ``st_checkpoint`` / ``st_save``: reading and writing sentence-transformers ``SparseEncoder`` checkpoints.
* ``query_graphs``: short query batches replayed as CUDA graphs.
* ``extract``: the head's dense [B, V] weights to CSR rows in input order.
"""
