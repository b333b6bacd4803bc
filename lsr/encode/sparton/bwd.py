"""Sparton head backward, from the saved (y32, argmax) only — no [B, S, V] and no recomputed GEMM.

    g[b, v]  = dY · exp(−Y) · [Y > 0]                 (d log1p(x)/dx = 1/(1+x) = exp(−Y); relu gate)
    dE[v]    = Σ_b g[b, v] · H[b, argmax[b, v]]       (a gathered reduction over b, fixed order)
    db[v]    = Σ_b g[b, v]
    dH[b, s] = Σ_{v : argmax[b, v] = s} g[b, v] · E[v]

dH is a sparse-times-dense product with B·V nonzeros (one per (b, v)): the nonzeros are bucketed by
row group (_DH_ROWS consecutive rows r = b·S + s; a counting sort: histogram + cumsum + scatter, each entry
tagged with its row inside the group), then one program per row group gathers E[v] for the group's entries (a
contiguous run) and writes each dH row exactly once (bf16 directly, no fp32 [B, S, D] buffer, no float
atomics). Entries with g = 0 (Y = 0: most of a real SPLADE vector) are dropped before the sort, so their E rows
are never read.

E can be far larger than L2 (250k x 768 bf16 is 384 MB, L2 holds ~50 MB). A bucket holds its entries
roughly in vocabulary order (the scatter's programs run in v order, and so does the deterministic sort), so
the dH programs running side by side sweep the vocabulary together and gather E rows from a sliding window
that stays in L2: one launch, no vocabulary chunks and no fp32 partial of dH (docs/performance/head.md).

Modes: the default fills the buckets with integer atomics (fast; the order inside a bucket, hence
the fp32 summation order of dH, varies run to run); ``deterministic=True`` orders each bucket by (b, v)
with a stable torch.sort instead, so every gradient is bit-identical run to run.
"""

from __future__ import annotations

import torch

from lsr.utils.kernels import INTERPRET, tl, triton

