"""The steps of ``lsr run`` that the one-process job (``lsr.pipeline.run``) and the torchrun job
(``lsr.pipeline.distributed``) share: devices and encoders, the output folder's claim, pre-encoded vectors,
the queries, and the run files and metrics.

Nothing here joins or talks to a process group: the torchrun job decides which rank runs which step.
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
from lsr.utils.devices import resolve_device

__all__ = ["build_encoder", "check_job_partitions", "claim_output", "corpus_settings", "doc_encoder", "encode_queries", "job_origin",
           "load_query_vectors", "open_encoder", "read_doc_vectors", "resolve_device", "timed_step",
           "write_results"]

log = logging.getLogger("lsr")


@contextmanager
def timed_step(name: str, timings: dict[str, float]) -> Iterator[None]:
    """Log the step's start and end and record its seconds in ``timings[name]`` (the job's result)."""
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
                                             backend=cfg.head, compile=cfg.compile, attention=cfg.attention)
    raise ValueError(f"unknown encoder.kind {cfg.kind!r} (use 'bm25' or 'splade')")


def open_encoder(cfg: EncoderConfig, device: str) -> Any:
    """The encoder ``lsr encode`` / ``lsr search`` use: for BM25 a ``model`` is the folder of a fitted encoder
    (loaded); anything else as ``build_encoder`` (BM25 unfitted)."""
    if cfg.kind == "bm25" and cfg.model:
        from lsr.encode.bm25.lexical import LexicalEncoder

        return LexicalEncoder.load(cfg.model)
    return build_encoder(cfg, device)


def corpus_settings(cfg: EncoderConfig, origin: dict[str, Any]) -> dict[str, Any]:
    """The ``encode_corpus`` settings of a job's documents (one process or every rank): resumed, and recorded
    with ``origin`` so that the vectors are never reused for other documents."""
    return {"batch_size": cfg.batch_size, "shard_rows": cfg.shard_rows, "resume": True, "doc_top_k": cfg.doc_top_k,
            "tokenize_workers": cfg.tokenize_workers, "origin": origin}


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
    # expected values hold only for the data they were measured on (a config run with --set data.dataset=...)
    expected = dict(cfg.evaluation.expected) if cfg.expected_holds() else {}
    result = {"name": cfg.name, "dataset": cfg.data.dataset, "device": device, "metrics": metrics,
              "expected": expected, "timings_s": timings, "n_docs": len(docnos),
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
    """Pre-encoded documents: an lsr vector directory, or pyserini JSON vectors with their ``vocab``."""
    from lsr.storage.shards import read_vectors

    p = Path(path)
    if p.is_dir():
        return read_vectors(p)
    if vocab is None:
        raise ValueError("pre-encoded JSON document vectors need search.vocab (vocab.txt or a tokenizer folder)")
    from lsr.interop.anserini import read_anserini_documents

    return read_anserini_documents(p, vocab)


def check_job_partitions(cfg: RunConfig, dataset: Any, n_partitions: int) -> None:
    """Refuse more partitions than the dataset's documents before any encoding (when the dataset knows its
    size and the job encodes it)."""
    if n_partitions > 1 and dataset.n_docs is not None and not cfg.search.doc_vectors:
        from lsr.index.sharded import check_partition_count

        check_partition_count(dataset.n_docs, n_partitions, cfg.data.dataset)
