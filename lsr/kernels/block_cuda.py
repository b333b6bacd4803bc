"""Block scorer in CUDA C++ with shared-memory tiles: the fast exact path at scale.

Same contract as ``lsr.kernels.block.triton_block_candidates`` (group = 1) and the same torch twin,
``torch_block_candidates``; the outputs are bit-identical. Why a CUDA kernel next to the Triton one:
Triton cannot address shared memory, so its scratch tile lives in L2 and every add is an L2 atomic
(~42 G adds/s on an H200: 2.2K QPS at 8.8M docs). Here a CTA accumulates one (query, span of SPAN
docs) item in shared memory (docs/notes-search.md has the measurements behind each choice):

* the item's run table (per query term: its postings for the span, query weight x scale, and a
  prefix sum of its 128-posting steps) is filled in shared memory; the warps split the steps into
  contiguous ranges, so a CTA stays balanced whatever the run lengths;
* a step reads 128 postings as 16-byte vectors (4 per lane, from a 16-byte aligned start; out-of-run
  positions are masked), U steps' loads in flight per warp;
* sums are lsr.kernels.fixed's int64 fixed point (exact, order-independent), kept as three 24-bit limbs
  in uint32 cells so that every add is a native 32-bit shared atomic (a 64-bit shared atomicAdd is a
  compare-and-swap loop: 2x slower here); a cell takes at most one add per query term, so 256 terms
  between normalisations cannot overflow a limb;
* the read-out converts a row of 64 docs only if one of them can reach theta (an integer bound on the
  fixed-point sum), and writes either every 32-doc row's best key (``theta is None``) or the docs >=
  theta into CAP slots in ascending doc order + a count (lsr.kernels.topk's contract);
* CTAs take items in order from a global counter (the next one is claimed while this one is scored).
  Items are span-major, so the CTAs work on one or two spans at a time and the span's postings are
  read from HBM once and from L2 by every query of the batch (a fixed item stride let slow CTAs drift
  many spans apart: 50 GB of HBM reads per 500-query batch instead of 7.5 GB).

Compiled at first use with NVRTC (``torch.cuda._compile_kernel``, no nvcc or build step needed);
``usable()`` says whether it serves a given index here, and lsr.search_triton falls back to the Triton
kernel when it does not. Not runnable under TRITON_INTERPRET: CPU CI tests the twin and the Triton
kernel, the ``gpu`` tests compare this one with the twin bit for bit.
"""

from __future__ import annotations

import functools

import torch

from lsr.kernels.block import check_block_args
from lsr.kernels.topk import ROW

__all__ = ["MAX_SPAN", "SPAN", "available", "cuda_block_candidates", "programs_per_sm", "usable"]

