"""Rerank kernels, each a Triton kernel with its launcher and torch twin in one module.

* ``maxsim``: late-interaction scores Σ_i max_j Q[q, i]·D[doc, j] for candidate lists or all pairs
  (forward launcher, torch twin, autograd function).
* ``maxsim_bwd``: its backward kernels (gradients to Q and D through the saved argmax).
"""
