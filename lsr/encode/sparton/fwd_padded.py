"""The padded Sparton forward: the tl kernel on [B, S, D] states and its launcher ``triton_sparton_fwd``.

Kernel: one program per (batch row b, vocab tile); it loops over the sequence in BLOCK_S chunks, computes the
[BLOCK_V, BLOCK_S] logit tile Eᵀ-major with tl.dot (fp32 accumulation; the max over S is then a reduction along
the MMA's N axis, i.e. inside a thread / quad, no shared memory) and keeps a running max + argmax on chip.
[B, S, V] is never materialised; the epilogue (bias, relu, log1p, stores) is ``epilogue.store_head_row``.

Launches: problems of at least ``AUTOTUNE_MIN_ELEMENTS`` (B·S·V) are autotuned and run two launches, one for the
rows whose kept positions are exactly 0..len-1 (right padding: no mask reads in the chunk loop) and one for the
rest; a program whose row belongs to the other launch returns at once (no host sync). The caller may hand the first
launch's rows to another forward (``rows_without_holes``: the dispatch passes the resident-tile kernel of
``fwd_resident`` on sm_90). Smaller problems run one launch with a fixed config (no autotuning run per new V).

Argument checks: ``reference.check_kernel_inputs``; torch twin: ``reference.torch_sparton_head``; the backward
runs from the saved (y32, argmax) in ``bwd``; the autograd function is in ``autograd``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lsr.encode.sparton.reference import check_kernel_inputs
from lsr.utils.kernels import INTERPRET, fold_row_max, grouped_program_ids, tl, triton
from lsr.utils.runtime import failure_memory

__all__ = ["AUTOTUNE_MIN_ELEMENTS", "FAMILY_FAILED", "RowsForward", "autotuners", "autotunes", "triton_sparton_fwd"]

AUTOTUNE_MIN_ELEMENTS = 2**25  # B·S·V from which the launcher autotunes and splits rows (smaller: one fixed config)
# a forward for the rows without holes: (hidden, weight, bias, lengths, rows_ok, y, y32, arg) -> True when it wrote
# them, False to leave them to the tl kernel
RowsForward = Callable[..., bool]

# the optional config families, best first; a family that fails to compile on the installed triton is remembered and
# the next one runs (the last, plain loads, always compiles: its failure is raised)
FAMILY_FAILED = {
    "tma": failure_memory("encode.sparton.padded_tma", "sparton: the TMA config family of the forward",
                          "falling back to flattened loops"),
    "flat": failure_memory("encode.sparton.padded_flat", "sparton: the flattened-loop config family of the forward",
                           "falling back to plain loops"),
}


def autotunes(B: int, S: int, V: int, blocks: dict | None = None, *, interpret: bool = INTERPRET) -> bool:
    """Whether ``triton_sparton_fwd`` autotunes (and splits rows into two launches) for this problem: large
    problems without a pinned config, outside Triton's interpreter."""
    return blocks is None and not interpret and B * S * V >= AUTOTUNE_MIN_ELEMENTS


