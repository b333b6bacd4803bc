"""Packed ("varlen") Sparton head for inference: Y[b, v] = log1p(relu(max_s (H Eᵀ + bias)[b, s, v])).

Why: the padded forward (``fwd_padded.triton_sparton_fwd``) runs one program per (batch row, vocab tile)
and pays a whole BLOCK_S (128) token tile per text even when the text is short. MS MARCO passages
average ~77 wordpieces, so on length-bucketed batches with S <= 128 the head costs the same for any S
in 64..128. Packing the real tokens of all texts back to back into 128-token tiles makes the GEMM work
proportional to the real tokens (~40% less on MS MARCO lengths; measurements: docs/performance/head.md).

Design:
  * packed token j is row ``tok_row[j] = b·S + s`` of hidden viewed as [B·S, D] (the unmasked positions
    in row-major order, so tokens are sorted by b) and belongs to text ``seg[j] = tok_row[j] // S``. On
    Hopper the launcher gathers a packed copy [T, D] (cheap next to the head) so that H tiles are
    TMA loads like E's (gathered pointer loads were slower per tile); elsewhere the
    kernel gathers its H tile through ``tok_row`` and no copy is made;
  * one program per (token tile of BLOCK_T packed tokens, vocab tile of BLOCK_V), in grouped order
    (GROUP_T token tiles sweep the vocabulary together, so each E tile is reused from L2);
  * the [BLOCK_V, BLOCK_T] logit tile comes from tl.dot with fp32 accumulation, then for every text
    present in the tile (a contiguous range of segment ids) a masked max over its tokens, + bias, relu;
  * texts that span tiles are merged with an atomic max into a [B, V] buffer that starts at 0. The
    relu'd values are >= 0, so their fp32 bit patterns order like int32 and the buffer holds int32 bits
    (an integer atomic max compiles everywhere); max is order independent, so the result is
    deterministic, and zeros (most of the vocabulary for a sparse model) are not written at all;
  * a finishing kernel applies the same Kahan log1p as the padded kernel and casts to hidden's dtype;
    rows without tokens stay 0.
max(relu(m₁ + b), relu(m₂ + b)) = relu(max(m₁, m₂) + b) exactly (rounding is monotonic), so the result
equals the padded head's up to the order of the GEMM's accumulation.

Inference only (no argmax is kept, so there is no backward): the torch twin is
``reference.torch_sparton_head`` (same semantics: masked positions ignored, a fully masked row gives 0).
Launchers: ``triton_packed_sparton_fwd`` on padded [B,S,D] states with a mask; ``triton_packed_tokens_fwd`` on
states that are already packed ([T,D] + the text of each token, as ``lsr.encode.backbone.varlen_body`` produces
them; no host sync), whose torch twin is ``reference.torch_packed_tokens_head``. ``packing_pays`` is the
dispatch's rule for packing a padded batch; the backend-choosing heads are ``dispatch.packed_sparton_head`` /
``dispatch.packed_tokens_sparton_head``.
"""

from __future__ import annotations

import torch

from lsr.encode.sparton.reference import check_head_args, refuse_grad
from lsr.utils.kernels import INTERPRET, grouped_program_ids, tl, triton
from lsr.utils.runtime import failure_memory

__all__ = ["PACK_MAX_FILL", "TMA_FAILED", "TILE_T", "packing_pays", "triton_packed_sparton_fwd", "triton_packed_tokens_fwd"]

TILE_T = 128          # packed tokens per tile (the tuned configs' BLOCK_T)
PACK_MAX_FILL = 0.8   # pack only when real tokens fill at most this share of the padded kernel's tiles


