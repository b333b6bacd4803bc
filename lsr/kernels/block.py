"""Block-accumulating scorer: per (doc span, query group) scores built on chip, top candidates emitted.

Why: term-parallel scatter (lsr.kernels.scatter) does one random read-modify-write in a [B, N] HBM
buffer per touched posting (~2.2 N per SPLADE query). Here a program owns the scores of G queries on a
span of SPAN docs ([span * SPAN, (span + 1) * SPAN), the block-aligned index makes every term's
postings for it one contiguous run) in a private scratch tile of G * SPAN int64 -- small enough to stay
in L1/L2 -- so the HBM traffic is the postings, read once per span and shared through L2 by all
queries that touch the span at the same time (work items are ordered span-major).

Work item = (query group q0..q0+G-1, span). ``SPLIT`` worker rows per query walk that query's terms
round-robin (terms pre-sorted by document frequency, longest first, which balances the rows); every
row consumes one ``CHUNK`` of its current term's run per step, with the next chunk and the next term's
run bounds prefetched one step ahead (software pipelining by hand: the loop is a data-dependent while).

Accumulation (exact, deterministic, lsr.kernels.fixed):
* ``ATOMIC``: int64 atomics into the scratch (any row split; integer adds commute).
* otherwise: plain load / add / store and a CTA barrier per step (SPLIT must be 1: one row per query
  walks one term at a time, whose docs are distinct, so no two lanes touch one cell in a step).

Then the tile is read back (and zeroed for the next item) and turned into candidates
(lsr.kernels.topk): ``ROWMAX`` writes the best key of every 32 docs (the sample pass that bounds the
k-th score), otherwise every doc with score >= theta[q] goes to CAP slots (+ a count, which flags
overflow). The grid is persistent: program p owns scratch slot p and items p, p + P, ...
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lsr.kernels.fixed import from_fixed, to_fixed, torch_from_fixed, torch_to_fixed
from lsr.kernels.topk import ROW, emit_above, pack_key, pack_keys, row_max_keys, torch_emit, torch_row_max

_ROW = tl.constexpr(ROW)

__all__ = ["span_items", "triton_block_candidates", "torch_block_candidates", "default_programs"]


@triton.jit
def _term_run(q_terms_ptr, q_w_ptr, span_off_ptr, stride_so_t, span, qstart, qlen, i, need):
    """(start, end, weight) of query term i's postings in ``span``; empty where not ``need``."""
    ok = need & (i < qlen)
    t = tl.load(q_terms_ptr + qstart + i, mask=ok, other=0).to(tl.int64)
    w = tl.load(q_w_ptr + qstart + i, mask=ok, other=0.0)
    p = span_off_ptr + t * stride_so_t + span
    s = tl.load(p, mask=ok, other=0)
    e = tl.load(p + 1, mask=ok, other=0)
    return s, e, w


