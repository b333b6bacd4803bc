"""Seeded synthetic SPLADE-like collections (documents and queries) for benchmarks and tests, in torch.

Calibrated to the statistics that set the cost of exact sparse search on MS MARCO with SPLADE++ ED:
~127 non-zeros per document, 44-50 per query, the most frequent term in ~52% of the documents,
~2.2 N postings touched per query, and weights shaped like log1p of a lognormal (SPLADE weights are
log(1 + relu(logit))). ``synth_stats`` measures these numbers on any pair of collections.

Model:
* Term popularity: a Zipf-Mandelbrot law over frequency ranks, p(r) ~ (r + offset)^-exponent, mapped to
  vocabulary ids through a seeded permutation (frequent word pieces are spread over the id space), or
  through ``term_ranking`` (e.g. ``ranking_from_queries`` of real query vectors: then real queries of
  that vocabulary touch as many postings of the synthetic collection as they do of the real one).
* Topics: every row belongs to one of ``n_topics``; a topic owns ``topic_terms`` mid-frequency terms
  (log-uniform ranks above ``topic_min_rank``, popularity ~ 1/j inside the topic). A draw comes from
  the row's topic with probability ``*_topic_frac``, else from the global law (for queries the law
  flattened to p^query_flatten). Topics make relevant documents share query terms, as in real data.
* A row of target length L takes ``ceil(oversample * L)`` draws with replacement, keeps the distinct
  terms and, if more than L, a uniformly random L of them.
* Weight = log1p(X), log X = mu + sigma * z + rarity_slope * (rarity - 1/2) + topic_shift * [topic draw],
  rarity = log(1 + rank) / log(1 + V), z ~ N(0, 1); clipped to [w_min, w_max].

Everything is vectorised; on CUDA 8.8M documents take seconds. Documents come in blocks of
``block_rows`` rows, each from its own generator seeded by (seed, block), so the first N documents are
the same for every collection size >= N on one device type (CPU and CUDA streams differ: hand exact
vectors to other systems with ``save_npz``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from lsr.sparse import SparseVectors

__all__ = ["SynthSpec", "load_npz", "ranking_from_queries", "save_npz", "synth_docs", "synth_queries", "synth_stats"]


@dataclass(frozen=True)
class SynthSpec:
    vocab_size: int = 30522
    zipf_exponent: float = 1.08
    zipf_offset: float = 22.0
    doc_len_mean: float = 127.0
    doc_len_sigma: float = 0.33
    doc_len_range: tuple[int, int] = (8, 400)
    query_len_mean: float = 47.0
    query_len_sigma: float = 0.32
    query_len_range: tuple[int, int] = (3, 120)
    oversample: float = 1.5
    query_flatten: float = 0.78
    n_topics: int = 1000
    topic_terms: int = 200
    topic_min_rank: int = 250
    doc_topic_frac: float = 0.22
    query_topic_frac: float = 0.38
    doc_mu: float = -1.38
    doc_sigma: float = 1.25
    query_mu: float = -1.42
    query_sigma: float = 1.65
    rarity_slope: float = 0.7
    topic_shift: float = 1.2
    w_min: float = 0.01
    w_max: float = 3.5
    block_rows: int = 1 << 18
    seed: int = 0


class _Law:
    """Global and topic term distributions (small; built on the CPU from the seed, then moved)."""

    def __init__(self, spec: SynthSpec, device: torch.device, term_ranking: torch.Tensor | None = None) -> None:
        V = spec.vocab_size
        g = torch.Generator().manual_seed(spec.seed * 1_000_003 + 7)
        ranks = torch.arange(V, dtype=torch.float64)
        p = (ranks + 1 + spec.zipf_offset) ** -spec.zipf_exponent
        self.cdf_doc = torch.cumsum(p / p.sum(), 0).to(device)
        pq = p ** spec.query_flatten
        self.cdf_query = torch.cumsum(pq / pq.sum(), 0).to(device)
        self.rank_to_term = torch.randperm(V, generator=g).to(device)
        if term_ranking is not None:
            if term_ranking.shape != (V,) or not torch.equal(torch.sort(term_ranking.cpu()).values, torch.arange(V)):
                raise ValueError(f"term_ranking must be a permutation of the {V} term ids")
            self.rank_to_term = term_ranking.to(device=device, dtype=torch.int64)
        lo = math.log(min(spec.topic_min_rank, V - 1) + 1)
        u = torch.rand((spec.n_topics, spec.topic_terms), generator=g, dtype=torch.float64)
        self.topic_rank = (torch.exp(lo + u * (math.log(V) - lo)) - 1).long().clamp_(0, V - 1).to(device)
        tp = 1.0 / torch.arange(1, spec.topic_terms + 1, dtype=torch.float64)
        self.cdf_topic = torch.cumsum(tp / tp.sum(), 0).to(device)


def _lengths(n: int, mean: float, sigma: float, bounds: tuple[int, int], gen: torch.Generator,
             device: torch.device) -> torch.Tensor:
    z = torch.randn(n, generator=gen, device=device)
    return (mean * torch.exp(sigma * z - sigma * sigma / 2)).round().clamp_(*bounds).long()


def _rows(n: int, kind: str, spec: SynthSpec, law: _Law, gen: torch.Generator,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(indptr int64 [n+1], terms int32 [nnz], weights float32 [nnz]) of n rows."""
    V = spec.vocab_size
    doc = kind == "doc"
    L = _lengths(n, spec.doc_len_mean if doc else spec.query_len_mean,
                 spec.doc_len_sigma if doc else spec.query_len_sigma,
                 spec.doc_len_range if doc else spec.query_len_range, gen, device)
    topic = torch.randint(spec.n_topics, (n,), generator=gen, device=device)
    draws = torch.ceil(L * spec.oversample).long()
    row = torch.repeat_interleave(torch.arange(n, device=device), draws)
    m = row.numel()
    cdf = law.cdf_doc if doc else law.cdf_query
    rank = torch.searchsorted(cdf, torch.rand(m, generator=gen, device=device, dtype=torch.float64))
    from_topic = torch.rand(m, generator=gen, device=device) < (spec.doc_topic_frac if doc else spec.query_topic_frac)
    j = torch.searchsorted(law.cdf_topic, torch.rand(m, generator=gen, device=device, dtype=torch.float64))
    j = j.clamp_(max=spec.topic_terms - 1)
    rank = torch.where(from_topic, law.topic_rank[topic[row], j], rank.clamp_(max=V - 1))
    del j
    # distinct (row, rank); a pair drawn from the topic at least once counts as a topic term
    key = (row * V + rank) * 2 + from_topic.long()
    key = torch.unique(key)  # sorted
    pair, flag = key // 2, (key % 2).bool()
    last = torch.ones_like(pair, dtype=torch.bool)
    last[:-1] = pair[1:] != pair[:-1]                        # the last of a pair has flag 1 if any has
    pair, flag = pair[last], flag[last]
    row, rank = pair // V, pair % V
    # at most L[row] of them, chosen uniformly: order each row by a random priority
    prio = torch.rand(row.numel(), generator=gen, device=device)
    order = torch.sort(row.double() + prio.double() * 0.5, stable=True).indices
    row, rank, flag = row[order], rank[order], flag[order]
    counts = torch.bincount(row, minlength=n)
    starts = torch.cumsum(counts, 0) - counts
    keep = torch.arange(row.numel(), device=device) - starts[row] < L[row]
    row, rank, flag = row[keep], rank[keep], flag[keep]
    term = law.rank_to_term[rank]
    order = torch.sort(row * V + term).indices
    row, rank, flag, term = row[order], rank[order], flag[order], term[order]
    # weights: log1p of a lognormal, larger for rare and for topic terms
    rarity = torch.log1p(rank.float()) / math.log1p(V) - 0.5
    z = torch.randn(row.numel(), generator=gen, device=device)
    logx = ((spec.doc_mu if doc else spec.query_mu) + (spec.doc_sigma if doc else spec.query_sigma) * z
            + spec.rarity_slope * rarity + spec.topic_shift * flag.float())
    w = torch.log1p(torch.exp(logx)).clamp_(spec.w_min, spec.w_max)
    indptr = torch.zeros(n + 1, dtype=torch.int64, device=device)
    torch.cumsum(torch.bincount(row, minlength=n), 0, out=indptr[1:])
    return indptr, term.to(torch.int32), w.float()


