"""Block scorer in CUDA C++ with shared-memory tiles: the fast exact path at scale.

Same contract as ``lsr.search.kernels.block.triton_block_candidates`` (group = 1) and the same torch twin,
``torch_block_candidates``; the outputs are bit-identical. Why a CUDA kernel next to the Triton one:
Triton cannot address shared memory, so its scratch tile lives in L2 and every add is an L2 atomic
(~42 G adds/s on an H200: 2.2K QPS at 8.8M docs). Here a CTA accumulates one (query, span of SPAN
docs) item in shared memory (docs/notes-search.md has the measurements behind each choice):

* the item's run table (per query term: its postings for the span, query weight x scale, and a
  prefix sum of its 128-posting steps) is filled in shared memory; the warps split the steps into
  contiguous ranges, so a CTA stays balanced whatever the run lengths;
* a step reads 128 postings as 16-byte vectors (4 per lane, from a 16-byte aligned start; out-of-run
  positions are masked); a warp keeps its run in registers and issues the next step's loads before
  this step's adds (two steps in flight);
* sums are lsr.search.kernels.fixed's int64 fixed point (exact, order-independent), kept as three 24-bit limbs
  in uint32 cells so that every add is a native 32-bit shared atomic (a 64-bit shared atomicAdd is a
  compare-and-swap loop: 2x slower here); a cell takes at most one add per query term, so 256 terms
  between normalisations cannot overflow a limb;
* the read-out converts a row of 64 docs only if one of them can reach theta (an integer bound on the
  fixed-point sum), and writes either every 32-doc row's best key (``theta is None``) or the docs >=
  theta into CAP slots in ascending doc order + a count (lsr.search.kernels.topk's contract);
* CTAs take items in order from a global counter (the next one is claimed while this one is scored).
  Items are span-major, so the CTAs work on one or two spans at a time and the span's postings are
  read from HBM once and from L2 by every query of the batch (a fixed item stride let slow CTAs drift
  many spans apart: 50 GB of HBM reads per 500-query batch instead of 7.5 GB).

Compiled at first use with NVRTC (``torch.cuda._compile_kernel``, no nvcc or build step needed);
``usable()`` says whether it serves a given index here, and lsr.search.triton_backend falls back to the Triton
kernel when it does not. Not runnable under TRITON_INTERPRET: CPU CI tests the twin and the Triton
kernel, the ``gpu`` tests compare this one with the twin bit for bit.
"""

from __future__ import annotations

import functools

import torch

from lsr.search.kernels.block import COARSE_SHIFT, check_block_args
from lsr.search.kernels.topk import ROW

__all__ = ["MAX_SPAN", "SPAN", "available", "cuda_block_candidates", "programs_per_sm", "usable"]