_SOURCE = r"""
typedef long long i64;
typedef unsigned long long u64;
#define FULL 0xffffffffu
#define NT (WARPS * 32)
#define RPW (SPAN / 64 / WARPS)   // read-out rows of 64 docs per warp

__device__ __forceinline__ i64 pack_key(float s, i64 doc) {
    // lsr.kernels.topk.pack_key: bits(score) << 31 | (2^31 - 1 - doc); -1 for scores <= 0
    return s > 0.f ? (((i64)__float_as_int(s)) << 31) | (0x7fffffffLL - doc) : -1LL;
}

// the int64 sums of cells 2i and 2i + 1 from their limbs (limb sums may exceed 24 bits: shifts add them)
__device__ __forceinline__ longlong2 peek(const unsigned* h, const unsigned* m, const unsigned* l, int i) {
    const uint2 a = reinterpret_cast<const uint2*>(h)[i], b = reinterpret_cast<const uint2*>(m)[i],
                c = reinterpret_cast<const uint2*>(l)[i];
    return make_longlong2(((i64)a.x << 48) + ((i64)b.x << 24) + (i64)c.x, ((i64)a.y << 48) + ((i64)b.y << 24) + (i64)c.y);
}

__device__ __forceinline__ longlong2 take(unsigned* h, unsigned* m, unsigned* l, int i) {   // read and zero
    const longlong2 v = peek(h, m, l, i);
    reinterpret_cast<uint2*>(h)[i] = make_uint2(0u, 0u);
    reinterpret_cast<uint2*>(m)[i] = make_uint2(0u, 0u);
    reinterpret_cast<uint2*>(l)[i] = make_uint2(0u, 0u);
    return v;
}

extern "C" __global__ void __launch_bounds__(NT)
lsr_block_scores(const int* __restrict__ post_doc, const float* __restrict__ post_w,
                 const i64* __restrict__ span_off, int stride_so,
                 const i64* __restrict__ q_indptr, const int* __restrict__ q_terms,
                 const float* __restrict__ q_w, const double* __restrict__ scale,
                 const double* __restrict__ inv_scale, const float* __restrict__ theta,
                 const int* __restrict__ item_q, const int* __restrict__ item_span,
                 const i64* __restrict__ item_out, int n_items,
                 i64* __restrict__ out, int* __restrict__ counts, int* __restrict__ next_item)
{
    // the int64 sums as three 24-bit limbs in uint32 cells (hi: bits 48.., mid: 24..47, lo: 0..23):
    // native 32-bit shared atomics, no compare-and-swap loop; a cell takes at most one add per query
    // term, so TG <= 256 adds of < 2^24 never overflow a limb between normalisations
    extern __shared__ __align__(16) i64 smem[];
    unsigned* t_hi24 = (unsigned*)smem;
    unsigned* t_mid = t_hi24 + SPAN;
    unsigned* t_low = t_mid + SPAN;
    i64* t_base = (i64*)(t_low + SPAN);        // per run: where its step c reads (base + 128 c)
    i64* t_lo = t_base + TG;                   // run [lo, hi) in the postings
    i64* t_hi = t_lo + TG;
    double* t_wq = (double*)(t_hi + TG);       // query weight * scale
    int* t_cum = (int*)(t_wq + TG);            // inclusive prefix sum of steps per run
    int* w_count = t_cum + TG;                 // hits per warp segment (read-out)
    int* s_item = w_count + WARPS;             // the item this CTA works on
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < 3 * SPAN; i += NT) t_hi24[i] = 0u;
    __syncthreads();
    // items are taken in order from a global counter, so the CTAs work on neighbouring items (one or two
    // spans) at any time and the span's postings stay in L2 for all the queries that read them (a fixed
    // stride lets slow CTAs fall behind by many spans)
    // (the next item is claimed while this one is scored: the counter's latency stays off the path)
    if (tid == 0) *s_item = atomicAdd(next_item, 1);
    __syncthreads();
    for (;;) {
        const int item = *s_item;
        if (item >= n_items) break;
        int next = 0;
        if (tid == 0) next = atomicAdd(next_item, 1);
        const int q = item_q[item];
        const int span = item_span[item];
        const i64 out0 = item_out[item];
        const i64 doc0 = (i64)span * SPAN;
        const i64 qs = q_indptr[q], qe = q_indptr[q + 1];
        const double sc = scale[q];
        for (i64 g = qs; g < qe; g += TG) {
            // ---- the runs of terms g.. in this span, read in 16-byte aligned steps of 128 postings
            for (int i = tid; i < TG; i += NT) {
                i64 rs = 0, re = 0;
                double wqs = 0.0;
                if (g + i < qe) {
                    const i64* so = span_off + (i64)q_terms[g + i] * stride_so + span;
                    rs = so[0];
                    re = so[1];
                    wqs = (double)q_w[g + i] * sc;
                }
                t_base[i] = rs & ~3LL;
                t_lo[i] = rs;
                t_hi[i] = re;
                t_wq[i] = wqs;
                t_cum[i] = re > rs ? (int)((re - (rs & ~3LL) + 127) >> 7) : 0;
            }
            __syncthreads();
            if (warp == 0) {                   // inclusive scan of t_cum: TG / 32 entries per lane
                int run = 0;
                #pragma unroll
                for (int j = 0; j < TG / 32; ++j) run += t_cum[lane * (TG / 32) + j];
                int inc = run;
                #pragma unroll
                for (int d = 1; d < 32; d <<= 1) {
                    const int y = __shfl_up_sync(FULL, inc, d);
                    if (lane >= d) inc += y;
                }
                int acc = inc - run;
                #pragma unroll
                for (int j = 0; j < TG / 32; ++j) {
                    const int n = t_cum[lane * (TG / 32) + j];
                    t_base[lane * (TG / 32) + j] -= (i64)acc * 128;   // step c of the run reads base + 128 c
                    acc += n;
                    t_cum[lane * (TG / 32) + j] = acc;
                }
            }
            __syncthreads();
            // ---- warp w takes a contiguous range of the steps; shared atomics: runs of different terms
            // may hit one doc at the same time (integer adds commute: the sums are exact and deterministic)
            const int total = t_cum[TG - 1];
            const int c_end = (int)((i64)total * (warp + 1) / WARPS);
            int c = (int)((i64)total * warp / WARPS);
            int r = 0;
            {
                int lo = 0, hi = TG - 1;       // first run with t_cum > c
                while (lo < hi) { const int mid = (lo + hi) >> 1; if (t_cum[mid] > c) hi = mid; else lo = mid + 1; }
                r = lo;
            }
            for (; c < c_end; c += U) {
                int4 doc[U];
                float4 w[U];
                double wq[U];
                i64 p0[U], lo[U], hi[U];
                #pragma unroll
                for (int u = 0; u < U; ++u) {        // issue all U steps' loads first
                    const bool ok = c + u < c_end;
                    while (ok && t_cum[r] <= c + u) ++r;
                    p0[u] = t_base[r] + (i64)(c + u) * 128 + 4 * lane;
                    lo[u] = t_lo[r];
                    hi[u] = ok ? t_hi[r] : 0;
                    wq[u] = t_wq[r];
                    if (p0[u] < hi[u]) {
                        doc[u] = __ldg(reinterpret_cast<const int4*>(post_doc + p0[u]));
                        w[u] = __ldg(reinterpret_cast<const float4*>(post_w + p0[u]));
                    } else {
                        doc[u] = make_int4(-1, -1, -1, -1);
                        w[u] = make_float4(0.f, 0.f, 0.f, 0.f);
                    }
                }
                #pragma unroll
                for (int u = 0; u < U; ++u) {
                    const int dd[4] = {doc[u].x, doc[u].y, doc[u].z, doc[u].w};
                    const float ww[4] = {w[u].x, w[u].y, w[u].z, w[u].w};
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const i64 p = p0[u] + e;
                        if (dd[e] >= 0 && p >= lo[u] && p < hi[u]) {
                            const u64 v = (u64)(i64)((double)ww[e] * wq[u]);
                            const int cell = dd[e] - (int)doc0;
                            atomicAdd(t_low + cell, (unsigned)(v & 0xffffffu));
                            atomicAdd(t_mid + cell, (unsigned)((v >> 24) & 0xffffffu));
                            if (v >> 48) atomicAdd(t_hi24 + cell, (unsigned)(v >> 48));
                        }
                    }
                }
            }
            __syncthreads();                   // all adds land; the run table may be refilled
            if (g + TG < qe) {                 // more terms follow: carry the limbs (keeps them < 2^25)
                for (int i = tid; i < SPAN; i += NT) {
                    const unsigned l = t_low[i], m = t_mid[i] + (l >> 24);
                    t_low[i] = l & 0xffffffu;
                    t_mid[i] = m & 0xffffffu;
                    t_hi24[i] += m >> 24;
                }
                __syncthreads();
            }
        }
        // ---- read out (and zero) the tile: warp w owns rows [w R, (w + 1) R) of 64 docs (2 per lane)
        const double inv = inv_scale[q];
        const int R = SPAN / 64 / WARPS;
#if ROWMAX
        for (int j = warp * R; j < (warp + 1) * R; ++j) {
            const longlong2 a = take(t_hi24, t_mid, t_low, j * 32 + lane);
            const i64 d = doc0 + j * 64 + 2 * lane;
            i64 best = max(pack_key((float)((double)a.x * inv), d), pack_key((float)((double)a.y * inv), d + 1));
            #pragma unroll
            for (int m = 8; m > 0; m >>= 1) best = max(best, __shfl_xor_sync(FULL, best, m));  // 16 lanes = 32 docs
            if ((lane & 15) == 0) out[out0 + 2 * j + (lane >> 4)] = best;
        }
#else
        // acc < alo implies score < theta (scores are monotone in acc): most rows skip the conversion.
        // Hits are counted per warp, then written after the hits of the warps before it, so the slots
        // hold the first CAP hits in ascending doc order whatever the warp timing.
        const float th = theta[q];
        const double lim = (double)nextafterf(th, 0.f) * sc * (1.0 - 0x1p-50);
        const i64 alo = th > 0.f ? (lim >= 0x1p62 ? 0x7fffffffffffffffLL : max((i64)lim, 1LL)) : 1LL;
        const unsigned below = (1u << lane) - 1u;
        int n_hit = 0;
#if RPW <= 8
        // one pass over the tile: each warp keeps its rows' hit masks and scores in registers
        unsigned hm0[RPW], hm1[RPW];
        float hs0[RPW], hs1[RPW];
        #pragma unroll
        for (int jj = 0; jj < RPW; ++jj) {
            const longlong2 a = take(t_hi24, t_mid, t_low, (warp * RPW + jj) * 32 + lane);
            hm0[jj] = hm1[jj] = 0u;
            hs0[jj] = hs1[jj] = 0.f;
            if (__any_sync(FULL, a.x >= alo || a.y >= alo)) {
                hs0[jj] = (float)((double)a.x * inv);
                hs1[jj] = (float)((double)a.y * inv);
                hm0[jj] = __ballot_sync(FULL, hs0[jj] > 0.f && hs0[jj] >= th);
                hm1[jj] = __ballot_sync(FULL, hs1[jj] > 0.f && hs1[jj] >= th);
                n_hit += __popc(hm0[jj]) + __popc(hm1[jj]);
            }
        }
        if (lane == 0) w_count[warp] = n_hit;
        __syncthreads();
        int base = 0, all = 0;
        for (int v = 0; v < WARPS; ++v) { base += v < warp ? w_count[v] : 0; all += w_count[v]; }
        #pragma unroll
        for (int jj = 0; jj < RPW; ++jj) {
            if (base < CAP && (hm0[jj] | hm1[jj])) {
                const bool h0 = (hm0[jj] >> lane) & 1u, h1 = (hm1[jj] >> lane) & 1u;
                const int slot = base + __popc(hm0[jj] & below) + __popc(hm1[jj] & below);
                const i64 d = doc0 + (warp * RPW + jj) * 64 + 2 * lane;
                if (h0 && slot < CAP) out[out0 + slot] = pack_key(hs0[jj], d);
                if (h1 && slot + h0 < CAP) out[out0 + slot + h0] = pack_key(hs1[jj], d + 1);
                base += __popc(hm0[jj]) + __popc(hm1[jj]);
            }
        }
#else
        // many rows per warp: count first, then read again to write (registers would spill)
        for (int j = warp * R; j < (warp + 1) * R; ++j) {
            const longlong2 a = peek(t_hi24, t_mid, t_low, j * 32 + lane);
            if (__any_sync(FULL, a.x >= alo || a.y >= alo)) {
                const float s0 = (float)((double)a.x * inv), s1 = (float)((double)a.y * inv);
                n_hit += __popc(__ballot_sync(FULL, s0 > 0.f && s0 >= th)) + __popc(__ballot_sync(FULL, s1 > 0.f && s1 >= th));
            }
        }
        if (lane == 0) w_count[warp] = n_hit;
        __syncthreads();
        int base = 0, all = 0;
        for (int v = 0; v < WARPS; ++v) { base += v < warp ? w_count[v] : 0; all += w_count[v]; }
        for (int j = warp * R; j < (warp + 1) * R; ++j) {
            const longlong2 a = take(t_hi24, t_mid, t_low, j * 32 + lane);
            if (base < CAP && __any_sync(FULL, a.x >= alo || a.y >= alo)) {
                const float s0 = (float)((double)a.x * inv), s1 = (float)((double)a.y * inv);
                const bool h0 = s0 > 0.f && s0 >= th, h1 = s1 > 0.f && s1 >= th;
                const unsigned m0 = __ballot_sync(FULL, h0), m1 = __ballot_sync(FULL, h1);
                const int slot = base + __popc(m0 & below) + __popc(m1 & below);
                const i64 d = doc0 + j * 64 + 2 * lane;
                if (h0 && slot < CAP) out[out0 + slot] = pack_key(s0, d);
                if (h1 && slot + h0 < CAP) out[out0 + slot + h0] = pack_key(s1, d + 1);
                base += __popc(m0) + __popc(m1);
            }
        }
#endif
        if (tid == 0) counts[out0 / CAP] = all;
#endif
        __syncthreads();                       // zeros, w_count and s_item reads finish before the next item
        if (tid == 0) *s_item = next;
        __syncthreads();
    }
}
"""

