"""Bidirectional attention inside each text of a packed batch, tiled over the packed rows (inference).

Why: in the padding-free body a batch's texts lie back to back ([T, H, Dh] rows, text b at rows
cu[b]:cu[b+1]). Flash attention's variable-length kernel gives every (text, head) pair its own program
with a 128-row query tile: on MS MARCO passages (~75 tokens) half of each tile is empty and each program
does one short load-compute-store, far below the GPU's tensor-core rate, and a noticeable share of BERT-base's
encoding time (measurements in the performance docs). Here a program takes BLOCK_M consecutive packed rows
of one head, whatever texts they belong to, and streams the keys from the first of those texts' start
to the last one's end; a key counts for a query when both lie in the same text (``segments``).

Numerics as flash attention's: scores and the online softmax in fp32 (exp2 with log2(e) folded into
the scale), the probabilities rounded to the value dtype for the P·V product, fp32 accumulation, one
rounding of the output. Results equal ``torch_varlen_attention``'s up to summation order.

Two tilings, chosen per batch from its longest text by ``packed_attention`` (where each was faster on an H200
over MS MARCO-like length-sorted batches; measurements in the performance docs): texts that fit a 64-row tile
share one (``grouped``, 64 // max_len whole texts per tile), as do texts longer than 1.5 tiles (each cut
into 64-row slices against its own keys, like flash attention but with 64 rows); texts in between take
the row tiling above, whose key span is then shorter than two slices' work.

Public API: ``packed_attention`` (backend choice), ``triton_packed_attention`` (launcher),
``torch_varlen_attention`` (twin: the texts padded into [B, H, L, Dh], sdpa with a key mask).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from lsr.utils.kernels import INTERPRET, tl, triton
from lsr.utils.ragged import ragged_positions

__all__ = ["packed_attention", "packed_attention_runs", "text_of_rows", "torch_varlen_attention", "triton_packed_attention"]

BLOCK_M = 64


def text_of_rows(cu: torch.Tensor, n_rows: int) -> torch.Tensor:
    """cu int [B+1] start offsets -> the text of each of ``n_rows`` rows, int32 [n_rows]. No host sync, and no
    device assertion where cu does not add up to n_rows (CUDA-graph warm-ups run on zeroed buffers): a row
    past cu[-1] counts as the last text's."""
    rows = torch.arange(n_rows, device=cu.device, dtype=cu.dtype)
    return torch.searchsorted(cu[1:], rows, right=True).clamp_(max=max(cu.numel() - 2, 0)).to(torch.int32)


def torch_varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                           max_len: int) -> torch.Tensor:
    """Torch twin: bidirectional softmax attention inside each packed sequence.

    q, k, v [T, H, Dh] (row j belongs to the sequence whose ``cu_seqlens`` range holds j), cu_seqlens
    int32/int64 [B+1] (0 = cu[0] <= ... <= cu[B] = T), max_len >= the longest sequence -> [T, H, Dh]
    in q's dtype. Pads into [B, H, max_len, Dh] and calls sdpa with a boolean key mask.
    """
    T, H, Dh = q.shape
    B = cu_seqlens.numel() - 1
    if T == 0 or B == 0:
        return q.new_empty(T, H, Dh)
    cu = cu_seqlens.to(q.device, torch.int64)
    seg, pos = ragged_positions(torch.zeros_like(cu[1:]), cu[1:] - cu[:-1], T)

    def pad(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(B, max_len, H, Dh)
        out[seg, pos] = x
        return out.transpose(1, 2)  # [B, H, L, Dh]

    keep = torch.arange(max_len, device=q.device)[None, :] < (cu[1:] - cu[:-1])[:, None]  # [B, L] real keys
    out = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), attn_mask=keep[:, None, None, :])
    return out.transpose(1, 2)[seg, pos]