if triton is not None:

    @triton.jit
    def _bwd_prep_kernel(dy_ptr, y32_ptr, arg_ptr, g_ptr, count_ptr, live_ptr, S, V, stride_dy_b,
                         COUNT: tl.constexpr, LIVE: tl.constexpr, ROWS: tl.constexpr, TILE: tl.constexpr,
                         BLOCK: tl.constexpr):
        """g = dY·exp(−Y)·[Y>0]; if LIVE: live[v // TILE] = 1 where some g != 0 (the dE kernel's vocabulary tiles, zeroed
        before); if COUNT: count[(b·S + argmax) // ROWS] += 1 for every g != 0."""
        b = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < V
        row = b.to(tl.int64) * V
        y = tl.load(y32_ptr + row + offs, mask=ok, other=0.0)
        dy = tl.load(dy_ptr + b.to(tl.int64) * stride_dy_b + offs, mask=ok, other=0.0).to(tl.float32)
        g = tl.where(y > 0.0, dy * tl.exp(-y), 0.0)
        tl.store(g_ptr + row + offs, g, mask=ok)
        if LIVE:
            tile_live = tl.max(tl.reshape((g != 0.0).to(tl.int32), [BLOCK // TILE, TILE]), axis=1)
            tiles = tl.program_id(1) * (BLOCK // TILE) + tl.arange(0, BLOCK // TILE)
            tl.atomic_max(live_ptr + tiles, tile_live, mask=tile_live != 0)  # masked g is 0: no tile past V is set
        if COUNT:
            a = tl.load(arg_ptr + row + offs, mask=ok, other=0)
            tl.atomic_add(count_ptr + (b * S + a) // ROWS, 1, mask=ok & (g != 0.0))


    @triton.jit
    def _bwd_bucket_kernel(g_ptr, arg_ptr, cursor_ptr, vs_ptr, gs_ptr, S, V, ROWS: tl.constexpr, TAG: tl.constexpr,
                           BLOCK: tl.constexpr):
        """Fast mode: i = cursor[group]++; (tagged v, g)[i] = (v | row-in-group << TAG, g) for g != 0, group and
        row-in-group of r = b·S + argmax (the order inside a bucket varies, roughly ascending in v)."""
        b = tl.program_id(0)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < V
        row = b.to(tl.int64) * V
        g = tl.load(g_ptr + row + offs, mask=ok, other=0.0)
        a = tl.load(arg_ptr + row + offs, mask=ok, other=0)
        live = ok & (g != 0.0)
        r = b * S + a
        pos = tl.atomic_add(cursor_ptr + r // ROWS, 1, mask=live)
        tl.store(vs_ptr + pos, offs | ((r % ROWS) << TAG), mask=live)
        tl.store(gs_ptr + pos, g, mask=live)


    @triton.jit
    def _bwd_dh_kernel(e_ptr, vs_ptr, gs_ptr, off_ptr, dh_ptr, D, N_ROWS, stride_e_v, INPUT_PRECISION: tl.constexpr,
                       SPLIT_BF16: tl.constexpr, DOT_FP32: tl.constexpr, NUM_STAGES: tl.constexpr,
                       ROWS: tl.constexpr, TAG: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
        """dH[r, d-tile] = Σ_{i in bucket of r} g_i · E[v_i, d-tile] for the ROWS rows r = q·ROWS + t of group q.

        The group's entries are one contiguous run, each v tagged with its row t (v | t << TAG); each chunk of BLOCK_N
        entries is gathered once and reduced into its rows with a one-hot [ROWS, BLOCK_N] x [BLOCK_N, BLOCK_D] dot (g folded
        into the one-hot), so short and long buckets both keep loads in flight. SPLIT_BF16 (bf16 E): the weights go
        in as bf16 hi + lo (g to ~16 bits; E exact) so the gathered tile feeds the MMA straight from the pipelined
        load; otherwise E is converted to fp32 (ieee / 3xTF32 dot).
        """
        q = tl.program_id(0)
        offs_r = q * ROWS + tl.arange(0, ROWS)
        first = tl.load(off_ptr + q)
        last = tl.load(off_ptr + q + 1)
        offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        offs_n = tl.arange(0, BLOCK_N)
        acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
        for n0 in tl.range(first, last, BLOCK_N, num_stages=NUM_STAGES):
            idx = n0 + offs_n
            n_ok = idx < last
            tagged = tl.load(vs_ptr + idx, mask=n_ok, other=0)
            gv = tl.load(gs_ptr + idx, mask=n_ok, other=0.0)  # 0 past the run: those columns add nothing
            v = tagged & ((1 << TAG) - 1)
            e = tl.load(e_ptr + v.to(tl.int64)[:, None] * stride_e_v + offs_d[None, :],
                        mask=n_ok[:, None] & d_ok[None, :], other=0.0)
            hit = (tagged >> TAG)[None, :] == tl.arange(0, ROWS)[:, None]
            w = tl.where(hit, gv[None, :], 0.0)
            if SPLIT_BF16:
                w_hi = w.to(tl.bfloat16)
                w_lo = (w - w_hi.to(tl.float32)).to(tl.bfloat16)
                if DOT_FP32:  # interpreter: its bf16 tl.dot is wrong (triton 3.9); fp32 of bf16 values is exact
                    w_hi, w_lo, e = w_hi.to(tl.float32), w_lo.to(tl.float32), e.to(tl.float32)
                acc = tl.dot(w_hi, e, acc)
                acc = tl.dot(w_lo, e, acc)
            else:
                acc = tl.dot(w, e.to(tl.float32), acc, input_precision=INPUT_PRECISION)
        out = offs_r.to(tl.int64)[:, None] * D + offs_d[None, :]
        tl.store(dh_ptr + out, acc.to(dh_ptr.dtype.element_ty), mask=(offs_r < N_ROWS)[:, None] & d_ok[None, :])


    @triton.jit
    def _bwd_de_kernel(h_ptr, g_ptr, arg_ptr, live_ptr, wide_ptr, de_ptr, db_ptr, B, V, D, stride_h_b, stride_h_s,
                       stride_de_v, HAS_DE: tl.constexpr, HAS_DB: tl.constexpr, WIDE: tl.constexpr,
                       BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
        """dE[v-tile, d-tile] = Σ_b g[b, v] · H[b, argmax[b, v], d-tile] (b ascending); db[v] = Σ_b g[b, v].

        Launched twice, with narrow and with wide vocabulary tiles; only the launch whose WIDE equals the flag at
        wide_ptr (set on the GPU from the gradient's density, no host sync) does anything.
        Two batch rows per iteration, both gathers issued before either is used (twice the loads in flight).
        A vocabulary tile without gradient in any row (live[tile] == 0: most of a trained head's vocabulary)
        skips the loop and stores zeros; the test is once per program, so dense gradients pay nothing.
        """
        if tl.load(wide_ptr) == WIDE:
            _de_tile(h_ptr, g_ptr, arg_ptr, live_ptr, de_ptr, db_ptr, B, V, D, stride_h_b, stride_h_s, stride_de_v,
                     HAS_DE, HAS_DB, BLOCK_V, BLOCK_D)


    @triton.jit
    def _de_tile(h_ptr, g_ptr, arg_ptr, live_ptr, de_ptr, db_ptr, B, V, D, stride_h_b, stride_h_s, stride_de_v,
                 HAS_DE: tl.constexpr, HAS_DB: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_D: tl.constexpr):
        offs_v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        v_ok = offs_v < V
        offs_d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        d_ok = offs_d < D
        acc = tl.zeros([BLOCK_V, BLOCK_D], tl.float32)
        g_sum = tl.zeros([BLOCK_V], tl.float32)
        h_b = h_ptr  # advanced by 2·stride_h_b per iteration (pointer arithmetic is 64-bit)
        if tl.load(live_ptr + tl.program_id(0)) != 0:
            for b in range(0, B, 2):
                ok1 = v_ok & (offs_v * 0 + b + 1 < B)  # (a tensor compare: the interpreter's b is a Python int)
                g0 = tl.load(g_ptr + b * V + offs_v, mask=v_ok, other=0.0)  # B·V < 2**31 (checked by the launcher)
                g1 = tl.load(g_ptr + (b + 1) * V + offs_v, mask=ok1, other=0.0)
                g_sum += g0 + g1
                if HAS_DE:
                    a0 = tl.load(arg_ptr + b * V + offs_v, mask=v_ok, other=0)
                    a1 = tl.load(arg_ptr + (b + 1) * V + offs_v, mask=ok1, other=0)
                    live0 = v_ok & (g0 != 0.0)  # g = 0: the H row is not needed
                    live1 = ok1 & (g1 != 0.0)
                    h0 = tl.load(h_b + a0.to(tl.int64)[:, None] * stride_h_s + offs_d[None, :],
                                 mask=live0[:, None] & d_ok[None, :], other=0.0)
                    h1 = tl.load(h_b + stride_h_b + a1.to(tl.int64)[:, None] * stride_h_s + offs_d[None, :],
                                 mask=live1[:, None] & d_ok[None, :], other=0.0)
                    acc += g0[:, None] * h0.to(tl.float32)
                    acc += g1[:, None] * h1.to(tl.float32)
                h_b += 2 * stride_h_b
        if HAS_DE:
            tl.store(de_ptr + offs_v.to(tl.int64)[:, None] * stride_de_v + offs_d[None, :],
                     acc.to(de_ptr.dtype.element_ty), mask=v_ok[:, None] & d_ok[None, :])
        if HAS_DB:
            if tl.program_id(1) == 0:
                tl.store(db_ptr + offs_v, g_sum, mask=v_ok)


_DH_ROWS = 16  # rows of dH a program of the dH kernel writes (a bucket of the sort is one such row group)
_TAG_SHIFT = 27  # an entry's v and its row in the group share one int32: v | row << _TAG_SHIFT
_ENTRY_BLOCK = 1024  # (b, v) entries a program of the prep and bucket kernels


def triton_sparton_bwd(dy: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, y32: torch.Tensor,
                       arg: torch.Tensor, *, need_dh: bool = True, need_dw: bool = True, need_db: bool = True,
                       deterministic: bool = False
                       ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Backward launcher.

    dy [B,V] (any float dtype/strides), hidden [B,S,D] and weight [V,D] (contiguous, one dtype),
    y32 [B,V] float32 and arg [B,V] int32 from ``triton_sparton_fwd``. Returns dH [B,S,D] (hidden's
    dtype), dE [V,D] (weight's dtype) and db [V] float32; None where not needed.
    """
    B, S, D = hidden.shape
    V = weight.shape[0]
    if not (hidden.is_contiguous() and weight.is_contiguous() and y32.is_contiguous() and arg.is_contiguous()):
        raise ValueError("hidden, weight, y32 and arg must be contiguous")
    if dy.shape != (B, V) or y32.shape != (B, V) or arg.shape != (B, V) or weight.shape[1] != D:
        raise ValueError("shape mismatch: dy/y32/arg must be [B,V], hidden [B,S,D], weight [V,D]")
    if y32.dtype != torch.float32 or arg.dtype != torch.int32:
        raise TypeError("y32 must be float32 and arg int32")
    if B * V >= 2**31 or B * S >= 2**31 or V >= 2**_TAG_SHIFT:
        raise ValueError(f"B·V and B·S must be < 2**31 and V < 2**{_TAG_SHIFT}")
    dev = hidden.device
    n_groups = triton.cdiv(B * S, _DH_ROWS)
    dy = dy.contiguous() if dy.stride(-1) != 1 else dy
    g = torch.empty(B, V, dtype=torch.float32, device=dev)
    # bucket sizes, shifted by one for the cumsum
    counts = torch.zeros(n_groups + 1 if need_dh else 1, dtype=torch.int32, device=dev)
    live_narrow = torch.zeros(triton.cdiv(V, _DE_TILES[0][0]) if need_dw or need_db else 1, dtype=torch.int32,
                              device=dev)  # set by the prep kernel only for dE / db
    if B and V:
        _bwd_prep_kernel[(B, triton.cdiv(V, _ENTRY_BLOCK))](dy, y32, arg, g, counts[1:], live_narrow, S, V,
                                                            dy.stride(0), COUNT=need_dh, LIVE=need_dw or need_db,
                                                            ROWS=_DH_ROWS, TILE=_DE_TILES[0][0], BLOCK=_ENTRY_BLOCK)
    dh = dw = db = None
    if need_dh:
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)  # bucket starts
        tagged_v, g_sorted = _bucket_entries(g, arg, offsets, S, deterministic)
        dh = _hidden_grads(hidden, weight, tagged_v, g_sorted, offsets)
    if need_dw or need_db:
        dw = torch.empty_like(weight, dtype=torch.float32 if INTERPRET else None) if need_dw else None
        db = torch.empty(V, dtype=torch.float32, device=dev) if need_db else None
        if V and D:
            _weight_grads(hidden, g, arg, live_narrow, dw, db, weight.stride(0))
    # the interpreter truncates fp32 -> bf16/fp16 stores (GPU rounds to nearest): it stores fp32, cast here
    return _cast(dh, hidden.dtype), _cast(dw, weight.dtype), db


def _bucket_entries(g: torch.Tensor, arg: torch.Tensor, offsets: torch.Tensor, S: int, deterministic: bool
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tagged v, g) of every entry with g != 0, bucketed by row group (b·S + argmax) // _DH_ROWS: int32 and float32
    [B·V], the buckets starting at ``offsets``; tagged v = v | (row in the group) << _TAG_SHIFT. Deterministic: each
    bucket in (b, v) order (a stable sort on the group); otherwise integer atomics fill them in an order that varies."""
    B, V = g.shape
    dev = g.device
    if deterministic:  # dropped entries sort last
        row = torch.arange(B, device=dev, dtype=torch.int32)[:, None] * S + arg
        n_keys = offsets.numel() - 1
        order = torch.sort(torch.where(g != 0, row // _DH_ROWS, n_keys).view(-1), stable=True).indices
        tag = (row.view(-1)[order] % _DH_ROWS) << _TAG_SHIFT
        del row
        return (order % V).to(torch.int32) | tag, g.view(-1)[order]
    tagged_v = torch.empty(B * V, dtype=torch.int32, device=dev)
    g_sorted = torch.empty(B * V, dtype=torch.float32, device=dev)
    if B and V:
        cursor = offsets[:-1].clone()
        _bwd_bucket_kernel[(B, triton.cdiv(V, _ENTRY_BLOCK))](g, arg, cursor, tagged_v, g_sorted, S, V,
                                                              ROWS=_DH_ROWS, TAG=_TAG_SHIFT, BLOCK=_ENTRY_BLOCK)
    return tagged_v, g_sorted


# (entries a step, columns) of the dH kernel. 64 entries a step pay off only for long buckets, i.e. up to
# _DH_ROWS·V/S ≥ _DH_LONG entries per row group (A/B in docs/performance/head.md)
_DH_TILE, _DH_TILE_LONG, _DH_LONG = (32, 128), (64, 128), 4096


def _hidden_grads(hidden: torch.Tensor, weight: torch.Tensor, tagged_v: torch.Tensor, g_sorted: torch.Tensor,
                  offsets: torch.Tensor) -> torch.Tensor:
    """dH [B, S, D] from the bucketed entries (fp32 under the interpreter, see _cast)."""
    B, S, D = hidden.shape
    dh = torch.empty_like(hidden, dtype=torch.float32 if INTERPRET else None)
    long_buckets = _DH_ROWS * weight.shape[0] >= _DH_LONG * max(S, 1)
    block_n, block_d = (16, 16) if INTERPRET else _DH_TILE_LONG if long_buckets else _DH_TILE
    if B * S and D:
        grid = (offsets.numel() - 1, triton.cdiv(D, block_d))
        prec = "ieee" if hidden.dtype == torch.float32 or INTERPRET else "tf32x3"
        _bwd_dh_kernel[grid](weight, tagged_v, g_sorted, offsets, dh, D, B * S, weight.stride(0),
                             INPUT_PRECISION=prec, SPLIT_BF16=weight.dtype == torch.bfloat16, DOT_FP32=INTERPRET,
                             NUM_STAGES=1 if INTERPRET else 2, ROWS=_DH_ROWS, TAG=_TAG_SHIFT, BLOCK_N=block_n,
                             BLOCK_D=block_d, num_warps=4)
    return dh


# (BLOCK_V, BLOCK_D, num_warps) of the dE kernel, narrow and wide vocabulary tiles. Wide tiles were the faster
# ones for dense gradients in a sweep on H100 and H200 (docs/performance/head.md); with a trained head's
# sparse gradient they have more live tiles (a tile is live if any of its entries is), so narrow ones stay for that.
_DE_TILES = ((16, 32, 4), (32, 16, 4)) if INTERPRET else ((32, 128, 4), (64, 64, 2))
_WIDE_LIVE_SHARE = 0.75  # wide tiles when at least this share of them is live


def _weight_grads(hidden: torch.Tensor, g: torch.Tensor, arg: torch.Tensor, live_narrow: torch.Tensor,
                  dw: torch.Tensor | None, db: torch.Tensor | None, stride_w_v: int) -> None:
    """dE into ``dw`` and db into ``db`` (either may be None) with the tile width the gradient's density picks,
    decided on the GPU: both widths are launched and the one not picked returns at once (no host sync).
    ``live_narrow``: the narrow tiles' live flags (set by the prep kernel; ``_live_tiles`` is their torch twin)."""
    B, S, D = hidden.shape
    V = g.shape[1]
    narrow_v, wide_v = _DE_TILES[0][0], _DE_TILES[1][0]
    live_wide = _pairs_live(live_narrow, wide_v // narrow_v)
    wide = _wide_flag(live_wide)
    for flag, (block_v, block_d, warps), live in ((0, _DE_TILES[0], live_narrow), (1, _DE_TILES[1], live_wide)):
        grid = (triton.cdiv(V, block_v), triton.cdiv(D, block_d) if dw is not None else 1)
        _bwd_de_kernel[grid](hidden, g, arg, live, wide, g if dw is None else dw, g if db is None else db,
                             B, V, D, hidden.stride(0), hidden.stride(1), stride_w_v, HAS_DE=dw is not None,
                             HAS_DB=db is not None, WIDE=flag, BLOCK_V=block_v, BLOCK_D=block_d, num_warps=warps)


def _wide_flag(live_wide: torch.Tensor) -> torch.Tensor:
    """int8 [1] on the flags' device: 1 (wide tiles) when at least _WIDE_LIVE_SHARE of the wide tiles are live."""
    return (live_wide.sum(dtype=torch.int32) >= _WIDE_LIVE_SHARE * live_wide.numel()).to(torch.int8).view(1)


def _pairs_live(live: torch.Tensor, factor: int) -> torch.Tensor:
    """int8 flags [cdiv(n, factor)]: 1 where any of ``factor`` consecutive flags of ``live`` [n] is (the live flags
    of tiles ``factor`` times as wide)."""
    pad = -live.numel() % factor
    return torch.nn.functional.pad(live.to(torch.int8), (0, pad)).view(-1, factor).amax(1)


def _live_tiles(g: torch.Tensor, block_v: int) -> torch.Tensor:
    """int8 [cdiv(V, block_v)]: 1 where some row of g [B, V] has a non-zero entry in that vocabulary tile (the torch
    twin of the prep kernel's flags)."""
    return _pairs_live((g != 0).any(0), block_v)


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    return t if t is None else t.to(dtype)
