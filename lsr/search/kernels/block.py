"""Block-accumulating scorer: per (query, doc span) scores accumulated in a private scratch tile,
then only the top candidates go to HBM.

Why: term-parallel scatter (lsr.search.kernels.scatter) does one random read-modify-write in a [B, N] HBM
buffer per touched posting (~2.2 N per SPLADE query). Here a program owns the scores of G queries on
a span of SPAN docs ([span * SPAN, (span + 1) * SPAN); the block-aligned index makes every term's
postings for it one contiguous run) in a private int64 scratch tile of G * SPAN cells, which stays in
L2, so HBM traffic is the postings, read about once per span and shared through L2 by all queries
working on that span at the same time (work items are ordered span-major).

Work item = (queries q0..q0+G-1, span). The item's runs (one per (query, term)) are cut into
CHUNK-wide chunks numbered consecutively; a step takes R consecutive chunks (an [R, CHUNK] tile, so
short runs of rare terms and long runs of frequent ones mix freely), each finding its run by a binary
search over the cumulative chunk counts, kept with the run bounds in a small per-program table. The
next step's chunks are located and loaded before the current one is accumulated (a hand-made
two-stage pipeline). Accumulation is exact and deterministic: int64 fixed point (lsr.search.kernels.fixed)
with atomics -- chunks of different terms may hit one cell in a step, and integer adds commute.

The L2 atomic units cap this at about the rate of the seed's HBM atomics (docs/performance/search.md), so at 8.8M docs it matches the seed's throughput (exact, deterministic, with
1/13 of its memory). A conflict-free variant without atomics (one query per tile row, plain
load/add/store and a CTA barrier per step) was slower in every configuration tried: Triton cannot
keep the scratch in shared memory, and each step waits for an L2 round trip.

Then the tile is read back as [RB, 32] rows of docs (and zeroed for the next item) and turned into
candidates (lsr.search.kernels.topk): ``ROWMAX`` writes the best key of every 32 docs (the sample pass that
bounds the k-th score), otherwise every doc with score >= theta[q] goes to CAP slots (+ a count,
which flags overflow). The grid is persistent: program p owns scratch slot p and items p, p + P, ...
"""

from __future__ import annotations

import functools

import torch

from lsr.index.compact import WEIGHT_DTYPES, is_compact, local_ids
from lsr.search.kernels import terms_bucket
from lsr.search.kernels.coarse import COARSE_SHIFT, coarse_outputs, coarse_unusual
from lsr.search.kernels.fixed import check_query_csr, check_scales, from_fixed, torch_from_fixed, torch_to_fixed
from lsr.search.kernels.topk import (
    ROW,
    emit_tile,
    pack_key,
    pack_keys,
    row_max_keys,
    torch_emit,
    torch_row_max,
)
from lsr.utils.kernels import check_tensor, tl, triton
from lsr.utils.ragged import ragged_positions, segment_ids

__all__ = ["check_block_args", "default_programs", "span_items", "torch_block_candidates", "triton_block_candidates"]

