"""The padding-free BERT-family body used for inference on CUDA, with its kernels (each beside its torch twin).

Module map:

* ``varlen_body``: ``VarlenBody``, backbone + MLM transform on packed tokens (``pack_batch`` / ``pack_tokens``
  build its inputs).
* ``packed_attention``: bidirectional attention inside each text of a packed batch (Triton kernel + twin).
* ``add_layer_norm``: residual add + LayerNorm in one pass (Triton kernel + twin).
"""

from lsr.encode.backbone.add_layer_norm import add_layer_norm, torch_add_layer_norm
from lsr.encode.backbone.packed_attention import packed_attention, torch_varlen_attention
from lsr.encode.backbone.varlen_body import VarlenBody, pack_batch, pack_tokens

__all__ = ["VarlenBody", "add_layer_norm", "pack_batch", "pack_tokens", "packed_attention", "torch_add_layer_norm",
           "torch_varlen_attention"]
