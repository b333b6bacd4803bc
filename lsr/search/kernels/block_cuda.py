"""Block scorer in CUDA C++ with shared-memory tiles: the fast exact path at scale.

Same contract as ``lsr.search.kernels.block.triton_block_candidates`` (group = 1) and the same torch twin,
``torch_block_candidates``; the outputs are bit-identical. Why a CUDA kernel next to the Triton one:
Triton cannot address shared memory, so its scratch tile lives in L2 and every add is an L2 atomic
(a rate that caps it near the seed's scatter: docs/performance/search.md). Here a CTA accumulates one (query, span of SPAN
docs) item in shared memory (docs/performance/search.md has the measurements behind each choice):

* the item's run table (per query term: its postings for the span, query weight x scale, and a
  prefix sum of its 128-posting steps) is filled in shared memory; the warps split the steps into
  contiguous ranges, so a CTA stays balanced whatever the run lengths;
* a step reads 128 postings as 16-byte vectors (4 per lane, from a 16-byte aligned start; out-of-run
  positions are masked; compact postings, lsr.index.compact: 8 per lane, 256 per step, decoded in
  registers, source macro WEIGHT); a warp keeps its run in registers and issues the next step's loads
  before this step's adds (two steps in flight);
* sums are lsr.search.kernels.fixed's int64 fixed point (exact, order-independent), kept as three 24-bit limbs
  in uint32 cells so that every add is a native 32-bit shared atomic (a 64-bit shared atomicAdd is a
  compare-and-swap loop, slower here); a cell takes at most one add per query term, so 256 terms
  between normalisations cannot overflow a limb;
* coarse mode (the block path's passes for batches): a 16-bit half of a uint32 word per doc sums
  floor(c / 2^45) of each contribution c (< 2^16 in all: no carry into the other half), computed exactly in
  float32 (block_scores.cu says why), one shared atomic per posting; the kernel then fits 40 registers and
  runs 3 CTAs of 16 warps per SM on 32,768-doc spans (the three-limb passes: 2, on 8,192);
* the read-out converts a row of 64 docs only if one of them can reach theta (an integer bound on the
  fixed-point sum), and writes either every 32-doc row's best key (``theta is None``) or the docs >=
  theta into CAP slots in ascending doc order + a count (lsr.search.kernels.topk's contract);
* CTAs take items in order from a global counter (the next one is claimed while this one is scored).
  Items are span-major, so the CTAs work on one or two spans at a time and the span's postings are
  read from HBM once and from L2 by every query of the batch (a fixed item stride let slow CTAs drift
  many spans apart and multiplied the HBM reads of a large batch).

Compiled at first use with NVRTC (``torch.cuda._compile_kernel``, no nvcc or build step needed);
``usable()`` says whether it serves a given index here, and lsr.search.plan takes the Triton kernel when it
does not. Not runnable under TRITON_INTERPRET: CPU CI tests the twin and the Triton
kernel, the ``gpu`` tests compare this one with the twin bit for bit.
"""

from __future__ import annotations

import functools

import torch

from lsr.search.kernels import cuda_source
from lsr.search.kernels.block import check_block_args
from lsr.search.kernels.coarse import COARSE_KEY_SHIFT, COARSE_SHIFT
from lsr.search.kernels.topk import ROW

__all__ = ["MAX_COARSE_SPAN", "MAX_SPAN", "SPAN", "available", "compiled_variants", "cuda_block_candidates",
           "max_coarse_span", "programs_per_sm", "usable"]

_SOURCE = cuda_source("block_scores.cu")

WARPS = 16         # warps per CTA, sharing one tile
TERMS = 128        # query terms per run table fill (longer queries take several; small: a short per-item set-up)
SPAN = 8192        # docs per work item: the limb tiles take 96 KB, 2 CTAs per SM of 228 KB
MAX_SPAN = 16384   # 192 KB of tiles
MAX_COARSE_SPAN = 65536   # coarse mode: 2 bytes of tile a doc (128 KB)
COARSE_ROW = 128   # docs per coarse read-out row (block_scores.cu RROW); a coarse span holds one per warp at least


_WEIGHT_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}   # the source's WEIGHT: the posting layout


def _postings_per_load(post_w: torch.Tensor) -> int:
    """Postings in one 16-byte load: 4 (float32 postings) or 8 (compact postings, lsr.index.compact)."""
    return 16 // post_w.element_size()


def max_coarse_span(warps: int) -> int:
    """The largest span the coarse read-out takes with ``warps`` warps: it notes <= 64 rows of 128 docs a warp."""
    return min(MAX_COARSE_SPAN, COARSE_ROW * 64 * warps)