if triton is not None:

    _ROW = tl.constexpr(ROW)
    @triton.jit
    def _locate(c, total, tab_ptr, NT: tl.constexpr, LOG_NT: tl.constexpr, CHUNK: tl.constexpr):
        """Runs of chunk numbers c [R]: (start position, end position, scaled weight, query row, valid).

        tab_ptr: the item's table, 5 fields of NT entries: 0 inclusive cumulative chunk count
        (ascending), 1 run start, 2 run end, 3 float64 bits of w_query * scale, 4 query row g.
        """
        valid = c < total
        lo = tl.zeros_like(c)
        hi = tl.zeros_like(c) + NT
        for _ in tl.static_range(LOG_NT + 1):    # first j with cum[j] > c
            mid = (lo + hi) // 2
            go = tl.load(tab_ptr + mid, mask=valid & (lo < hi), other=0) <= c
            lo = tl.where((lo < hi) & go, mid + 1, lo)
            hi = tl.where((lo < hi) & ~go, mid, hi)
        j = tl.minimum(lo, NT - 1)
        cum = tl.load(tab_ptr + j, mask=valid, other=0)
        start = tl.load(tab_ptr + NT + j, mask=valid, other=0)
        end = tl.load(tab_ptr + 2 * NT + j, mask=valid, other=0)
        wqs = tl.load(tab_ptr + 3 * NT + j, mask=valid, other=0).to(tl.float64, bitcast=True)
        g = tl.load(tab_ptr + 4 * NT + j, mask=valid, other=0)
        n = (end - start + CHUNK - 1) // CHUNK
        pos = start + (c - (cum - n)) * CHUNK
        return pos, end, wqs, g, valid


    @triton.jit
    def _posting_cells(doc, w, doc0, SPAN: tl.constexpr, COMPACT: tl.constexpr):
        """(cell offset in the span, real posting) of loaded postings: global doc ids with -1 padding, or
        compact block-local ids with weight-0 padding (the span divides the block: the id's low bits)."""
        if COMPACT:
            return doc.to(tl.int64) & (SPAN - 1), w != 0
        else:
            return doc.to(tl.int64) - doc0, doc >= 0


    @triton.jit
    def _block_kernel(post_doc_ptr, post_w_ptr, span_off_ptr, stride_so_t,
                      q_indptr_ptr, q_terms_ptr, q_w_ptr, scale_ptr, inv_ptr, theta_ptr,
                      item_q_ptr, item_span_ptr, item_out_ptr, n_items, out_stride_g,
                      scratch_ptr, table_ptr, out_ptr, count_ptr, B,
                      G: tl.constexpr, MAXQ: tl.constexpr, R: tl.constexpr, CHUNK: tl.constexpr,
                      SPAN: tl.constexpr, RB: tl.constexpr, CAP: tl.constexpr, ROWMAX: tl.constexpr,
                      LOG_NT: tl.constexpr, COMPACT: tl.constexpr):
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

            # ---- the item's runs, one per (query g, term i), numbered into one chunk sequence
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
            tl.debug_barrier()                                       # the table is read by every thread

            # ---- accumulate R chunks per step; the next step's chunks are loaded one step ahead
            c = tl.arange(0, R).to(tl.int64)
            total = tl.sum(row_total, axis=0)
            pos, end, wqs, gr, valid = _locate(c, total, tab, NT, LOG_NT, CHUNK)
            p = pos[:, None] + lane[None, :]
            m = valid[:, None] & (p < end[:, None])
            doc = tl.load(post_doc_ptr + p, mask=m, other=-1)
            w = tl.load(post_w_ptr + p, mask=m, other=0.0)
            for _ in range(tl.cdiv(total, R)):
                c += R
                pos, end, n_wqs, n_gr, valid = _locate(c, total, tab, NT, LOG_NT, CHUNK)
                p = pos[:, None] + lane[None, :]
                m = valid[:, None] & (p < end[:, None])
                n_doc = tl.load(post_doc_ptr + p, mask=m, other=-1)
                n_w = tl.load(post_w_ptr + p, mask=m, other=0.0)
                v = (w.to(tl.float32).to(tl.float64) * wqs[:, None]).to(tl.int64)   # = trunc(w_q * w_d * 2^e), exact
                off, real = _posting_cells(doc, w, doc0, SPAN, COMPACT)
                tl.atomic_add(slot + gr[:, None] * SPAN + off, v, mask=real, sem="relaxed")  # padding / masked
                doc, w, wqs, gr = n_doc, n_w, n_wqs, n_gr
            tl.debug_barrier()                                       # all adds land before the read-out

            # ---- read out (and zero) each query's tile as [RB, 32] rows of docs; emit candidates
            for gg in range(G):
                rq = q0 + gg
                if rq < B:                                           # rows past B never accumulated
                    inv = tl.load(inv_ptr + rq)
                    row_out = out_ptr + out0 + gg * out_stride_g
                    if not ROWMAX:
                        theta = tl.load(theta_ptr + rq)
                    base = tl.zeros((), dtype=tl.int32)   # carried by the loop below: a tensor from the start
                    for c0 in range(0, SPAN, RB * _ROW):
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


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_programs(device: torch.device, per_sm: int = 8) -> int:
    """Persistent grid size: a few resident programs per SM (2 under the interpreter)."""
    return _sm_count(device) * per_sm if device.type == "cuda" else 2


