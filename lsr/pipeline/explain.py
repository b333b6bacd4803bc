"""``lsr run CONFIG --explain``: the plans a run follows, composed into one text; nothing is encoded or written.

The plans are the ones the stages make and their executors read (``lsr.utils.plans``): the encoder's plan for
document and query batches (``SpladeEncoder.explain``), the batch plan of the ranks (``lsr.parallel.plan``) and,
where the run's output folder already holds its index (a run that was made before), the search plan of the first
query batch on it (``Searcher.explain``). Before the index exists the search plan cannot be made (it reads the
index: its size, its postings, the block layout); the text says how to print it once it does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lsr.config import RunConfig
from lsr.utils.plans import Plan, Step

__all__ = ["explain_run"]


@dataclass(frozen=True)
class _StagePlan(Plan):
    """A stage whose route has no choices, or whose plan is made later, in the same form as the others."""

    name: str
    steps: tuple[Step, ...]

    def title(self) -> str:
        return self.name

    def plan_steps(self) -> tuple[Step, ...]:
        return self.steps


def explain_run(cfg: RunConfig, world_size: int = 1) -> list[Plan]:
    """The plans of ``cfg``'s run on ``world_size`` ranks, in the order the run takes them."""
    from lsr.data.sources import load_dataset
    from lsr.utils.devices import resolve_device

    device = resolve_device(cfg.device)
    dataset = load_dataset(cfg.data.dataset, cfg.data.split)
    plans: list[Plan] = []
    encoder = None
    if not (cfg.inputs.doc_vectors and cfg.inputs.query_vectors):
        from lsr.encode.factory import build_encoder

        encoder = build_encoder(cfg.encoder, device)
    plans += _encode_plans(cfg, encoder)
    from lsr.parallel.plan import plan_batch

    plans.append(plan_batch(cfg.index.partitions, world_size, len(dataset.queries)))
    plans.append(_search_plan(cfg, dataset, encoder, device))
    return plans


def _encode_plans(cfg: RunConfig, encoder: object | None) -> list[Plan]:
    explain = getattr(encoder, "explain", None)
    if explain is None:   # BM25 or pre-encoded vectors: no route to choose
        what = (Step("documents", "pre-encoded", cfg.inputs.doc_vectors) if cfg.inputs.doc_vectors else
                Step("documents", "bm25", f"term counts, k1={cfg.encoder.k1}, b={cfg.encoder.b}"),
                Step("queries", "pre-encoded", cfg.inputs.query_vectors) if cfg.inputs.query_vectors else
                Step("queries", "bm25", "the analyzer's terms, weight 1"))
        return [_StagePlan("encode plan", what)]
    batch = cfg.encoder.batch_size or 32
    plans = [] if cfg.inputs.doc_vectors else [explain("doc", batch=batch)]
    return plans if cfg.inputs.query_vectors else [*plans, explain("query", batch=batch)]


def _search_plan(cfg: RunConfig, dataset: object, encoder: object | None, device: str) -> Plan:
    """The first query batch's search plan on the index an earlier run left in the output folder, else a note."""
    from lsr.index.inverted import InvertedIndex

    index_dir = Path(cfg.output) / "index"
    if not (index_dir / "meta.json").is_file() or cfg.index.partitions > 1:
        why = f"made per query batch from the index, which this run builds in {index_dir}"
        return _StagePlan("search plan", (Step("plan", "after the index is built", why),
                                          Step("print it", f"lsr search --index {index_dir} ... --explain")))
    from lsr.pipeline.steps import doc_encoder, encode_queries
    from lsr.search.searcher import Searcher, run_depth

    index = InvertedIndex.load(index_dir, device=device)
    if cfg.encoder.kind == "bm25" and encoder is not None:   # the fit the earlier run saved (nothing is fitted here)
        encoder = doc_encoder(cfg, dataset, Path(cfg.output), {}, device, fit=False)
    queries, _ = encode_queries(cfg, dataset, encoder)
    batch = queries[: cfg.search.batches.size or len(queries)].to(device)
    from lsr.pipeline.run import run_filter, run_metadata

    doc_filter = run_filter(cfg)
    searcher = Searcher(index, config=cfg.search, metadata=run_metadata(cfg, doc_filter, index, index_dir))
    return searcher.explain(batch, k=run_depth(cfg.search.k, index.n_docs), filter=doc_filter)