if triton is not None:
    from lsr.encode.sparton.epilogue import store_head_row  # a tl function: defined only where triton imports

    @triton.jit
    def _sparton_fwd_kernel(
        h_ptr, e_ptr, h_desc, e_desc, bias_ptr, mask_ptr, len_ptr, holes_ptr, y_ptr, y32_ptr, arg_ptr,
        B, S, V, D, S_KEY,  # S_KEY (bucketed S) is only an autotune key
        stride_h_b, stride_h_s, stride_e_v, stride_m_b, stride_y_b,
        HAS_BIAS: tl.constexpr, STORE_FP32: tl.constexpr, STORE_ARGMAX: tl.constexpr, ROW_KIND: tl.constexpr,
        INPUT_PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
        BLOCK_V: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, GROUP_B: tl.constexpr,
        FLATTEN: tl.constexpr, USE_TMA: tl.constexpr,
    ):
        # Grouped order: GROUP_B batch rows share each E tile while it is in L2, and each H[b] is
        # reused by the ~all vocab tiles running next to it.
        b, vt = grouped_program_ids(tl.program_id(0), B, tl.cdiv(V, BLOCK_V), GROUP_B)
        # ROW_KIND 0: every row, the mask read per S chunk; 1: only rows whose kept positions are 0..len-1, no mask
        # reads (a load in the flattened chunk loop is not hidden: docs/performance/head.md); 2: the others
        if ROW_KIND == 0:
            mine = True
        else:
            mine = (tl.load(holes_ptr + b) != 0) == (ROW_KIND == 2)
        if mine:
            offs_v = vt * BLOCK_V + tl.arange(0, BLOCK_V)
            v_ok = offs_v < V
            offs_d = tl.arange(0, BLOCK_D)
            offs_s = tl.arange(0, BLOCK_S)
            h_base = h_ptr + b.to(tl.int64) * stride_h_b
            n_s = tl.load(len_ptr + b)  # last unmasked position + 1: trailing padding costs nothing
            run_max = tl.full([BLOCK_V], float("-inf"), tl.float32)
            run_arg = tl.zeros([BLOCK_V], tl.int32)
            for s0 in tl.range(0, n_s, BLOCK_S, flatten=FLATTEN):  # flatten: pipeline across S chunks too
                s_ok = s0 + offs_s < n_s
                acc = tl.zeros([BLOCK_V, BLOCK_S], tl.float32)
                for d0 in range(0, D, BLOCK_D):
                    if USE_TMA:  # Hopper TMA; rows past this b's n_s (next b / zero fill) are masked below
                        e = e_desc.load([vt * BLOCK_V, d0])
                        h = tl.trans(h_desc.load([b * S + s0, d0]))
                    else:
                        d_ok = d0 + offs_d < D
                        e = tl.load(e_ptr + offs_v[:, None] * stride_e_v + (d0 + offs_d)[None, :],
                                    mask=v_ok[:, None] & d_ok[None, :], other=0.0)
                        h = tl.load(h_base + (s0 + offs_s)[None, :] * stride_h_s + (d0 + offs_d)[:, None],
                                    mask=s_ok[None, :] & d_ok[:, None], other=0.0)
                    if DOT_FP32:  # interpreter: its bf16/fp16 tl.dot is wrong (triton 3.9); fp32 is exact here
                        e, h = e.to(tl.float32), h.to(tl.float32)
                    acc = tl.dot(e, h, acc, input_precision=INPUT_PRECISION)
                if ROW_KIND == 1:
                    keep = s_ok
                else:
                    keep = tl.load(mask_ptr + b * stride_m_b + s0 + offs_s, mask=s_ok, other=0) != 0
                run_max, run_arg = fold_row_max(acc, keep, run_max, run_arg, s0, STORE_ARGMAX)
            store_head_row(run_max, run_arg, offs_v, v_ok, b, bias_ptr, y_ptr, y32_ptr, arg_ptr, stride_y_b,
                           HAS_BIAS, STORE_FP32, STORE_ARGMAX)

    def _fwd_prune(configs, named_args, **kwargs):
        s_key = named_args["S_KEY"]
        tma = named_args.get("h_desc") is not None
        kept = [c for c in configs if c.kwargs["BLOCK_S"] <= max(s_key, 64)  # no tiles of mostly padding
                and (tma or not c.kwargs["USE_TMA"])]
        return kept or configs

    def _set_desc_blocks(nargs: dict) -> None:
        if nargs.get("h_desc") is not None:
            nargs["h_desc"].block_shape = [nargs["BLOCK_S"], nargs["BLOCK_D"]]
            nargs["e_desc"].block_shape = [nargs["BLOCK_V"], nargs["BLOCK_D"]]

    def _configs(family: str) -> list:
        # (BLOCK_V, BLOCK_S, BLOCK_D, warps, stages, flatten, tma): the shapes that led the autotuning runs
        # recorded in docs/performance/head.md ("Sparton tile shapes"), best first
        shapes = {
            "tma": [(256, 128, 64, 8, 3, True, True), (256, 128, 64, 8, 4, True, True),
                    (128, 256, 64, 8, 4, True, True), (256, 128, 128, 8, 2, True, True),
                    (256, 128, 64, 8, 3, True, False), (256, 128, 64, 8, 4, True, False),
                    (128, 256, 64, 8, 3, True, False)],
            "flat": [(256, 128, 64, 8, 3, True, False), (128, 256, 64, 8, 3, True, False),
                     (128, 128, 64, 8, 3, True, False), (128, 64, 64, 4, 4, False, False)],
            "plain": [(256, 128, 64, 8, 3, False, False), (128, 256, 64, 8, 3, False, False),
                      (128, 128, 64, 8, 3, False, False), (128, 64, 64, 4, 4, False, False)],
        }[family]
        return [triton.Config({"BLOCK_V": bv, "BLOCK_S": bs, "BLOCK_D": bd, "GROUP_B": 8, "FLATTEN": f, "USE_TMA": t},
                              num_warps=w, num_stages=st, pre_hook=_set_desc_blocks)
                for bv, bs, bd, w, st, f, t in shapes]

    def _tuner(configs: list):
        return triton.autotune(configs, key=["V", "D", "S_KEY", "ROW_KIND"],
                               prune_configs_by={"early_config_prune": _fwd_prune})(_sparton_fwd_kernel)

    # TMA loads (triton >= 3.4 tensor descriptors) and loop flattening (tl.range(flatten=True), >= 3.3)
    # are tried first; if a family fails to compile on this triton the launcher drops to the next
    _FWD_TUNERS = {family: _tuner(_configs(family)) for family in ("tma", "flat", "plain")}


