"""Sparton: the fused SPLADE LM head  Y[b, v] = log1p(relu(max_s (H Eᵀ + bias)[b, s, v]))  over unmasked s.

Public API: ``sparton_head`` (differentiable, backend choice), ``torch_sparton_head`` (torch twin,
the one reference), ``SpartonHead`` (nn.Module), ``triton_sparton_fwd`` (forward launcher),
``SpartonHeadFunction`` (autograd). The backward kernels live in ``sparton_bwd.py``.

Forward: one program per (batch row b, vocab tile); it loops over the sequence in BLOCK_S chunks,
computes the [BLOCK_V, BLOCK_S] logit tile Eᵀ-major with tl.dot (fp32 accumulation; the max over S is
then a reduction along the MMA's N axis, i.e. inside a thread / quad, no shared memory) and keeps a
running max + argmax on chip. [B, S, V] is never materialised. Large problems run two launches, one for the rows
whose kept positions are exactly 0..len-1 (right padding: no mask reads in the chunk loop) and one for the rest;
a program whose row belongs to the other launch returns at once (no host sync). On an sm_90 GPU the first of the two
runs ``sparton_resident.py`` instead (the E tile stays on chip for the whole batch; bit-identical, faster).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from lsr.utils.kernels import INTERPRET, fold_row_max, grouped_program_ids, tl, triton, use_triton

__all__ = ["SpartonHead", "SpartonHeadFunction", "check_head_args", "sparton_head", "torch_sparton_head", "triton_sparton_fwd"]


def check_head_args(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
             mask: torch.Tensor | None) -> torch.Tensor:
    """Validate shapes/devices; return the mask as bool [B, S] (all-true when None)."""
    if hidden.dim() != 3 or weight.dim() != 2:
        raise ValueError(f"hidden must be [B,S,D] and weight [V,D], got {tuple(hidden.shape)}, {tuple(weight.shape)}")
    B, S, D = hidden.shape
    if weight.shape[1] != D:
        raise ValueError(f"hidden dim {D} != weight dim {weight.shape[1]}")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must be [V]={weight.shape[0]}, got {tuple(bias.shape)}")
    if mask is None:
        mask = torch.ones(B, S, dtype=torch.bool, device=hidden.device)
    if tuple(mask.shape) != (B, S):
        raise ValueError(f"mask must be [B,S]=({B},{S}), got {tuple(mask.shape)}")
    for name, t in (("weight", weight), ("bias", bias), ("mask", mask)):
        if t is not None and t.device != hidden.device:
            raise ValueError(f"{name} is on {t.device}, hidden on {hidden.device}")
    return mask if mask.dtype == torch.bool else mask != 0


def torch_sparton_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                       mask: torch.Tensor | None = None, *, upcast: bool = True) -> torch.Tensor:
    """Plain-torch twin: builds the [B, S, V] logits.

    hidden [B,S,D], weight [V,D], bias [V] | None, mask [B,S] (bool/int, nonzero = keep) -> [B,V] in
    hidden's dtype. ``upcast=True`` computes in float32 (float64 stays float64) — the reference;
    ``upcast=False`` keeps the logits in the input precision (what an eager HF head does).
    Masked positions are −inf; a fully masked row gives 0.
    """
    mask = check_head_args(hidden, weight, bias, mask)
    cdt = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    h, w = (hidden.to(cdt), weight.to(cdt)) if upcast else (hidden, weight.to(hidden.dtype))
    logits = h @ w.t()
    if bias is not None:
        logits = logits + bias.to(logits.dtype)
    logits = logits.masked_fill(~mask[:, :, None], float("-inf"))
    return torch.log1p(torch.relu(logits.amax(dim=1))).to(hidden.dtype)


if triton is not None:

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
        # reads (a load in the flattened chunk loop is not hidden: docs/notes-sparton.md, session 25); 2: the others
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

    @triton.jit
    def store_head_row(run_max, run_arg, offs_v, v_ok, b, bias_ptr, y_ptr, y32_ptr, arg_ptr, stride_y,
                       HAS_BIAS: tl.constexpr, STORE_FP32: tl.constexpr, STORE_ARGMAX: tl.constexpr):
        """Batch row b's outputs from its running max over s: y = log1p(relu(max + bias)), y32 and argmax. Also
        called from the Gluon kernel (sparton_resident.py), so both forwards write the same bits."""
        if HAS_BIAS:  # bias is constant over s: add after the max, argmax unchanged
            run_max += tl.load(bias_ptr + offs_v, mask=v_ok, other=0.0).to(tl.float32)
        r = tl.maximum(run_max, 0.0)  # relu; -inf (fully masked row) -> 0
        u = 1.0 + r  # log1p(r) = log(u) * r / (u - 1) (Kahan): exact for tiny r
        y = tl.where(u == 1.0, r, tl.log(u) * (r / tl.where(u == 1.0, 1.0, u - 1.0)))
        out = b.to(tl.int64) * stride_y + offs_v
        tl.store(y_ptr + out, y.to(y_ptr.dtype.element_ty), mask=v_ok)
        if STORE_ARGMAX:
            tl.store(arg_ptr + out, run_arg, mask=v_ok)
        if STORE_FP32:
            tl.store(y32_ptr + out, y, mask=v_ok)

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
        # recorded in docs/benchmarks.md ("Sparton tile shapes"), best first
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
    _FWD_TUNERS = [_tuner(_configs("tma")), _tuner(_configs("flat")), _tuner(_configs("plain"))]


def triton_sparton_fwd(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       mask: torch.Tensor, need_fp32: bool = False, need_argmax: bool = True,
                       _blocks: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Forward launcher.

    hidden [B,S,D] and weight [V,D] of one dtype (bf16/fp16/fp32), bias [V] | None (any float dtype),
    mask [B,S] bool. Returns y [B,V] (hidden's dtype), y32 [B,V] float32 (only if ``need_fp32``, for
    the backward) and argmax [B,V] int32 (only if ``need_argmax``: the first position of the max over
    unmasked s; 0 for a fully masked row). ``_blocks`` pins a kernel config (tests).
    """
    if triton is None:
        raise RuntimeError("the Triton backend needs the `triton` package")
    _check_fwd_inputs(hidden, weight, bias, mask)
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
    big = B * S * V >= 2**25  # small problems: a fixed config, not an autotuning run per new V
    descs = _tma_descriptors(hidden, weight, big, _blocks)
    s_key = min(triton.next_power_of_2(max(S, 1)), 256)
    tuned = _blocks is None and not INTERPRET and big
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
        if tuned and kind == 1 and _resident_fwd(hidden, weight, bias, lengths, holes, y, y32, arg):
            continue
        if tuned:
            _launch_tuned(lambda meta: (B * triton.cdiv(V, meta["BLOCK_V"]),), args, {**flags, "ROW_KIND": kind})
        else:
            launch = {} if INTERPRET else {"num_warps": 4, "num_stages": 3}
            _sparton_fwd_kernel[(B * triton.cdiv(V, blocks["BLOCK_V"]),)](
                *args, **flags, **{"FLATTEN": False, "USE_TMA": False, **blocks}, **launch, ROW_KIND=kind)
    return y.to(hidden.dtype), y32, arg