def _min_ctas(warps: int, coarse: bool) -> int:
    """CTAs per SM the kernel is compiled for (``__launch_bounds__``; at most 2048 threads an SM): 48 warps for
    the coarse passes (3 CTAs of 16 warps: its float32 adds fit 40 registers, and a third CTA hides the others'
    stalls; docs/performance/search.md), 2 CTAs for the three-limb passes (64 registers)."""
    return max(1, min(48 // warps if coarse else 2, 64 // warps, 32))   # 32: the most CTAs an SM holds


@functools.cache
def _kernel(span: int, cap: int, rowmax: bool, warps: int, terms: int, coarse: bool = False, weight: int = 0,
            device_index: int = 0):
    """The kernel variant compiled on one device: a loaded module belongs to the GPU it was loaded on (launched on
    another it fails with "invalid resource handle"), so each GPU of a process gets its own."""
    if terms > 256 or terms % 32:
        raise ValueError("run tables hold a multiple of 32 terms, at most 256 (the limb headroom)")
    defines = f"#define SPAN {span}\n#define CAP {cap}\n#define ROWMAX {int(rowmax)}\n#define COARSE {int(coarse)}\n" \
              f"#define CSHIFT {COARSE_SHIFT}\n#define KSHIFT {COARSE_KEY_SHIFT}\n" \
              f"#define LIMBS {1 if coarse else 3}\n#define WARPS {warps}\n" \
              f"#define TG {terms}\n#define WEIGHT {weight}\n#define MIN_CTAS {_min_ctas(warps, coarse)}\n"
    with torch.cuda.device(device_index):
        kern = torch.cuda._compile_kernel(defines + _SOURCE, "lsr_block_scores")
        kern.set_shared_memory_config(_smem(span, warps, terms, coarse))
    return kern


def compiled_variants() -> int:
    """Variants of the kernel compiled in this process (each NVRTC compile stalls its first search)."""
    return _kernel.cache_info().currsize


def _smem(span: int, warps: int, terms: int, coarse: bool = False) -> int:
    # sum tiles (three limbs, or a 16-bit coarse sum), run table, per-warp counts, item
    return span * (2 if coarse else 12) + terms * 28 + warps * 4 + 16


@functools.cache
def available(device_index: int = 0, weight: int = 0) -> bool:
    """True when the kernel compiles and runs here (a CUDA device, NVRTC, torch.cuda._compile_kernel),
    for the posting layout ``weight`` (0: float32 postings, 1 / 2: compact with bf16 / fp16 weights)."""
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "_compile_kernel"):
        return False
    try:
        _kernel(64 * WARPS, 8, False, WARPS, TERMS, weight=weight, device_index=device_index)
        return True
    except Exception:  # noqa: BLE001 - no NVRTC / driver too old: the Triton kernel takes over
        return False


def usable(post_doc: torch.Tensor, post_w: torch.Tensor, span: int, warps: int = WARPS) -> bool:
    """Whether this kernel can serve these postings (float32 or compact) and span (else use the Triton
    kernel, also when the compact variant does not compile here)."""
    return (post_doc.is_cuda and 64 * warps <= span <= MAX_SPAN and post_w.dtype in _WEIGHT_CODES
            and post_doc.numel() % _postings_per_load(post_w) == 0
            and post_doc.data_ptr() % 16 == 0 and post_w.data_ptr() % 16 == 0
            and available(post_doc.device.index or 0, _WEIGHT_CODES[post_w.dtype]))


@functools.cache
def programs_per_sm(span: int, warps: int = WARPS, device_index: int = 0, coarse: bool = False,
                    terms: int = TERMS) -> int:
    """CTAs that fit on one SM by shared memory and registers (the persistent grid is SMs x this)."""
    props = torch.cuda.get_device_properties(device_index)
    per_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    # compiled for _min_ctas CTAs per SM (registers capped to fit them), else <= 64 registers a thread
    by_regs = max(_min_ctas(warps, coarse), getattr(props, "regs_per_multiprocessor", 65536) // (64 * 32 * warps))
    # 1 KB per CTA is reserved by the driver
    return max(1, min(by_regs, per_sm // (_smem(span, warps, terms, coarse) + 1024)))


def cuda_block_candidates(post_doc: torch.Tensor, post_w: torch.Tensor, span_off: torch.Tensor,
                          q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                          scale: torch.Tensor, inv_scale: torch.Tensor, span: int,
                          items: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], out_size: int, *,
                          theta: torch.Tensor | None = None, cap: int = 32, group: int = 1,
                          warps: int = WARPS, coarse_lo: torch.Tensor | None = None, coarse_rows: bool = False,
                          terms: int = TERMS, **_: object
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shared-memory block scorer over work items; emits candidate keys.

    Args: as ``lsr.search.kernels.block.triton_block_candidates`` (group must be 1; its Triton tuning
        arguments are accepted and ignored; compact postings are read 8 per 16-byte load), plus
        warps: warps per CTA.
        terms: query terms per fill of the shared run table (a multiple of 32, <= 256; longer queries take
            several fills).
        span: docs per span, a power of two in [64 * warps, 16384] (span * 12 bytes of limb tiles in
            shared memory per CTA); coarse modes: in [128 * warps, max_coarse_span(warps)] (span * 2 bytes).
        coarse_lo: int64 [B] or None: coarse mode (lsr.search.kernels.block.torch_block_candidates' contract):
            a 16-bit half of a uint32 word per doc sums (contribution >> COARSE_SHIFT) with one shared
            atomic per posting, and the docs whose coarse sum reaches coarse_lo[q] (clamped to >= 1) are emitted as
            coarse keys into cap slots (+ counts); theta is not used.
        coarse_rows: with theta and coarse_lo None: every 32-doc row's best coarse key (pass 1 on coarse
            sums; ``lsr.search.kernels.coarse.coarse_theta`` turns them into a theta).
    Returns:
        (keys int64 [out_size], counts int32 [out_size // cap] or None); unwritten slots hold -1.
    """
    dev = post_doc.device
    item_q, item_span, item_out, _ = items
    if group != 1:
        raise ValueError("the CUDA block kernel takes one query per work item (group=1)")
    if dev.type != "cuda":
        raise RuntimeError("the CUDA block kernel needs CUDA tensors")
    rowmax = theta is None and coarse_lo is None
    coarse = coarse_lo is not None or (rowmax and coarse_rows)
    lo, hi = (COARSE_ROW * warps, max_coarse_span(warps)) if coarse else (64 * warps, MAX_SPAN)
    if not lo <= span <= hi or span & (span - 1) or warps & (warps - 1) or warps > 32:
        raise ValueError(f"span must be a power of two in [{lo}, {hi}] with {warps} warps "
                         f"({'coarse: ' if coarse else ''}read-out rows of {64 * (1 + coarse)} docs per warp; "
                         f"warps a power of two <= 32), got {span}")
    B = check_block_args(post_doc, post_w, span_off, q_indptr, q_terms, q_weights, scale, inv_scale, items, theta)
    per_load = _postings_per_load(post_w)
    if post_doc.numel() % per_load or post_doc.data_ptr() % 16 or post_w.data_ptr() % 16:
        raise ValueError(f"postings must be 16-byte aligned with a length divisible by {per_load} "
                         "(the index pads to 32)")
    if coarse_lo is not None:   # uint32 in the kernel; a floor >= 2^16 is never reached (coarse sums stay below it)
        coarse_lo = coarse_lo.clamp(1, (1 << 32) - 1).contiguous()
    out = torch.full((out_size,), -1, dtype=torch.int64, device=dev)
    counts = None if rowmax else torch.zeros(out_size // cap, dtype=torch.int32, device=dev)
    n_items = item_q.numel()
    if n_items == 0 or B == 0:
        return out, counts
    if n_items >= 1 << 31 or span_off.stride(0) >= 1 << 31:
        raise ValueError("too many work items for one launch (split the queries)")
    width = span // ROW if rowmax else cap
    n_cta = min(n_items, torch.cuda.get_device_properties(dev).multi_processor_count  # a CTA per item
                * programs_per_sm(span, warps, dev.index or 0, coarse, terms))
    kern = _kernel(span, width, rowmax, warps, terms, coarse, _WEIGHT_CODES[post_w.dtype], dev.index or 0)
    with torch.cuda.device(dev):
        kern(grid=(n_cta, 1, 1), block=(32 * warps, 1, 1), shared_mem=_smem(span, warps, terms, coarse),
             args=[post_doc, post_w, span_off, span_off.stride(0), q_indptr, q_terms, q_weights, scale,
                   inv_scale, theta if theta is not None else scale, coarse_lo if coarse_lo is not None else q_indptr,
                   item_q, item_span, item_out, n_items, out,
                   out if rowmax else counts, torch.zeros(1, dtype=torch.int32, device=dev)])
    return out, counts
