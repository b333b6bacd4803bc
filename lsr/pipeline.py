"""The end-to-end job behind ``lsr run``: encode -> index -> search -> evaluate.

Every step writes its result under ``config.output`` (vectors, index, runs, metrics.json), and the
encoding step resumes from complete shards, so an interrupted job picks up where it stopped.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lsr.config import EncoderConfig, RunConfig
from lsr.storage.files import atomic_write_text
from lsr.utils.devices import check_device

__all__ = ["build_encoder", "claim_output", "doc_encoder", "encode_documents", "encode_queries", "job_origin",
           "load_query_vectors", "read_doc_vectors", "resolve_device", "run_pipeline", "timed_step",
           "write_results"]

log = logging.getLogger("lsr")


def resolve_device(device: str | None) -> str:
    """"auto"/None -> "cuda" when a GPU is visible, else "cpu"; a one-line ValueError for a malformed name."""
    import torch

    if device is not None:
        check_device(str(device))  # str: a torch.device passes as its name
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={device!r} was asked for but no CUDA GPU is visible")
    return str(device)


@contextmanager
def timed_step(name: str, timings: dict[str, float]) -> Iterator[None]:
    log.info("%s ...", name)
    t0 = time.perf_counter()
    yield
    timings[name] = round(time.perf_counter() - t0, 3)
    log.info("%s done in %.2fs", name, timings[name])


def build_encoder(cfg: EncoderConfig, device: str) -> Any:
    """Instantiate the configured encoder (a BM25 encoder is returned unfitted)."""
    if cfg.kind == "bm25":
        from lsr.encode.bm25.lexical import LexicalEncoder

        return LexicalEncoder(k1=cfg.k1, b=cfg.b)
    if cfg.kind == "splade":
        if not cfg.model:
            raise ValueError("encoder.kind=splade needs encoder.model (a Hugging Face id or a local path)")
        from lsr.encode.splade.encoder import SpladeEncoder

        return SpladeEncoder.from_pretrained(cfg.model, device=device, dtype=cfg.dtype, query_model=cfg.query_model,
                                             max_length_query=cfg.max_length_query,
                                             max_length_doc=cfg.max_length_doc, doc_top_k=cfg.doc_top_k,
                                             backend=cfg.head, compile=cfg.compile)
    raise ValueError(f"unknown encoder.kind {cfg.kind!r} (use 'bm25' or 'splade')")


def load_query_vectors(path: str, vocab: Any, scale: float | None = None) -> Any:
    """Pre-encoded queries: an lsr vector directory or an Anserini ``qid\\ttok tok ...`` file."""
    from lsr.storage.shards import read_vectors

    p = Path(path)
    if p.is_dir():
        return read_vectors(p)
    from lsr.interop.anserini import read_anserini_queries

    if vocab is None:
        raise ValueError(f"{p} is read as Anserini token queries: give their vocabulary (--vocab / search.vocab: "
                         "vocab.txt or a tokenizer folder); for text topics (qid<TAB>text) give the encoder (--model)")
    return read_anserini_queries(p, vocab, **({} if scale is None else {"scale": scale}))


def encode_documents(cfg: RunConfig, dataset: Any, encoder: Any, out: Path, origin: dict[str, Any]) -> dict[str, Any]:
    """Write document vectors to ``out`` and return the manifest; collective in a torchrun job (every rank
    encodes its slice, the folder equals one process's). A complete directory is reused only when it was
    written with the same encoder settings (encode_corpus / ShardWriter check them)."""
    from lsr.encode.corpus import encode_corpus
    from lsr.parallel.encode import encode_corpus_distributed
    from lsr.parallel.topology import rank_and_size

    kw = {"batch_size": cfg.encoder.batch_size, "shard_rows": cfg.encoder.shard_rows, "resume": True,
          "doc_top_k": cfg.encoder.doc_top_k, "tokenize_workers": cfg.encoder.tokenize_workers, "origin": origin}
    rank, world = rank_and_size()
    if world == 1:
        return encode_corpus(encoder, dataset.docs_iter(), out, n_docs=dataset.n_docs, **kw)
    n_docs = dataset.n_docs if dataset.n_docs is not None else sum(1 for _ in dataset.docs_iter())
    return encode_corpus_distributed(encoder, dataset.docs_iter(), out, n_docs, show_progress_bar=rank == 0, **kw)


def doc_encoder(cfg: RunConfig, dataset: Any, out: Path, origin: dict[str, Any], device: str, fit: bool = True) -> Any:
    """The configured encoder; BM25 fitted on the corpus (or an earlier fit of the same documents
    reused) when ``fit``, else loaded from ``out/encoder`` (where a fitting rank saved it)."""
    encoder = build_encoder(cfg.encoder, device)
    if cfg.encoder.kind != "bm25":
        return encoder
    if fit:
        return _fit_lexical(encoder, dataset, out / "encoder", origin)
    from lsr.encode.bm25.lexical import LexicalEncoder

    return LexicalEncoder.load(out / "encoder")


def encode_queries(cfg: RunConfig, dataset: Any, encoder: Any) -> tuple[Any, dict[str, Any] | None]:
    """(the job's query vectors, the encoder description search checks against the index, or None for
    pre-encoded queries, which keep only the dataset's queries when it has any). No query at all is an
    error: the job's metrics would be zeros."""
    queries, meta = _job_queries(cfg, dataset, encoder)
    if len(queries) == 0:
        raise ValueError(f"{cfg.data.dataset}: no queries to search (split {cfg.data.split or 'default'}); check the dataset, "
                         "its split and its qrels")
    return queries, meta


def _job_queries(cfg: RunConfig, dataset: Any, encoder: Any) -> tuple[Any, dict[str, Any] | None]:
    if cfg.search.query_vectors:
        vocab = cfg.search.vocab or (encoder.vocab if encoder is not None else None)
        queries = load_query_vectors(cfg.search.query_vectors, vocab, cfg.search.query_scale)
        keep = [i for i, q in enumerate(queries.ids) if q in dataset.queries] if dataset.queries else None
        return (queries[keep] if keep is not None and len(keep) < len(queries) else queries), None
    if encoder is None:
        raise ValueError("search.doc_vectors needs search.query_vectors too (no encoder is configured)")
    qids = list(dataset.queries)
    return encoder.encode_query([dataset.queries[q] for q in qids], ids=qids), encoder.describe()


def run_pipeline(cfg: RunConfig, overwrite: bool = False) -> dict[str, Any]:
    """Run the whole job; returns {"metrics", "timings", "files", "config"} and writes metrics.json.

    ``cfg.output`` must be a new or empty folder, or one an earlier ``lsr run`` wrote for the same
    documents (its artefacts are then reused or resumed); ``overwrite=True`` also takes a folder lsr did
    not write or one made for other documents (lsr's own artefacts in it are recomputed). Under torchrun
    every rank runs it (``lsr.parallel.pipeline``) and every rank returns rank 0's result.
    """
    from lsr.parallel.topology import is_distributed

    if is_distributed():
        from lsr.parallel.pipeline import run_pipeline_distributed

        return run_pipeline_distributed(cfg, overwrite)
    import torch

    from lsr.data.sources import load_dataset
    from lsr.search.searcher import Searcher, run_depth
    from lsr.storage.shards import read_vectors

    device = resolve_device(cfg.device)
    out = Path(cfg.output)
    timings: dict[str, float] = {}
    dataset = load_dataset(cfg.data.dataset, cfg.data.split)
    origin = claim_output(cfg, dataset, out, overwrite)
    encoder = None
    with timed_step("encode documents", timings):
        doc_meta = None
        if cfg.search.doc_vectors:
            docs = read_doc_vectors(cfg.search.doc_vectors, cfg.search.vocab)
        else:
            encoder = doc_encoder(cfg, dataset, out, origin, device)
            doc_meta = encode_documents(cfg, dataset, encoder, out / "doc_vectors", origin).get("metadata")
            docs = read_vectors(out / "doc_vectors", verify=False)  # encode_corpus has just verified the shards
    with timed_step("build index", timings):
        index = _build_index(cfg, docs, out / "index", device, doc_meta)
        del docs
    with timed_step("encode queries", timings):
        queries, query_meta = encode_queries(cfg, dataset, encoder)
    with timed_step("search", timings):
        searcher = Searcher(index, device=device, backend=cfg.search.backend)
        scores, doc_idx = searcher.search(queries.to(device), k=run_depth(cfg.search.k, index.n_docs), query_batch=cfg.search.query_batch,
                                          query_metadata=query_meta)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return write_results(cfg, dataset, queries, index.docnos, (scores, doc_idx), timings, device)


def _build_index(cfg: RunConfig, docs: Any, out: Path, device: str, doc_meta: dict[str, Any] | None) -> Any:
    """The job's index saved in ``out``: one InvertedIndex, or a sharded one for ``index.partitions`` > 1."""
    from lsr.index.inverted import InvertedIndex

    if cfg.index.partitions == 1:
        index = InvertedIndex.build(docs, device=device, block_size=cfg.index.block_size, metadata=doc_meta,
                                    postings=cfg.index.postings)
        index.save(out, overwrite=True)
        return index
    from lsr.parallel.sharded_index import ShardedIndex

    # built and saved partition by partition, then loaded: the partitions stay memory-mapped on the host
    # and the searcher moves them to the device, or streams them there when they do not fit
    ShardedIndex.build(docs, cfg.index.partitions, out, device=device, block_size=cfg.index.block_size,
                       metadata=doc_meta, overwrite=True, postings=cfg.index.postings)
    return ShardedIndex.load(out, verify=False)


def write_results(cfg: RunConfig, dataset: Any, queries: Any, docnos: list[str], topk: tuple[Any, Any],
                  timings: dict[str, float], device: str) -> dict[str, Any]:
    """Write run.trec / run.msmarco.tsv, evaluate (and rerank when configured), write metrics.json;
    returns the job's result."""
    import pyarrow as pa

    from lsr.data import runs
    from lsr.evaluation.topk import evaluate_topk

    out = Path(cfg.output)
    with timed_step("write runs", timings):
        docno_array = pa.array(docnos, pa.string())  # one conversion serves both writers and the metrics
        scores, doc_idx = (t.cpu() for t in topk)
        runs.write_topk({"trec": out / "run.trec", "msmarco": out / "run.msmarco.tsv"}, queries.ids, docno_array,
                        scores, doc_idx, tag=cfg.name)
    with timed_step("evaluate", timings):
        metrics = evaluate_topk(queries.ids, doc_idx, docno_array, dataset.qrels, cfg.evaluation.metrics, scores=scores)
    files = {"run_trec": str(out / "run.trec"), "run_msmarco": str(out / "run.msmarco.tsv"), "index": str(out / "index")}
    result_extra: dict[str, Any] = {}
    if cfg.rerank.model:  # second stage: its metrics become the job's, the first stage's are kept beside
        from lsr.rerank.rerank import rerank_stage

        with timed_step("rerank", timings):
            first = runs.from_topk(queries.ids, docnos, scores, doc_idx)
            files["run_rerank"] = str(out / "rerank.trec")
            result_extra = {"metrics_first_stage": metrics}
            metrics = rerank_stage(cfg.rerank, first, dataset, device, out, cfg.evaluation.metrics)
    result = {"name": cfg.name, "dataset": cfg.data.dataset, "device": device, "metrics": metrics,
              "expected": dict(cfg.evaluation.expected), "timings_s": timings, "n_docs": len(docnos),
              "n_queries": len(queries), "files": files, **result_extra}
    atomic_write_text(out / "metrics.json", json.dumps(result, indent=1))
    return result


_MARKER = ".lsr-run.json"   # {"writer": "lsr run", "origin": {...}}: this folder is lsr's, made from these documents
_DERIVED = ("encoder", "doc_vectors")  # reused by a later run of the job, so they must match its documents


def job_origin(cfg: RunConfig, dataset: Any) -> dict[str, Any]:
    """What the job's documents are: the pre-encoded vectors, or the dataset's record of its source."""
    return ({"doc_vectors": str(Path(cfg.search.doc_vectors).resolve())} if cfg.search.doc_vectors
            else dict(dataset.docs_origin))


def claim_output(cfg: RunConfig, dataset: Any, out: Path, overwrite: bool) -> dict[str, Any]:
    """Refuse an output folder inside an input, one lsr did not write, or one made from other documents
    (unless ``overwrite``: then stale artefacts are removed); record the documents and save the config in
    it; returns the documents' origin."""
    import shutil

    from lsr.storage.provenance import check_not_inside, check_same_origin

    check_not_inside(out, [cfg.data.dataset, cfg.data.dataset.rsplit(":", 1)[0], cfg.search.doc_vectors,
                           cfg.search.query_vectors, cfg.search.vocab, cfg.encoder.model], "output folder")
    origin = job_origin(cfg, dataset)
    marker = out / _MARKER
    if marker.is_file():
        recorded = json.loads(marker.read_text(encoding="utf-8")).get("origin")
        try:
            check_same_origin(recorded, origin, out, "choose another output folder, or pass --overwrite to "
                                                      "recompute its vectors")
        except ValueError:
            if not overwrite:
                raise
            for name in _DERIVED:
                shutil.rmtree(out / name, ignore_errors=True)
    elif out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise FileExistsError(f"{out} exists and was not written by lsr run (no {_MARKER}); choose a new output "
                              "folder or pass --overwrite to write into it")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(marker, json.dumps({"writer": "lsr run", "origin": origin}, indent=1))
    cfg.save(out / "config.yaml")
    return origin


def _fit_lexical(encoder: Any, dataset: Any, path: Path, origin: dict[str, Any]) -> Any:
    """Fit BM25 statistics on the corpus (or reuse a saved fit of the same documents) and keep them
    with the output (``origin.json`` beside the fit records which documents)."""
    from lsr.encode.bm25.lexical import LexicalEncoder

    recorded = path / "origin.json"
    if (path / "lexical.json").exists() and recorded.is_file():
        saved = LexicalEncoder.load(path)
        same_docs = json.loads(recorded.read_text(encoding="utf-8")) == origin
        if same_docs and (saved.k1, saved.b) == (encoder.k1, encoder.b):
            return saved  # the corpus statistics of an earlier run of this job
    encoder.fit(text for _, text in dataset.docs_iter())
    encoder.save(path)
    atomic_write_text(recorded, json.dumps(origin, indent=1))
    return encoder


def read_doc_vectors(path: str, vocab: str | None) -> Any:
    from lsr.storage.shards import read_vectors

    p = Path(path)
    if p.is_dir():
        return read_vectors(p)
    if vocab is None:
        raise ValueError("pre-encoded JSON document vectors need search.vocab (vocab.txt or a tokenizer folder)")
    from lsr.interop.anserini import read_anserini_documents

    return read_anserini_documents(p, vocab)
