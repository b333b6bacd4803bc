"""BM25 as sparse vectors, the offline baseline that needs no model weights.

* ``analyzer``: a Lucene ``EnglishAnalyzer``-like text analysis (what Anserini / Pyserini BM25 uses).
* ``lexical``: ``LexicalEncoder``, BM25 document weights and query term counts.
"""
