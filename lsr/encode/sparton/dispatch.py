"""The one place that decides which Sparton forward runs, and says why.

Variants (each in its own module, all equal to ``reference.torch_sparton_head`` within the dtype's tolerance):

==============  ===============================================================  ===========================
variant         what runs                                                        backward
==============  ===============================================================  ===========================
``torch``       ``reference.torch_sparton_head`` (builds [B, S, V])              torch autograd
``cpu_tiled``   ``cpu.cpu_sparton_head`` (vocabulary x token tiles)              none (inference only)
``padded``      ``fwd_padded`` tl kernel on every row                            ``bwd`` (saved argmax)
``resident``    ``fwd_resident`` for rows without holes (sm_90, **experimental**), ``bwd`` (saved argmax)
                the tl kernel for the others
``packed``      ``fwd_packed``: real tokens of all texts share tiles              none (inference only)
==============  ===============================================================  ===========================

``plan_head(facts, ...)`` is a pure function of the inputs' facts (``HeadFacts``: device, dtype, shapes, whether a
gradient is needed, the GPU's compute capability and SM count), so the choice for another GPU can be asked on any
machine. ``variant=`` forces one (an impossible one raises, naming why); ``SpartonDispatch`` runs the plan and
remembers, for the process, a resident kernel that failed to compile (Gluon is experimental: the tl kernel then
runs those rows, bit-identical). ``sparton_head`` / ``explain_sparton_head`` use the module's ``DEFAULT_DISPATCH``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from lsr.encode.sparton import fwd_resident
from lsr.encode.sparton.autograd import SpartonHeadFunction
from lsr.encode.sparton.cpu import cpu_sparton_head
from lsr.encode.sparton.fwd_packed import (
    PACK_MAX_FILL,
    packing_pays,
    triton_packed_sparton_fwd,
    triton_packed_tokens_fwd,
)
from lsr.encode.sparton.fwd_padded import AUTOTUNE_MIN_ELEMENTS, autotunes, triton_sparton_fwd
from lsr.encode.sparton.reference import (
    check_head_args,
    needs_grad,
    refuse_grad,
    torch_packed_tokens_head,
    torch_sparton_head,
)
from lsr.utils.kernels import INTERPRET, KERNEL_IMPLS, triton, use_triton
from lsr.utils.plans import Plan, Step
from lsr.utils.runtime import FailureMemory, failure_memory

__all__ = ["DEFAULT_DISPATCH", "RESIDENT_FAILED", "RESIDENT_MIN_WAVES", "VARIANTS", "HeadFacts", "SpartonDispatch", "SpartonPlan",
           "explain_sparton_head", "packed_tokens_sparton_head", "plan_head", "sparton_head"]

VARIANTS = ("torch", "cpu_tiled", "padded", "resident", "packed")
_TRITON_VARIANTS = ("padded", "resident", "packed")
_INFERENCE_ONLY = ("cpu_tiled", "packed")
# the resident kernel runs one program per 128-row vocabulary tile: with few waves of them (30522 rows: 1.8 on an
# H100) the idle SMs of the last one cost what the resident tile saves (docs/performance/head.md)
RESIDENT_MIN_WAVES = 8
_RESIDENT = ("sparton: the resident-tile forward", "using the tl kernel")
# the process's memory of a resident kernel that failed to compile (Gluon is experimental), DEFAULT_DISPATCH's
RESIDENT_FAILED = failure_memory("encode.sparton.resident", *_RESIDENT)


@dataclass(frozen=True)
class HeadFacts:
    """What the choice depends on: read off the inputs by ``of``, or written by hand to ask about another GPU."""

    device: str                                # "cuda", "cpu", ...
    dtype: torch.dtype
    batch: int
    seq: int
    width: int                                 # D
    vocab: int                                 # V
    needs_grad: bool = False
    capability: tuple[int, int] | None = None  # CUDA compute capability
    sm_count: int = 0
    aligned: bool = True                       # both operands 16-byte aligned (after the launcher's .contiguous())
    interpret: bool = INTERPRET                # Triton's interpreter runs the kernels (TRITON_INTERPRET=1)

    @classmethod
    def of(cls, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> HeadFacts:
        """The facts of one call (hidden [B,S,D], weight [V,D]; grad mode decides ``needs_grad``)."""
        B, S, D = hidden.shape
        cap, sms = _gpu_facts(hidden.device.index or 0) if hidden.device.type == "cuda" else (None, 0)
        return cls(hidden.device.type, hidden.dtype, B, S, D, weight.shape[0], needs_grad(hidden, weight, bias),
                   cap, sms, _aligned(hidden) and _aligned(weight))


@dataclass(frozen=True)
class SpartonPlan(Plan):
    """The forward that runs (one of ``VARIANTS``), why, and what computes the gradient."""

    variant: str
    reason: str
    backward: str

    def title(self) -> str:
        return "sparton head plan"

    def plan_steps(self) -> tuple[Step, ...]:
        return Step("forward", self.variant, self.reason), Step("backward", self.backward)


@functools.lru_cache(maxsize=None)
def _gpu_facts(index: int) -> tuple[tuple[int, int], int]:
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), props.multi_processor_count


def _aligned(t: torch.Tensor) -> bool:
    return not t.is_contiguous() or t.data_ptr() % 16 == 0  # a contiguous copy is allocator-aligned


def _backward(variant: str, facts: HeadFacts) -> str:
    if not facts.needs_grad:
        return "none (inference)"
    return "torch autograd" if variant == "torch" else "triton, from the saved argmax (bwd)"


def plan_head(facts: HeadFacts, *, backend: str = "auto", variant: str = "auto", packed: bool = False,
              min_waves: int = RESIDENT_MIN_WAVES, failed: dict[str, str] | None = None) -> SpartonPlan:
    """Choose the forward for ``facts``. ``backend``: "auto" (Triton on CUDA, the CPU tiled head for CPU inference,
    the twin otherwise), "triton", "torch". ``variant``: "auto" or one of ``VARIANTS`` (forced). ``packed``: auto may
    pick the packed head for inference where packing pays. ``failed``: variants that failed in this process, with
    why (auto avoids them)."""
    if variant != "auto":
        return _forced(facts, backend, variant)
    if not use_triton(backend, torch.device(facts.device)):
        if backend == "auto" and facts.device == "cpu" and not facts.needs_grad:
            return SpartonPlan("cpu_tiled", "CPU inference: vocabulary x token tiles, [B, S, V] never built",
                               _backward("cpu_tiled", facts))
        why = ("backend='torch'" if backend == "torch" else
               "a gradient is needed and the CPU tiled head has none" if facts.device == "cpu" else
               "triton is not installed" if triton is None else f"no Triton kernels on {facts.device}")
        return SpartonPlan("torch", why, _backward("torch", facts))
    if packed and not facts.needs_grad and packing_pays(facts.seq):
        return SpartonPlan("packed", f"inference at width {facts.seq}: real tokens fill at most {PACK_MAX_FILL:.0%} "
                           "of the padded kernel's token tiles", _backward("packed", facts))
    if not autotunes(facts.batch, facts.seq, facts.vocab, interpret=facts.interpret):
        small = "Triton's interpreter" if facts.interpret else f"B·S·V below {AUTOTUNE_MIN_ELEMENTS}"
        return SpartonPlan("padded", f"{small}: one launch with a fixed config", _backward("padded", facts))
    why_not = _why_not_resident(facts, min_waves, failed or {})
    if why_not is not None:
        return SpartonPlan("padded", f"autotuned tl kernel; resident kernel off: {why_not}", _backward("padded", facts))
    tiles = -(-facts.vocab // fwd_resident.BLOCK_V)
    return SpartonPlan("resident", f"sm_90 {str(facts.dtype).removeprefix('torch.')}, {tiles} vocabulary tiles fill "
                       f">= {min_waves} waves of {facts.sm_count} SMs (experimental Gluon kernel; rows with holes run "
                       "the tl kernel)", _backward("resident", facts))


def _why_not_resident(facts: HeadFacts, min_waves: int, failed: dict[str, str]) -> str | None:
    if "resident" in failed:
        return f"it failed earlier in this process ({failed['resident']})"
    reason = fwd_resident.unsupported_reason(facts.capability, facts.dtype, facts.width, facts.aligned)
    if reason is not None:
        return reason
    tiles = -(-facts.vocab // fwd_resident.BLOCK_V)
    if tiles < min_waves * facts.sm_count:
        return (f"{tiles} vocabulary tiles are {tiles / max(facts.sm_count, 1):.1f} waves of {facts.sm_count} SMs, "
                f"under {min_waves}: the last wave's idle SMs cost what the resident tile saves")
    return None


def _forced(facts: HeadFacts, backend: str, variant: str) -> SpartonPlan:
    """The plan for ``variant=`` (raises where it cannot run these inputs)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be 'auto' or one of {', '.join(VARIANTS)}; got {variant!r}")
    if backend not in KERNEL_IMPLS:
        raise ValueError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    if variant in _TRITON_VARIANTS:
        if backend == "torch":
            raise ValueError(f"variant={variant!r} is a Triton kernel; it cannot run with backend='torch'")
        use_triton("triton", torch.device(facts.device))  # raises where Triton cannot run
    elif backend == "triton":
        raise ValueError(f"variant={variant!r} is a torch implementation; it cannot run with backend='triton'")
    if variant in _INFERENCE_ONLY and facts.needs_grad:
        raise ValueError(f"variant={variant!r} is inference-only; call it under torch.no_grad() or use 'padded'/'torch'")
    if variant == "resident":
        why_not = fwd_resident.unsupported_reason(facts.capability, facts.dtype, facts.width, facts.aligned)
        if why_not is None and not autotunes(facts.batch, facts.seq, facts.vocab, interpret=facts.interpret):
            why_not = f"the padded launcher splits rows only from B·S·V = {AUTOTUNE_MIN_ELEMENTS}"
        if why_not is not None:
            raise ValueError(f"variant='resident' cannot run these inputs: {why_not}")
    return SpartonPlan(variant, f"forced by variant={variant!r}", _backward(variant, facts))


