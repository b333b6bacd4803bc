"""The SPLADE encoder: a Hugging Face masked LM or decoder LLM (or sentence-transformers sparse checkpoint) with the
Sparton head.

Module map:

* ``encoder``: ``SpladeEncoder`` (``from_pretrained``, ``encode_query`` / ``encode_document``, ``decode``,
  ``prepare`` / ``encode_prepared`` for pipelines, ``save_pretrained``).
* ``forward``: one prepared batch through a tower (padding-free body + packed head, or HF's padded forward +
  ``lsr.encode.sparton.sparton_head``); ``plan_encode`` / ``EncodePlan``: which route, and why.
* ``checkpoint``: masked-LM checkpoints and tokenizers (``MaskedLMTower``; local folders, hub ids, the offline rules).
* ``causal``: decoder LLMs (``CausalLMTower``: Qwen3, Llama, Mistral, ...; causal or bidirectional attention) and
  ``load_tower``, which picks the tower a checkpoint's config calls for.
* ``st_checkpoint`` / ``st_save``: reading and writing sentence-transformers ``SparseEncoder`` checkpoints.
* ``query_graphs``: short query batches bucketed and replayed as CUDA graphs (``QueryGraphs``).
* ``extract``: the head's dense [B, V] weights to CSR rows in input order.
"""

from lsr.encode.splade.causal import CausalLMTower
from lsr.encode.splade.checkpoint import MaskedLMTower
from lsr.encode.splade.encoder import SpladeEncoder
from lsr.encode.splade.query_graphs import QueryGraphs
from lsr.encode.splade.st_checkpoint import StaticTower
from lsr.encode.splade.st_save import save_st_checkpoint

__all__ = ["CausalLMTower", "MaskedLMTower", "QueryGraphs", "SpladeEncoder", "StaticTower", "save_st_checkpoint"]
