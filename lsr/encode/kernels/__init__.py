"""Encoder kernels, each a Triton kernel with its launcher and torch twin in one module.

* ``sparton``: the fused SPLADE head ``sparton_head`` (max over tokens of log1p(relu(H Eᵀ + b))) on padded
  [B, S, D] states, forward, and the autograd function whose backward routes through the saved argmax.
* ``sparton_bwd``: the backward kernels of that head.
* ``sparton_resident``: its forward on Hopper (sm_90) with the vocabulary tile kept on chip (Gluon, warp-specialized:
  two consumer warpgroups take turns so one folds while the other multiplies; the launcher in ``sparton`` picks it for
  rows without holes when the vocabulary is large).
* ``sparton_packed``: the head over packed (padding-free) tokens.
* ``add_layer_norm``: residual add + LayerNorm in one pass, for the padding-free body.
"""