if triton is not None:

    # the batch's sizes change with every batch: one compiled variant for all of them (Triton would otherwise
    # compile one per size that is 1 or a multiple of 16, seconds in the first batches of a run)
    @triton.jit(do_not_specialize=["T", "B", "per_tile", "tiles_per_group"])
    def _packed_attention_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, seg_ptr, cu_ptr, T, B, per_tile, tiles_per_group, qk_scale,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        DH: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPED: tl.constexpr,
    ):
        head = tl.program_id(1)
        if GROUPED:  # texts [g * per_tile, ...) whole, or a BLOCK_M slice of one text (per_tile = 1)
            g = tl.program_id(0) // tiles_per_group
            first = g * per_tile
            k_start = tl.load(cu_ptr + first)
            k_end = tl.load(cu_ptr + tl.minimum(first + per_tile, B))
            m0 = k_start + (tl.program_id(0) % tiles_per_group) * BLOCK_M
            if m0 >= k_end:
                return
            row_end = k_end
        else:  # BLOCK_M consecutive packed rows, whatever texts they belong to
            m0 = tl.program_id(0) * BLOCK_M
            row_end = T
            # the keys: from the start of the first row's text to the end of the last row's text
            k_start = tl.load(cu_ptr + tl.load(seg_ptr + m0))
            k_end = tl.load(cu_ptr + tl.load(seg_ptr + tl.minimum(m0 + BLOCK_M, T) - 1) + 1)
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        dims = tl.arange(0, DH)
        # each row's own text: keys [lo, hi)
        seg_q = tl.load(seg_ptr + rows, mask=row_ok, other=0)
        lo = tl.where(row_ok, tl.load(cu_ptr + seg_q), 0)
        hi = tl.where(row_ok, tl.load(cu_ptr + seg_q + 1), 0)
        rows64 = rows.to(tl.int64)
        q = tl.load(q_ptr + rows64[:, None] * stride_qt + head * stride_qh + dims[None, :], mask=row_ok[:, None], other=0.0)
        # a finite start: a chunk with no key of a row's text gives p = exp2(-inf) = 0, never NaN
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, DH], tl.float32)
        for n0 in range(k_start, k_end, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            col_ok = cols < k_end
            cols64 = cols.to(tl.int64)
            k = tl.load(k_ptr + cols64[:, None] * stride_kt + head * stride_kh + dims[None, :], mask=col_ok[:, None],
                        other=0.0)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where((cols[None, :] >= lo[:, None]) & (cols[None, :] < hi[:, None]), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v = tl.load(v_ptr + cols64[:, None] * stride_vt + head * stride_vh + dims[None, :], mask=col_ok[:, None],
                        other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # a row without keys (past the tile, zeroed cu): 0
        tl.store(o_ptr + rows64[:, None] * stride_ot + head * stride_oh + dims[None, :], out.to(o_ptr.dtype.element_ty),
                 mask=row_ok[:, None])


def triton_packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: torch.Tensor,
                            cu_seqlens: torch.Tensor, max_len: int, block_m: int = 64, block_n: int = 64, num_warps: int = 4,
                            num_stages: int = 1, grouped: bool = False) -> torch.Tensor:
    """Launcher. q, k, v [T, H, Dh] of one float dtype (rows and heads may be strided, Dh contiguous, Dh a
    power of two >= 16), segments int32 [T] (the text of each row, non-decreasing), cu_seqlens int32 [B+1]
    (text b is rows cu[b]:cu[b+1]) -> [T, H, Dh] in q's dtype, contiguous."""
    if triton is None:
        raise RuntimeError("the Triton backend needs the `triton` package")
    T, H, Dh = q.shape
    if k.shape != q.shape or v.shape != q.shape or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError("q, k and v must share shape and dtype")
    if Dh < 16 or Dh & (Dh - 1):
        raise ValueError(f"head dim must be a power of two >= 16, got {Dh}")
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    # the interpreter truncates fp32 -> 16-bit stores (the GPU rounds to nearest): store fp32, cast here
    out = torch.empty(T, H, Dh, dtype=torch.float32 if INTERPRET else q.dtype, device=q.device)
    if T:
        B = cu_seqlens.numel() - 1
        per_tile = max(1, block_m // max(max_len, 1))
        tiles_per_group = triton.cdiv(max_len, block_m) if per_tile == 1 else 1
        grid = (triton.cdiv(B, per_tile) * tiles_per_group if grouped else triton.cdiv(T, block_m), H)
        _packed_attention_kernel[grid](
            q, k, v, out, segments, cu_seqlens, T, B, per_tile, tiles_per_group, math.log2(math.e) / math.sqrt(Dh),
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
            DH=Dh, BLOCK_M=block_m, BLOCK_N=block_n, GROUPED=grouped,
            **({} if INTERPRET else {"num_warps": num_warps, "num_stages": num_stages}))
    return out.to(q.dtype)


def packed_attention_runs(q: torch.Tensor) -> bool:
    """Whether the Triton kernel serves q: CUDA sm80+ (bf16 tensor cores, as flash attention needs), fp16 /
    bf16, head dim a power of two in [16, 256]."""
    Dh = q.shape[-1]
    if triton is None or INTERPRET or Dh < 16 or Dh > 256 or Dh & (Dh - 1):
        return False
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and torch.cuda.get_device_capability(q.device)[0] >= 8


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, segments: torch.Tensor,
                     cu_seqlens: torch.Tensor, max_len: int) -> torch.Tensor:
    """Attention inside each packed text with the tiling that suits the batch's longest text (module doc):
    same contract as ``triton_packed_attention``; max_len >= the longest text."""
    grouped = max_len <= BLOCK_M or 2 * max_len > 3 * BLOCK_M
    # software pipelining paid in the grouped tiling only (measured on an H200; see the performance docs)
    return triton_packed_attention(q, k, v, segments, cu_seqlens, max_len, BLOCK_M, 64, 4, 2 if grouped else 1, grouped)
