"""What distributed search sends between ranks, packed so that one collective carries each message.

* ``broadcast_queries``: rank 0's query batch (and k) on every rank in two broadcasts: the sizes, with a flag
  saying whether rank 0 refused the request (so the refusal costs no collective of its own), then one int32
  buffer holding the CSR arrays (float32 weights as their bit patterns).
* ``pack_hits`` / ``unpack_hits``: a [B, k] top-k (float32 scores, int64 doc indices) as one int64 tensor, the
  scores' bit patterns first; an optional last column carries a failure flag, so an all-gather of results
  also tells every rank whether another one failed (no separate agreement collective per batch).

Bit patterns travel unchanged, so the received scores equal the sent ones bit for bit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from lsr.sparse import SparseVectors

__all__ = ["broadcast_queries", "pack_hits", "unpack_hits"]

_INT32_MAX = (1 << 31) - 1


def _query_buffer(queries: SparseVectors) -> torch.Tensor:
    """indptr, indices and the weights' bit patterns of ``queries`` in one int32 tensor."""
    return torch.cat([queries.indptr.to(torch.int32), queries.indices.to(torch.int32),
                      queries.values.to(torch.float32).contiguous().view(torch.int32)])


def broadcast_queries(queries: SparseVectors | None, k: int, refusal: BaseException | None,
                      comm: torch.device) -> tuple[SparseVectors, int]:
    """Rank 0's ``queries`` and ``k`` on every rank (collective; ids stay on rank 0, the others get "0", "1",
    ...). Rank 0 passes ``refusal``, the error of its own check of the request, or None: with one, rank 0
    raises it and every other rank raises a RuntimeError saying rank 0 refused, once the sizes have gone out."""
    rank = dist.get_rank()
    if rank == 0 and refusal is None and queries is not None and queries.nnz > _INT32_MAX:
        refusal = ValueError(f"{queries.nnz} query terms in one search call are more than {_INT32_MAX}: pass fewer "
                             "queries per call")
    sizes = torch.zeros(5, dtype=torch.int64, device=comm)
    if rank == 0:
        ok = refusal is None and queries is not None
        host = [len(queries), queries.nnz, queries.vocab_size, k, 0] if ok else [0, 0, 0, 0, 1]
        sizes.copy_(torch.tensor(host, dtype=torch.int64))
    dist.broadcast(sizes, 0)
    n, nnz, vocab, k, refused = host if rank == 0 else sizes.tolist()  # the sizes that allocate the buffer
    if refused:
        if rank == 0:
            raise refusal if refusal is not None else ValueError("rank 0 must pass the queries")
        raise RuntimeError("another rank failed to check the queries (rank 0's error says why)")
    if rank == 0:
        dist.broadcast(_query_buffer(queries).to(comm), 0)
        return queries, k
    buf = torch.empty(n + 1 + 2 * nnz, dtype=torch.int32, device=comm)
    dist.broadcast(buf, 0)
    indptr, indices = buf[:n + 1].to(torch.int64), buf[n + 1:n + 1 + nnz]
    values = buf[n + 1 + nnz:].view(torch.float32)
    return SparseVectors(indptr, indices, values, [str(i) for i in range(n)], vocab, validate=False), k


def pack_hits(scores: torch.Tensor, doc_idx: torch.Tensor, rows: int, failed: bool | None = None) -> torch.Tensor:
    """[rows, 2k (+1)] int64: the scores' bit patterns, the doc indices (and the failure flag when ``failed`` is
    given); rows beyond the hits' own are padding (score 0, doc -1), so every rank sends the same shape."""
    k = scores.shape[1]
    out = torch.zeros(rows, 2 * k + (failed is not None), dtype=torch.int64, device=scores.device)
    m = scores.shape[0]
    out[:m, :k] = scores.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
    out[:m, k:2 * k] = doc_idx
    out[m:, k:2 * k] = -1
    if failed:
        out[:, -1] = 1
    return out


def unpack_hits(packed: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores float32 [rows, k], doc_idx int64 [rows, k]) of a ``pack_hits`` tensor (its flag column ignored)."""
    scores = packed[:, :k].to(torch.int32).view(torch.float32)
    return scores, packed[:, k:2 * k]
