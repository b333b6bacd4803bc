"""Block-accumulating scorer: per (query, doc span) scores accumulated in a private scratch tile,
then only the top candidates go to HBM.

Why: term-parallel scatter (lsr.kernels.scatter) does one random read-modify-write in a [B, N] HBM
buffer per touched posting (~2.2 N per SPLADE query). Here a program owns the scores of G queries on
a span of SPAN docs ([span * SPAN, (span + 1) * SPAN); the block-aligned index makes every term's
postings for it one contiguous run) in a private int64 scratch tile of G * SPAN cells, which stays in
L2, so HBM traffic is the postings, read about once per span and shared through L2 by all queries
working on that span at the same time (work items are ordered span-major).

Work item = (queries q0..q0+G-1, span). The item's runs (one per query term) are cut into CHUNK-wide
chunks and numbered; a chunk finds its run by a binary search over cumulative chunk counts kept with
the run bounds in a small per-program table (L1). The next step's chunks are located and loaded
before the current step is accumulated (a hand-made two-stage pipeline). Two accumulation modes,
both exact and deterministic (int64 fixed point, lsr.kernels.fixed):

* ``ATOMIC``: one numbering over the whole item; a step takes R consecutive chunks (an [R, CHUNK]
  tile mixing short runs of rare terms and long runs of frequent ones) and adds with int64 atomics
  (chunks of different terms may hit one cell in a step; integer adds commute). Measured on an H200:
  L2 atomics cap this at ~35-40 G adds/s, the seed's rate.
* rows (not ATOMIC): row g of a [G, CHUNK] tile walks query g's own chunks, one per step. A chunk
  lies in one term's run, so its docs are distinct, and rows own separate cells: plain
  load/add/store is race-free, with a CTA barrier between steps (no atomic unit involved).

Then the tile is read back as [RB, 32] rows of docs (and zeroed for the next item) and turned into
candidates (lsr.kernels.topk): ``ROWMAX`` writes the best key of every 32 docs (the sample pass that
bounds the k-th score), otherwise every doc with score >= theta[q] goes to CAP slots (+ a count,
which flags overflow). The grid is persistent: program p owns scratch slot p and items p, p + P, ...
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from lsr.kernels.fixed import from_fixed, torch_from_fixed, torch_to_fixed
from lsr.kernels.topk import ROW, emit_tile, pack_key, pack_keys, row_max_keys, torch_emit, torch_row_max

__all__ = ["span_items", "triton_block_candidates", "torch_block_candidates", "default_programs"]

_ROW = tl.constexpr(ROW)


@triton.jit
def _locate(c, total, tab_ptr, LEN: tl.constexpr, LOG_LEN: tl.constexpr, FIELD: tl.constexpr,
            CHUNK: tl.constexpr):
    """Runs of chunk numbers c: (start position, end position, scaled weight, query row, valid).

    tab_ptr (scalar, or one per element of c) points at LEN entries of field 0, the inclusive
    cumulative chunk counts (ascending); field k is at tab_ptr + k * FIELD: 1 run start, 2 run end,
    3 float64 bits of w_query * scale, 4 query row g.
    """
    valid = c < total
    lo = tl.zeros_like(c)
    hi = tl.zeros_like(c) + LEN
    for _ in tl.static_range(LOG_LEN + 1):   # first j with cum[j] > c
        mid = (lo + hi) // 2
        go = tl.load(tab_ptr + mid, mask=valid & (lo < hi), other=0) <= c
        lo = tl.where((lo < hi) & go, mid + 1, lo)
        hi = tl.where((lo < hi) & ~go, mid, hi)
    j = tl.minimum(lo, LEN - 1)
    cum = tl.load(tab_ptr + j, mask=valid, other=0)
    start = tl.load(tab_ptr + FIELD + j, mask=valid, other=0)
    end = tl.load(tab_ptr + 2 * FIELD + j, mask=valid, other=0)
    wqs = tl.load(tab_ptr + 3 * FIELD + j, mask=valid, other=0).to(tl.float64, bitcast=True)
    g = tl.load(tab_ptr + 4 * FIELD + j, mask=valid, other=0)
    n = (end - start + CHUNK - 1) // CHUNK
    pos = start + (c - (cum - n)) * CHUNK
    return pos, end, wqs, g, valid


@triton.jit
def _block_kernel(post_doc_ptr, post_w_ptr, span_off_ptr, stride_so_t,
                  q_indptr_ptr, q_terms_ptr, q_w_ptr, scale_ptr, inv_ptr, theta_ptr,
                  item_q_ptr, item_span_ptr, item_out_ptr, n_items, out_stride_g,
                  scratch_ptr, table_ptr, out_ptr, count_ptr, B,
                  G: tl.constexpr, MAXQ: tl.constexpr, R: tl.constexpr, CHUNK: tl.constexpr,
                  SPAN: tl.constexpr, RB: tl.constexpr, CAP: tl.constexpr, ROWMAX: tl.constexpr,
                  ATOMIC: tl.constexpr, SEARCH: tl.constexpr, LOG_SEARCH: tl.constexpr, STEP: tl.constexpr):
    pid = tl.program_id(0)
    NT: tl.constexpr = G * MAXQ
    slot = scratch_ptr + pid.to(tl.int64) * (G * SPAN)
    tab = table_ptr + pid.to(tl.int64) * (5 * NT)
    gi = tl.arange(0, G)
    ii = tl.arange(0, MAXQ)
    lane = tl.arange(0, CHUNK)
    rows = tl.arange(0, RB)
    for item in range(pid, n_items, tl.num_programs(0)):
        q0 = tl.load(item_q_ptr + item)
        span = tl.load(item_span_ptr + item)
        out0 = tl.load(item_out_ptr + item)
        doc0 = span.to(tl.int64) * SPAN

        if ATOMIC:
            # ---- the item's runs, one per (query g, term i), numbered into one chunk sequence; a
            # step takes R consecutive chunks ([R, CHUNK] tile), each finding its run by binary
            # search in the table; int64 atomics, since chunks of different terms may share a doc
            q = q0 + gi
            qok = q < B
            qs = tl.load(q_indptr_ptr + q, mask=qok, other=0)
            ql = tl.where(qok, tl.load(q_indptr_ptr + q + 1, mask=qok, other=0) - qs, 0)
            tok = ii[None, :] < ql[:, None]
            t = tl.load(q_terms_ptr + qs[:, None] + ii[None, :], mask=tok, other=0).to(tl.int64)
            wq = tl.load(q_w_ptr + qs[:, None] + ii[None, :], mask=tok, other=0.0)
            scale = tl.load(scale_ptr + q, mask=qok, other=1.0)
            rs = tl.load(span_off_ptr + t * stride_so_t + span, mask=tok, other=0)
            re = tl.load(span_off_ptr + t * stride_so_t + span + 1, mask=tok, other=0)
            cum = tl.cumsum(tl.where(tok, (re - rs + CHUNK - 1) // CHUNK, 0), axis=1)
            row_total = tl.max(cum, axis=1)
            cum += (tl.cumsum(row_total, axis=0) - row_total)[:, None]
            cell_tab = tab + gi[:, None] * MAXQ + ii[None, :]
            tl.store(cell_tab, cum)
            tl.store(cell_tab + NT, rs)
            tl.store(cell_tab + 2 * NT, re)
            tl.store(cell_tab + 3 * NT, (wq.to(tl.float64) * scale[:, None]).to(tl.int64, bitcast=True))
            tl.store(cell_tab + 4 * NT, gi[:, None].to(tl.int64) + 0 * ii[None, :])
            tl.debug_barrier()                                   # the table is read by every thread
            c = tl.arange(0, R).to(tl.int64)
            total = tl.sum(row_total, axis=0)
            pos, end, wqs, gr, valid = _locate(c, total, tab, SEARCH, LOG_SEARCH, NT, CHUNK)
            p = pos[:, None] + lane[None, :]
            m = valid[:, None] & (p < end[:, None])
            doc = tl.load(post_doc_ptr + p, mask=m, other=-1)
            w = tl.load(post_w_ptr + p, mask=m, other=0.0)
            for _ in range(0, tl.cdiv(total, R)):
                c += STEP
                pos, end, n_wqs, n_gr, valid = _locate(c, total, tab, SEARCH, LOG_SEARCH, NT, CHUNK)
                p = pos[:, None] + lane[None, :]
                m = valid[:, None] & (p < end[:, None])
                n_doc = tl.load(post_doc_ptr + p, mask=m, other=-1)
                n_w = tl.load(post_w_ptr + p, mask=m, other=0.0)
                v = (w.to(tl.float64) * wqs[:, None]).to(tl.int64)   # = trunc(w_q * w_d * 2^e), exact
                cell = slot + gr[:, None] * SPAN + (doc.to(tl.int64) - doc0)
                tl.atomic_add(cell, v, mask=doc >= 0, sem="relaxed")  # -1: padding / masked
                doc, w, wqs, gr = n_doc, n_w, n_wqs, n_gr
        else:
            # ---- rows: row g walks query g's non-empty runs (compacted into table row g), one
            # chunk per step ([G, CHUNK] tile). A chunk's docs are distinct and rows own separate
            # cells, so plain load/add/store is race-free; a CTA barrier separates the steps.
            for gg in tl.static_range(G):                        # one query at a time: few registers
                q = q0 + gg
                qok = q < B
                qs = tl.load(q_indptr_ptr + q, mask=qok, other=0)
                ql = tl.where(qok, tl.load(q_indptr_ptr + q + 1, mask=qok, other=0) - qs, 0)
                tok = ii < ql
                t = tl.load(q_terms_ptr + qs + ii, mask=tok, other=0).to(tl.int64)
                wq = tl.load(q_w_ptr + qs + ii, mask=tok, other=0.0)
                scale = tl.load(scale_ptr + q, mask=qok, other=1.0)
                rs = tl.load(span_off_ptr + t * stride_so_t + span, mask=tok, other=0)
                re = tl.load(span_off_ptr + t * stride_so_t + span + 1, mask=tok, other=0)
                full = tok & (re > rs)
                dest = tab + gg * MAXQ + tl.cumsum(full.to(tl.int32), axis=0) - 1
                tl.store(dest + NT, rs, mask=full)
                tl.store(dest + 2 * NT, re, mask=full)
                tl.store(dest + 3 * NT, (wq.to(tl.float64) * scale).to(tl.int64, bitcast=True), mask=full)
                tl.store(tab + 4 * NT + gg * MAXQ, tl.sum(full.to(tl.int64), axis=0))
                tl.store(tab + 4 * NT + gg * MAXQ + 1,
                         tl.sum(tl.where(full, (re - rs + CHUNK - 1) // CHUNK, 0), axis=0))
            tl.debug_barrier()                                   # the table is read by every thread
            rowtab = tab + gi * MAXQ
            n_runs = tl.load(rowtab + 4 * NT)
            n_steps = tl.max(tl.load(rowtab + 4 * NT + 1), axis=0)
            j = tl.zeros([G], dtype=tl.int64)
            has = j < n_runs
            pos = tl.load(rowtab + NT, mask=has, other=0)
            end = tl.load(rowtab + 2 * NT, mask=has, other=0)
            wqs = tl.load(rowtab + 3 * NT, mask=has, other=0).to(tl.float64, bitcast=True)
            has = j + 1 < n_runs                                 # the next run, one step ahead
            n_s = tl.load(rowtab + NT + 1, mask=has, other=0)
            n_e = tl.load(rowtab + 2 * NT + 1, mask=has, other=0)
            n_q = tl.load(rowtab + 3 * NT + 1, mask=has, other=0)
            p = pos[:, None] + lane[None, :]
            m = p < end[:, None]
            doc = tl.load(post_doc_ptr + p, mask=m, other=-1)
            w = tl.load(post_w_ptr + p, mask=m, other=0.0)
            for _ in range(0, n_steps):
                # where every row's next chunk is, and its postings
                pos += CHUNK
                done = pos >= end
                pos = tl.where(done, n_s, pos)
                end = tl.where(done, n_e, end)
                n_wqs = tl.where(done, n_q.to(tl.float64, bitcast=True), wqs)
                j = tl.where(done, j + 1, j)
                need = done & (j + 1 < n_runs)
                n_s = tl.where(done, tl.load(rowtab + NT + j + 1, mask=need, other=0), n_s)
                n_e = tl.where(done, tl.load(rowtab + 2 * NT + j + 1, mask=need, other=0), n_e)
                n_q = tl.where(done, tl.load(rowtab + 3 * NT + j + 1, mask=need, other=0), n_q)
                p = pos[:, None] + lane[None, :]
                m = p < end[:, None]
                n_doc = tl.load(post_doc_ptr + p, mask=m, other=-1)
                n_w = tl.load(post_w_ptr + p, mask=m, other=0.0)
                # this step's chunks
                v = (w.to(tl.float64) * wqs[:, None]).to(tl.int64)
                cell = slot + gi[:, None] * SPAN + (doc.to(tl.int64) - doc0)
                ok = doc >= 0
                old = tl.load(cell, mask=ok, other=0)
                tl.store(cell, old + v, mask=ok)
                tl.debug_barrier()                               # the next step may hit these cells
                doc, w, wqs = n_doc, n_w, n_wqs
        tl.debug_barrier()                                       # all adds land before the read-out

        # ---- read out (and zero) each query's tile as [RB, 32] rows of docs; emit candidates
        for gg in tl.static_range(G):
            rq = q0 + gg
            if rq < B:                                           # rows past B never accumulated
                inv = tl.load(inv_ptr + rq)
                row_out = out_ptr + out0 + gg * out_stride_g
                if not ROWMAX:
                    theta = tl.load(theta_ptr + rq)
                base = 0
                for c0 in tl.static_range(0, SPAN, RB * _ROW):
                    off = c0 + rows[:, None] * _ROW + tl.arange(0, _ROW)[None, :]
                    a_ptr = slot + gg * SPAN + off
                    acc = tl.load(a_ptr, cache_modifier=".cg")  # L2: the atomics bypass L1
                    tl.store(a_ptr, tl.zeros([RB, _ROW], dtype=tl.int64))
                    s = from_fixed(acc, inv)
                    keys = pack_key(s, doc0 + off)              # untouched cells: 0 -> key -1
                    if ROWMAX:
                        tl.store(row_out + c0 // _ROW + rows, row_max_keys(keys))
                    else:
                        base = emit_tile(keys, (keys >= 0) & (s >= theta), row_out, base, CAP)
                if not ROWMAX:
                    tl.store(count_ptr + (out0 + gg * out_stride_g) // CAP, base)
        tl.debug_barrier()                                       # zeros and table reads finish first


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
                            theta: torch.Tensor | None = None, cap: int = 32, group: int = 1, rows: int = 16,
                            chunk: int = 32, readout: int = 1024, atomic: bool = True,
                            max_terms: int | None = None, n_programs: int | None = None, num_warps: int = 4
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
        group: queries per item; chunk: postings per chunk; atomic: True -> a step is a [rows, chunk]
            tile of the item's chunks, accumulated with atomics; False -> a [group, chunk] tile, one
            chunk per query, plain load/add/store (see the module docstring); readout: cells per
            read-out tile; max_terms: longest query (default: measured, one host sync).
    Returns:
        (keys int64 [out_size], counts int32 [out_size // cap] or None); unwritten slots hold -1.
    """
    dev = post_doc.device
    item_q, item_span, item_out, out_stride_g = items
    if post_doc.dtype != torch.int32 or post_w.dtype != torch.float32 or post_doc.shape != post_w.shape:
        raise ValueError("post_doc must be int32 and post_w float32 of one shape [P]")
    if span_off.dtype != torch.int64 or span_off.dim() != 2 or span_off.stride(1) != 1:
        raise ValueError("span_off must be int64 [V, n_spans + 1] with contiguous rows")
    if any(x < 1 or x & (x - 1) for x in (span, chunk, group, rows)) or span < ROW:
        raise ValueError("span, chunk, group and rows must be powers of two (span >= 32)")
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
    if n_items == 0 or B == 0:
        return out, counts
    if max_terms is None:
        max_terms = int(q_indptr.diff().max())
    maxq = max(64, triton.next_power_of_2(max_terms))  # few buckets: one compile serves most queries
    n_prog = min(n_items, n_programs or default_programs(dev))
    scratch = torch.zeros(n_prog * group * span, dtype=torch.int64, device=dev)
    table = torch.empty(n_prog * 5 * group * maxq, dtype=torch.int64, device=dev)
    rb = min(span, max(ROW, readout)) // ROW   # rows of 32 docs per read-out tile: bounds registers
    search = group * maxq if atomic else maxq  # chunk numbering: over the item, or per query
    _block_kernel[(n_prog,)](post_doc, post_w, span_off, span_off.stride(0),
                             q_indptr, q_terms, q_weights, scale, inv_scale,
                             scale if rowmax else theta,
                             item_q, item_span, item_out, n_items, out_stride_g,
                             scratch, table, out, out if rowmax else counts, B,
                             G=group, MAXQ=maxq, R=rows, CHUNK=chunk, SPAN=span, RB=rb, CAP=width,
                             ROWMAX=rowmax, ATOMIC=atomic, SEARCH=search, LOG_SEARCH=search.bit_length() - 1,
                             STEP=rows if atomic else 1, num_warps=num_warps, num_stages=1)
    return out, counts


def torch_block_candidates(post_doc: torch.Tensor, post_w: torch.Tensor, span_off: torch.Tensor,
                           q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                           scale: torch.Tensor, inv_scale: torch.Tensor, span: int,
                           items: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], out_size: int, *,
                           theta: torch.Tensor | None = None, cap: int = 32, group: int = 1,
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
