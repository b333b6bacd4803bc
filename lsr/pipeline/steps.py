"""The steps of ``lsr run`` that the one-process job (``lsr.pipeline.run``) and the torchrun job
(``lsr.pipeline.distributed``) share: the documents' encoder (BM25 fitted once per corpus), the output folder's
claim, the queries, and the run files and metrics. The encoder itself comes from ``lsr.encode.factory``,
pre-encoded vectors from ``lsr.interop.vectors``.

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

from lsr.config import RunConfig
from lsr.encode.factory import build_encoder
from lsr.interop.vectors import read_query_vectors
from lsr.storage.files import atomic_write_text

__all__ = ["check_job_partitions", "claim_output", "doc_encoder", "encode_queries", "job_origin", "timed_step",
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
    if cfg.inputs.query_vectors:
        vocab = cfg.inputs.vocab or (encoder.vocab if encoder is not None else None)
        queries = read_query_vectors(cfg.inputs.query_vectors, vocab, cfg.inputs.query_scale)
        keep = [i for i, q in enumerate(queries.ids) if q in dataset.queries] if dataset.queries else None
        return (queries[keep] if keep is not None and len(keep) < len(queries) else queries), None
    if encoder is None:
        raise ValueError("inputs.doc_vectors needs inputs.query_vectors too (no encoder is configured)")
    qids = list(dataset.queries)
    return encoder.encode_query([dataset.queries[q] for q in qids], ids=qids), encoder.describe()


def write_results(cfg: RunConfig, dataset: Any, queries: Any, docnos: list[str], topk: tuple[Any, Any],
                  timings: dict[str, float], device: str, search_plan: str | None = None) -> dict[str, Any]:
    """Write run.trec / run.msmarco.tsv, evaluate (and rerank when configured), write metrics.json (with the
    ``search_plan`` the search followed, where given: ``SearchPlan.describe()``); returns the job's result."""
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
    if search_plan is not None:
        result["search_plan"] = search_plan
    atomic_write_text(out / "metrics.json", json.dumps(result, indent=1))
    return result


_MARKER = ".lsr-run.json"   # {"writer": "lsr run", "origin": {...}}: this folder is lsr's, made from these documents
_DERIVED = ("encoder", "doc_vectors")  # reused by a later run of the job, so they must match its documents


def job_origin(cfg: RunConfig, dataset: Any) -> dict[str, Any]:
    """What the job's documents are: the pre-encoded vectors, or the dataset's record of its source."""
    return ({"doc_vectors": str(Path(cfg.inputs.doc_vectors).resolve())} if cfg.inputs.doc_vectors
            else dict(dataset.docs_origin))


def claim_output(cfg: RunConfig, dataset: Any, out: Path, overwrite: bool) -> dict[str, Any]:
    """Refuse an output folder inside an input, one lsr did not write, or one made from other documents
    (unless ``overwrite``: then stale artefacts are removed); record the documents and save the config in
    it; returns the documents' origin."""
    import shutil

    from lsr.storage.provenance import check_not_inside, check_same_origin

    check_not_inside(out, [cfg.data.dataset, cfg.data.dataset.rsplit(":", 1)[0], cfg.inputs.doc_vectors,
                           cfg.inputs.query_vectors, cfg.inputs.vocab, cfg.encoder.model], "output folder")
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


def check_job_partitions(cfg: RunConfig, dataset: Any, n_partitions: int) -> None:
    """Refuse more partitions than the dataset's documents before any encoding (when the dataset knows its
    size and the job encodes it)."""
    if n_partitions > 1 and dataset.n_docs is not None and not cfg.inputs.doc_vectors:
        from lsr.index.sharded import check_partition_count

        check_partition_count(dataset.n_docs, n_partitions, cfg.data.dataset)