def packing_pays(width: int) -> bool:
    """Whether the packed head should beat the padded one on a batch padded to ``width`` positions.

    The padded kernel pays ceil(width / 128) token tiles per text, the packed one at most width / 128
    (fewer with padding inside the batch), at ~1.2x the cost per tile (measured on full texts of 64 and 128
    tokens: docs/performance/head.md), so it pays below ~80% fill."""
    return 0 < width <= PACK_MAX_FILL * TILE_T * -(-width // TILE_T)


if triton is not None:

    @triton.jit
    def _packed_fwd_kernel(
        h_ptr, e_ptr, h_desc, e_desc, bias_ptr, row_ptr, seg_ptr, out_ptr,
        T, V, D,
        stride_h_row, stride_e_v, stride_out_b,
        HAS_BIAS: tl.constexpr, INPUT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
        BLOCK_V: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, GROUP_T: tl.constexpr,
        USE_TMA: tl.constexpr,
    ):
        # Grouped order: GROUP_T token tiles share each E tile while it is in L2; each H tile is reused
        # by the vocab tiles running next to it.
        tt, vt = grouped_program_ids(tl.program_id(0), tl.cdiv(T, BLOCK_T), tl.cdiv(V, BLOCK_V), GROUP_T)

        offs_v = vt * BLOCK_V + tl.arange(0, BLOCK_V)
        v_ok = offs_v < V
        offs_d = tl.arange(0, BLOCK_D)
        offs_t = tt * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = offs_t < T
        if not USE_TMA:
            rows = tl.load(row_ptr + offs_t, mask=t_ok, other=0)  # past T: row 0, a valid address, never pooled
            h_rows = h_ptr + rows.to(tl.int64) * stride_h_row
        acc = tl.zeros([BLOCK_V, BLOCK_T], tl.float32)
        for d0 in range(0, D, BLOCK_D):
            if USE_TMA:  # Hopper TMA over the packed copy [T, D] (rows past T are zero-filled, masked below)
                e = e_desc.load([vt * BLOCK_V, d0])
                h = tl.trans(h_desc.load([tt * BLOCK_T, d0]))
            else:
                d_ok = d0 + offs_d < D
                e = tl.load(e_ptr + offs_v[:, None] * stride_e_v + (d0 + offs_d)[None, :],
                            mask=v_ok[:, None] & d_ok[None, :], other=0.0)
                h = tl.load(h_rows[None, :] + (d0 + offs_d)[:, None], mask=t_ok[None, :] & d_ok[:, None], other=0.0)
            if DOT_FP32:  # interpreter: its bf16/fp16 tl.dot is wrong (triton 3.9); fp32 is exact here
                e, h = e.to(tl.float32), h.to(tl.float32)
            acc = tl.dot(e, h, acc, input_precision=INPUT_PRECISION)

        seg = tl.load(seg_ptr + offs_t, mask=t_ok, other=-1)  # the text of each token; -1 past T matches no text
        seg_lo = tl.min(tl.where(t_ok, seg, 2147483647))
        seg_hi = tl.max(seg)
        if HAS_BIAS:  # constant over s: added after the max
            bias = tl.load(bias_ptr + offs_v, mask=v_ok, other=0.0).to(tl.float32)
        for b in range(seg_lo, seg_hi + 1):  # tokens are sorted by text: a contiguous id range
            m = tl.max(tl.where((seg == b)[None, :], acc, float("-inf")), axis=1)
            if HAS_BIAS:
                m += bias
            r = tl.maximum(m, 0.0)  # relu; -inf (a fully masked text between two others) -> 0
            # the buffer starts at 0, so zeros (most of a sparse model's terms) need no atomic at all
            tl.atomic_max(out_ptr + b * stride_out_b + offs_v, r.to(tl.int32, bitcast=True),
                          mask=v_ok & (r != 0.0), sem="relaxed")

    @triton.jit
    def _packed_finish_kernel(bits_ptr, y_ptr, N, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < N
        r = tl.load(bits_ptr + offs, mask=ok, other=0).to(tl.float32, bitcast=True)
        u = 1.0 + r  # log1p(r) = log(u) * r / (u - 1) (Kahan), as the padded kernel: the same bits
        y = tl.where(u == 1.0, r, tl.log(u) * (r / tl.where(u == 1.0, 1.0, u - 1.0)))
        tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=ok)

    def _set_desc_blocks(nargs: dict) -> None:
        if nargs.get("h_desc") is not None:
            nargs["h_desc"].block_shape = [nargs["BLOCK_T"], nargs["BLOCK_D"]]
            nargs["e_desc"].block_shape = [nargs["BLOCK_V"], nargs["BLOCK_D"]]

    # (BLOCK_V, BLOCK_T, BLOCK_D, warps, stages, GROUP_T): the padded forward's best H200 bf16 shapes (256x128 w8),
    # and 128x128 tiles of one warpgroup (two programs an SM, one's epilogue under the other's GEMM) in groups of 64
    # token tiles (the group's H rows, 12 MB at D = 768, stay in L2 while E streams past them once per group)
    _SHAPES = [(256, 128, 64, 8, 3, 8), (256, 128, 64, 8, 4, 8), (128, 128, 64, 8, 3, 8), (128, 128, 64, 4, 3, 64),
               (128, 128, 64, 4, 2, 64)]
    # Small models (D <= 128: two K steps) are bound by the epilogue (masked max per text, atomics), not the
    # GEMM. The shapes above fit one program per SM (sm_90: 254 registers x 8 warps); these fit 2-4 (125-168
    # registers, 48-82 KB of shared memory with two stages), so one program's GEMM overlaps another's
    # epilogue, and 64-token tiles hold fewer texts (fewer masked passes per logit). Tuned only for such D.
    _SMALL_D_SHAPES = [(128, 128, 64, 4, 2, 8), (256, 64, 64, 8, 2, 8), (128, 64, 64, 4, 2, 8)]

    def _configs(tma: bool) -> list:
        return [triton.Config({"BLOCK_V": bv, "BLOCK_T": bt, "BLOCK_D": bd, "GROUP_T": g, "USE_TMA": tma},
                              num_warps=w, num_stages=st, pre_hook=_set_desc_blocks)
                for bv, bt, bd, w, st, g in _SHAPES + _SMALL_D_SHAPES]

    def _prune(configs: list, named_args: dict, **_: object) -> list:
        if named_args["D"] <= 128:
            return configs
        return [c for c in configs if (c.kwargs["BLOCK_V"], c.kwargs["BLOCK_T"], c.kwargs["BLOCK_D"], c.num_warps,
                                       c.num_stages, c.kwargs["GROUP_T"]) in _SHAPES]

    # Re-running a config while tuning is harmless: an atomic max of the same values is idempotent.
    # TMA loads (Hopper, triton >= 3.4) where they compile, else plain loads (TMA_FAILED remembers).
    _TMA_TUNER, _PLAIN_TUNER = (triton.autotune(_configs(tma), key=["V", "D"],
                                                prune_configs_by={"early_config_prune": _prune})(_packed_fwd_kernel)
                                for tma in (True, False))

TMA_FAILED = failure_memory("encode.sparton.packed_tma", "sparton_packed: the TMA configs",
                            "falling back to plain loads")   # (compiled only where triton has tensor descriptors)


def _check(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if triton is None:
        raise RuntimeError("the Triton backend needs the `triton` package")
    refuse_grad(hidden, weight, bias)
    if hidden.dtype not in (torch.bfloat16, torch.float16, torch.float32) or weight.dtype != hidden.dtype:
        raise TypeError(f"hidden/weight must share a bf16/fp16/fp32 dtype, got {hidden.dtype}/{weight.dtype}")
    if bias is not None and not bias.is_floating_point():
        raise TypeError(f"bias must be a float tensor, got {bias.dtype}")


def triton_packed_sparton_fwd(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                              mask: torch.Tensor | None, _blocks: dict | None = None) -> torch.Tensor:
    """Packed forward launcher (inference only).

    hidden [B,S,D] and weight [V,D] of one dtype (bf16/fp16/fp32), bias [V] | None (any float dtype),
    mask [B,S] (bool/int, nonzero = keep; None = all) -> y [B,V] in hidden's dtype; rows without
    unmasked positions are 0. One host sync: the number of real tokens sets the grid.
    ``_blocks`` pins a kernel config (tests): BLOCK_V, BLOCK_T, BLOCK_D, GROUP_T.
    """
    mask = check_head_args(hidden, weight, bias, mask)
    _check(hidden, weight, bias)
    B, S, D = hidden.shape
    if B * S >= 2**31:
        raise ValueError("B·S must be < 2**31")
    tok_row = torch.nonzero(mask.reshape(-1)).squeeze(1).to(torch.int32)  # the sync; row-major = sorted by b
    seg = torch.div(tok_row, S, rounding_mode="floor")  # the text of each packed token
    return _packed_fwd(hidden.contiguous().reshape(B * S, D), tok_row, seg, B, weight, bias, _blocks)


def triton_packed_tokens_fwd(tokens: torch.Tensor, segments: torch.Tensor, n_texts: int, weight: torch.Tensor,
                             bias: torch.Tensor | None, _blocks: dict | None = None) -> torch.Tensor:
    """Packed forward on tokens that are already packed (inference only; no host sync).

    tokens [T,D] and weight [V,D] of one dtype (bf16/fp16/fp32), segments int32 [T] (the text of each
    token, non-decreasing, in [0, n_texts)), bias [V] | None -> y [n_texts, V] in tokens' dtype; texts
    without tokens are 0. ``_blocks``: as ``triton_packed_sparton_fwd``.
    """
    _check(tokens, weight, bias)
    if tokens.dim() != 2 or weight.dim() != 2 or tokens.shape[1] != weight.shape[1]:
        raise ValueError(f"tokens [T,D] and weight [V,D] expected, got {tuple(tokens.shape)} / {tuple(weight.shape)}")
    if segments.shape != tokens.shape[:1]:
        raise ValueError(f"segments must be [T] = [{tokens.shape[0]}], got {tuple(segments.shape)}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must be [V]={weight.shape[0]}, got {tuple(bias.shape)}")
    if tokens.shape[0] >= 2**31:
        raise ValueError("T must be < 2**31")
    return _packed_fwd(tokens.contiguous(), None, segments.to(torch.int32), n_texts, weight, bias, _blocks)


def _packed_fwd(src: torch.Tensor, tok_row: torch.Tensor | None, seg: torch.Tensor, B: int, weight: torch.Tensor,
                bias: torch.Tensor | None, _blocks: dict | None) -> torch.Tensor:
    """src [R, D] contiguous rows; packed token j is row tok_row[j] of src (tok_row None: row j) and
    belongs to text seg[j] (int32, non-decreasing) -> [B, V] in src's dtype."""
    D = src.shape[1]
    V = weight.shape[0]
    if V * D >= 2**31 or B * V >= 2**31:
        raise ValueError("V·D and B·V must be < 2**31")
    weight = weight.contiguous()
    bias = bias.contiguous() if bias is not None else None
    dev = src.device
    # the interpreter truncates fp32 -> bf16/fp16 stores (GPU rounds to nearest): store fp32, cast here
    y = torch.empty(B, V, dtype=torch.float32 if INTERPRET else src.dtype, device=dev)
    if B * V == 0:
        return y.to(src.dtype)
    bits = torch.zeros(B, V, dtype=torch.int32, device=dev)  # fp32 bits of the running relu'd max
    T = seg.numel()
    if T > 0:
        rows = tok_row if tok_row is not None else torch.arange(T, dtype=torch.int32, device=dev)
        flags = {"HAS_BIAS": bias is not None,
                 "INPUT_PRECISION": "ieee" if src.dtype == torch.float32 or INTERPRET else "tf32",
                 "DOT_FP32": INTERPRET}
        small = _blocks is not None or INTERPRET or T * V < 2**25  # a fixed config, no tuning run per V

        def args(descs: tuple) -> tuple:
            return (src, weight, *descs, bias if bias is not None else weight, rows, seg, bits, T, V, D,
                    src.stride(0), weight.stride(0), bits.stride(0))

        if small:
            blocks = dict(_blocks or ({"BLOCK_V": 32, "BLOCK_T": 16, "BLOCK_D": 16, "GROUP_T": 2} if INTERPRET else
                                      {"BLOCK_V": 64, "BLOCK_T": 64, "BLOCK_D": 64, "GROUP_T": 8}))
            blocks.setdefault("USE_TMA", False)
            launch = {} if INTERPRET else {"num_warps": 4, "num_stages": 3}
            grid = (triton.cdiv(T, blocks["BLOCK_T"]) * triton.cdiv(V, blocks["BLOCK_V"]),)
            _packed_fwd_kernel[grid](*args((None, None)), **flags, **blocks, **launch)
        else:
            grid = lambda meta: (triton.cdiv(T, meta["BLOCK_T"]) * triton.cdiv(V, meta["BLOCK_V"]),)  # noqa: E731
            tma = (not TMA_FAILED.failed and torch.cuda.get_device_capability(dev)[0] >= 9
                   and (D * src.element_size()) % 16 == 0 and weight.data_ptr() % 16 == 0)
            if tma:  # a packed copy [T, D] (cheap next to the head) so that H tiles are TMA boxes, not gathers
                from triton.tools.tensor_descriptor import TensorDescriptor

                packed = src if tok_row is None else src.index_select(0, tok_row)
                descs = (TensorDescriptor.from_tensor(packed, [64, 64]),  # block shapes: set per config
                         TensorDescriptor.from_tensor(weight, [64, 64]))
                try:
                    _TMA_TUNER[grid](*args(descs), **flags)
                except Exception as e:  # noqa: BLE001 - compiler failure of the optional TMA family
                    TMA_FAILED.record(e)
                    tma = False
            if not tma:
                _PLAIN_TUNER[grid](*args((None, None)), **flags)
    block = 1024
    _packed_finish_kernel[(triton.cdiv(B * V, block),)](bits, y, B * V, BLOCK=block)
    return y.to(src.dtype)