def triton_sparton_fwd(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       mask: torch.Tensor, need_fp32: bool = False, need_argmax: bool = True, *,
                       rows_without_holes: RowsForward | None = None, _blocks: dict | None = None,
                       ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Forward launcher.

    hidden [B,S,D] and weight [V,D] of one dtype (bf16/fp16/fp32), bias [V] | None (any float dtype),
    mask [B,S] bool. Returns y [B,V] (hidden's dtype), y32 [B,V] float32 (only if ``need_fp32``, for
    the backward) and argmax [B,V] int32 (only if ``need_argmax``: the first position of the max over
    unmasked s; 0 for a fully masked row). ``rows_without_holes``: where the launch autotunes (``autotunes``),
    the forward that writes the rows whose kept positions are 0..len-1 (see ``RowsForward``); the tl kernel writes
    them when it is None or returns False. ``_blocks`` pins a kernel config (tests).
    """
    if triton is None:
        raise RuntimeError("the Triton backend needs the `triton` package (pip install 'lsr-gpu[triton]')")
    check_kernel_inputs(hidden, weight, bias, mask)
    B, S, D = hidden.shape
    V = weight.shape[0]
    hidden, weight, mask = hidden.contiguous(), weight.contiguous(), mask.contiguous()
    bias = bias.contiguous() if bias is not None else None
    dev = hidden.device
    # the interpreter truncates fp32 -> bf16/fp16 stores (GPU rounds to nearest): store fp32, cast here
    y = torch.empty(B, V, dtype=torch.float32 if INTERPRET else hidden.dtype, device=dev)
    arg = torch.empty(B, V, dtype=torch.int32, device=dev) if need_argmax else None
    y32 = torch.empty(B, V, dtype=torch.float32, device=dev) if need_fp32 else None
    if B == 0 or V == 0:
        return y.to(hidden.dtype), y32, arg
    pos = torch.arange(1, S + 1, dtype=torch.int32, device=dev)
    lengths = (torch.where(mask, pos, 0).amax(dim=1).to(torch.int32) if S > 0
               else torch.zeros(B, dtype=torch.int32, device=dev))
    big = B * S * V >= AUTOTUNE_MIN_ELEMENTS  # small problems: a fixed config, not an autotuning run per new V
    descs = _tma_descriptors(hidden, weight, big, _blocks)
    s_key = min(triton.next_power_of_2(max(S, 1)), 256)
    tuned = autotunes(B, S, V, _blocks)
    blocks = None if tuned else dict(_blocks or (
        {"BLOCK_V": 32, "BLOCK_S": 16, "BLOCK_D": 16, "GROUP_B": 2} if INTERPRET else
        {"BLOCK_V": 64, "BLOCK_S": min(max(s_key, 16), 64), "BLOCK_D": 64, "GROUP_B": 8}))
    # tuned (large) problems launch twice, rows without holes skipping the mask reads; tests pin (1, 2) as well
    kinds = (1, 2) if tuned else blocks.pop("ROW_KINDS", (0,))
    # the per-row flag only the split launches read: kept positions are not just 0..len-1
    holes = (mask.sum(1, dtype=torch.int32) != lengths).to(torch.int8) if kinds != (0,) else lengths
    args = (hidden, weight, *descs, bias if bias is not None else y, mask.view(torch.uint8), lengths, holes, y,
            y32 if need_fp32 else y, arg if need_argmax else lengths, B, S, V, D, s_key,
            hidden.stride(0), hidden.stride(1), weight.stride(0), mask.stride(0), y.stride(0))
    flags = {"HAS_BIAS": bias is not None, "STORE_FP32": need_fp32, "STORE_ARGMAX": need_argmax,
             "INPUT_PRECISION": "ieee" if hidden.dtype == torch.float32 or INTERPRET else "tf32",
             "DOT_FP32": INTERPRET}
    for kind in kinds:  # a program whose row is of the other kind returns at once
        if tuned and kind == 1 and rows_without_holes is not None and \
                rows_without_holes(hidden, weight, bias, lengths, holes == 0, y, y32, arg):
            continue
        if tuned:
            _launch_tuned(lambda meta: (B * triton.cdiv(V, meta["BLOCK_V"]),), args, {**flags, "ROW_KIND": kind})
        else:
            launch = {} if INTERPRET else {"num_warps": 4, "num_stages": 3}
            _sparton_fwd_kernel[(B * triton.cdiv(V, blocks["BLOCK_V"]),)](
                *args, **flags, **{"FLATTEN": False, "USE_TMA": False, **blocks}, **launch, ROW_KIND=kind)
    return y.to(hidden.dtype), y32, arg


def _tma_descriptors(hidden: torch.Tensor, weight: torch.Tensor, big: bool, blocks: dict | None) -> tuple:
    """TMA tensor descriptors of hidden [B·S, D] and weight [V, D] (Hopper and later, 16-byte aligned, large problems
    or a pinned TMA config), else (None, None). Block shapes are set per autotuning config by a pre-hook."""
    B, S, D = hidden.shape
    dev = hidden.device
    tma = (big and blocks is None and dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] >= 9
           and (D * hidden.element_size()) % 16 == 0 and hidden.data_ptr() % 16 == 0 and weight.data_ptr() % 16 == 0) \
        or bool(blocks and blocks.get("USE_TMA"))
    if not tma:
        return None, None
    from triton.tools.tensor_descriptor import TensorDescriptor

    blk = [blocks["BLOCK_S"], blocks["BLOCK_D"]] if blocks else [64, 64]
    return (TensorDescriptor.from_tensor(hidden.view(B * S, D), blk),
            TensorDescriptor.from_tensor(weight, [blocks["BLOCK_V"], blk[1]] if blocks else [64, 64]))


def autotuners() -> list:
    """The autotuned kernels of the config families that still compile here, first the one in use (benchmarks
    record their caches)."""
    if triton is None:
        return []
    return [tuner for family, tuner in _FWD_TUNERS.items() if not _family_failed(family)]


def _family_failed(family: str) -> bool:
    return family in FAMILY_FAILED and FAMILY_FAILED[family].failed


def _launch_tuned(grid, args: tuple, flags: dict) -> None:
    """Launch the autotuned forward with the first config family that compiles on the installed triton."""
    for family, tuner in _FWD_TUNERS.items():
        if _family_failed(family):
            continue
        memory = FAMILY_FAILED.get(family)
        try:
            tuner[grid](*args, **flags)
            return
        except Exception as e:  # noqa: BLE001 - compiler failure of an optional config family
            if memory is None:   # plain loads: nothing to fall back to
                raise
            memory.record(e, stacklevel=3)