class SpartonDispatch:
    """Plans and runs the head's forwards; remembers a resident kernel that failed to compile (``resident_failed``,
    ``failed``) and counts the variants it ran (``runs``).

    Args:
        min_waves: the resident kernel needs at least this many waves of vocabulary tiles per SM.
        resident_forward: the resident rows' forward (default ``fwd_resident.resident_fwd``); a stand-in lets
            tests drive the fallback without a Hopper GPU.
        resident_failed: where the resident kernel's failure is remembered (default: a memory of this dispatch's
            own; ``DEFAULT_DISPATCH`` uses the process's ``RESIDENT_FAILED``, which ``lsr doctor`` lists).
    """

    def __init__(self, *, min_waves: int = RESIDENT_MIN_WAVES, resident_forward: Callable[..., None] | None = None,
                 resident_failed: FailureMemory | None = None) -> None:
        self.min_waves = min_waves
        self.resident_failed = resident_failed or FailureMemory(RESIDENT_FAILED.name, *_RESIDENT)
        self.runs: Counter[str] = Counter()  # variant -> calls planned with it (what ran, for reports and tests)
        self._resident_forward = resident_forward or fwd_resident.resident_fwd

    @property
    def failed(self) -> dict[str, str]:
        """Variant -> why it failed in this process (what ``plan_head`` avoids)."""
        why = self.resident_failed.why
        return {} if why is None else {"resident": why}

    def plan(self, facts: HeadFacts, *, backend: str = "auto", variant: str = "auto",
             packed: bool = False) -> SpartonPlan:
        """``plan_head`` with this dispatch's wave rule and failures."""
        return plan_head(facts, backend=backend, variant=variant, packed=packed, min_waves=self.min_waves,
                         failed=self.failed)

    def resident_rows(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      lengths: torch.Tensor, rows_ok: torch.Tensor, y: torch.Tensor, y32: torch.Tensor | None,
                      arg: torch.Tensor | None) -> bool:
        """``fwd_padded.RowsForward`` through the resident kernel: True when it wrote the rows; False (the tl kernel
        writes them) once it has failed, which it remembers and warns about once."""
        if self.resident_failed.failed:
            return False
        try:
            self._resident_forward(hidden, weight, bias, lengths, rows_ok, y, y32, arg)
            return True
        except Exception as e:  # noqa: BLE001 - Gluon is experimental: an API change must not break the head
            self.resident_failed.record(e, stacklevel=3)
            return False

    def head(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mask: torch.Tensor | None,
             *, backend: str = "auto", deterministic: bool = False, variant: str = "auto",
             packed: bool = False) -> torch.Tensor:
        """``sparton_head`` through this dispatch."""
        hidden, weight = _autocast_inputs(hidden, weight)
        plan = self.plan(HeadFacts.of(hidden, weight, bias), backend=backend, variant=variant, packed=packed)
        self.runs[plan.variant] += 1
        if plan.variant in ("torch", "cpu_tiled"):
            with torch.autocast(hidden.device.type, enabled=False):
                run = cpu_sparton_head if plan.variant == "cpu_tiled" else torch_sparton_head
                return run(hidden, weight, bias, mask)
        mask = check_head_args(hidden, weight, bias, mask)
        if plan.variant == "packed":
            return triton_packed_sparton_fwd(hidden, weight, bias, mask)
        rows = self.resident_rows if plan.variant == "resident" else None
        if not needs_grad(hidden, weight, bias):  # inference: no fp32 copy of y, no autograd node
            return triton_sparton_fwd(hidden, weight, bias, mask, need_argmax=False, rows_without_holes=rows)[0]
        return SpartonHeadFunction.apply(hidden, weight, bias, mask, deterministic, rows)


