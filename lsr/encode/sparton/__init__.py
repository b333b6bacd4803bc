"""Sparton, the fused SPLADE head  Y[b, v] = log1p(relu(max_s (H Eᵀ + b)[b, s, v]))  without [B, S, V] logits.

* ``fwd_padded``: the head on padded [B, S, D] states (forward kernel, autograd function, ``sparton_head``).
* ``fwd_packed``: the head over packed (padding-free) tokens, for inference.
* ``fwd_resident``: the Hopper (sm_90) forward with the vocabulary tile resident on chip (Gluon; experimental).
* ``bwd``: the backward kernels, from the saved (y32, argmax) only.
* ``cpu``: the tiled CPU head.
"""