_SOURCE = r"""
typedef long long i64;
typedef unsigned long long u64;
#define FULL 0xffffffffu
#define NT (WARPS * 32)
#define RPW (SPAN / 64 / WARPS)   // read-out rows of 64 docs per warp

__device__ __forceinline__ i64 pack_key(float s, i64 doc) {
    // lsr.search.kernels.topk.pack_key: bits(score) << 31 | (2^31 - 1 - doc); -1 for scores <= 0
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

extern "C" __global__ void __launch_bounds__(NT, 2)
lsr_block_scores(const int* __restrict__ post_doc, const float* __restrict__ post_w,
                 const i64* __restrict__ span_off, int stride_so,
                 const i64* __restrict__ q_indptr, const int* __restrict__ q_terms,
                 const float* __restrict__ q_w, const double* __restrict__ scale,
                 const double* __restrict__ inv_scale, const float* __restrict__ theta,
                 const long long* __restrict__ coarse_lo,
                 const int* __restrict__ item_q, const int* __restrict__ item_span,
                 const i64* __restrict__ item_out, int n_items,
                 i64* __restrict__ out, int* __restrict__ counts, int* __restrict__ next_item)
{
    // the int64 sums as three 24-bit limbs in uint32 cells (hi: bits 48.., mid: 24..47, lo: 0..23):
    // native 32-bit shared atomics, no compare-and-swap loop; a cell takes at most one add per query
    // term, so TG <= 256 adds of < 2^24 never overflow a limb between normalisations
    // COARSE: one uint32 cell per doc holding the sum of (contribution >> CSHIFT) (< 2^31: no carries)
    extern __shared__ __align__(16) i64 smem[];
    unsigned* t_hi24 = (unsigned*)smem;
    unsigned* t_mid = t_hi24 + SPAN;
    unsigned* t_low = t_mid + SPAN;
    i64* t_base = (i64*)(t_hi24 + LIMBS * SPAN);   // per run: where its step c reads (base + 128 c)
    double* t_wq = (double*)(t_base + TG);     // query weight * scale
    int* t_lo = (int*)(t_wq + TG);             // run [base + lo, base + hi) in the postings
    int* t_hi = t_lo + TG;
    int* t_cum = t_hi + TG;                    // inclusive prefix sum of steps per run
    int* w_count = t_cum + TG;                 // hits per warp segment (read-out)
    int* s_item = w_count + WARPS;             // the item this CTA works on
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int i = tid; i < LIMBS * SPAN; i += NT) t_hi24[i] = 0u;
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
                const i64 a = rs & ~3LL;       // 16-byte aligned start; lo and hi are relative to it
                t_base[i] = a;
                t_lo[i] = (int)(rs - a);
                t_hi[i] = (int)(re - a);
                t_wq[i] = wqs;
                t_cum[i] = re > rs ? (int)((re - a + 127) >> 7) : 0;
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
                    // step c of the run reads base + 128 c: bounds move by the steps before the run
                    t_base[lane * (TG / 32) + j] -= (i64)acc * 128;
                    t_lo[lane * (TG / 32) + j] += acc * 128;
                    t_hi[lane * (TG / 32) + j] += acc * 128;
                    acc += n;
                    t_cum[lane * (TG / 32) + j] = acc;
                }
            }
            __syncthreads();
            // ---- warp w takes a contiguous range of the steps; shared atomics: runs of different terms
            // may hit one doc at the same time (integer adds commute: the sums are exact and deterministic).
            // The step's run is warp-uniform and kept in registers, and the next step's loads are issued
            // before this step's adds.
            const int total = t_cum[TG - 1];
            const int c_end = (int)((i64)total * (warp + 1) / WARPS);
            int c = (int)((i64)total * warp / WARPS);
            if (c < c_end) {
                int r = 0;
                {
                    int lo = 0, hi = TG - 1;   // first run with t_cum > c
                    while (lo < hi) { const int mid = (lo + hi) >> 1; if (t_cum[mid] > c) hi = mid; else lo = mid + 1; }
                    r = lo;
                }
                int bound = t_cum[r], rlo = t_lo[r], rhi = t_hi[r];
                double wq = t_wq[r];
                const int* pd = post_doc + t_base[r];
                const float* pw = post_w + t_base[r];
                // step cc: the lane reads postings x0 .. x0 + 3 of its run (from pd / pw); bit e of the
                // mask: x0 + e lies in the run [rlo, rhi). A lane with nothing to read loads the run's start.
                auto load = [&](int cc, int4& d, float4& w, unsigned& m, double& q) {
                    while (cc >= bound) {      // warp-uniform: the next run
                        ++r;
                        bound = t_cum[r];
                        rlo = t_lo[r];
                        rhi = t_hi[r];
                        wq = t_wq[r];
                        pd = post_doc + t_base[r];
                        pw = post_w + t_base[r];
                    }
                    const int x0 = cc * 128 + 4 * lane;
                    const int a = max(rlo - x0, 0), b = min(rhi - x0, 4);
                    m = b > a ? (1u << b) - (1u << a) : 0u;
                    const int xs = m ? x0 : (rlo & ~3);
                    d = __ldg(reinterpret_cast<const int4*>(pd + xs));
                    w = __ldg(reinterpret_cast<const float4*>(pw + xs));
                    q = wq;
                };
                // postings outside the run (another run's docs) and -1 padding are skipped; the run's own
                // docs lie in the span, so doc % SPAN is their cell. The skip stays a branch: sending idle
                // lanes to a shared cell serialised their atomics (60-80% slower, docs/notes-search.md)
                auto add = [&](const int4& d, const float4& w, unsigned m, double q) {
                    const int dd[4] = {d.x, d.y, d.z, d.w};
                    const float ww[4] = {w.x, w.y, w.z, w.w};
                    #pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const bool ok = (m & (1u << e)) && dd[e] >= 0;
                        const u64 v = (u64)(i64)((double)ww[e] * q);
                        unsigned* cell = t_hi24 + (dd[e] & (SPAN - 1));
                        if (ok) {
#if COARSE
                            atomicAdd(cell, (unsigned)(v >> CSHIFT));
#else
                            atomicAdd(cell, (unsigned)(v >> 48));
                            atomicAdd(cell + SPAN, (unsigned)(v >> 24) & 0xffffffu);
                            atomicAdd(cell + 2 * SPAN, (unsigned)v & 0xffffffu);
#endif
                        }
                    }
                };
                // two steps in flight: the next step's loads are issued before this step's adds
                int4 dA, dB;
                float4 wA, wB;
                unsigned mA, mB;
                double qA, qB;
                load(c, dA, wA, mA, qA);
                for (;; c += 2) {
                    const bool more1 = c + 1 < c_end;
                    if (more1) load(c + 1, dB, wB, mB, qB);
                    add(dA, wA, mA, qA);
                    if (!more1) break;
                    const bool more2 = c + 2 < c_end;
                    if (more2) load(c + 2, dA, wA, mA, qA);
                    add(dB, wB, mB, qB);
                    if (!more2) break;
                }
            }
            __syncthreads();                   // all adds land; the run table may be refilled
            if (!COARSE && g + TG < qe) {      // more terms follow: carry the limbs (keeps them < 2^25)
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
#if COARSE
        // coarse keys (sum << 31 | 2^31 - 1 - doc) of the docs whose coarse sum reaches lo[q], CAP slots
        // in ascending doc order + a count, as below
        const unsigned clo = (unsigned)coarse_lo[q];
        const unsigned below = (1u << lane) - 1u;
        int n_hit = 0;
        for (int j = warp * R; j < (warp + 1) * R; ++j) {
            const uint2 a = reinterpret_cast<const uint2*>(t_hi24)[j * 32 + lane];
            n_hit += __popc(__ballot_sync(FULL, a.x >= clo)) + __popc(__ballot_sync(FULL, a.y >= clo));
        }
        if (lane == 0) w_count[warp] = n_hit;
        __syncthreads();
        int base = 0, all = 0;
        for (int v = 0; v < WARPS; ++v) { base += v < warp ? w_count[v] : 0; all += w_count[v]; }
        for (int j = warp * R; j < (warp + 1) * R; ++j) {
            const uint2 a = reinterpret_cast<const uint2*>(t_hi24)[j * 32 + lane];
            reinterpret_cast<uint2*>(t_hi24)[j * 32 + lane] = make_uint2(0u, 0u);
            const bool h0 = a.x >= clo, h1 = a.y >= clo;
            const unsigned m0 = __ballot_sync(FULL, h0), m1 = __ballot_sync(FULL, h1);
            if (base < CAP && (m0 | m1)) {
                const int slot = base + __popc(m0 & below) + __popc(m1 & below);
                const i64 d = doc0 + j * 64 + 2 * lane;
                if (h0 && slot < CAP) out[out0 + slot] = ((i64)a.x << 31) | (0x7fffffffLL - d);
                if (h1 && slot + h0 < CAP) out[out0 + slot + h0] = ((i64)a.y << 31) | (0x7fffffffLL - d - 1);
            }
            base += __popc(m0) + __popc(m1);
        }
        if (tid == 0) counts[out0 / CAP] = all;
#elif ROWMAX
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
STEP = 2           # kept for BlockConfig.cuda_step; the loop always has two steps in flight (session 6)
TERMS = 256        # query terms per run table fill (longer queries take several)
SPAN = 8192        # docs per work item: the limb tiles take 96 KB, 2 CTAs per H200 SM
MAX_SPAN = 16384   # 192 KB of tiles


@functools.cache
def _kernel(span: int, cap: int, rowmax: bool, warps: int, terms: int, coarse: bool = False):
    if terms > 256 or terms % 32:
        raise ValueError("run tables hold a multiple of 32 terms, at most 256 (the limb headroom)")
    defines = f"#define SPAN {span}\n#define CAP {cap}\n#define ROWMAX {int(rowmax)}\n#define COARSE {int(coarse)}\n" \
              f"#define CSHIFT {COARSE_SHIFT}\n#define LIMBS {1 if coarse else 3}\n#define WARPS {warps}\n" \
              f"#define TG {terms}\n"
    kern = torch.cuda._compile_kernel(defines + _SOURCE, "lsr_block_scores")
    kern.set_shared_memory_config(_smem(span, warps, terms, coarse))
    return kern


def _smem(span: int, warps: int, terms: int, coarse: bool = False) -> int:
    # sum tiles (three limbs, or one coarse cell), run table, per-warp counts, item
    return span * (4 if coarse else 12) + terms * 28 + warps * 4 + 16


@functools.cache
def available(device_index: int = 0) -> bool:
    """True when the kernel compiles and runs here (a CUDA device, NVRTC, torch.cuda._compile_kernel)."""
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "_compile_kernel"):
        return False
    try:
        with torch.cuda.device(device_index):
            _kernel(64 * WARPS, 8, False, WARPS, TERMS)
        return True
    except Exception:  # noqa: BLE001 - no NVRTC / driver too old: the Triton kernel takes over
        return False


def usable(post_doc: torch.Tensor, post_w: torch.Tensor, span: int, warps: int = WARPS) -> bool:
    """Whether this kernel can serve these postings and span (else use the Triton kernel)."""
    return (post_doc.is_cuda and 64 * warps <= span <= MAX_SPAN and post_doc.numel() % 4 == 0
            and post_doc.data_ptr() % 16 == 0 and post_w.data_ptr() % 16 == 0
            and available(post_doc.device.index or 0))


@functools.cache
def programs_per_sm(span: int, warps: int = WARPS, device_index: int = 0, coarse: bool = False) -> int:
    """CTAs that fit on one SM by shared memory and registers (the persistent grid is SMs x this)."""
    props = torch.cuda.get_device_properties(device_index)
    per_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    by_regs = getattr(props, "regs_per_multiprocessor", 65536) // (64 * 32 * warps)   # <= 64 registers a thread
    # 1 KB per CTA is reserved by the driver
    return max(1, min(by_regs, per_sm // (_smem(span, warps, TERMS, coarse) + 1024)))


def cuda_block_candidates(post_doc: torch.Tensor, post_w: torch.Tensor, span_off: torch.Tensor,
                          q_indptr: torch.Tensor, q_terms: torch.Tensor, q_weights: torch.Tensor,
                          scale: torch.Tensor, inv_scale: torch.Tensor, span: int,
                          items: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], out_size: int, *,
                          theta: torch.Tensor | None = None, cap: int = 32, group: int = 1,
                          warps: int = WARPS, step: int = STEP, coarse_lo: torch.Tensor | None = None,
                          **_: object
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Shared-memory block scorer over work items; emits candidate keys.

    Args: as ``lsr.search.kernels.block.triton_block_candidates`` (group must be 1; its Triton tuning
        arguments are accepted and ignored), plus
        warps: warps per CTA; step: accepted and unused (two steps are always in flight).
        span: docs per span, a power of two in [64 * warps, 16384] (span * 12 bytes of limb tiles in
            shared memory per CTA; span * 4 in coarse mode).
        coarse_lo: int64 [B] or None: coarse mode (lsr.search.kernels.block.torch_block_candidates' contract):
            one uint32 cell per doc sums (contribution >> COARSE_SHIFT) with one shared atomic per
            posting, and the docs whose coarse sum reaches coarse_lo[q] (clamped to >= 1) are emitted as
            coarse keys into cap slots (+ counts); theta is not used.
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
    rowmax = theta is None and coarse_lo is None
    coarse = coarse_lo is not None
    if coarse:   # uint32 in the kernel; a floor >= 2^31 is never reached (coarse sums stay below it)
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
                * programs_per_sm(span, warps, dev.index or 0, coarse))
    kern = _kernel(span, width, rowmax, warps, TERMS, coarse)
    with torch.cuda.device(dev):
        kern(grid=(n_cta, 1, 1), block=(32 * warps, 1, 1), shared_mem=_smem(span, warps, TERMS, coarse),
             args=[post_doc, post_w, span_off, span_off.stride(0), q_indptr, q_terms, q_weights, scale,
                   inv_scale, theta if theta is not None else scale, coarse_lo if coarse else q_indptr,
                   item_q, item_span, item_out, n_items, out,
                   out if rowmax else counts, torch.zeros(1, dtype=torch.int32, device=dev)])
    return out, counts