WARPS = 16         # warps per CTA, sharing one tile
STEP = 2           # steps of 128 postings whose loads are issued together (U): loads in flight per warp
TERMS = 256        # query terms per run table fill (longer queries take several)
SPAN = 8192        # docs per work item: the limb tiles take 96 KB, 2 CTAs per H200 SM
MAX_SPAN = 16384   # 192 KB of tiles


@functools.cache
def _kernel(span: int, cap: int, rowmax: bool, warps: int, step: int, terms: int):
    if terms > 256 or terms % 32:
        raise ValueError("run tables hold a multiple of 32 terms, at most 256 (the limb headroom)")
    defines = f"#define SPAN {span}\n#define CAP {cap}\n#define ROWMAX {int(rowmax)}\n" \
              f"#define WARPS {warps}\n#define U {step}\n#define TG {terms}\n"
    kern = torch.cuda._compile_kernel(defines + _SOURCE, "lsr_block_scores")
    kern.set_shared_memory_config(_smem(span, warps, terms))
    return kern


def _smem(span: int, warps: int, terms: int) -> int:
    return span * 12 + terms * 36 + warps * 4 + 16   # limb tiles, run table, per-warp counts, item


@functools.cache
def available(device_index: int = 0) -> bool:
    """True when the kernel compiles and runs here (a CUDA device, NVRTC, torch.cuda._compile_kernel)."""
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "_compile_kernel"):
        return False
    try:
        with torch.cuda.device(device_index):
            _kernel(64 * WARPS, 8, False, WARPS, STEP, TERMS)
        return True
    except Exception:  # noqa: BLE001 - no NVRTC / driver too old: the Triton kernel takes over
        return False