def _check_fwd_inputs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mask: torch.Tensor) -> None:
    B, S, D = hidden.shape
    V = weight.shape[0]
    if hidden.dtype not in (torch.bfloat16, torch.float16, torch.float32) or weight.dtype != hidden.dtype:
        raise TypeError(f"hidden/weight must share a bf16/fp16/fp32 dtype, got {hidden.dtype}/{weight.dtype}")
    if weight.shape[1] != D or mask.shape != (B, S) or mask.dtype != torch.bool:
        raise ValueError("expected hidden [B,S,D], weight [V,D], bool mask [B,S]")
    if bias is not None and (bias.shape != (V,) or not bias.is_floating_point()):
        raise ValueError("bias must be a float [V]")
    if any(t.device != hidden.device for t in (weight, mask) + ((bias,) if bias is not None else ())):
        raise ValueError("all inputs must be on one device")
    if B * S >= 2**31 or V * D >= 2**31:
        raise ValueError("B·S and V·D must be < 2**31")


USE_RESIDENT = True  # False: the tl kernel for every row (benchmarks compare the two in one run)
# the resident kernel runs one program per 128-row vocabulary tile: with few waves of them (30522 rows: 1.8 on an
# H100) the idle SMs of the last one cost what the resident tile saves (docs/notes-sparton.md, session 26)
RESIDENT_MIN_WAVES = 8


def _resident_fwd(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, lengths: torch.Tensor,
                  holes: torch.Tensor, y: torch.Tensor, y32: torch.Tensor | None, arg: torch.Tensor | None) -> bool:
    """Rows without holes through the resident-tile kernel where it applies; False where it does not, or where it
    failed to compile on this triton (then it stays off for the process, and the tl kernel runs)."""
    from lsr.encode.sparton import fwd_resident as sparton_resident  # it imports this module's store_head_row

    global USE_RESIDENT
    if not (USE_RESIDENT and sparton_resident.resident_applies(hidden, weight)):
        return False
    if not _fills_waves(triton.cdiv(weight.shape[0], sparton_resident.BLOCK_V), hidden.device):
        return False
    try:
        sparton_resident.resident_fwd(hidden, weight, bias, lengths, holes == 0, y, y32, arg)
        return True
    except Exception as e:  # noqa: BLE001 - Gluon is experimental: an API change must not break the head
        warnings.warn(f"sparton: the resident-tile forward failed ({type(e).__name__}: {str(e)[:300]}); "
                      "using the tl kernel", stacklevel=3)
        USE_RESIDENT = False
        return False