def check_block_args(post_doc: torch.Tensor, post_w: torch.Tensor, span_off: torch.Tensor,
                     q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor, scale: torch.Tensor,
                     inv_scale: torch.Tensor, items: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int],
                     theta: torch.Tensor | None) -> int:
    """Dtype / shape / device checks shared by the block scorers (Triton and CUDA); returns B."""
    dev = post_doc.device
    item_q, item_span, item_out, _ = items
    check_tensor("post_doc", post_doc, dtype=(torch.int32, torch.int16), ndim=1)
    w_dtypes = tuple(WEIGHT_DTYPES.values()) if is_compact(post_doc) else torch.float32   # compact: 16-bit
    check_tensor("post_w", post_w, dtype=w_dtypes, shape=tuple(post_doc.shape), device=dev)
    check_tensor("span_off", span_off, dtype=torch.int64, ndim=2, device=dev, rows_contiguous=True)
    B = check_query_csr(q_indptr, q_terms, q_weights, dev)
    check_scales(scale, inv_scale, B, dev)
    for name, t, dt in (("item_q", item_q, torch.int32), ("item_span", item_span, torch.int32),
                        ("item_out", item_out, torch.int64)):
        check_tensor(name, t, dtype=dt, ndim=1, device=dev, contiguous=True)
    if theta is not None:
        check_tensor("theta", theta, dtype=torch.float32, shape=(B,), device=dev)
    return B