def _generate(n: int, kind: str, spec: SynthSpec, device: str | torch.device, salt: int,
              term_ranking: torch.Tensor | None) -> SparseVectors:
    dev = torch.device(device)
    law = _Law(spec, dev, term_ranking)
    parts = []
    for b in range(-(-n // spec.block_rows)):
        gen = torch.Generator(device=dev).manual_seed(spec.seed * 1_000_003 + salt * 65_537 + b + 1)
        rows = min(spec.block_rows, n - b * spec.block_rows)
        # every block is drawn at full size, so a prefix of the collection does not depend on n
        ip, t, w = _rows(spec.block_rows, kind, spec, law, gen, dev)
        parts.append((ip[:rows + 1], t[:int(ip[rows])], w[:int(ip[rows])]))
    if not parts:
        return SparseVectors(torch.zeros(1, dtype=torch.int64), torch.zeros(0, dtype=torch.int32),
                             torch.zeros(0), [], spec.vocab_size, device=dev, validate=False)
    offs = torch.tensor([0] + [int(p[0][-1]) for p in parts], device=dev).cumsum(0)
    indptr = torch.cat([parts[0][0][:1]] + [p[0][1:] + o for p, o in zip(parts, offs)])
    ids = [f"{kind[0]}{i}" for i in range(n)]
    return SparseVectors(indptr, torch.cat([p[1] for p in parts]), torch.cat([p[2] for p in parts]), ids,
                         spec.vocab_size, validate=False)


def synth_docs(n_docs: int, spec: SynthSpec = SynthSpec(), device: str | torch.device = "cuda", *,
               term_ranking: torch.Tensor | None = None) -> SparseVectors:
    """n_docs synthetic document vectors (ids "d0", "d1", ...) on ``device``. ``term_ranking``: term ids
    from the most to the least frequent (default: a seeded permutation)."""
    return _generate(n_docs, "doc", spec, device, 1, term_ranking)


def synth_queries(n_queries: int, spec: SynthSpec = SynthSpec(), device: str | torch.device = "cuda", *,
                  term_ranking: torch.Tensor | None = None) -> SparseVectors:
    """n_queries synthetic query vectors (ids "q0", ...) sharing the documents' terms and topics."""
    return _generate(n_queries, "query", spec, device, 2, term_ranking)


def ranking_from_queries(queries: SparseVectors, noise: float = 0.8, seed: int = 0) -> torch.Tensor:
    """Term ids ranked by how often real queries use them, blurred by Gumbel noise of scale ``noise`` on
    log(1 + count) (ties and unused terms in seeded random order). Query frequency overstates document
    frequency: with no noise SPLADE++ ED dev queries touch 3.5 N postings of a synthetic collection ranked
    this way, with 0.8 about the 2.2 N they touch on MS MARCO (docs/performance/search.md)."""
    V = queries.vocab_size
    counts = torch.bincount(queries.indices.long().cpu(), minlength=V).double()
    g = torch.Generator().manual_seed(seed)
    gumbel = -torch.log(-torch.log(torch.rand(V, generator=g, dtype=torch.float64).clamp_(1e-12, 1 - 1e-12)))
    return torch.argsort(-(torch.log1p(counts) + noise * gumbel), stable=True)


def synth_stats(docs: SparseVectors, queries: SparseVectors) -> dict[str, float]:
    """The statistics the generator is calibrated to (and that set search cost)."""
    n = len(docs)
    df = torch.bincount(docs.indices.long(), minlength=docs.vocab_size)
    touched = torch.zeros(len(queries), dtype=torch.float64, device=df.device)
    touched.index_add_(0, queries.row_ids().to(df.device), df[queries.indices.long().to(df.device)].double())
    dw, qw = docs.values.float(), queries.values.float()
    return {
        "n_docs": n, "n_queries": len(queries),
        "doc_nnz_mean": docs.nnz / max(n, 1), "query_nnz_mean": queries.nnz / max(len(queries), 1),
        "query_nnz_max": int(queries.lengths.max()) if len(queries) else 0,
        "max_df_frac": float(df.max()) / max(n, 1),
        "touched_per_query_over_n": float(touched.mean()) / max(n, 1),
        "doc_w_mean": float(dw.mean()), "doc_w_median": float(dw.median()),
        "query_w_mean": float(qw.mean()), "query_w_median": float(qw.median()),
    }


def save_npz(path: str, docs: SparseVectors, queries: SparseVectors) -> None:
    """Write the CSR arrays (keys doc_indptr, doc_terms, doc_weights, q_indptr, q_terms, q_weights)."""
    import numpy as np
    np.savez(path, doc_indptr=docs.indptr.cpu().numpy(), doc_terms=docs.indices.cpu().numpy(),
             doc_weights=docs.values.cpu().numpy(), q_indptr=queries.indptr.cpu().numpy(),
             q_terms=queries.indices.cpu().numpy(), q_weights=queries.values.cpu().numpy(),
             vocab_size=np.int64(max(docs.vocab_size, queries.vocab_size)))


def load_npz(path: str, device: str | torch.device = "cpu") -> tuple[SparseVectors, SparseVectors]:
    """(docs, queries) from an .npz with the keys of ``save_npz`` (validated; vocab_size optional)."""
    import numpy as np
    z = np.load(path, allow_pickle=False)
    vocab = int(z["vocab_size"]) if "vocab_size" in z else None
    if vocab is None:
        vocab = int(max(z["doc_terms"].max(initial=-1), z["q_terms"].max(initial=-1))) + 1
    docs = SparseVectors(z["doc_indptr"], z["doc_terms"], z["doc_weights"], vocab_size=vocab, device=device)
    queries = SparseVectors(z["q_indptr"], z["q_terms"], z["q_weights"], vocab_size=vocab, device=device)
    return docs, queries


def describe(spec: SynthSpec) -> dict:
    """JSON-ready description of a spec (for benchmark records)."""
    return asdict(spec)
