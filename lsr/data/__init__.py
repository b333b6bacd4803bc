"""Datasets and runs: documents, queries and qrels from one spec string, and TREC / MS MARCO run files.

* ``sources``: ``load_dataset(spec, split)`` and ``Dataset`` over local BEIR / TSV folders, Parquet / JSONL files,
  ir_datasets ids and Hugging Face datasets; topics and qrels readers.
* ``irds``: ir_datasets as a source (offline refusals, download errors named).
* ``hf``: Hugging Face ``datasets`` as a source (``hf:ORG/NAME``).
* ``runs``: reading, writing and converting run files.
"""
