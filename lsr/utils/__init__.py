"""Small helpers every stage shares.

* ``devices``: the device names lsr accepts, checked in one place.
* ``ragged``: index arithmetic on ragged (CSR-like) layouts.
* ``kernels``: the optional Triton import, backend choice and launcher argument checks.
"""