def _fills_waves(programs: int, device: torch.device) -> bool:
    return programs >= RESIDENT_MIN_WAVES * torch.cuda.get_device_properties(device).multi_processor_count


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


def _launch_tuned(grid, args: tuple, flags: dict) -> None:
    """Launch the autotuned forward with the first config family that compiles on the installed triton."""
    while True:
        try:
            _FWD_TUNERS[0][grid](*args, **flags)
            return
        except Exception as e:  # noqa: BLE001 - compiler failure of an optional config family
            if len(_FWD_TUNERS) == 1:
                raise
            warnings.warn(f"sparton: a forward config family failed ({type(e).__name__}: {str(e)[:300]}); "
                          "falling back", stacklevel=2)
            _FWD_TUNERS.pop(0)


class SpartonHeadFunction(torch.autograd.Function):
    """Triton forward; backward from the saved (y32, argmax) only (see sparton_bwd.py)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, mask, deterministic):  # type: ignore[override]
        hidden, weight = hidden.contiguous(), weight.contiguous()
        y, y32, arg = triton_sparton_fwd(hidden, weight, bias, mask, need_fp32=True)
        ctx.save_for_backward(hidden, weight, y32, arg)
        ctx.bias_dtype = bias.dtype if bias is not None else None
        ctx.deterministic = deterministic
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        from lsr.encode.sparton.bwd import triton_sparton_bwd

        hidden, weight, y32, arg = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dh, dw, db = triton_sparton_bwd(dy, hidden, weight, y32, arg, need_dh=need_h, need_dw=need_w,
                                        need_db=need_b and ctx.bias_dtype is not None,
                                        deterministic=ctx.deterministic)
        if db is not None:
            db = db.to(ctx.bias_dtype)
        return dh, dw, db, None, None


def sparton_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, backend: str = "auto",
                 deterministic: bool = False) -> torch.Tensor:
    """SPLADE max-pooled head without building [B, S, V]; differentiable w.r.t. hidden, weight, bias.

    hidden [B,S,D] (bf16/fp16/fp32), weight [V,D], bias [V] | None, mask [B,S] (bool/int) -> [B,V]
    in hidden's dtype (under autocast: the autocast dtype), computed with float32 accumulation.
    ``backend``: "auto" (Triton on CUDA; on the CPU the tiled ``sparton_cpu.cpu_sparton_head`` for
    inference and the torch twin when a gradient is needed), "triton", "torch" (the twin).
    ``deterministic=True`` makes the Triton backward bit-identical run to run.
    """
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):  # the head is a matmul: run it in the autocast dtype
        dt = torch.get_autocast_dtype(dev)
        hidden, weight = hidden.to(dt), weight.to(dt)
    if weight.dtype != hidden.dtype:
        weight = weight.to(hidden.dtype)  # differentiable cast; the kernels want one input dtype
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    if not use_triton(backend, hidden.device):
        with torch.autocast(hidden.device.type, enabled=False):
            if backend == "auto" and hidden.device.type == "cpu" and not needs_grad:
                from lsr.encode.sparton.cpu import cpu_sparton_head  # (imports this module)

                return cpu_sparton_head(hidden, weight, bias, mask)  # tiled: never builds [B, S, V]
            return torch_sparton_head(hidden, weight, bias, mask)
    mask = check_head_args(hidden, weight, bias, mask)
    if not needs_grad:  # inference: no fp32 copy of y, no autograd node
        return triton_sparton_fwd(hidden, weight, bias, mask, need_argmax=False)[0]
    return SpartonHeadFunction.apply(hidden, weight, bias, mask, deterministic)


class SpartonHead(nn.Module):
    """The MLM decoder (weight [V, D], bias [V]) applied as a Sparton head: forward(hidden, mask) -> [B, V]."""

    def __init__(self, vocab_size: int, hidden_size: int, bias: bool = True, *, backend: str = "auto",
                 deterministic: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, **kw))
        self.bias = nn.Parameter(torch.zeros(vocab_size, **kw)) if bias else None
        self.backend, self.deterministic = backend, deterministic
        nn.init.normal_(self.weight, std=0.02)

    @classmethod
    def from_linear(cls, decoder: nn.Linear, bias: torch.Tensor | None = None, **kw) -> SpartonHead:
        """Share the parameters of an HF decoder Linear (``bias`` overrides, e.g. BERT's cls.predictions.bias)."""
        head = cls.__new__(cls)
        nn.Module.__init__(head)
        head.weight = decoder.weight
        head.bias = bias if bias is not None else decoder.bias
        head.backend, head.deterministic = kw.get("backend", "auto"), kw.get("deterministic", False)
        return head

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        return sparton_head(hidden, self.weight, self.bias, mask, self.backend, self.deterministic)

    def extra_repr(self) -> str:
        V, D = self.weight.shape
        return f"vocab_size={V}, hidden_size={D}, bias={self.bias is not None}, backend={self.backend!r}"
