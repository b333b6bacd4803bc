"""``lsr.encode.kernels.sparton``: the public-API path of the Sparton head (``lsr.encode.sparton`` holds the code)."""