@triton.jit
def _block_kernel(post_doc_ptr, post_w_ptr, span_off_ptr, stride_so_t,
                  q_indptr_ptr, q_terms_ptr, q_w_ptr, scale_ptr, inv_ptr, theta_ptr,
                  item_q_ptr, item_span_ptr, item_out_ptr, n_items, out_stride_g,
                  scratch_ptr, out_ptr, count_ptr, B,
                  G: tl.constexpr, SPLIT: tl.constexpr, SPAN: tl.constexpr, CHUNK: tl.constexpr,
                  RB: tl.constexpr, CAP: tl.constexpr, ROWMAX: tl.constexpr, ATOMIC: tl.constexpr):
    pid = tl.program_id(0)
    R: tl.constexpr = G * SPLIT
    r = tl.arange(0, R)
    rg = r // SPLIT
    lane = tl.arange(0, CHUNK)
    gq = tl.arange(0, G)
    slot = scratch_ptr + pid.to(tl.int64) * (G * SPAN)
    row_slot = slot + rg.to(tl.int64)[:, None] * SPAN            # [R, 1]
    for item in range(pid, n_items, tl.num_programs(0)):
        q0 = tl.load(item_q_ptr + item)
        span = tl.load(item_span_ptr + item)
        out0 = tl.load(item_out_ptr + item)
        doc0 = span.to(tl.int64) * SPAN

        # ---- accumulate: every worker row walks its query's terms i = r % SPLIT, + SPLIT, ...
        q = q0 + rg
        qok = q < B
        qstart = tl.load(q_indptr_ptr + q, mask=qok, other=0)
        qlen = tl.where(qok, tl.load(q_indptr_ptr + q + 1, mask=qok, other=0) - qstart, 0)
        scale = tl.load(scale_ptr + q, mask=qok, other=1.0)
        everyone = r >= 0
        i_cur = (r % SPLIT).to(tl.int64)
        pos, end, wq = _term_run(q_terms_ptr, q_w_ptr, span_off_ptr, stride_so_t, span, qstart, qlen,
                                 i_cur, everyone)
        i_nxt = i_cur + SPLIT
        n_s, n_e, n_w = _term_run(q_terms_ptr, q_w_ptr, span_off_ptr, stride_so_t, span, qstart, qlen,
                                  i_nxt, everyone)
        alive = i_cur < qlen
        p = pos[:, None] + lane[None, :]
        m = alive[:, None] & (p < end[:, None])
        doc = tl.load(post_doc_ptr + p, mask=m, other=-1)
        w = tl.load(post_w_ptr + p, mask=m, other=0.0)
        while tl.max(alive.to(tl.int32), axis=0) > 0:
            ok = doc >= 0                                           # -1: padding or masked
            cell = row_slot + (doc.to(tl.int64) - doc0)
            v = to_fixed(wq[:, None], w, scale[:, None])
            if ATOMIC:
                tl.atomic_add(cell, v, mask=ok, sem="relaxed")
            else:
                old = tl.load(cell, mask=ok, other=0)
                tl.store(cell, old + v, mask=ok)
                tl.debug_barrier()                                  # next step may hit these cells
            # advance: next chunk of the run, or the prefetched next term
            pos = pos + CHUNK
            done = pos >= end
            pos = tl.where(done, n_s, pos)
            end = tl.where(done, n_e, end)
            wq = tl.where(done, n_w, wq)
            i_cur = tl.where(done, i_nxt, i_cur)
            i_nxt = tl.where(done, i_nxt + SPLIT, i_nxt)
            f_s, f_e, f_w = _term_run(q_terms_ptr, q_w_ptr, span_off_ptr, stride_so_t, span, qstart, qlen,
                                      i_nxt, done)
            n_s = tl.where(done, f_s, n_s)
            n_e = tl.where(done, f_e, n_e)
            n_w = tl.where(done, f_w, n_w)
            alive = i_cur < qlen
            p = pos[:, None] + lane[None, :]
            m = alive[:, None] & (p < end[:, None])
            doc = tl.load(post_doc_ptr + p, mask=m, other=-1)
            w = tl.load(post_w_ptr + p, mask=m, other=0.0)
        tl.debug_barrier()                                          # all adds land before the read-out

        # ---- read out (and zero) the tile, emit candidates
        rq = q0 + gq
        rok = rq < B
        inv = tl.load(inv_ptr + rq, mask=rok, other=1.0)
        rows_out = out_ptr + out0 + gq.to(tl.int64) * out_stride_g
        if not ROWMAX:
            theta = tl.load(theta_ptr + rq, mask=rok, other=0.0)
        base = tl.zeros([G], dtype=tl.int32)
        for c0 in tl.static_range(0, SPAN, RB):
            cols = c0 + tl.arange(0, RB)
            a_ptr = slot + gq.to(tl.int64)[:, None] * SPAN + cols[None, :]
            acc = tl.load(a_ptr, cache_modifier=".cg")              # L2: atomics bypass L1
            tl.store(a_ptr, tl.zeros([G, RB], dtype=tl.int64))
            s = from_fixed(acc, inv[:, None])
            keys = pack_key(s, doc0 + cols[None, :])                # untouched cells: 0 -> key -1
            if ROWMAX:
                best = row_max_keys(keys, G, RB)
                rcols = c0 // _ROW + tl.arange(0, RB // _ROW)
                tl.store(rows_out[:, None] + rcols[None, :], best, mask=rok[:, None])
            else:
                ok_c = (keys >= 0) & (s >= theta[:, None]) & rok[:, None]
                base = emit_above(keys, ok_c, rows_out, base, CAP)
        if not ROWMAX:
            tl.store(count_ptr + out0 // CAP + gq.to(tl.int64) * (out_stride_g // CAP), base, mask=rok)
        tl.debug_barrier()                                          # zeros land before the next item


def span_items(n_queries: int, spans: torch.Tensor, group: int, width: int) -> tuple[torch.Tensor, ...]:
    """Work items over all query groups x ``spans`` (span-major), output laid out [B, len(spans), width].

    Returns (item_q int32, item_span int32, item_out int64 [n_items], out_stride_g).
    """
    dev = spans.device
    L = spans.numel()
    n_groups = -(-n_queries // group)
    q0 = (torch.arange(n_groups, device=dev, dtype=torch.int64) * group).repeat(L)
    col = torch.arange(L, device=dev, dtype=torch.int64).repeat_interleave(n_groups)
    item_out = (q0 * L + col) * width
    return q0.to(torch.int32), spans.to(torch.int32).repeat_interleave(n_groups), item_out, L * width


def default_programs(device: torch.device, per_sm: int = 8) -> int:
    """Persistent grid size: a few resident programs per SM (1 under the interpreter)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count * per_sm
    return 2


def triton_block_candidates(post_doc: torch.Tensor, post_w: torch.Tensor, span_off: torch.Tensor,
                            q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                            scale: torch.Tensor, inv_scale: torch.Tensor, span: int,
                            items: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], out_size: int, *,
                            theta: torch.Tensor | None = None, cap: int = 32, group: int = 4, split: int = 1,
                            atomic: bool = False, chunk: int = 32, readout: int = 1024,
                            n_programs: int | None = None, num_warps: int = 4
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the block scorer over work items and emit candidate keys.

    Args:
        post_doc / post_w: int32 / float32 [P] postings (-1 / 0 padding), term-major, span-ordered.
        span_off: int64 [V, n_spans + 1]: term t's postings for span j are
            post[span_off[t, j] : span_off[t, j + 1]], docs in [j * span, (j + 1) * span).
        q_indptr / q_terms / q_weights: query CSR (int64 / int32 / float32); any term order.
        scale / inv_scale: float64 [B] (``query_scales``).
        span: docs per span (power of two, >= 32).
        items: (item_q int32, item_span int32, item_out int64 [n_items], out_stride_g), e.g. from
            ``span_items``: item i covers queries item_q[i] + g (g < group) on span item_span[i]; row g
            writes ``width`` keys at out[item_out[i] + g * out_stride_g].
        out_size: length of the flat output.
        theta: float32 [B] thresholds (emission, width = cap), or None (row maxima, width = span / 32).
        group / split / atomic / chunk: see the module docstring (split > 1 needs atomic).
    Returns:
        (keys int64 [out_size], counts int32 [out_size // cap] or None); unwritten slots hold -1.
    """
    dev = post_doc.device
    item_q, item_span, item_out, out_stride_g = items
    if post_doc.dtype != torch.int32 or post_w.dtype != torch.float32 or post_doc.shape != post_w.shape:
        raise ValueError("post_doc must be int32 and post_w float32 of one shape [P]")
    if span_off.dtype != torch.int64 or span_off.dim() != 2 or span_off.stride(1) != 1:
        raise ValueError("span_off must be int64 [V, n_spans + 1] with contiguous rows")
    if span < ROW or span & (span - 1) or chunk & (chunk - 1) or group & (group - 1) or split & (split - 1):
        raise ValueError("span, chunk, group and split must be powers of two (span >= 32)")
    if split > 1 and not atomic:
        raise ValueError("split > 1 needs atomic accumulation")
    for name, t, dt in (("q_indptr", q_indptr, torch.int64), ("q_terms", q_terms, torch.int32),
                        ("q_weights", q_weights, torch.float32), ("scale", scale, torch.float64),
                        ("inv_scale", inv_scale, torch.float64), ("item_q", item_q, torch.int32),
                        ("item_span", item_span, torch.int32), ("item_out", item_out, torch.int64)):
        if t.dtype != dt or t.dim() != 1 or not t.is_contiguous() or t.device != dev:
            raise ValueError(f"{name} must be a contiguous 1-D {dt} tensor on {dev}")
    B = q_indptr.numel() - 1
    rowmax = theta is None
    width = span // ROW if rowmax else cap
    if out_stride_g % width:
        raise ValueError("out_stride_g must be a multiple of the row width")
    if not rowmax and (theta.shape != (B,) or theta.dtype != torch.float32 or theta.device != dev):
        raise ValueError("theta must be float32 [B] on the postings' device")
    out = torch.full((out_size,), -1, dtype=torch.int64, device=dev)
    counts = None if rowmax else torch.zeros(out_size // cap, dtype=torch.int32, device=dev)
    n_items = item_q.numel()
    if n_items == 0:
        return out, counts
    n_prog = min(n_items, n_programs or default_programs(dev))
    scratch = torch.zeros(n_prog * group * span, dtype=torch.int64, device=dev)
    rb = min(span, max(ROW, readout // group))  # read-out tile of `readout` cells: bounds registers
    _block_kernel[(n_prog,)](post_doc, post_w, span_off, span_off.stride(0),
                             q_indptr, q_terms, q_weights, scale, inv_scale,
                             scale if rowmax else theta,
                             item_q, item_span, item_out, n_items, out_stride_g,
                             scratch, out, out if rowmax else counts, B,
                             G=group, SPLIT=split, SPAN=span, CHUNK=chunk, RB=rb, CAP=width, ROWMAX=rowmax,
                             ATOMIC=atomic, num_warps=num_warps, num_stages=1)
    return out, counts


def torch_block_candidates(post_doc: torch.Tensor, post_w: torch.Tensor, span_off: torch.Tensor,
                           q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                           scale: torch.Tensor, inv_scale: torch.Tensor, span: int,
                           items: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], out_size: int, *,
                           theta: torch.Tensor | None = None, cap: int = 32, group: int = 4,
                           **_: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Torch twin of ``triton_block_candidates`` (same arguments and bit-identical results; the
    kernel-only tuning arguments are accepted and ignored)."""
    dev = post_doc.device
    item_q, item_span, item_out, out_stride_g = items
    B = q_indptr.numel() - 1
    n_spans = span_off.shape[1] - 1
    # dense fixed-point scores of every (query, doc) from the span table
    t = q_terms.long()
    lens = span_off[t, -1] - span_off[t, 0]
    entry = torch.repeat_interleave(torch.arange(t.numel(), device=dev), lens)
    pos = span_off[t, 0][entry] + torch.arange(entry.numel(), device=dev) - (torch.cumsum(lens, 0) - lens)[entry]
    doc = post_doc[pos].long()
    keep = doc >= 0
    entry, doc, w = entry[keep], doc[keep], post_w[pos][keep]
    row = torch.repeat_interleave(torch.arange(B, device=dev), q_indptr.diff())[entry]
    acc = torch.zeros((B + group) * n_spans * span, dtype=torch.int64, device=dev)
    acc.index_add_(0, row * (n_spans * span) + doc, torch_to_fixed(q_weights[entry], w, scale[row]))
    inv = torch.cat([inv_scale, torch.ones(group, dtype=torch.float64, device=dev)])
    scores = torch_from_fixed(acc.view(B + group, -1), inv.unsqueeze(1))
    # per (item, g) row: the span's scores -> keys -> row maxima or emission
    qg = item_q.long().unsqueeze(1) + torch.arange(group, device=dev)                 # [I, G]
    cols = item_span.long().unsqueeze(1) * span + torch.arange(span, device=dev)     # [I, span]
    s = scores[qg.unsqueeze(2), cols.unsqueeze(1)].reshape(-1, span)
    keys = pack_keys(s, cols.unsqueeze(1).expand(-1, group, -1).reshape(-1, span))
    valid = (qg < B).flatten()
    starts = (item_out.unsqueeze(1) + torch.arange(group, device=dev) * out_stride_g).flatten()[valid]
    out = torch.full((out_size,), -1, dtype=torch.int64, device=dev)
    if theta is None:
        rows, counts = torch_row_max(keys)[valid], None
    else:
        th = torch.cat([theta, torch.zeros(group, dtype=torch.float32, device=dev)])[qg.flatten()]
        rows, cnt = torch_emit(keys, (keys >= 0) & (s >= th.unsqueeze(1)), cap)
        rows = rows[valid]
        counts = torch.zeros(out_size // cap, dtype=torch.int32, device=dev)
        counts[starts // cap] = cnt[valid]
    width = rows.shape[1]
    out[(starts.unsqueeze(1) + torch.arange(width, device=dev)).flatten()] = rows.flatten()
    return out, counts
