"""Late-interaction rerank stage: fused MaxSim kernels (``lsr.rerank.kernels``), a ColBERT-style encoder
(``lsr.rerank.encoder``) and ``lsr rerank`` (``lsr.cli.rerank``), which rescores the top-k of a run."""
