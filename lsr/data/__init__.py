"""Datasets and runs: documents, queries and qrels from one spec string, and TREC / MS MARCO run files.

* ``sources``: ``load_dataset(spec, split)``: local BEIR / TSV folders, the topics and qrels shipped with lsr,
  and the dispatch to the two sources below.
* ``dataset``: ``Dataset`` (queries and qrels in memory, documents streamed) and ``DatasetUnavailableError``:
  the record every source returns.
* ``readers``: topics (TSV, BEIR JSONL) and qrels (TREC, BEIR) files, checked as they are read.
* ``irds``: ir_datasets ids as a source (offline refusals, failed downloads named).
* ``hf``: Hugging Face ``datasets`` as a source (``hf:ORG/NAME``, local Parquet / JSONL files).
* ``runs``: reading, writing and converting run files.

``sources`` imports ``irds`` and ``hf`` only when a spec needs them, and they import only ``dataset`` and
``readers``: no source imports another.
"""

from __future__ import annotations

from lsr.data.dataset import Dataset, DatasetUnavailableError
from lsr.data.readers import read_qrels, read_topics_tsv
from lsr.data.runs import read_run, write_topk, write_trec
from lsr.data.sources import load_dataset

__all__ = ["Dataset", "DatasetUnavailableError", "load_dataset", "read_qrels", "read_run", "read_topics_tsv",
           "write_topk", "write_trec"]