def triton_block_candidates(post_doc: torch.Tensor, post_w: torch.Tensor, span_off: torch.Tensor,
                            q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                            scale: torch.Tensor, inv_scale: torch.Tensor, span: int,
                            items: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], out_size: int, *,
                            theta: torch.Tensor | None = None, cap: int = 32, group: int = 1, rows: int = 8,
                            chunk: int = 32, readout: int = 1024, max_terms: int | None = None,
                            n_programs: int | None = None, num_warps: int = 4
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the block scorer over work items and emit candidate keys.

    Args:
        post_doc / post_w: int32 / float32 [P] postings (-1 / 0 padding), term-major, span-ordered; or
            the compact layout (``lsr.index.compact``): int16 block-local ids / bf16 or fp16 weights
            (0 padding), where ``span`` must divide the index block.
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
        group: queries per item; rows x chunk: the [rows, chunk] posting tile of a step; readout:
            cells per read-out tile; max_terms: longest query (default: measured, one host sync);
            n_programs: persistent grid size (default ``default_programs``).
    Returns:
        (keys int64 [out_size], counts int32 [out_size // cap] or None); unwritten slots hold -1.
    """
    dev = post_doc.device
    item_q, item_span, item_out, out_stride_g = items
    if any(x < 1 or x & (x - 1) for x in (span, chunk, group, rows)) or span < ROW:
        raise ValueError("span, chunk, group and rows must be powers of two (span >= 32)")
    B = check_block_args(post_doc, post_w, span_off, q_indptr, q_terms, q_weights, scale, inv_scale, items, theta)
    rowmax = theta is None
    width = span // ROW if rowmax else cap
    if out_stride_g % width:
        raise ValueError("out_stride_g must be a multiple of the row width")
    out = torch.full((out_size,), -1, dtype=torch.int64, device=dev)
    counts = None if rowmax else torch.zeros(out_size // cap, dtype=torch.int32, device=dev)
    n_items = item_q.numel()
    if n_items == 0 or B == 0:
        return out, counts
    if max_terms is None:
        max_terms = int(q_indptr.diff().max())
    maxq = terms_bucket(max_terms)
    n_prog = min(n_items, n_programs or default_programs(dev))
    scratch = torch.zeros(n_prog * group * span, dtype=torch.int64, device=dev)
    table = torch.empty(n_prog * 5 * group * maxq, dtype=torch.int64, device=dev)
    # rows of 32 docs per read-out tile (bounds registers). On a GPU one row: tiles of several rows lost or misplaced
    # keys there (not under the interpreter) once a program read out more than one tile, or with 8 warps
    # (docs/performance/search.md); the read-out loop is a dynamic one, so one-row tiles cost no unrolling
    rb = 1 if dev.type == "cuda" else min(span, max(ROW, readout)) // ROW
    _block_kernel[(n_prog,)](post_doc, post_w, span_off, span_off.stride(0),
                             q_indptr, q_terms, q_weights, scale, inv_scale,
                             scale if rowmax else theta,
                             item_q, item_span, item_out, n_items, out_stride_g,
                             scratch, table, out, out if rowmax else counts, B,
                             G=group, MAXQ=maxq, R=rows, CHUNK=chunk, SPAN=span, RB=rb, CAP=width,
                             ROWMAX=rowmax, LOG_NT=(group * maxq).bit_length() - 1,
                             COMPACT=is_compact(post_doc), num_warps=num_warps,
                             num_stages=1)
    return out, counts


def _query_postings(post_doc: torch.Tensor, post_w: torch.Tensor, span_off: torch.Tensor, q_terms: torch.Tensor,
                    span: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Real postings of every query term (query-term entry, global doc int64, float32 weight) for the twin.

    Compact postings hold block-local ids: a run of span j (the span divides the block) holds docs
    ``j * span + (local & (span - 1))``."""
    t = q_terms.long()
    if not is_compact(post_doc):
        entry, pos = ragged_positions(span_off[t, 0], span_off[t, -1] - span_off[t, 0])
        doc = post_doc[pos].long()
        keep = doc >= 0
        return entry[keep], doc[keep], post_w[pos][keep]
    n_spans = span_off.shape[1] - 1
    run, pos = ragged_positions(span_off[t, :-1].flatten(), span_off[t].diff(dim=1).flatten())
    w = post_w[pos].to(torch.float32)
    doc = (run % n_spans) * span + (local_ids(post_doc[pos]).long() & (span - 1))
    keep = w > 0
    return (run // n_spans)[keep], doc[keep], w[keep]


def torch_block_candidates(post_doc: torch.Tensor, post_w: torch.Tensor, span_off: torch.Tensor,
                           q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                           scale: torch.Tensor, inv_scale: torch.Tensor, span: int,
                           items: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], out_size: int, *,
                           theta: torch.Tensor | None = None, cap: int = 32, group: int = 1,
                           coarse_lo: torch.Tensor | None = None, coarse_rows: bool = False,
                           **_: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Torch twin of ``triton_block_candidates`` (same arguments and bit-identical results; the
    kernel-only tuning arguments are accepted and ignored) and of the CUDA kernel's coarse modes (group 1):
    with ``coarse_lo`` (int64 [B] >= 1) the keys ``sum << COARSE_KEY_SHIFT | (2**31 - 1 - doc)`` of the docs whose
    coarse sum (``COARSE_SHIFT``) reaches coarse_lo[q], emitted like theta's; with ``coarse_rows`` (and
    neither theta nor coarse_lo) every 32-doc row's best such key."""
    dev = post_doc.device
    item_q, item_span, item_out, out_stride_g = items
    B = q_indptr.numel() - 1
    n_spans = span_off.shape[1] - 1
    # dense fixed-point scores of every (query, doc) from the span table
    entry, doc, w = _query_postings(post_doc, post_w, span_off, q_terms, span)
    row = segment_ids(q_indptr.diff())[entry]
    acc = torch.zeros((B + group) * n_spans * span, dtype=torch.int64, device=dev)
    contrib = torch_to_fixed(q_weights[entry], w, scale[row])
    coarse = coarse_lo is not None or (coarse_rows and theta is None)
    if coarse and group != 1:
        raise ValueError("the coarse modes take one query per work item (group=1)")
    acc.index_add_(0, row * (n_spans * span) + doc, contrib >> COARSE_SHIFT if coarse else contrib)
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
    if coarse:   # group 1: one row per item
        sums = acc.view(B + group, -1)[item_q.long().unsqueeze(1), cols]
        unusual = coarse_unusual(q_indptr, q_weights, scale)[item_q.long()]
        rows, counts = coarse_outputs(sums, cols, unusual, coarse_lo, item_q, starts, cap, out_size)
    elif theta is None:
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
