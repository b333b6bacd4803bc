"""The padding-free BERT-family body used for inference on CUDA, with its kernels (each beside its torch twin).

* ``varlen_body``: ``VarlenBody``, backbone + MLM transform on packed tokens.
* ``packed_attention``: bidirectional attention inside each text of a packed batch.
* ``add_layer_norm``: residual add + LayerNorm in one pass.
"""