def _autocast_inputs(hidden: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Under autocast the head is a matmul: it runs in the autocast dtype; weight follows hidden's dtype (a
    differentiable cast; the kernels want one input dtype)."""
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        hidden, weight = hidden.to(dt), weight.to(dt)
    return hidden, weight if weight.dtype == hidden.dtype else weight.to(hidden.dtype)


DEFAULT_DISPATCH = SpartonDispatch(resident_failed=RESIDENT_FAILED)


def sparton_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 mask: torch.Tensor | None = None, backend: str = "auto", deterministic: bool = False, *,
                 variant: str = "auto", packed: bool = False) -> torch.Tensor:
    """SPLADE max-pooled head without building [B, S, V]; differentiable w.r.t. hidden, weight, bias.

    hidden [B,S,D] (bf16/fp16/fp32), weight [V,D], bias [V] | None, mask [B,S] (bool/int) -> [B,V]
    in hidden's dtype (under autocast: the autocast dtype), computed with float32 accumulation.
    ``backend``: "auto" (Triton on CUDA; on the CPU the tiled head for inference and the torch twin when a
    gradient is needed), "triton", "torch" (the twin). ``variant``: force one forward (see ``VARIANTS`` and
    ``explain_sparton_head``). ``packed``: inference may pack the real tokens where that pays (same values up to
    the GEMM's summation order). ``deterministic=True`` makes the Triton backward bit-identical run to run.
    """
    return DEFAULT_DISPATCH.head(hidden, weight, bias, mask, backend=backend, deterministic=deterministic,
                                 variant=variant, packed=packed)


def explain_sparton_head(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                         backend: str = "auto", variant: str = "auto", packed: bool = False) -> SpartonPlan:
    """The plan ``sparton_head`` would follow for these inputs (printable: variant, reason, backward)."""
    hidden, weight = _autocast_inputs(hidden, weight)
    return DEFAULT_DISPATCH.plan(HeadFacts.of(hidden, weight, bias), backend=backend, variant=variant, packed=packed)


def packed_tokens_sparton_head(tokens: torch.Tensor, segments: torch.Tensor, n_texts: int, weight: torch.Tensor,
                               bias: torch.Tensor | None = None, backend: str = "auto") -> torch.Tensor:
    """Inference-only SPLADE head on tokens packed back to back (e.g. by a padding-free backbone).

    tokens [T,D], segments int [T] (text of each token, non-decreasing), n_texts B, weight [V,D], bias
    [V] | None -> [B,V] in tokens' dtype: y[b] = log1p(relu(max over b's tokens of tokens·Eᵀ + bias)),
    0 for a text without tokens. ``backend``: "auto" (``fwd_packed`` on CUDA, the torch twin elsewhere),
    "triton", "torch". (The tokens are packed already: the packed kernel or its twin is the only choice.)
    """
    refuse_grad(tokens, weight, bias)
    if not use_triton(backend, tokens.device):
        return torch_packed_tokens_head(tokens, segments, n_texts, weight, bias)
    return triton_packed_tokens_fwd(tokens, segments, n_texts, weight.to(tokens.dtype), bias)