def usable(post_doc: torch.Tensor, post_w: torch.Tensor, span: int, warps: int = WARPS) -> bool:
    """Whether this kernel can serve these postings and span (else use the Triton kernel)."""
    return (post_doc.is_cuda and 64 * warps <= span <= MAX_SPAN and post_doc.numel() % 4 == 0
            and post_doc.data_ptr() % 16 == 0 and post_w.data_ptr() % 16 == 0
            and available(post_doc.device.index or 0))


@functools.cache
def programs_per_sm(span: int, warps: int = WARPS, device_index: int = 0) -> int:
    """CTAs that fit on one SM by shared memory (the persistent grid is SMs x this)."""
    props = torch.cuda.get_device_properties(device_index)
    per_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    return max(1, per_sm // (_smem(span, warps, TERMS) + 1024))   # 1 KB per CTA is reserved by the driver


def cuda_block_candidates(post_doc: torch.Tensor, post_w: torch.Tensor, span_off: torch.Tensor,
                          q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                          scale: torch.Tensor, inv_scale: torch.Tensor, span: int,
                          items: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], out_size: int, *,
                          theta: torch.Tensor | None = None, cap: int = 32, group: int = 1,
                          warps: int = WARPS, step: int = STEP, **_: object
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shared-memory block scorer over work items; emits candidate keys.

    Args: as ``lsr.kernels.block.triton_block_candidates`` (group must be 1; its Triton tuning
        arguments are accepted and ignored), plus
        warps: warps per CTA; step: steps of 128 postings loaded together.
        span: docs per span, a power of two in [64 * warps, 16384] (span * 12 bytes of limb tiles in
            shared memory per CTA).
    Returns:
        (keys int64 [out_size], counts int32 [out_size // cap] or None); unwritten slots hold -1.
    """
    dev = post_doc.device
    item_q, item_span, item_out, _ = items
    if group != 1:
        raise ValueError("the CUDA block kernel takes one query per work item (group=1)")
    if dev.type != "cuda":
        raise RuntimeError("the CUDA block kernel needs CUDA tensors")
    if span < 64 * warps or span > MAX_SPAN or span & (span - 1) or warps & (warps - 1) or warps > 32:
        raise ValueError(f"span must be a power of two in [64 * warps, {MAX_SPAN}] (warps a power of two <= 32), "
                         f"got span {span}, warps {warps}")
    if post_doc.numel() % 4 or post_doc.data_ptr() % 16 or post_w.data_ptr() % 16:
        raise ValueError("postings must be 16-byte aligned with a length divisible by 4 (the index pads to 32)")
    B = check_block_args(post_doc, post_w, span_off, q_indptr, q_terms, q_weights, scale, inv_scale, items, theta)
    rowmax = theta is None
    out = torch.full((out_size,), -1, dtype=torch.int64, device=dev)
    counts = None if rowmax else torch.zeros(out_size // cap, dtype=torch.int32, device=dev)
    n_items = item_q.numel()
    if n_items == 0 or B == 0:
        return out, counts
    if n_items >= 1 << 31 or span_off.stride(0) >= 1 << 31:
        raise ValueError("too many work items for one launch (split the queries)")
    width = span // ROW if rowmax else cap
    n_cta = min(n_items, torch.cuda.get_device_properties(dev).multi_processor_count  # a CTA per item
                * programs_per_sm(span, warps, dev.index or 0))
    kern = _kernel(span, width, rowmax, warps, step, TERMS)
    with torch.cuda.device(dev):
        kern(grid=(n_cta, 1, 1), block=(32 * warps, 1, 1), shared_mem=_smem(span, warps, TERMS),
             args=[post_doc, post_w, span_off, span_off.stride(0), q_indptr, q_terms, q_weights, scale,
                   inv_scale, scale if rowmax else theta, item_q, item_span, item_out, n_items, out,
                   out if rowmax else counts, torch.zeros(1, dtype=torch.int32, device=dev)])
    return out, counts
